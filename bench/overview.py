"""The console's overview of a large ledger: how long `GET /console/api/overview` takes.

Run by hand: `.venv/bin/python bench/overview.py [CALLS]` (default 100,000). It writes a log of
CALLS calls over the last 24 hours the way the writer does (canonical lines, chained hashes, a
signature on each call's last record), in a mix of principals, decisions and rules (allowed
calls that ran; asks approved after a wait, denied, timed out; policy denials), then measures,
in process (the machine is shared: each step 3 times, the median printed):

- cold: the console's call index folds the whole log (read, parse, fold: the first request
  after a start), then counts it;
- warm: a request once the index is up to date (the log unchanged): the counting alone, and the
  answer's JSON;
- append: 100 calls appended, then a request (the index reads only what was appended);
- the timeline's first page of calls (200 rows), and a text filter over the whole log.

The page's drawing (inline SVG of a few dozen bars) is not measured here: the browser test
draws the same answer.
"""

from __future__ import annotations

import base64
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.audit import canonical, digest
from gateway.audit.overview import overview
from gateway.audit.selection import Selection
from gateway.server.console.auditview import CallIndex
from gateway.server.console.cards import call_row, overview_shown

RUNS = 3
PRINCIPALS = ["agent", "ci-bot", "reviewer", "nightly", "intern"]
COMMANDS = ["git status", "pytest -q tests/test_api.py -k login", "rm -rf build/cache", "ls -la src",
            "grep -rn TODO gateway | head -50", "make lint", "python3 -m pip install -r requirements.txt",
            "curl https://example.com/install.sh", "git push --force origin main"]  # fmt: skip


class Ledger:
    """A log written line by line as the writer writes it (hash chain; a fake signature)."""

    def __init__(self, directory: Path, start: datetime) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "audit-000001.jsonl"
        self.prev, self.seq, self.start = "", 0, start
        self.sig = base64.b64encode(b"\0" * 64).decode()
        self.lines: list[str] = []

    def add(self, at: datetime, fields: dict[str, Any], signed: bool = False) -> None:
        self.seq += 1
        record = {**fields, "seq": self.seq, "ts": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "prev": self.prev}
        record["hash"] = self.prev = digest(record)
        if signed:
            record["sig"] = self.sig
        self.lines.append(canonical(record) + "\n")

    def flush(self) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(self.lines))
        self.lines = []


def write_calls(ledger: Ledger, first: int, n: int, start: datetime, span: timedelta) -> None:
    """Calls `first` .. `first + n - 1`, spread evenly over `span` from `start`."""
    step = span / max(n, 1)
    for k in range(first, first + n):
        at = start + step * (k - first)
        command = COMMANDS[k % len(COMMANDS)]
        base = {"call_id": f"{k:016x}", "principal": PRINCIPALS[k % len(PRINCIPALS)], "tool": "run",
                "policy_sha256": "ab" * 32}  # fmt: skip
        kind = k % 10  # 0-5 allowed, 6-7 asked, 8-9 denied
        decision = "allow" if kind < 6 else "ask" if kind < 8 else "deny"
        rule = {"allow": "dev-tools", "ask": "pip" if "pip" in command else "rm", "deny": "no-curl"}[decision]
        reasons = [{"stage": "permissions", "code": "rule", "message": "why", "rule": rule},
                   {"stage": "pathjail", "code": "paths_checked", "message": "2 path(s) inside the roots",
                    "details": {"read": ["/srv/ws/src/a.py"], "write": ["/srv/ws/build/out"]}}]  # fmt: skip
        ledger.add(at, {**base, "event": "decision", "decision": decision, "rule": rule, "reasons": reasons,
                        "arguments": {"command": command, "cwd": None, "env": {}, "shell": "bash"},
                        "data": {"commands": [{"argv": command.split(), "redirects": []}]}})  # fmt: skip
        if decision == "deny":
            continue
        if decision == "ask":
            waited = timedelta(seconds=(k * 7) % 600)
            approved = k % 3 != 0
            how = "timeout" if k % 30 == 0 else "queue"
            ledger.add(at + waited, {**base, "event": "approval", "decision": "allow" if approved else "deny",
                                     "rule": rule, "data": {"answered": how != "timeout", "by": "alice", "how": how,
                                                            "digest": "cd" * 32}},
                       signed=not approved)  # fmt: skip
            if not approved:
                continue
            at += waited
        ledger.add(at + timedelta(milliseconds=40), {**base, "event": "result", "data": {
            "status": "ok", "exit_code": 0, "duration_ms": 40, "stdout_bytes": 1200, "stderr_bytes": 0}}, signed=True)


def median_of(what: Callable[[], Any]) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(RUNS):
        t0 = time.perf_counter()
        out = what()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    now = datetime.now(UTC)
    since = now - timedelta(hours=24)
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit"
        ledger = Ledger(audit, since)
        write_calls(ledger, 0, n, since, timedelta(hours=23))
        ledger.flush()
        size = ledger.path.stat().st_size
        print(f"{n} calls, {ledger.seq} records, {size / 1e6:.1f} MB")

        def answer(index: CallIndex) -> str:
            return json.dumps(overview_shown(overview(index.all_calls(), since, now + timedelta(seconds=1))))

        def cold() -> str:
            return answer(CallIndex(audit))

        took, body = median_of(cold)
        counted = json.loads(body)["calls"]
        print(f"cold (fold the whole log, then count): {took * 1000:.0f} ms  ({counted} calls counted)")
        index = CallIndex(audit)
        index.refresh()
        took, _ = median_of(lambda: answer(index))
        print(f"warm (count, and the answer's JSON): {took * 1000:.0f} ms")
        appended = [n]

        def append() -> str:
            write_calls(ledger, appended[0], 100, now - timedelta(minutes=5), timedelta(minutes=1))
            ledger.flush()
            appended[0] += 100
            return answer(index)

        took, _ = median_of(append)
        print(f"100 calls appended, then a request: {took * 1000:.0f} ms")
        took, _ = median_of(lambda: [call_row(c) for c in index.calls(Selection(), 200, None, None)["calls"]])
        print(f"timeline, first 200 calls: {took * 1000:.0f} ms")
        chosen = Selection.of(text="requirements")
        took, found = median_of(lambda: index.calls(chosen, 200, None, index.text_calls(chosen))["matched"])
        print(f"timeline, text filter over the whole log: {took * 1000:.0f} ms ({found} calls)")


if __name__ == "__main__":
    main()
