"""The reviewer's CLI (`gateway audit tail|show|query|calls`) through the real command: time
ranges in every form, every filter, every format, and exit codes a script can use.

The log is written record by record with times the test chooses (`write_log`: the writer's
canonical lines, chained), so each time form has records on both sides of its bound; the
calls view also reads a log a real gateway wrote (decision, approval, result)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.approval import CallbackApprover
from gateway.audit import AuditLog, canonical, digest
from gateway.audit.timespec import TimeSpecError, key, parse
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy
from tests.conftest import eventually


def cli(audit: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "audit", *args, "--audit-dir", str(audit)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_STATE_HOME": str(audit.parent / "state")},
    )


def write_log(directory: Path, records: list[dict[str, Any]]) -> None:
    """The records as the writer would have written them (seq, prev, hash), at their `ts`."""
    directory.mkdir(parents=True, exist_ok=True)
    prev, lines = "", []
    for seq, fields in enumerate(records, 1):
        record = {**fields, "seq": seq, "prev": prev}
        record["hash"] = digest(record)
        prev = record["hash"]
        lines.append(canonical(record) + "\n")
    (directory / "audit-000001.jsonl").write_text("".join(lines), encoding="utf-8")


def at(when: datetime) -> str:
    return key(when)


def decision(ts: datetime, call: str, command: str, verdict: str, rule: str | None, **more: Any) -> dict[str, Any]:
    return {"ts": at(ts), "event": "decision", "call_id": call, "principal": more.pop("principal", "agent"),
            "tool": more.pop("tool", "run"), "decision": verdict, "rule": rule, "arguments": {"command": command},
            "data": {"commands": [{"argv": command.split(), "redirects": []}]}, **more}  # fmt: skip


@dataclass(frozen=True)
class Clock:
    """The times a test's records and bounds are made from, taken when the test starts (the CLI
    runs seconds later, not minutes: a suite's start is no good for `2h`)."""

    now: datetime
    today: datetime
    yesterday: datetime

    @classmethod
    def read(cls) -> Clock:
        now = datetime.now(UTC)
        today = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return cls(now, today, today - timedelta(days=1))

    def records(self) -> list[tuple[str, datetime]]:
        """Records on both sides of every bound the tests use (`name`: each one's call id)."""
        return [
            ("before-yesterday", self.yesterday - timedelta(hours=12)),
            ("yesterday-noon", self.yesterday + timedelta(hours=12)),
            ("today-start", self.today + timedelta(seconds=1)),
            ("three-hours-ago", self.now - timedelta(hours=3)),
            ("an-hour-ago", self.now - timedelta(hours=1)),
        ]

    def expected(self, since: datetime | None, until: datetime | None) -> set[str]:
        return {n for n, w in self.records() if (since is None or w >= since) and (until is None or w < until)}


@pytest.fixture
def clock() -> Clock:
    return Clock.read()


@pytest.fixture
def timed(tmp_path: Path, clock: Clock) -> Path:
    audit = tmp_path / "audit"
    ordered = sorted(clock.records(), key=lambda t: t[1])
    write_log(audit, [decision(when, name, f"echo {name}", "allow", "echo") for name, when in ordered])
    return audit


def ids(out: str) -> set[str]:
    return {json.loads(line)["call_id"] for line in out.splitlines() if line.strip()}


# --- the two that silently failed -----------------------------------------------------------
@pytest.mark.parametrize("verb", ["query", "tail", "calls"])
def test_until_bounds_every_reading_verb(timed: Path, clock: Clock, verb: str) -> None:
    out = cli(timed, verb, "--until", at(clock.today), "--json")
    assert out.returncode == 0, out.stderr
    assert ids(out.stdout) == clock.expected(None, clock.today)
    assert {"before-yesterday", "yesterday-noon"} <= ids(out.stdout) and "today-start" not in ids(out.stdout)


def test_since_yesterday_is_yesterday_on(timed: Path, clock: Clock) -> None:
    out = cli(timed, "query", "--since", "yesterday", "--json")
    assert out.returncode == 0, out.stderr
    assert ids(out.stdout) == clock.expected(clock.yesterday, None)
    assert "yesterday-noon" in ids(out.stdout) and "before-yesterday" not in ids(out.stdout)


def test_show_takes_the_range_too(timed: Path) -> None:
    assert ids(cli(timed, "show", "yesterday-noon", "--json").stdout) == {"yesterday-noon"}
    out = cli(timed, "show", "yesterday-noon", "--since", "today", "--json")
    assert (out.returncode, out.stdout) == (1, "")
    assert "no records for call yesterday-noon" in out.stderr


# --- every time form -----------------------------------------------------------------------
Bound = Callable[[Clock], Any]
H, M = timedelta(hours=1), timedelta(minutes=1)


