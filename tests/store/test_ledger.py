"""The fleet's ledger in a real PostgreSQL: `gateway run --store` records each call in its
process's stream before it runs, `gateway audit verify --store` checks every stream, and an
attacker who holds the database (a superuser, past the append-only triggers) is found out."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from gateway.audit.records import canonical, digest
from tests.test_gateway import PERMISSIVE, ws

__all__ = ["ws"]


def gateway(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGW_STORE"}
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip


@pytest.fixture
def setup(tmp_path: Path, ws: Path) -> dict[str, str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({**PERMISSIVE, "workspace": str(ws)}))
    return {"--policy": str(policy), "--workspace": str(ws), "--audit-dir": str(tmp_path / "audit"),
            "--audit-keys": str(tmp_path / "keys"), "--principal": "agent"}  # fmt: skip


def run(setup: dict[str, str], dsn: str, command: str) -> subprocess.CompletedProcess[str]:
    return gateway("run", "--store", dsn, *[x for kv in setup.items() for x in kv], "--", command)


def verify(dsn: str, setup: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return gateway("audit", "verify", "--store", dsn, "--key", str(Path(setup["--audit-keys"]) / "signing.pub"))


def rows(dsn: str) -> list[tuple[str, int, dict[str, object]]]:
    with psycopg.connect(dsn) as conn:
        got = conn.execute("SELECT r.stream, r.seq, r.body FROM agw.record r JOIN agw.stream s USING (stream) "
                           "ORDER BY s.n, r.seq").fetchall()  # fmt: skip
    return [(s, q, json.loads(b)) for s, q, b in got]


def as_attacker(dsn: str, *statements: tuple[str, tuple[object, ...]]) -> None:
    """A superuser past the append-only triggers (what the signed links and checks are for)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET session_replication_role = replica")
        for sql, params in statements:
            conn.execute(sql, params)


def test_each_call_is_in_its_stream_before_it_runs(dsn: str, setup: dict[str, str], ws: Path) -> None:
    out = run(setup, dsn, "echo made > made.txt")
    assert out.returncode == 0, out.stderr
    assert (ws / "made.txt").read_text() == "made\n"
    got = rows(dsn)
    assert [r["event"] for _, _, r in got] == ["stream_started", "policy_loaded", "decision", "result"]
    assert {s for s, _, _ in got} == {got[0][0]}
    assert got[2][2]["decision"] == "allow" and got[2][2]["arguments"]["command"] == "echo made > made.txt"
    assert all(r["stream"] == got[0][0] and r["seq"] == q for _, q, r in got)
    assert "sig" in got[-1][2]
    checked = verify(dsn, setup)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok: 1 streams, 4 records" in checked.stdout


def test_a_hosts_streams_link_in_order(dsn: str, setup: dict[str, str]) -> None:
    for _ in range(3):
        assert run(setup, dsn, "true").returncode == 0
    starts = [r for _, q, r in rows(dsn) if q == 1]
    assert starts[0]["data"]["previous"] is None
    for before, after in itertools.pairwise(starts):
        assert after["data"]["previous"]["stream"] == before["stream"]
        assert after["data"]["previous"]["seq"] == 4
    assert verify(dsn, setup).returncode == 0


def test_nobody_updates_or_deletes_the_ledger(dsn: str, setup: dict[str, str]) -> None:
    assert run(setup, dsn, "true").returncode == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in ("UPDATE agw.record SET body = body WHERE seq = 2", "DELETE FROM agw.record WHERE seq = 4",
                    "TRUNCATE agw.record CASCADE", "DELETE FROM agw.stream"):  # fmt: skip
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(sql)
    assert verify(dsn, setup).returncode == 0


def _edit(dsn: str, stream: str) -> None:
    (_, _, r) = next(x for x in rows(dsn) if x[0] == stream and x[1] == 3)
    r["arguments"]["command"] = "echo harmless"
    as_attacker(dsn, ("UPDATE agw.record SET body = %s WHERE stream = %s AND seq = 3", (canonical(r), stream)))


