"""The pins of upstream tool definitions (gateway/upstream/pins.py): first sight, drift, accepting
it bound to what was seen, and nothing changed when the record cannot be written."""

from __future__ import annotations

import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditUnavailable
from gateway.upstream.pins import PinError, PinStore, definition, fingerprint

TOOL = {"name": "create_issue", "description": "Open an issue.", "inputSchema": {"type": "object"},
        "annotations": {"readOnlyHint": False}, "_meta": {"ignored": 1}, "icons": []}  # fmt: skip


class Ledger:
    def __init__(self, fail: bool = False) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if self.fail:
            raise AuditUnavailable("disk full")
        self.records.append((event, data))


def listing(**descriptions: str) -> dict[str, dict[str, Any]]:
    return {n: definition({**TOOL, "name": n, "description": d}) for n, d in descriptions.items()}


def test_what_is_pinned_is_what_the_agent_sees_of_a_tool() -> None:
    assert definition(TOOL) == {k: TOOL[k] for k in ("name", "description", "inputSchema", "annotations")}
    moved = definition({**TOOL, "annotations": {"readOnlyHint": True}})
    assert fingerprint(moved) != fingerprint(definition(TOOL))
    assert fingerprint(definition({**TOOL, "_meta": {"other": 2}})) == fingerprint(definition(TOOL))


def test_first_sight_pins_everything_then_drift_is_pending_until_accepted(tmp_path: Path) -> None:
    pins, ledger = PinStore(tmp_path), Ledger()
    first = pins.observe("gh", listing(a="A", b="B"), ledger)
    assert first.first_sight and set(first.pinned) == {"a", "b"}
    assert stat.S_IMODE(pins.path.stat().st_mode) == 0o600
    again = pins.observe("gh", listing(a="A", b="B"), ledger)
    assert not again.drift and len(ledger.records) == 1  # nothing new: nothing recorded
    changed = pins.observe("gh", listing(a="A, and now something else", b="B", c="C"), ledger)
    assert [(d.tool, d.kind) for d in changed.drift] == [("a", "changed"), ("c", "new")]
    assert [e for e, _ in ledger.records] == ["upstream_pinned", "upstream_drift", "upstream_drift"]
    pins.observe("gh", listing(a="A, and now something else", b="B", c="C"), ledger)
    assert len(ledger.records) == 3  # the same drift is recorded once
    (a,) = [d for d in pins.drifts("gh") if d.tool == "a"]
    assert '+  "description": "A, and now something else"' in a.to_json()["diff"]
    with pytest.raises(PinError, match="changed since you looked"):
        pins.accept("gh", "a", "0" * 16, "alice", ledger)
    pins.accept("gh", "a", a.seen_sha256[:12], "alice", ledger)
    assert pins.pinned_sha256("gh", "a") == a.seen_sha256 and ledger.records[-1][0] == "upstream_accepted"
    assert [d.tool for d in pins.drifts()] == ["c"]


def test_drift_that_goes_away_is_no_longer_pending(tmp_path: Path) -> None:
    pins, ledger = PinStore(tmp_path), Ledger()
    pins.observe("gh", listing(a="A"), ledger)
    pins.observe("gh", listing(a="rug pulled"), ledger)
    assert [d.tool for d in pins.drifts()] == ["a"]
    pins.observe("gh", listing(a="A"), ledger)
    assert pins.drifts() == [] and pins.pinned_sha256("gh", "a") == fingerprint(listing(a="A")["a"])


def test_nothing_is_pinned_or_accepted_when_it_cannot_be_recorded(tmp_path: Path) -> None:
    pins = PinStore(tmp_path)
    with pytest.raises(AuditUnavailable):
        pins.observe("gh", listing(a="A"), Ledger(fail=True))
    assert pins.pinned_sha256("gh", "a") is None and not pins.path.exists()
    pins.observe("gh", listing(a="A"), Ledger())
    pins.observe("gh", listing(a="B"), Ledger())
    (d,) = pins.drifts()
    with pytest.raises(AuditUnavailable):
        pins.accept("gh", "a", d.seen_sha256, "alice", Ledger(fail=True))
    assert pins.pinned_sha256("gh", "a") == fingerprint(listing(a="A")["a"]) and pins.drifts() != []


def test_a_store_sees_what_another_process_changed(tmp_path: Path) -> None:
    server, cli = PinStore(tmp_path), PinStore(tmp_path)
    server.observe("gh", listing(a="A"), Ledger())
    server.observe("gh", listing(a="B"), Ledger())
    (d,) = cli.drifts()
    cli.accept("gh", "a", d.seen_sha256, "root", Ledger())
    assert server.pinned_sha256("gh", "a") == d.seen_sha256 and server.drifts() == []


def test_concurrent_acceptances_pin_once(tmp_path: Path) -> None:
    PinStore(tmp_path).observe("gh", listing(a="A"), Ledger())
    PinStore(tmp_path).observe("gh", listing(a="B"), Ledger())
    (d,) = PinStore(tmp_path).drifts()
    ledger, outcomes = Ledger(), []

    def accept() -> None:
        try:
            PinStore(tmp_path).accept("gh", "a", d.seen_sha256, "x", ledger)
            outcomes.append("ok")
        except PinError:
            outcomes.append("refused")

    threads = [threading.Thread(target=accept) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok"] + ["refused"] * 7 and len(ledger.records) == 1


def test_a_corrupt_pins_file_is_an_error_not_an_empty_store(tmp_path: Path) -> None:
    pins = PinStore(tmp_path)
    pins.path.write_text("{not json")
    with pytest.raises(PinError, match="not JSON"):
        pins.pinned_sha256("gh", "a")


def test_a_server_changing_everything_at_once_does_not_flood_the_ledger(tmp_path: Path) -> None:
    pins, ledger = PinStore(tmp_path), Ledger()
    pins.observe("gh", listing(**{f"t{i}": "A" for i in range(100)}), ledger)
    pins.observe("gh", listing(**{f"t{i}": "rug pulled" for i in range(100)}), ledger)
    drift = [d for e, d in ledger.records if e == "upstream_drift"]
    assert len(drift) == 21 and drift[-1]["more"] == 80  # 20 one by one, then one for the rest
    assert len(pins.drifts()) == 100  # every one of them is blocked all the same