@pytest.mark.parametrize(
    ("since", "until", "lower", "upper"),
    [
        # (what is typed, from the clock), (the bound it means)
        (lambda c: "yesterday", lambda c: "today", lambda c: c.yesterday, lambda c: c.today),
        (lambda c: "2h", None, lambda c: c.now - 2 * H, None),
        (lambda c: "2h ago", None, lambda c: c.now - 2 * H, None),
        (lambda c: "90m", None, lambda c: c.now - 90 * M, None),
        (lambda c: "1h30m", None, lambda c: c.now - 90 * M, None),
        (lambda c: "4h", lambda c: "2h", lambda c: c.now - 4 * H, lambda c: c.now - 2 * H),
        (None, lambda c: "2d", None, lambda c: c.now - 48 * H),
        (lambda c: f"{c.yesterday:%Y-%m-%d}", lambda c: f"{c.today:%Y-%m-%d}", lambda c: c.yesterday,
         lambda c: c.today),
        (lambda c: f"{c.yesterday + 11 * H:%Y-%m-%dT%H:%M}", None, lambda c: c.yesterday + 11 * H, None),
        (lambda c: f"{c.yesterday + 13 * H:%Y-%m-%dT%H:%M:%SZ}", None, lambda c: c.yesterday + 13 * H, None),
        # another zone: 13:00 at +02:00 is 11:00 UTC, before yesterday's noon record
        (lambda c: f"{c.yesterday + 13 * H:%Y-%m-%dT%H:%M}+02:00", None, lambda c: c.yesterday + 11 * H, None),
    ],
)  # fmt: skip
def test_every_time_form(
    timed: Path, clock: Clock, since: Bound | None, until: Bound | None, lower: Bound | None, upper: Bound | None
) -> None:
    args = [*(["--since", since(clock)] if since else []), *(["--until", until(clock)] if until else [])]
    out = cli(timed, "query", *args, "--json")
    assert out.returncode in (0, 1), out.stderr
    assert ids(out.stdout) == clock.expected(lower(clock) if lower else None, upper(clock) if upper else None)


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("now", datetime(2026, 11, 25, 10, 30, tzinfo=UTC)),
        ("today", datetime(2026, 11, 25, tzinfo=UTC)),
        ("yesterday", datetime(2026, 11, 24, tzinfo=UTC)),
        ("2h", datetime(2026, 11, 25, 8, 30, tzinfo=UTC)),
        ("30m", datetime(2026, 11, 25, 10, 0, tzinfo=UTC)),
        ("1w", datetime(2026, 11, 18, 10, 30, tzinfo=UTC)),
        ("2026-11-20", datetime(2026, 11, 20, tzinfo=UTC)),
        ("2026-11-20T09:15", datetime(2026, 11, 20, 9, 15, tzinfo=UTC)),
        ("2026-11-20 09:15:30.5Z", datetime(2026, 11, 20, 9, 15, 30, 500000, tzinfo=UTC)),
        ("2026-11-20T09:15-05:00", datetime(2026, 11, 20, 14, 15, tzinfo=UTC)),
    ],
)
def test_time_forms_at_a_fixed_now(text: str, when: datetime) -> None:
    assert parse(text, now=datetime(2026, 11, 25, 10, 30, tzinfo=UTC)) == when


@pytest.mark.parametrize("bad", ["tomorrow", "2x", "h2", "-2h", "2026-13-01", "10:00", ""])
def test_a_time_it_cannot_read_is_a_usage_error_naming_the_option(timed: Path, bad: str) -> None:
    with pytest.raises(TimeSpecError):
        parse(bad, "--until")
    if bad:
        out = cli(timed, "calls", f"--until={bad}")
        assert out.returncode == 2 and out.stdout == ""
        assert f"--until {bad!r}: expected an ISO 8601 time" in out.stderr


# --- every filter --------------------------------------------------------------------------
@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    audit = tmp_path / "audit"
    t = datetime.now(UTC) - timedelta(minutes=30)
    s = timedelta(seconds=1)
    write_log(audit, [
        {"ts": at(t), "event": "server_started", "data": {"transport": "http", "host": "127.0.0.1", "port": 8765}},
        decision(t + s, "c-git", "git status", "allow", "git-read"),
        {"ts": at(t + 2 * s), "event": "result", "call_id": "c-git", "principal": "agent", "tool": "run",
         "data": {"status": "ok", "exit_code": 0, "duration_ms": 12, "stdout_bytes": 30, "stderr_bytes": 2}},
        decision(t + 3 * s, "c-rm", "rm -rf build", "ask", "rm", principal="bob"),
        {"ts": at(t + 4 * s), "event": "approval", "call_id": "c-rm", "principal": "bob", "tool": "run",
         "decision": "deny", "rule": "rm", "data": {"answered": True, "by": "alice", "how": "queue",
                                                   "reason": "keep the build"}},
        decision(t + 5 * s, "c-quote", 'echo "quoted" \\ back', "deny", "no-echo"),
        decision(t + 6 * s, "c-write", "session write", "allow", "sessions", tool="session"),
        decision(t + 7 * s, "c-line", "ls", "allow", "ls", tool="session", parent="c-write"),
        {"ts": at(t + 8 * s), "event": "egress", "principal": "agent", "tool": "run",
         "data": {"host": "pypi.org", "allowed": True}},
    ])  # fmt: skip
    return audit