def _rehash(dsn: str, stream: str) -> None:
    """Edit a record and recompute its hash (but not the chain after it, nor a signature)."""
    (_, _, r) = next(x for x in rows(dsn) if x[0] == stream and x[1] == 3)
    r["arguments"]["command"] = "echo harmless"
    r["hash"] = digest(r)
    sql = "UPDATE agw.record SET body = %s, hash = %s WHERE stream = %s AND seq = 3"
    as_attacker(dsn, (sql, (canonical(r), r["hash"], stream)))


def _delete(dsn: str, stream: str) -> None:
    as_attacker(dsn, ("DELETE FROM agw.record WHERE stream = %s AND seq = 3", (stream,)))


def _reorder(dsn: str, stream: str) -> None:
    got = {q: (r["hash"], canonical(r)) for s, q, r in rows(dsn) if s == stream}
    as_attacker(
        dsn,
        ("UPDATE agw.record SET body = %s, hash = %s WHERE stream = %s AND seq = 3", (got[4][1], got[4][0], stream)),
        ("UPDATE agw.record SET body = %s, hash = %s WHERE stream = %s AND seq = 4", (got[3][1], got[3][0], stream)),
    )


def _truncate(dsn: str, stream: str) -> None:
    as_attacker(dsn, ("DELETE FROM agw.record WHERE stream = %s AND seq >= 3", (stream,)))


def _drop_stream(dsn: str, stream: str) -> None:
    as_attacker(dsn, ("DELETE FROM agw.record WHERE stream = %s", (stream,)),
                ("DELETE FROM agw.stream WHERE stream = %s", (stream,)))  # fmt: skip


@pytest.mark.parametrize(
    ("tamper", "found"),
    [
        # a record's content changed: its hash no longer matches
        (_edit, "does not match its hash (edited)"),
        # ... even with its hash recomputed: the next record's link breaks
        (_rehash, "does not link to the one before it"),
        # a record removed: a gap in the stream's seqs
        (_delete, "records 3..3 are missing"),
        # two records swapped: each says where it belongs
        (_reorder, "(moved or reordered)"),
        # a stream cut short: the host's next stream saw it reach further
        (_truncate, "saw it reach seq 4, and that record is not there"),
        # a whole stream removed: the host's next stream names it
        (_drop_stream, "that is gone"),
    ],
)
def test_tampering_is_found(dsn: str, setup: dict[str, str], tamper, found: str) -> None:  # type: ignore[no-untyped-def]
    assert run(setup, dsn, "echo one").returncode == 0
    assert run(setup, dsn, "echo two").returncode == 0
    assert verify(dsn, setup).returncode == 0
    first = rows(dsn)[0][0]
    tamper(dsn, first)
    checked = verify(dsn, setup)
    assert checked.returncode == 1, checked.stdout
    assert found in checked.stdout


def test_records_signed_by_another_key_are_refused(dsn: str, setup: dict[str, str], tmp_path: Path) -> None:
    assert run(setup, dsn, "true").returncode == 0
    other = {**setup, "--audit-keys": str(tmp_path / "other-keys")}
    assert run(other, dsn, "true").returncode == 0
    checked = verify(dsn, setup)
    assert checked.returncode == 1
    assert "signed with a key you did not pin" in checked.stdout


def test_the_readers_read_every_stream(dsn: str, setup: dict[str, str]) -> None:
    assert run(setup, dsn, "echo one").returncode == 0
    assert run(setup, dsn, "echo two").returncode == 0
    decided = gateway("audit", "query", "--store", dsn, "--event", "decision", "--format", "jsonl")
    assert decided.returncode == 0, decided.stderr
    got = [json.loads(line) for line in decided.stdout.splitlines()]
    assert [r["arguments"]["command"] for r in got] == ["echo one", "echo two"]
    assert len({r["stream"] for r in got}) == 2
    shown = gateway("audit", "show", got[1]["call_id"], "--store", dsn, "--format", "jsonl")
    assert [json.loads(x)["event"] for x in shown.stdout.splitlines()] == ["decision", "result"]
    calls = gateway("audit", "calls", "--store", dsn, "--format", "jsonl")
    assert calls.returncode == 0 and len(calls.stdout.splitlines()) == 2
