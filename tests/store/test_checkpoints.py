"""The sequencer's signed checkpoints: folded by whichever gateway holds the advisory lock,
chained and signed; `audit verify --store` then finds a stream cut short after a checkpoint saw
it (even the newest stream of a host, which no later stream names), an edited or forged
checkpoint, and (given a checkpoint the reviewer kept) a rolled-back one."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from gateway.audit.keys import SigningKey
from gateway.store import db, sequencer
from gateway.store.ledger import StoreLedger, verify_store
from tests.conftest import eventually
from tests.store.test_ledger import as_attacker, gateway, rows, run, setup, verify, ws

__all__ = ["setup", "ws"]


def fold(dsn: str, keys: Path) -> dict[str, object] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sequencer.fold(conn, SigningKey.load_or_create(keys))


def test_a_stream_cut_short_after_a_checkpoint_is_found(dsn: str, setup: dict[str, str]) -> None:
    assert run(setup, dsn, "echo one").returncode == 0
    cp = fold(dsn, Path(setup["--audit-keys"]))
    assert cp is not None and cp["n"] == 1 and cp["records"] == 4
    assert fold(dsn, Path(setup["--audit-keys"])) is None  # nothing new: no checkpoint
    assert verify(dsn, setup).returncode == 0
    stream = rows(dsn)[0][0]
    as_attacker(dsn, ("DELETE FROM agw.record WHERE stream = %s AND seq >= 3", (stream,)))
    checked = verify(dsn, setup)
    assert checked.returncode == 1
    assert f"stream {stream}: checkpoint 1 saw it at seq 4, and that record is not there" in checked.stdout
    # and the sequencer does not sign over it
    with pytest.raises(sequencer.CheckpointConflict, match="checkpoint 1 saw streams the ledger no longer holds"):
        fold(dsn, Path(setup["--audit-keys"]))


def test_checkpoints_chain_and_a_rolled_back_one_is_found(dsn: str, setup: dict[str, str], tmp_path: Path) -> None:
    keys = Path(setup["--audit-keys"])
    assert run(setup, dsn, "echo one").returncode == 0
    fold(dsn, keys)
    assert run(setup, dsn, "echo two").returncode == 0
    fold(dsn, keys)
    kept = gateway("store", "checkpoint", "--store", dsn)
    assert kept.returncode == 0 and '"n":2' in kept.stdout
    (tmp_path / "cp.json").write_text(kept.stdout)
    pub = str(keys / "signing.pub")
    ok = gateway("audit", "verify", "--store", dsn, "--key", pub, "--checkpoint", str(tmp_path / "cp.json"))
    assert ok.returncode == 0, ok.stdout
    assert "2 checkpoints" in ok.stdout
    as_attacker(dsn, ("DELETE FROM agw.checkpoint WHERE n = 2", ()))
    gone = gateway("audit", "verify", "--store", dsn, "--key", pub, "--checkpoint", str(tmp_path / "cp.json"))
    assert gone.returncode == 1
    assert "checkpoint 2 you kept is not in the store (rolled back)" in gone.stdout


@pytest.mark.parametrize(
    ("sql", "found"),
    [
        ("UPDATE agw.checkpoint SET body = replace(body, '\"records\":4', '\"records\":3') WHERE n = 1",
         "checkpoint 1: does not match its hash (edited)"),
        ("DELETE FROM agw.checkpoint WHERE n = 1", "checkpoints 1..1 are missing"),
    ],
)  # fmt: skip
def test_an_edited_or_removed_checkpoint_is_found(dsn: str, setup: dict[str, str], sql: str, found: str) -> None:
    keys = Path(setup["--audit-keys"])
    assert run(setup, dsn, "echo one").returncode == 0
    fold(dsn, keys)
    assert run(setup, dsn, "echo two").returncode == 0
    fold(dsn, keys)
    as_attacker(dsn, (sql, ()))
    checked = verify(dsn, setup)
    assert checked.returncode == 1
    assert found in checked.stdout


def test_a_checkpoint_signed_by_another_key_is_refused(dsn: str, setup: dict[str, str], tmp_path: Path) -> None:
    assert run(setup, dsn, "true").returncode == 0
    fold(dsn, tmp_path / "sequencer-of-someone-else")
    checked = verify(dsn, setup)
    assert checked.returncode == 1
    assert "checkpoint 1: signed with a key you did not pin" in checked.stdout


def test_one_gateway_sequences_and_another_takes_over(dsn: str, tmp_path: Path) -> None:
    key = SigningKey.load_or_create(tmp_path / "keys")
    ledgers = [StoreLedger(db.Store(dsn), tmp_path / f"a{i}", key=key, sequence=True) for i in range(2)]
    try:
        for led in ledgers:
            led.append("note", data={"hello": led.stream})
        seqs = [led.sequencer for led in ledgers]
        assert all(seqs)
        assert eventually(lambda: sum(bool(s and s.leading) for s in seqs) == 1)
        leader = next(s for s in seqs if s and s.leading)
        other = next(s for s in seqs if s is not leader)

        def covered() -> bool:
            with psycopg.connect(dsn) as conn:
                newest = sequencer.latest(conn)
            return newest is not None and set(newest["heads"]) == {led.stream for led in ledgers}

        assert eventually(covered)
        assert leader is not None and other is not None
        leader.stop()  # its connection closes: the lock goes with it
        assert eventually(lambda: other.leading)
        ledgers[1].append("note", data={"after": "takeover"})

        def moved() -> bool:
            with psycopg.connect(dsn) as conn:
                newest = sequencer.latest(conn)
            return newest is not None and newest["heads"][ledgers[1].stream][0] == 3

        assert eventually(moved)
    finally:
        for led in ledgers:
            led.close()
    store = db.Store(dsn)
    try:
        checked = verify_store(store)
        assert checked.ok and checked.checkpoints >= 2, checked.lines()
    finally:
        store.close()
