"""The ledger in numbers and in words (issue 27): the overview's counts (gateway/audit/overview.py)
over a ledger whose counts are known, spread over hours; a call's story (calls.story); the
console's call index (one fold shared with `gateway audit calls`) reading only what was appended."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.audit import canonical, digest
from gateway.audit.calls import Folder, story
from gateway.audit.overview import overview
from gateway.audit.selection import Selection
from gateway.server.console.auditview import CallIndex

T0 = datetime(2026, 11, 25, 8, 0, tzinfo=UTC)


class Ledger:
    """Records written as the writer writes them (canonical lines, a hash chain), at given times."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "audit-000001.jsonl"
        self.prev, self.seq = "", 0

    def add(self, at: datetime, event: str, **fields: Any) -> None:
        self.seq += 1
        record = {**fields, "event": event, "seq": self.seq, "ts": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                  "prev": self.prev}  # fmt: skip
        record["hash"] = self.prev = digest(record)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(canonical(record) + "\n")

    def call(self, n: int, at: datetime, principal: str, command: str, decision: str, rule: str,
             answer: tuple[bool, float, str] | None = None) -> None:  # fmt: skip
        """One call: its decision; an ask's answer (approved, seconds waited, how); a result if it ran."""
        base = {"call_id": f"c{n:05d}", "principal": principal, "tool": "run"}
        self.add(at, "decision", **base, arguments={"command": command}, decision=decision, rule=rule,
                 reasons=[{"stage": "permissions", "code": "rule", "message": f"{rule} says {decision}"}])  # fmt: skip
        ran = decision == "allow"
        if answer is not None:
            approved, waited, how = answer
            at += timedelta(seconds=waited)
            self.add(at, "approval", **base, decision="allow" if approved else "deny", rule=rule,
                     data={"answered": how != "timeout", "by": "alice", "how": how})  # fmt: skip
            ran = approved
        if ran:
            self.add(at + timedelta(milliseconds=30), "result", **base,
                     data={"status": "ok", "exit_code": 0, "duration_ms": 30, "stdout_bytes": 12})  # fmt: skip


def known(ledger: Ledger) -> None:
    """08:xx: 3 allowed, 1 denied; 09:xx: 2 asks (approved after 5 s, denied after 40 s), 1 ask
    timed out (after 120 s); 11:xx: 2 denied (the same command), 1 allowed for `bot`."""
    n = 0

    def call(at: datetime, *args: Any, **kw: Any) -> None:
        nonlocal n
        n += 1
        ledger.call(n, at, *args, **kw)

    for k in range(3):
        call(T0 + timedelta(minutes=k), "agent", "ls", "allow", "basics")
    call(T0 + timedelta(minutes=10), "agent", "curl x", "deny", "no-curl")
    call(T0 + timedelta(hours=1), "agent", "rm a", "ask", "rm", answer=(True, 5, "queue"))
    call(T0 + timedelta(hours=1, minutes=5), "agent", "rm b", "ask", "rm", answer=(False, 40, "queue"))
    call(T0 + timedelta(hours=1, minutes=9), "agent", "rm c", "ask", "rm", answer=(False, 120, "timeout"))
    call(T0 + timedelta(hours=3), "bot", "curl y", "deny", "no-curl")
    call(T0 + timedelta(hours=3, minutes=1), "bot", "curl y", "deny", "no-curl")
    call(T0 + timedelta(hours=3, minutes=2), "bot", "ls", "allow", "basics")


def test_the_overview_counts_a_known_ledger_by_hour_rule_command_wait_and_principal(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "audit")
    known(ledger)
    index = CallIndex(tmp_path / "audit")
    o = overview(index.all_calls(), T0, T0 + timedelta(hours=4))
    assert o["calls"] == 10 and o["bucket"] == "hour"
    bars = {b["at"]: (b["allow"], b["ask"], b["deny"], b["other"]) for b in o["per_bucket"]}
    assert bars == {"2026-11-25T08": (3, 0, 1, 0), "2026-11-25T09": (0, 3, 0, 0), "2026-11-25T10": (0, 0, 0, 0),
                    "2026-11-25T11": (1, 0, 2, 0)}  # fmt: skip
    # denied: the policy's 3 (no-curl), and the supervisor's denial and the timeout (rm)
    assert o["denied"]["count"] == 5
    assert o["denied"]["rules"]["top"] == [{"name": "no-curl", "count": 3}, {"name": "rm", "count": 2}]
    commands = {r["name"]: r["count"] for r in o["denied"]["commands"]["top"]}
    assert commands == {"curl y": 2, "curl x": 1, "rm b": 1, "rm c": 1}
    w = o["waits"]
    assert (w["answered"], w["timed_out"], w["waiting"], w["withdrawn"]) == (2, 1, 0, 0)
    assert (w["median_ms"], w["max_ms"]) == (40_000, 40_000)
    assert {b["label"]: b["count"] for b in w["buckets"] if b["count"]} == {"under 10 s": 1, "30-60 s": 1}
    assert [(p["principal"], p["allow"], p["ask"], p["deny"], p["calls"]) for p in o["principals"]] == [
        ("agent", 3, 3, 1, 7), ("bot", 1, 0, 2, 3)]  # fmt: skip
    # a range counts only the calls that began in it, half-open; a long range is drawn by day
    assert overview(index.all_calls(), T0 + timedelta(hours=1), T0 + timedelta(hours=3))["calls"] == 3
    by_day = overview(index.all_calls(), T0 - timedelta(days=5), T0 + timedelta(days=1))
    assert by_day["bucket"] == "day" and len(by_day["per_bucket"]) == 7 and by_day["calls"] == 10
    assert next(b for b in by_day["per_bucket"] if b["at"] == "2026-11-25")["deny"] == 3


