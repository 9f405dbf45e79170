"""One policy snapshot from decision to spawn: a `process start` decided under one policy is
sandboxed under that same policy, while the policy file is rewritten and reloaded under it."""

from __future__ import annotations

import copy
import re
import threading
from pathlib import Path
from typing import Any

import yaml

from gateway.audit import AuditLog
from gateway.calls import ProcessCall
from gateway.pipeline import Gateway
from gateway.policy.reload import PolicyHolder
from gateway.sandbox.identity import hand_over
from tests.server.conftest import POLICY, audit_records

STARTS = 120


def _policy(open_files: int) -> dict[str, Any]:
    p = copy.deepcopy(POLICY)
    p["roles"]["dev"]["limits"] |= {"open_files": open_files, "processes": 100_000}
    # cat's model (gateway/programs/cat.yaml) would jail /proc/self/limits, which the jail refuses
    # (resolved by the gateway, /proc/self is the gateway); here cat reads the sandbox's own limits
    basics = next(r for r in p["rules"] if r["id"] == "basics")
    basics["path_args"] = {}
    return p


def test_process_starts_are_sandboxed_under_the_policy_that_decided_them(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    hand_over(ws)
    path = tmp_path / "policies" / "p.yaml"
    path.parent.mkdir()
    texts = [yaml.safe_dump(_policy(n), sort_keys=False) for n in (1000, 900)]
    path.write_text(texts[0])
    holder = PolicyHolder(path, ws, interval=0)  # every call sees the file as it is now
    gw = Gateway(holder.current, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    by_sha: dict[str, int] = {}
    stop = threading.Event()

    def flip() -> None:  # a human editing the policy, again and again, while starts go on
        i = 0
        while not stop.is_set():
            i += 1
            path.write_text(texts[i % 2])
            holder.reload_if_changed()

    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def starts(n: int) -> None:
        for _ in range(n):
            out = gw.handle(ProcessCall(principal="agent", action="start", command="cat /proc/self/limits"))
            with lock:
                results.append(out)

    flipper = threading.Thread(target=flip)
    flipper.start()
    workers = [threading.Thread(target=starts, args=(STARTS // 4,)) for _ in range(4)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        stop.set()
        flipper.join()
    try:
        decided = {
            r["call_id"]: r["policy_sha256"] for r in audit_records(tmp_path / "audit") if r["event"] == "decision"
        }
        for text, n in zip(texts, (1000, 900), strict=True):
            path.write_text(text)
            holder.reload_if_changed()
            by_sha[holder.current().sha256] = n
        ok = [r for r in results if r["status"] == "ok"]
        assert len(ok) == STARTS, [r for r in results if r["status"] != "ok"][:3]
        mixed = []
        for out in ok:
            pid = out["process"]["id"]
            assert gw._processes.wait_for("agent", pid, 30)
            log = (tmp_path / "state" / "processes" / pid / "process.log").read_text()
            seen = int(re.search(r"Max open files\s+(\d+)", log).group(1))  # type: ignore[union-attr]
            if seen != by_sha[decided[out["call_id"]]]:
                mixed.append(out["call_id"])
        assert not mixed, f"{len(mixed)} of {len(ok)} starts were decided under one policy and sandboxed under another"
    finally:
        gw.close()
