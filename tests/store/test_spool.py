"""The opt-in spool (`--store-spool`, gateway/store/spool.py): with the store stopped mid-run,
calls go on, recorded in the spool; once it is back the spool is forwarded and the fleet's
ledger verifies as if it had never been cut off. A full spool refuses, naming its bound; a spool
edited while the store was away is refused, not inserted. Each test has a PostgreSQL of its own,
since it stops it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gateway.audit.keys import SigningKey
from gateway.audit.records import canonical, digest
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy
from gateway.store import db
from gateway.store.ledger import StoreLedger, verify_store
from tests.store.pg import Postgres
from tests.store.test_fail_closed import own_pg
from tests.test_gateway import policy, ws

__all__ = ["own_pg", "policy", "ws"]


def _ledger(
    pg: Postgres, tmp_path: Path, spool: Path | None, spool_max: int = 1 << 20, commit_timeout: float = 30
) -> StoreLedger:
    key = SigningKey.load_or_create(tmp_path / "k")
    store = db.Store(pg.dsn(), timeout=3)
    return StoreLedger(store, tmp_path / "audit", key=key, spool=spool, spool_max=spool_max,
                       commit_timeout=commit_timeout)  # fmt: skip


def _run(gw: Gateway, command: str) -> dict[str, object]:
    return gw.handle(RunCall(principal="agent", command=command))


def _commands(pg: Postgres) -> list[str]:
    """The decisions' commands in the order the store received them (each gateway has a stream of
    its own, named at random, so the order of stream names says nothing)."""
    store = db.Store(pg.dsn())
    try:
        checked = verify_store(store)
        assert checked.ok, checked.lines()
        with store.connection() as conn:
            sql = ("SELECT body::jsonb #>> '{arguments,command}' FROM agw.record "
                   "WHERE body::jsonb ->> 'event' = 'decision' ORDER BY received_at, stream, seq")  # fmt: skip
            return [r[0] for r in conn.execute(sql)]
    finally:
        store.close()


def _gone(path: Path) -> bool:
    deadline = time.monotonic() + 120  # generous: the machine is loaded
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


def test_calls_go_on_into_the_spool_and_are_forwarded_when_the_store_is_back(
    own_pg: Postgres, policy: CompiledPolicy, ws: Path, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    ledger = _ledger(own_pg, tmp_path, spool)
    gw = Gateway(policy, ledger)
    try:
        assert _run(gw, "echo one > one.txt")["status"] == "ok"
        own_pg.stop("immediate")
        for n in ("two", "three", "four"):
            out = _run(gw, f"echo {n} > {n}.txt")
            assert out["status"] == "ok", out  # recorded in the spool: the call ran
            assert (ws / f"{n}.txt").exists()
        assert ledger.spool is not None
        held = ledger.spool.path
        spooled = [json.loads(line) for line in held.read_text().splitlines()]
        assert [r["event"] for r in spooled].count("decision") == 3
        assert {r["stream"] for r in spooled} == {ledger.stream}
        own_pg.start()
        assert _gone(held), "the forwarder did not forward the spool once the store was back"
        assert _run(gw, "echo five > five.txt")["status"] == "ok"  # straight to the store again
        assert not held.exists()
    finally:
        gw.close()
        ledger.close()
    # every record once, in the chain's order, and the stream verifies end to end
    assert _commands(own_pg) == [f"echo {n} > {n}.txt" for n in ("one", "two", "three", "four", "five")]
    with db.Store(own_pg.dsn()) as store, store.connection() as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM agw.record WHERE stream = %s ORDER BY seq",
                                           (ledger.stream,))]  # fmt: skip
    assert seqs == list(range(1, ledger._seq + 1))


def test_a_full_spool_refuses_naming_its_bound(
    own_pg: Postgres, policy: CompiledPolicy, ws: Path, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    ledger = _ledger(own_pg, tmp_path, spool, spool_max=4000)
    gw = Gateway(policy, ledger)
    try:
        own_pg.stop("immediate")
        outs = [_run(gw, f"echo {n} > f{n}.txt") for n in range(8)]
        ran = [o for o in outs if o["status"] == "ok"]
        refused = [o for o in outs if o["status"] != "ok"]
        assert ran and refused, outs
        error = refused[0]["error"]
        assert isinstance(error, dict) and error["code"] == "AUDIT_UNAVAILABLE", error
        assert f"the spool {spool}" in error["message"] and "bound of 4000 bytes" in error["message"], error
        assert ledger.spool is not None and ledger.spool.path.stat().st_size <= 4000
        for n in range(8):  # exactly the calls that were recorded ran
            assert (ws / f"f{n}.txt").exists() == (outs[n]["status"] == "ok")
        own_pg.start()
        assert _gone(ledger.spool.path)
        assert _run(gw, "echo after > after.txt")["status"] == "ok"
    finally:
        gw.close()
        ledger.close()
    assert _commands(own_pg) == [f"echo {n} > f{n}.txt" for n in range(len(ran))] + ["echo after > after.txt"]


def test_without_a_spool_the_call_is_refused(
    own_pg: Postgres, policy: CompiledPolicy, ws: Path, tmp_path: Path
) -> None:
    ledger = _ledger(own_pg, tmp_path, None)
    gw = Gateway(policy, ledger)
    try:
        own_pg.stop("immediate")
        out = _run(gw, "echo x > x.txt")
        assert out["status"] == "denied" and "is unavailable" in str(out["error"]), out
        assert not (ws / "x.txt").exists()
        assert not list(tmp_path.rglob("*.spool"))
    finally:
        gw.close()
        ledger.close()


def _edit(path: Path, how: str) -> None:
    lines = path.read_text().splitlines()
    if how == "cut":  # the last batch taken away (the records of a call that ran)
        lines = lines[:-1]
    else:
        at = next(i for i, line in enumerate(lines) if "echo two" in line)
        if how == "edited":
            lines[at] = lines[at].replace("echo two", "echo harmless")
        else:  # a careful forger: the hash recomputed (the next link, or the signature, tells)
            record = json.loads(lines[at])
            record["arguments"]["command"] = "echo harmless"
            record["hash"] = digest(record)
            lines[at] = canonical(record)
    path.write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize("how", ["edited", "rehashed", "cut"])
def test_a_spool_edited_while_the_store_is_away_is_refused_not_inserted(
    own_pg: Postgres, policy: CompiledPolicy, ws: Path, tmp_path: Path, how: str
) -> None:
    spool = tmp_path / "spool"
    ledger = _ledger(own_pg, tmp_path, spool)
    gw = Gateway(policy, ledger)
    try:
        assert _run(gw, "echo one > one.txt")["status"] == "ok"
        own_pg.stop("immediate")
        assert _run(gw, "echo two > two.txt")["status"] == "ok"
        assert _run(gw, "echo three > three.txt")["status"] == "ok"
        assert ledger.spool is not None
        _edit(ledger.spool.path, how)
        own_pg.start()
        deadline = time.monotonic() + 120
        while ledger._broken is None and time.monotonic() < deadline:
            time.sleep(0.1)
        out = _run(gw, "echo four > four.txt")
        assert out["status"] == "denied", out
        message = str(out["error"])
        assert f"the spool {ledger.spool.path}" in message and "nothing of it was inserted" in message, message
        assert not (ws / "four.txt").exists()
        assert ledger.spool.path.exists()  # kept, for whoever investigates
    finally:
        gw.close()
        ledger.close()
    assert _commands(own_pg) == ["echo one > one.txt"]  # nothing of the spool went in


def test_a_spool_left_by_an_earlier_gateway_is_forwarded_before_the_next_one_starts(
    own_pg: Postgres, policy: CompiledPolicy, ws: Path, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    first = _ledger(own_pg, tmp_path, spool)
    gw = Gateway(policy, first)
    try:
        assert _run(gw, "echo one > one.txt")["status"] == "ok"
        own_pg.stop("immediate")
        assert _run(gw, "echo two > two.txt")["status"] == "ok"
    finally:
        gw.close()
        first.close()  # gone, its spool left behind
    assert first.spool is not None and first.spool.path.exists()
    own_pg.start()
    second = _ledger(own_pg, tmp_path, spool)
    try:
        assert not first.spool.path.exists()
        gw = Gateway(policy, second)
        assert _run(gw, "echo three > three.txt")["status"] == "ok"
        gw.close()
    finally:
        second.close()
    assert _commands(own_pg) == ["echo one > one.txt", "echo two > two.txt", "echo three > three.txt"]


def test_a_large_spool_on_a_slow_store_is_forwarded_though_it_takes_longer_than_the_commit_bound(
    own_pg: Postgres, tmp_path: Path
) -> None:
    """The commit bound is for a store that stops answering, not for one that answers slowly:
    a spool of 5,000 records forwarded to a store that takes 0.3 s for each statement needs
    about 3 s, twice the 1.5 s bound. Bounded as a whole, that forward was cut every time, and
    the spool (the gateway's start with it) never got through; bounded per answer, it lands."""
    spool = tmp_path / "spool"
    first = _ledger(own_pg, tmp_path, spool, spool_max=64 << 20)
    try:
        own_pg.stop("immediate")
        for n in range(5000):
            first.append("decision", call_id=f"c{n}", principal="agent", decision="allow", rule="r",
                         arguments={"command": f"echo {n}"})  # fmt: skip
    finally:
        first.close()  # gone, its spool left behind
    assert first.spool is not None and first.spool.path.exists()
    own_pg.start()
    with db.Store(own_pg.dsn()) as store, store.connection() as conn:  # a slow store: every statement waits
        conn.execute("CREATE FUNCTION agw.slow() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$")  # fmt: skip
        conn.execute("CREATE TRIGGER slow BEFORE INSERT ON agw.record FOR EACH STATEMENT EXECUTE FUNCTION agw.slow()")
    started = time.monotonic()
    second = _ledger(own_pg, tmp_path, spool, commit_timeout=1.5)
    took = time.monotonic() - started
    second.close()
    assert not first.spool.path.exists()
    assert took > 1.5  # what the old bound cut: the forward as a whole took longer than it
    with db.Store(own_pg.dsn()) as store:
        checked = verify_store(store)
        assert checked.ok, checked.lines()
        with store.connection() as conn:
            (count,) = conn.execute(
                "SELECT count(*) FROM agw.record WHERE body::jsonb ->> 'event' = 'decision'").fetchone()  # fmt: skip
    assert count == 5000