def test_a_calls_story_reads_in_order_and_names_who_answered(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "audit")
    known(ledger)
    rows = [r for r in CallIndex(tmp_path / "audit").call("c00005")["records"]]  # type: ignore[index]
    steps = story(rows)
    assert [s["step"] for s in steps] == ["decided", "asked", "answered", "ran", "ended"]
    assert steps[0]["text"] == "ask by rule rm: rm a (why: rm says ask)"
    assert steps[2]["text"] == "approved by alice (from the approvals queue); waited 5.0 s"
    assert steps[4]["text"] == "ok, exit 0 (12 B stdout)"
    timeout = story(CallIndex(tmp_path / "audit").call("c00007")["records"])  # type: ignore[index]
    assert timeout[-1]["text"] == "denied, unanswered (nobody answered in time); waited 120.0 s"


def test_the_console_folds_the_calls_as_the_cli_does_and_reads_only_what_was_appended(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "audit")
    known(ledger)
    index = CallIndex(tmp_path / "audit")
    index.refresh()
    first = index.reads
    assert first == ledger.path.stat().st_size
    index.refresh()
    assert index.reads == first  # nothing appended: nothing read
    ledger.call(99, T0 + timedelta(hours=5), "agent", "pwd", "allow", "basics")
    index.refresh()
    assert index.reads == ledger.path.stat().st_size  # the new lines only
    # the same rows `gateway audit calls` folds (one module: gateway/audit/calls.py)
    folder = Folder()
    with ledger.path.open("rb") as f:
        for line in f:
            folder.add(json.loads(line))
    assert [c.to_json() for c in folder.calls.values()] == [c.to_json() for c in index.all_calls()]
    # a line being written is taken once it is whole
    with ledger.path.open("a") as f:
        f.write('{"call_id":"c77777","event":"decision"')
    index.refresh()
    assert "c77777" not in {c.call_id for c in index.all_calls()}
    with ledger.path.open("a") as f:
        f.write(',"principal":"agent","seq":999,"ts":"2026-11-25T14:00:00.000000Z"}\n')
    assert "c77777" in {c.call_id for c in index.all_calls()}
    # a filter on the calls: the text is looked for in every record of a call
    chosen = Selection.of(text="RM B")
    found = index.calls(chosen, 50, None, index.text_calls(chosen))
    assert [c.command for c in found["calls"]] == ["rm b"], found
    denied = index.calls(Selection.of(decision="deny"), 50, None, None)
    assert {c.call_id for c in denied["calls"]} == {"c00004", "c00006", "c00007", "c00008", "c00009"}


def test_the_inbox_never_waits_for_a_fold_under_way(tmp_path: Path) -> None:
    """The card of a waiting call takes its decision record from the fold, but a fold under way
    (a large log's first one takes seconds) never holds the inbox up: the card is made without
    the record, and made again once the fold has it."""
    ledger = Ledger(tmp_path / "audit")
    known(ledger)
    ledger.call(50, T0 + timedelta(hours=4), "agent", "rm z", "ask", "rm")  # asked, not answered yet
    index = CallIndex(tmp_path / "audit")
    with index._lock:  # a fold under way on another thread
        assert index.ask("c00050") is None
    waiting = index.ask("c00050")
    assert waiting is not None and waiting["arguments"] == {"command": "rm z"}
    assert index.ask("c00005") is None  # answered: its record is not kept


def test_the_console_keeps_the_newest_calls_and_says_how_many_it_let_go(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "audit")
    known(ledger)
    index = CallIndex(tmp_path / "audit", max_calls=4)
    kept = [c.call_id for c in index.all_calls()]
    assert kept == ["c00007", "c00008", "c00009", "c00010"] and index.dropped == 6
    assert index.calls(Selection(), 50, None, None)["dropped"] == 6
