"""kill -9 in the fleet: a gateway killed while its call runs (the call's decision was in the
store before it ran; the host's next stream links on), and the sequencer killed while it folds
(another gateway takes the lock over; the checkpoints stay consistent with the ledger)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.store import db, sequencer
from gateway.store.ledger import verify_store
from tests.conftest import eventually
from tests.server.conftest import HttpGateway, policy_file, ws
from tests.server.test_transports import call_http
from tests.store.test_approvals import login
from tests.store.test_fleet import fleet_token
from tests.store.test_ledger import gateway

__all__ = ["policy_file", "ws"]

WRITER = r"""
import sys, time
from pathlib import Path
from gateway.audit.keys import SigningKey
from gateway.store import db
from gateway.store.ledger import StoreLedger
dsn, directory, keys = sys.argv[1:4]
log = StoreLedger(db.Store(dsn), Path(directory), key=SigningKey.load_or_create(Path(keys)), sequence=True)
print(log.stream, flush=True)
n = 0
while True:
    log.append("note", data={"n": n})
    n += 1
    time.sleep(0.02)
"""


def _writers(dsn: str, tmp_path: Path, count: int) -> list[subprocess.Popen[str]]:
    procs = []
    for i in range(count):
        argv = [sys.executable, "-c", WRITER, dsn, str(tmp_path / f"a{i}"), str(tmp_path / "keys")]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
        if i == 0:
            assert procs[0].stdout is not None and procs[0].stdout.readline()  # the key is made
    return procs


def _leader(dsn: str) -> int | None:
    """The pid of the gateway process that holds the sequencer's lock (from its application_name)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = %s",
            (sequencer.LOCK,),
        ).fetchone()
    return int(row[0].split()[-1]) if row else None


def _newest(dsn: str) -> dict[str, object] | None:
    with psycopg.connect(dsn) as conn:
        return sequencer.latest(conn)


def test_the_sequencer_killed_mid_fold_is_taken_over(dsn: str, tmp_path: Path) -> None:
    procs = _writers(dsn, tmp_path, 2)
    try:
        leader = eventually(lambda: _leader(dsn))
        assert leader in {p.pid for p in procs}
        before = eventually(lambda: _newest(dsn))
        assert before is not None
        victim = next(p for p in procs if p.pid == leader)
        victim.send_signal(signal.SIGKILL)  # wherever it is in its fold
        victim.wait(60)
        survivor = next(p for p in procs if p is not victim)
        assert eventually(lambda: _leader(dsn) == survivor.pid)
        n = int(before["n"])  # type: ignore[call-overload]
        assert eventually(lambda: (cp := _newest(dsn)) is not None and int(cp["n"]) > n + 3)  # type: ignore[call-overload]
    finally:
        for p in procs:
            p.kill()
            p.wait(60)
    with db.Store(dsn) as store:
        checked = verify_store(store)
    assert checked.ok, checked.lines()


def test_a_gateway_killed_while_its_call_runs(dsn: str, tmp_path: Path, policy_file: Path, ws: Path) -> None:
    keys = ("--store", dsn, "--audit-keys", str(tmp_path / "keys"))
    (tmp_path / "one").mkdir()
    server = HttpGateway(tmp_path / "one", policy_file, ws, extra=keys)
    token, _ = fleet_token(dsn, policy_file)
    got: list[Any] = []

    def agent() -> None:
        try:
            got.append(asyncio.run(call_http(server.url, token, "auto", ("run", {"command": "sleep 60"}))))
        except BaseException as exc:  # the server died under it
            got.append(exc)

    threading.Thread(target=agent, daemon=True).start()

    def decided() -> list[dict[str, Any]]:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT body FROM agw.record WHERE body::jsonb ->> 'event' = 'decision'").fetchall()
        return [json.loads(b) for (b,) in rows]

    try:
        eventually(lambda: decided() or got)  # in the store before the command started
        if not decided():  # the call ended (or never came) without a decision: say what the agent saw
            pytest.fail(f"no decision recorded; the agent got {got!r}; the server said {server.stderr.read_text()}")
        (decision,) = decided()
        assert decision["arguments"]["command"] == "sleep 60" and decision["decision"] == "allow"
    finally:
        server.stop(signal.SIGKILL)
    assert eventually(lambda: got)
    (tmp_path / "two").mkdir()
    again = HttpGateway(tmp_path / "two", policy_file, ws, extra=keys)  # the host's next gateway
    try:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT body FROM agw.record WHERE seq = 1 ORDER BY received_at").fetchall()
        _, second = (json.loads(b) for (b,) in rows)
        assert second["data"]["previous"]["stream"] == decision["stream"]
        assert second["data"]["previous"]["seq"] >= decision["seq"]
        assert second["data"]["closed"] == [decision["stream"]]
        (mark,) = _records(dsn, "interrupted")  # the call the kill cut short, marked by the next gateway
        assert mark["call_id"] == decision["call_id"] and mark["stream"] == second["stream"]
        assert mark["data"]["stream"] == decision["stream"] and "killed or it crashed" in mark["data"]["why"]
    finally:
        again.stop()
    (tmp_path / "three").mkdir()  # a later gateway does not mark it again
    HttpGateway(tmp_path / "three", policy_file, ws, extra=keys).stop()
    assert len(_records(dsn, "interrupted")) == 1
    with db.Store(dsn) as store:
        checked = verify_store(store)
    assert checked.ok, checked.lines()


def _records(dsn: str, event: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT body FROM agw.record WHERE body::jsonb ->> 'event' = %s", (event,)).fetchall()
    return [json.loads(b) for (b,) in rows]


def test_the_asks_of_a_killed_gateway_are_expired_by_the_next(
    dsn: str, tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    keys = ("--store", dsn, "--audit-keys", str(tmp_path / "keys"), "--pending-after", "600")
    (tmp_path / "one").mkdir()
    (ws / "victim").write_text("kept\n")
    server = HttpGateway(tmp_path / "one", policy_file, ws, extra=keys)
    token, _ = fleet_token(dsn, policy_file)

    def agent() -> None:
        with contextlib.suppress(BaseException):  # the server dies under it
            asyncio.run(call_http(server.url, token, "auto", ("run", {"command": "rm victim"})))

    threading.Thread(target=agent, daemon=True).start()

    def pending() -> list[tuple[str, str]]:
        with psycopg.connect(dsn) as conn:
            return [(str(c), str(s)) for c, s in conn.execute("SELECT call_id, state FROM agw.approval").fetchall()]

    try:
        asked = eventually(pending)
        assert asked and asked[0][1] == "pending", server.stderr.read_text()
    finally:
        server.stop(signal.SIGKILL)
    call_id = asked[0][0]
    (tmp_path / "two").mkdir()
    HttpGateway(tmp_path / "two", policy_file, ws, extra=keys).stop()
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT state, reason FROM agw.approval WHERE call_id = %s", (call_id,)).fetchone()
    assert row is not None and row[0] == "expired" and "ended while the ask was pending" in row[1]
    (mark,) = _records(dsn, "interrupted")
    assert mark["call_id"] == call_id and mark["data"]["ask"] == "expired"
    assert (ws / "victim").exists()
    alice = login(dsn, "agw_supervisor")  # an answer now runs nothing: refused
    late = gateway("approvals", "approve", "--store", alice, call_id)
    assert late.returncode == 2 and "was expired" in late.stderr