def seqs(out: str) -> list[int]:
    return [json.loads(line)["seq"] for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("args", "want"),
    [
        # events, one or several (repeated or comma-separated)
        (["--event", "result"], [3]),
        (["--event", "approval", "--event", "server_started"], [1, 5]),
        (["--event", "approval,result"], [3, 5]),
        # a call, and the parts it carried (their records name it as `parent`)
        (["--call", "c-rm"], [4, 5]),
        (["--call", "c-write"], [7, 8]),
        # who, what, how it was decided, by which rule
        (["--principal", "bob"], [4, 5]),
        (["--tool", "session"], [7, 8]),
        (["--decision", "deny"], [5, 6]),
        (["--rule", "git-read"], [2]),
        # text anywhere in the record, case-insensitive, with characters JSON escapes
        (["--text", "RM -RF"], [4]),
        (["--text", "keep the build"], [5]),
        (["--text", '"quoted" \\'], [6]),
        # a host: a server's listen address, a network host a record is about
        (["--host", "PyPI.org"], [9]),
        (["--host", "127.0.0.1"], [1]),
        # together: every filter must hold
        (["--principal", "bob", "--event", "approval", "--decision", "deny", "--rule", "rm"], [5]),
        (["--principal", "bob", "--tool", "session"], []),
    ],
)
def test_every_filter(mixed: Path, args: list[str], want: list[int]) -> None:
    out = cli(mixed, "query", *args, "--format", "jsonl")
    assert seqs(out.stdout) == want
    assert out.returncode == (0 if want else 1), out.stderr


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--decision", "ask"], ["c-rm"]),  # asked ...
        (["--decision", "deny"], ["c-rm", "c-quote"]),  # ... and denied: by the supervisor, by the policy
        (["--event", "approval"], ["c-rm"]),
        (["--text", "keep the build"], ["c-rm"]),  # in any of its records
        (["--call", "c-write"], ["c-write", "c-line"]),
        (["--principal", "agent", "--tool", "run"], ["c-git", "c-quote"]),
    ],
)
def test_calls_are_filtered_as_calls(mixed: Path, args: list[str], want: list[str]) -> None:
    out = cli(mixed, "calls", *args, "--format", "jsonl")
    assert [json.loads(line)["call_id"] for line in out.stdout.splitlines()] == want, out.stderr


# --- formats -----------------------------------------------------------------------------------
def test_csv_has_a_header_and_one_row_per_record_or_call(mixed: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(cli(mixed, "query", "--format", "csv").stdout)))
    assert [int(r["seq"]) for r in rows] == list(range(1, 10))
    assert rows[5]["what"].startswith('echo "quoted"') and rows[1]["rule"] == "git-read"
    assert rows[0]["hash"] and rows[0]["call_id"] == ""
    calls = list(csv.DictReader(io.StringIO(cli(mixed, "calls", "--format", "csv").stdout)))
    assert [c["call_id"] for c in calls] == ["c-git", "c-rm", "c-quote", "c-write", "c-line"]
    git, rm = calls[0], calls[1]
    assert (git["outcome"], git["exit_code"], git["duration_ms"], git["bytes"]) == ("ok", "0", "12", "32")
    assert (rm["decision"], rm["final"], rm["approved_by"], rm["outcome"]) == ("ask", "deny", "alice", "denied")


def test_ecs_and_ocsf_print_one_event_per_record(mixed: Path) -> None:
    ecs = [json.loads(line) for line in cli(mixed, "query", "--call", "c-git", "--format", "ecs").stdout.splitlines()]
    assert [e["event"]["action"] for e in ecs] == ["decision", "result"]
    assert ecs[0]["process"]["command_line"] == "git status" and ecs[1]["process"]["exit_code"] == 0
    ocsf = [json.loads(line) for line in cli(mixed, "calls", "--call", "c-rm", "--format", "ocsf").stdout.splitlines()]
    assert [(e["class_uid"], e["disposition_id"]) for e in ocsf] == [(1007, 14), (1007, 2)]


def test_text_rows_are_one_line_per_call_and_expand_to_records(mixed: Path) -> None:
    out = cli(mixed, "calls", "--call", "c-rm", "--records").stdout.splitlines()
    assert len(out) == 3
    row = out[0].split()
    assert row[1:6] == ["bob", "run", "ask(rm)->deny", "by", "alice"] and out[0].endswith("rm -rf build")
    assert out[1].lstrip().split()[2] == "decision" and out[2].lstrip().split()[2] == "approval"


