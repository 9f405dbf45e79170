"""The reviewer's CLI over the fleet's store: `audit query|tail -f|export|replay --store` read
every stream, in the global order where the sequencer folded them (commit order after), with the
filters and formats they have for the files (the same code: the store is another source)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from gateway.audit.keys import SigningKey
from gateway.audit.records import canonical
from gateway.store import db
from gateway.store.ledger import StoreLedger
from tests.audit.test_export import Receiver, receiver
from tests.conftest import eventually
from tests.store.test_ledger import gateway, run, setup
from tests.test_gateway import PERMISSIVE, ws

__all__ = ["receiver", "setup", "ws"]


def _ledger(dsn: str, tmp_path: Path, host: str) -> StoreLedger:
    return StoreLedger(db.Store(dsn), tmp_path / host, key=SigningKey.load_or_create(tmp_path / "keys"), host=host)


def _jsonl(out: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_the_global_order_is_the_checkpoints_then_commit_order(dsn: str, tmp_path: Path) -> None:
    a, b = _ledger(dsn, tmp_path, "h1"), _ledger(dsn, tmp_path, "h2")
    try:
        a.append("note", data={"n": "a1"})
        b.append("note", data={"n": "b1"})
        a2 = a.append("note", data={"n": "a2"})
        b.append("note", data={"n": "b2"})
        # a checkpoint that folded stream a only (a sequencer whose snapshot saw b's records not yet)
        body = {"n": 1, "prev": "", "heads": {a.stream: [a2["seq"], a2["hash"]]}, "records": a2["seq"]}
        with psycopg.connect(dsn) as conn:
            conn.execute("INSERT INTO agw.checkpoint (n, hash, body) VALUES (1, 'x', %s)", (canonical(body),))
    finally:
        a.close()
        b.close()
    got = _jsonl(gateway("audit", "query", "--store", dsn, "--event", "note", "--format", "jsonl"))
    assert [r["data"]["n"] for r in got] == ["a1", "a2", "b1", "b2"]  # folded first, then as received
    # the same filters as for the files: --host (the stream's host), --since
    h2 = _jsonl(gateway("audit", "query", "--store", dsn, "--host", "h2", "--event", "note", "--format", "jsonl"))
    assert [r["data"]["n"] for r in h2] == ["b1", "b2"]
    later = gateway("audit", "query", "--store", dsn, "--since", "2999-01-01T00:00:00Z")
    assert later.returncode == 1 and not later.stdout  # nothing matched


def test_tail_follows_every_stream_as_records_commit(dsn: str, tmp_path: Path) -> None:
    a = _ledger(dsn, tmp_path, "h1")
    a.append("note", data={"n": "before"})
    env = {k: v for k, v in os.environ.items() if k != "AGW_STORE"}
    argv = [sys.executable, "-m", "gateway", "audit", "tail", "-f", "-n", "1", "--store", dsn, "--event", "note",
            "--format", "jsonl"]  # fmt: skip
    tail = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[dict[str, Any]] = []

    def read() -> None:
        assert tail.stdout is not None
        for line in tail.stdout:
            lines.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    b = _ledger(dsn, tmp_path, "h2")
    try:
        assert eventually(lambda: len(lines) >= 1), tail.stderr
        for i in range(3):
            a.append("note", data={"n": f"a{i}"})
            b.append("note", data={"n": f"b{i}"})
        b.append("other", data={"n": "not a note"})
        assert eventually(lambda: len(lines) >= 7)
    finally:
        tail.kill()
        tail.wait(60)
        a.close()
        b.close()
    assert [r["data"]["n"] for r in lines] == ["before", "a0", "b0", "a1", "b1", "a2", "b2"]
    assert len({r["stream"] for r in lines}) == 2


def test_export_reads_the_store_in_every_format(dsn: str, setup: dict[str, str], receiver: Receiver) -> None:
    assert run(setup, dsn, "echo one").returncode == 0
    assert run(setup, dsn, "echo two").returncode == 0
    lines = _jsonl(gateway("audit", "export", "--store", dsn, "--format", "jsonl", "--event", "decision"))
    assert [r["arguments"]["command"] for r in lines] == ["echo one", "echo two"]
    ecs = _jsonl(gateway("audit", "export", "--store", dsn, "--format", "ecs", "--event", "decision"))
    assert [e["process"]["command_line"] for e in ecs] == ["echo one", "echo two"]
    ocsf = _jsonl(gateway("audit", "export", "--store", dsn, "--format", "ocsf", "--call", lines[1]["call_id"]))
    assert ocsf and all(e["class_uid"] == 1007 for e in ocsf)
    sent = gateway("audit", "export", "--store", dsn, "--format", "otlp", "--endpoint", receiver.url)
    assert sent.returncode == 0, sent.stderr
    assert len(receiver.spans) == 2 and "2 span(s) sent" in sent.stderr
    cursor = gateway("audit", "export", "--store", dsn, "--cursor", str(Path(setup["--audit-dir"]) / "c"))
    assert cursor.returncode == 2 and "--cursor is for the files" in cursor.stderr


def test_export_follows_the_store(dsn: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGW_STORE"}
    argv = [sys.executable, "-m", "gateway", "audit", "export", "--follow", "--store", dsn, "--event", "note"]
    export = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[dict[str, Any]] = []

    def read() -> None:
        assert export.stdout is not None
        for line in export.stdout:
            lines.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    a = _ledger(dsn, tmp_path, "h1")
    try:
        for i in range(3):
            a.append("note", data={"n": i})
        assert eventually(lambda: len(lines) >= 3)
    finally:
        export.kill()
        export.wait(60)
        a.close()
    assert [r["data"]["n"] for r in lines] == [0, 1, 2]


def test_replay_decides_the_fleets_calls_again(dsn: str, setup: dict[str, str], tmp_path: Path, ws: Path) -> None:
    assert run(setup, dsn, "echo one").returncode == 0
    assert run(setup, dsn, "echo two").returncode == 0
    draft = tmp_path / "draft.yaml"
    rules = [{**PERMISSIVE["rules"][0], "programs": ["cat"], "examples": {"match": ["cat x"]}}]  # type: ignore[index]
    draft.write_text(yaml.safe_dump({**PERMISSIVE, "rules": rules, "workspace": str(ws)}))
    out = gateway("audit", "replay", "--store", dsn, "--policy", str(draft), "--json")
    assert out.returncode == 1, out.stderr  # something would change
    report = json.loads(out.stdout)
    assert report["decisions"] == 2
    changed = [c for g in report["groups"] for c in g["calls"]]
    assert sorted(c["command"] for c in changed) == ["echo one", "echo two"]  # both streams
    same = gateway("audit", "replay", "--store", dsn, "--policy", setup["--policy"])
    assert same.returncode == 0, same.stdout + same.stderr


@pytest.mark.parametrize("verb", ["repair", "head", "adopt"])
def test_the_file_verbs_say_they_are_for_files(dsn: str, verb: str) -> None:
    out = gateway("audit", verb, "--store", dsn)
    assert out.returncode == 2 and "for the files of one host" in out.stderr
