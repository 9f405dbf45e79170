"""Approvals as rows: an agent's ask on one gateway of the fleet is answered from another
process by a supervisor as their own database login; exactly one answer wins; a gateway's
login cannot answer; an expired request or another digest is refused."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.approval import Approval, ApprovalRequest
from gateway.store import approvals, db
from tests.conftest import eventually
from tests.server.conftest import HttpGateway, envelope_of, policy_file, ws
from tests.server.test_transports import call_http
from tests.store.test_fleet import fleet_token
from tests.store.test_ledger import gateway

__all__ = ["policy_file", "ws"]
_ROLES = itertools.count(1)


def login(dsn: str, group: str) -> str:
    """A new login in `group` (agw_supervisor, agw_gateway), and the DSN that connects as it."""
    name = f"{group.removeprefix('agw_')}_{next(_ROLES)}_{threading.get_native_id()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {group}")
    return dsn.replace("postgresql://gw@", f"postgresql://{name}@")


@pytest.fixture
def two_gateways(tmp_path: Path, policy_file: Path, ws: Path, dsn: str) -> Iterator[list[HttpGateway]]:
    servers: list[HttpGateway] = []
    try:
        for i in range(2):
            home = tmp_path / f"gw{i}"
            home.mkdir()
            extra = ("--store", dsn, "--audit-keys", str(tmp_path / "keys"), "--pending-after", "600")
            servers.append(HttpGateway(home, policy_file, ws, extra=extra))
        yield servers
    finally:
        for s in servers:
            s.stop()


def test_an_ask_on_one_gateway_is_answered_from_anywhere_as_the_supervisor(
    two_gateways: list[HttpGateway], dsn: str, ws: Path
) -> None:
    first, _second = two_gateways
    (ws / "victim").write_text("delete me once a supervisor says so\n")
    token, _ = fleet_token(dsn, first.policy_file)
    got: list[Any] = []

    def agent() -> None:
        got.append(asyncio.run(call_http(first.url, token, "auto", ("run", {"command": "rm victim"}))))

    caller = threading.Thread(target=agent, daemon=True)
    caller.start()
    alice = login(dsn, "agw_supervisor")

    def asked() -> list[dict[str, Any]]:
        store = db.Store(alice)
        try:
            return approvals.pending(store)
        finally:
            store.close()

    rows = eventually(asked)
    assert rows and rows[0]["command"] == "rm victim"
    call_id = rows[0]["call_id"]
    listed = gateway("approvals", "list", "--store", alice)
    assert listed.returncode == 0 and call_id in listed.stdout
    shown = gateway("approvals", "show", "--store", alice, call_id)
    assert shown.returncode == 0 and "rm victim" in shown.stdout
    done = gateway("approvals", "approve", "--store", alice, call_id, "--reason", "deploy day", "--by", "mallory")
    assert done.returncode == 0, done.stderr
    who = alice.split("//")[1].split("@")[0]
    assert f"approved {call_id} as {who}" in done.stdout  # the login, not the name typed
    again = gateway("approvals", "deny", "--store", alice, call_id)
    assert again.returncode == 2 and "already has an answer (approved by" in again.stderr
    caller.join(120)
    result = envelope_of(got[0][0])
    if result["status"] == "pending":  # it was answered after the server said pending: fetch it
        (awaited,) = asyncio.run(call_http(first.url, token, "auto", ("await_call", {"call_id": call_id})))
        result = envelope_of(awaited)
    assert result["status"] == "ok", result
    assert not (ws / "victim").exists()
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT state, answered_by, answered_from FROM agw.approval WHERE call_id = %s",
                           (call_id,)).fetchone()  # fmt: skip
        records = [json.loads(b) for (b,) in conn.execute(
            "SELECT body FROM agw.record WHERE body::jsonb ->> 'event' = 'approval'")]  # fmt: skip
    assert row == ("approved", who, socket.gethostname())
    assert [(r["call_id"], r["decision"], r["data"]["by"], r["data"]["how"]) for r in records] == [
        (call_id, "allow", who, "store")
    ]


def _request(call_id: str) -> ApprovalRequest:
    return ApprovalRequest.bind(call_id, "agent", "run", "rm -rf build", "/ws", {}, "rm", "asks", "sha")


def _ask(dsn: str, call_id: str, timeout: float) -> tuple[approvals.StoreApprover, list[Approval | None]]:
    approver = approvals.StoreApprover(db.Store(dsn), "stream-x", "host-x")
    out: list[Approval | None] = []
    threading.Thread(target=lambda: out.append(approver.decide(_request(call_id), timeout)), daemon=True).start()
    return approver, out


def _pending(dsn: str, call_id: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM agw.approval WHERE call_id = %s AND state = 'pending'",
                            (call_id,)).fetchone() is not None  # fmt: skip


def test_exactly_one_answer_wins(dsn: str) -> None:
    _, out = _ask(dsn, "c-race", 120)
    assert eventually(lambda: _pending(dsn, "c-race"))
    supervisors = [login(dsn, "agw_supervisor") for _ in range(6)]
    results: list[str] = []
    start = threading.Barrier(len(supervisors))

    def answer(i: int, who: str) -> None:
        store = db.Store(who)
        try:
            start.wait()
            approvals.answer(store, "c-race", i % 2 == 0, f"answer {i}")
            results.append(f"won {i}")
        except approvals.ApprovalError as exc:
            results.append(str(exc))
        finally:
            store.close()

    threads = [threading.Thread(target=answer, args=(i, w)) for i, w in enumerate(supervisors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    won = [r for r in results if r.startswith("won")]
    assert len(won) == 1 and len(results) == len(supervisors), results
    assert all("already has an answer" in r for r in results if not r.startswith("won"))
    assert eventually(lambda: out)
    winner = int(won[0].split()[1])
    answer_ = out[0]
    assert answer_ is not None and answer_.approved == (winner % 2 == 0) and answer_.how == "store"


def test_a_gateways_login_cannot_answer(dsn: str) -> None:
    _, out = _ask(dsn, "c-self", 120)
    assert eventually(lambda: _pending(dsn, "c-self"))
    host = login(dsn, "agw_gateway")
    with psycopg.connect(host, autocommit=True) as conn:
        for sql in (
            "SELECT agw.answer('c-self', true, (SELECT digest FROM agw.approval WHERE call_id = 'c-self'), '', "
            "'once', '')",
            "UPDATE agw.approval SET state = 'approved', answered_by = 'alice' WHERE call_id = 'c-self'",
            "INSERT INTO agw.approval (call_id, stream, host, principal, request, digest, expires_at, state) "
            "VALUES ('c-forged', 's', 'h', 'agent', '{}', 'd', now() + interval '1 hour', 'approved')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        with pytest.raises(psycopg.errors.RaiseException, match="only as expired or withdrawn"):
            conn.execute("SELECT agw.settle('c-self', 'approved')")
        store = db.Store(host)
        try:
            with pytest.raises(approvals.ApprovalError, match="may not answer approvals"):
                approvals.answer(store, "c-self", True)
        finally:
            store.close()
    assert _pending(dsn, "c-self") and not out


def test_an_expired_request_or_another_digest_is_refused(dsn: str) -> None:
    alice = db.Store(login(dsn, "agw_supervisor"))
    try:
        _, out = _ask(dsn, "c-digest", 120)
        assert eventually(lambda: _pending(dsn, "c-digest"))
        with pytest.raises(approvals.ApprovalError, match="not the call you were shown"):
            approvals.answer(alice, "c-digest", True, digest="0" * 64)
        _, late = _ask(dsn, "c-late", 1)
        assert eventually(lambda: late)
        assert late == [None]  # nobody answered in time: denied
        with pytest.raises(approvals.ApprovalError, match="was expired"):
            approvals.answer(alice, "c-late", True)
        assert not out
    finally:
        alice.close()


def test_a_one_shot_run_asks_the_fleet(dsn: str, tmp_path: Path, ws: Path, policy_file: Path) -> None:
    (ws / "victim").write_text("x\n")
    argv = [sys.executable, "-m", "gateway", "run", "--store", dsn, "--policy", str(policy_file), "--workspace",
            str(ws), "--audit-dir", str(tmp_path / "audit"), "--audit-keys", str(tmp_path / "keys"), "--principal",
            "agent", "--approver", "queue", "--", "rm victim"]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        alice = login(dsn, "agw_supervisor")
        store = db.Store(alice)
        try:
            rows = eventually(lambda: approvals.pending(store))
            assert rows, "never asked"
            approvals.answer(store, rows[0]["call_id"], True, "fine")
        finally:
            store.close()
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert "answer from any host: gateway approvals approve --store" in err
    assert not (ws / "victim").exists()