# --- exit codes --------------------------------------------------------------------------------
def test_exit_codes(mixed: Path) -> None:
    assert cli(mixed, "query", "--rule", "git-read").returncode == 0
    assert cli(mixed, "query", "--rule", "nothing-like-it").returncode == 1
    assert cli(mixed, "calls", "--principal", "nobody").returncode == 1
    assert cli(mixed, "show", "no-such-call").returncode == 1
    assert cli(mixed, "query", "--since", "soon").returncode == 2
    assert cli(mixed, "tail", "-n", "0").returncode == 0  # nothing asked for, nothing wrong
    with (mixed / "audit-000001.jsonl").open("a") as f:
        f.write("this is not a record\n")
    out = cli(mixed, "query", "--rule", "git-read")
    assert out.returncode == 3 and "1 line(s) of the log are not records" in out.stderr
    assert len(out.stdout.splitlines()) == 1  # what could be read is printed


# --- calls from a real gateway's log --------------------------------------------------------------
def test_calls_fold_a_real_gateways_records(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    audit = tmp_path / "audit"
    gw = Gateway(policy, AuditLog(audit), CallbackApprover(lambda request: True, who="alice"))
    gw.handle(RunCall(principal="agent", command="echo hello; echo oops >&2"))
    gw.handle(RunCall(principal="agent", command="rm -f victim"))
    gw.handle(RunCall(principal="agent", command="curl https://example.com"))
    gw.handle(RunCall(principal="agent", command="python3 -c 'import sys; sys.exit(3)'"))
    calls = [json.loads(line) for line in cli(audit, "calls", "--json").stdout.splitlines()]
    assert [(c["decision"], c["rule"], c["final"], c["outcome"], c["exit_code"]) for c in calls] == [
        ("allow", "anything", "allow", "ok", 0),
        ("ask", "rm", "allow", "ok", 0),
        ("deny", "net", "deny", "denied", None),
        ("allow", "anything", "allow", "ok", 3),
    ]
    hello, rm = calls[0], calls[1]
    assert hello["bytes"] == len("hello\n") + len("oops\n") and hello["duration_ms"] >= 0
    assert hello["events"] == ["decision", "result"] and rm["events"] == ["decision", "approval", "result"]
    assert (rm["approved_by"], rm["approval_how"], rm["command"]) == ("alice", "callback", "rm -f victim")
    assert not (ws / "victim").exists()


def test_tail_follow_prints_new_matching_records_as_they_are_written(tmp_path: Path) -> None:
    audit, out = tmp_path / "audit", tmp_path / "out.jsonl"
    log = AuditLog(audit)
    for n in range(3):
        log.append("result", call_id=f"old{n}", data={"status": "ok"})
    log.append("decision", call_id="d0", decision="allow")
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "audit", "tail", "-f", "-n", "2", "--event", "result", "--json",
             "--audit-dir", str(audit)], stdout=sink, env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "s")},
        )  # fmt: skip
    try:
        assert eventually(lambda: len(out.read_text().splitlines()) == 2)
        log.append("decision", call_id="new", decision="allow")
        log.append("result", call_id="new", data={"status": "ok"})
        assert eventually(lambda: len(out.read_text().splitlines()) == 3)
        assert [json.loads(x)["call_id"] for x in out.read_text().splitlines()] == ["old1", "old2", "new"]
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_call_its_gateway_never_finished_is_interrupted(tmp_path: Path) -> None:
    audit = tmp_path / "audit"
    t = datetime.now(UTC) - timedelta(minutes=5)
    write_log(audit, [
        decision(t, "c-cut", "sleep 100", "allow", "sleep"),
        {"ts": at(t + timedelta(seconds=30)), "event": "interrupted", "call_id": "c-cut", "principal": "agent",
         "tool": "run", "data": {"why": "the gateway that allowed it (pid 7) ended first", "pid": 7}},
    ])  # fmt: skip
    (call,) = [json.loads(line) for line in cli(audit, "calls", "--json").stdout.splitlines()]
    assert (call["outcome"], call["error"], call["closed"]) == ("interrupted", "INTERRUPTED", True)
    assert "ended first" in call["reason"]
    ecs = [json.loads(line) for line in cli(audit, "query", "--format", "ecs").stdout.splitlines()]
    assert (ecs[1]["event"]["type"], ecs[1]["event"]["outcome"]) == (["end"], "unknown")
    ocsf = [json.loads(line) for line in cli(audit, "query", "--format", "ocsf").stdout.splitlines()]
    assert (ocsf[1]["class_uid"], ocsf[1]["activity_id"], ocsf[1]["status_id"]) == (1007, 2, 0)
