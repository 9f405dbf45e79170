"""Failover to a synchronous standby: the primary killed mid-run, the standby promoted; every
record the gateway was told is durable is on the new primary, calls are refused while no
primary answers and go on after the promotion, without restarting the gateway."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gateway.audit.keys import SigningKey
from gateway.audit.records import AuditUnavailable
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy
from gateway.store import db
from gateway.store.ledger import StoreLedger, verify_store
from tests.conftest import eventually
from tests.store.pg import SUPERUSER, Postgres, bindir
from tests.test_gateway import policy, ws

__all__ = ["policy", "ws"]
STANDBY = "standby1"


@pytest.fixture
def pair() -> Iterator[tuple[Postgres, Postgres]]:
    found = bindir()
    if found is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl, postgres): apt-get install postgresql")
    primary = Postgres(found)
    standby = Postgres(found)
    try:
        primary.start()
        with db.Store(primary.dsn()) as store:
            db.migrate(store, init=True)
        standby.standby_of(primary, STANDBY)
        standby.start()
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:  # from now on, commits wait for it
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'")
            conn.execute("SELECT pg_reload_conf()")

        def synchronous() -> bool:
            with psycopg.connect(primary.dsn()) as conn:
                row = conn.execute("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                                   (STANDBY,)).fetchone()  # fmt: skip
            return row == ("sync",)

        assert eventually(synchronous), "the standby never became synchronous"
        yield primary, standby
    finally:
        standby.remove()
        primary.remove()


def test_no_acknowledged_record_is_lost_when_the_primary_dies(
    pair: tuple[Postgres, Postgres], policy: CompiledPolicy, ws: Path, tmp_path: Path
) -> None:
    primary, standby = pair
    # both hosts in one connection string: libpq takes the one that accepts writes
    both = (f"postgresql://{SUPERUSER}@/postgres?host={primary.root},{standby.root}&port={primary.port},"
            f"{standby.port}&target_session_attrs=read-write")  # fmt: skip
    acknowledged: list[dict[str, object]] = []
    ledger = StoreLedger(db.Store(both, timeout=3), tmp_path / "audit", key=SigningKey.load_or_create(tmp_path / "k"))
    sink_append = ledger.append

    def keep(event: str, **fields: object) -> dict[str, object]:
        record = sink_append(event, **fields)
        acknowledged.append(record)
        return record

    ledger.append = keep  # type: ignore[method-assign]
    gw = Gateway(policy, ledger)
    try:
        for i in range(5):
            assert gw.handle(RunCall(principal="agent", command=f"echo {i} >> before.txt"))["status"] == "ok"
        primary.stop("immediate")  # the primary's host is lost
        out = gw.handle(RunCall(principal="agent", command="echo lost > during.txt"))
        assert out["status"] == "denied" and out["error"]["code"] == "AUDIT_UNAVAILABLE", out  # type: ignore[index]
        assert not (ws / "during.txt").exists()
        standby.promote()
        assert gw.handle(RunCall(principal="agent", command="echo on > after.txt"))["status"] == "ok"
        assert (ws / "after.txt").exists()
    finally:
        gw.close()
        ledger.close()
    with psycopg.connect(standby.dsn()) as conn:
        held = {(s, q): h for s, q, h in conn.execute("SELECT stream, seq, hash FROM agw.record")}
    assert acknowledged
    lost = [r for r in acknowledged if held.get((r["stream"], r["seq"])) != r["hash"]]
    assert lost == []
    with db.Store(standby.dsn()) as store:
        checked = verify_store(store)
    assert checked.ok, checked.lines()


def test_a_standby_that_stops_answering_refuses_calls_within_the_commit_bound(
    pair: tuple[Postgres, Postgres], policy: CompiledPolicy, ws: Path, tmp_path: Path
) -> None:
    """The synchronous standby stops (its host is lost) and nothing is promoted: the primary
    holds every commit until the standby is back, and the call waiting on its record waited with
    it, for ever. Past the commit bound the ledger cuts the connection: the call is refused,
    naming the bound, and did not run; once the standby is back calls go on, and what landed
    unacknowledged is voided on the record."""
    primary, standby = pair
    ledger = StoreLedger(db.Store(primary.dsn(), timeout=3), tmp_path / "audit",
                         key=SigningKey.load_or_create(tmp_path / "k"), commit_timeout=2)  # fmt: skip
    gw = Gateway(policy, ledger)
    got: list[dict[str, object]] = []
    try:
        assert gw.handle(RunCall(principal="agent", command="echo one > one.txt"))["status"] == "ok"
        standby.stop("immediate")
        call = threading.Thread(
            target=lambda: got.append(gw.handle(RunCall(principal="agent", command="echo two > two.txt"))),
            daemon=True,
        )
        call.start()
        call.join(120)  # a bound on the test, far past the ledger's 2 s
        assert not call.is_alive(), "the call still waits for a standby that is gone"
        (out,) = got
        assert out["status"] == "denied" and out["error"]["code"] == "AUDIT_UNAVAILABLE", out  # type: ignore[index]
        message = out["error"]["message"]  # type: ignore[index]
        assert "did not answer a commit within 2 s" in message and "--store-commit-timeout" in message, message
        assert not (ws / "two.txt").exists()
        standby.start()
        assert eventually(
            lambda: gw.handle(RunCall(principal="agent", command="echo three > three.txt"))["status"] == "ok",
            seconds=120,
        )
        assert (ws / "three.txt").exists()
    finally:
        gw.close()
        ledger.close()
    with db.Store(primary.dsn()) as store:
        checked = verify_store(store)
        with store.connection() as conn:
            voided = [json.loads(b) for (b,) in conn.execute(
                "SELECT body FROM agw.record WHERE body::jsonb ->> 'event' = 'audit_voided'")]  # fmt: skip
    assert checked.ok, checked.lines()
    assert voided and voided[0]["data"]["seqs"], voided  # the refused call's records landed, and say so


def test_a_spooling_gateway_is_not_held_for_ever_by_a_standby_that_stops_answering(
    pair: tuple[Postgres, Postgres], policy: CompiledPolicy, ws: Path, tmp_path: Path
) -> None:
    """With --store-spool, a commit cut at the bound goes to the spool and its call runs. The
    primary still answers reads, so the forwarder soon finds the store "back" and forwards the
    spool: that commit waits for the same standby. It must be bounded as well: unbounded, the
    forwarder holds the ledger's commit turn for as long as the standby is away, and every call
    waits on it, for ever. Once the standby is back, every call that ran is in the store."""
    primary, standby = pair
    ledger = StoreLedger(db.Store(primary.dsn(), timeout=3), tmp_path / "audit", spool=tmp_path / "spool",
                         key=SigningKey.load_or_create(tmp_path / "k"), commit_timeout=2)  # fmt: skip
    gw = Gateway(policy, ledger)
    got: list[dict[str, object]] = []

    def call(name: str) -> dict[str, object]:
        done = threading.Thread(
            target=lambda: got.append(gw.handle(RunCall(principal="agent", command=f"echo {name} > {name}.txt"))),
            daemon=True,
        )
        done.start()
        done.join(120)  # a bound on the test, far past the ledger's 2 s
        assert not done.is_alive(), f"the call {name} still waits for a standby that is gone"
        return got.pop()

    try:
        assert call("one")["status"] == "ok"
        standby.stop("immediate")
        assert call("two")["status"] == "ok"  # cut at the bound, recorded in the spool
        assert ledger.spool is not None and ledger.spool.holding
        # the primary answers the forwarder's probe: it forwards the spool, and that commit waits too
        assert eventually(lambda: ledger._reachable, seconds=60), "the forwarder never found the store"
        for name in ("three", "four", "five"):  # the forwarder's turns come in between
            out = call(name)
            assert out["status"] in ("ok", "denied"), out
            assert (out["status"] == "ok") == (ws / f"{name}.txt").exists(), out
        standby.start()
        assert eventually(lambda: not ledger.spool.holding, seconds=120), "the spool was never forwarded"  # type: ignore[union-attr]
    finally:
        if not (standby.data / "postmaster.pid").exists():  # a call held for ever: let it go before closing
            standby.start()
        gw.close()
        ledger.close()
    with db.Store(primary.dsn()) as store:
        checked = verify_store(store)
    assert checked.ok, checked.lines()


def test_a_gateway_starting_while_its_standby_is_away_says_so_within_the_bound(
    pair: tuple[Postgres, Postgres], tmp_path: Path
) -> None:
    """The stream's start is a commit too: with the synchronous standby gone, a gateway starting
    waited for it for ever, saying nothing. It is refused within the commit bound, naming it, and
    the backend it left waiting is ended (it held the host's start lock: the next start on this
    host would have waited behind it)."""
    primary, standby = pair
    standby.stop("immediate")
    made: list[object] = []

    def start() -> None:
        try:
            made.append(StoreLedger(db.Store(primary.dsn(), timeout=3), tmp_path / "audit",
                                    key=SigningKey.load_or_create(tmp_path / "k"), commit_timeout=2))  # fmt: skip
        except AuditUnavailable as exc:
            made.append(exc)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    starting.join(120)
    try:
        assert not starting.is_alive(), "the gateway still waits for a standby that is gone"
        (got,) = made
        assert isinstance(got, AuditUnavailable), got
        assert "did not answer the start of this gateway's stream within 2 s" in str(got), got
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            waiting = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchone()
        assert waiting == (0,), "a backend still waits for the standby"
    finally:
        standby.start()  # what is still waiting (on the old code) ends with the standby's return
