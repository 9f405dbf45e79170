"""What-if replay: every recorded command decision of a time range decided again under a draft
policy, and the calls whose decision would change, grouped by rule.

Only the decision stages run (`gateway.decide.evaluate`: parse, tool family, rules, second
opinion, path jail), exactly as `gateway check` runs them: nothing executes, nobody is asked,
nothing is written to the audit log. The call's context comes from its decision record
(`data.context`, written since replay exists: the resolved cwd, the call's variables, the shell,
the workspace, the principal's level and roots); older records fall back to the arguments.

A record that cannot be decided again the same way is counted and named, never skipped in
silence: a tool whose decisions are not command decisions (files, env, ...), a command or
variable the log kept only redacted or summarised, a principal the draft does not define, a
record from before `data.context` with no cwd.

The log is streamed: memory stays bounded by the number of rule pairs and `max_rows`, whatever
the log's size; `max_calls` bounds the work (the rest is counted as not replayed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit import timespec
from gateway.audit.records import REDACTED, records
from gateway.decide import evaluate
from gateway.decision import Decision, Reason, Verdict
from gateway.escaping import escaped
from gateway.policy.compile import CompiledPolicy
from gateway.policy.loader import PolicyError, parse_policy_at
from gateway.policy.schema import Tool
from gateway.policy.selftest import load_checked

MAX_ROWS = 200
"""Changed calls shown (all groups together); every change is counted all the same."""
MAX_CALLS = 100_000
"""Command decisions replayed at most in one run; the rest are counted as not replayed."""
MAX_WORKSPACES = 8
"""Distinct recorded workspaces the draft is loaded for (one load each)."""
EXAMPLES = 5
"""Call ids named per reason a record was not replayed."""

_FAMILY = {"run": Tool.RUN, "session": Tool.SESSION, "process": Tool.PROCESSES}
_REPLAYED = frozenset({"decision", "egress_allowed", "egress_connection", "egress_dns_refused"})
"""Command decisions, and the network's: a connection let through, one the policy refused, a
lookup refused (sandbox/egress/)."""

Redecide = Callable[[CompiledPolicy, str, dict[str, Any], dict[str, Any]], "tuple[Any, str] | str"]
"""(draft, principal, recorded arguments, the decision record) -> (the draft's Decision, what
the call was, shown in the report), or why the record cannot be decided again."""
DECIDERS: dict[str, Redecide] = {}
"""Tool families whose decisions are not command decisions but can be decided again, by tool:
each family registers its own (gateway/upstream/replay.py), so this module names none."""


class ReplayError(Exception):
    """The replay cannot start: the draft does not load (the message names file and line), a
    bad time bound, no audit directory."""


@dataclass(frozen=True)
class ChangedCall:
    call_id: str
    ts: str
    principal: str
    tool: str
    command: str
    cwd: str
    reason: str
    """The draft's first reason (why it decides as it does)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id, "ts": self.ts, "principal": self.principal, "tool": self.tool,
            "command": self.command, "cwd": self.cwd, "reason": self.reason,
        }  # fmt: skip


@dataclass
class ChangeGroup:
    """Calls going from one decision and rule to another."""

    old_decision: str
    old_rule: str | None
    new_decision: str
    new_rule: str | None
    count: int = 0
    calls: list[ChangedCall] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": {"decision": self.old_decision, "rule": self.old_rule},
            "to": {"decision": self.new_decision, "rule": self.new_rule},
            "count": self.count,
            "shown": len(self.calls),
            "calls": [c.to_json() for c in self.calls],
        }


@dataclass
class Skipped:
    """Records of one kind that were not replayed, with a few of their call ids."""

    why: str
    count: int = 0
    call_ids: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"why": self.why, "count": self.count, "call_ids": self.call_ids}


@dataclass
class ReplayReport:
    draft: str
    draft_sha256: str
    audit_dir: str
    since: str | None
    until: str | None
    decisions: int = 0
    """Decision records in the range."""
    replayed: int = 0
    unchanged: int = 0
    changed: int = 0
    groups: dict[tuple[str, str | None, str, str | None], ChangeGroup] = field(default_factory=dict)
    not_replayed: dict[str, Skipped] = field(default_factory=dict)
    unreadable_lines: int = 0
    max_rows: int = MAX_ROWS
    shown: int = 0

    @property
    def skipped(self) -> int:
        return sum(s.count for s in self.not_replayed.values())

    def _skip(self, code: str, why: str, call_id: str) -> None:
        entry = self.not_replayed.setdefault(code, Skipped(why))
        entry.count += 1
        if len(entry.call_ids) < EXAMPLES and call_id:
            entry.call_ids.append(call_id)

    def _change(self, key: tuple[str, str | None, str, str | None], call: ChangedCall) -> None:
        self.changed += 1
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = ChangeGroup(*key)
        group.count += 1
        if self.shown < self.max_rows:
            group.calls.append(call)
            self.shown += 1

    def ordered(self) -> list[ChangeGroup]:
        """The groups, the largest first."""
        return sorted(self.groups.values(), key=lambda g: (-g.count, g.old_rule or "", g.new_rule or ""))

    def to_json(self) -> dict[str, Any]:
        return {
            "draft": self.draft,
            "draft_sha256": self.draft_sha256,
            "audit_dir": self.audit_dir,
            "since": self.since,
            "until": self.until,
            "decisions": self.decisions,
            "replayed": self.replayed,
            "unchanged": self.unchanged,
            "changed": self.changed,
            "shown": self.shown,
            "max_rows": self.max_rows,
            "groups": [g.to_json() for g in self.ordered()],
            "not_replayed": {code: s.to_json() for code, s in sorted(self.not_replayed.items())},
            "skipped": self.skipped,
            "unreadable_lines": self.unreadable_lines,
        }


def parse_time(text: str | None, what: str) -> datetime | None:
    """A bound as `gateway audit` reads every time (timespec.py: `2026-11-22T10:00`, a date,
    `2h`, `yesterday`, ...; UTC when no zone is given)."""
    if text is None or text == "":
        return None
    try:
        return timespec.parse(text, what)
    except timespec.TimeSpecError as exc:
        raise ReplayError(str(exc)) from None


class _Drafts:
    """The draft, compiled once per recorded workspace (relative roots resolve against it)."""

    def __init__(self, path: Path, workspace: Path | None) -> None:
        self.path = path
        self.workspace = workspace
        self.loaded: dict[str, CompiledPolicy] = {}

    def load(self, recorded: str | None) -> CompiledPolicy | str:
        """The draft for a record's workspace, or why it cannot be had."""

        where = str(self.workspace) if self.workspace is not None else (recorded or "")
        found = self.loaded.get(where)
        if found is not None:
            return found
        if len(self.loaded) >= MAX_WORKSPACES:
            return f"more than {MAX_WORKSPACES} workspaces in the range: pass --workspace"
        try:
            policy = load_checked(self.path, Path(where) if where else None)
        except PolicyError as exc:
            raise ReplayError(f"the draft does not load: {exc}") from None
        self.loaded[where] = policy
        return policy


def replay(
    draft: Path | str,
    audit_dir: Path | str,
    since: str | None = None,
    until: str | None = None,
    *,
    workspace: Path | None = None,
    max_rows: int = MAX_ROWS,
    max_calls: int = MAX_CALLS,
    confined: bool = False,
    source: Callable[[], Iterable[tuple[Any, int, dict[str, Any] | None, bytes]]] | None = None,
) -> ReplayReport:
    """Decide every recorded command call in [since, until) again under `draft` (a policy file,
    or its YAML text) and report those whose decision or deciding rule would change. `workspace`
    overrides the recorded one. Raises ReplayError when the draft does not load (file:line) or a
    bound is not a time. Nothing runs and nothing is written.

    `confined` (the console: whoever sends the draft may read no other file of the server): a
    draft with an `include` is refused before anything it names is read; otherwise `include:
    [/etc/shadow]` has the loader read that file as the server and quote it in its error.

    `source`: the records to replay instead of the files in `audit_dir` (the fleet's store:
    gateway/store/reader.py, every stream in the global order); `audit_dir` then only names it."""
    lower, upper = parse_time(since, "--since"), parse_time(until, "--until")
    if source is None and not Path(audit_dir).is_dir():
        raise ReplayError(f"no audit directory at {audit_dir}")
    with _DraftFile(draft) as (path, name, text):
        if confined:
            _check_includes(path)
        report = ReplayReport(
            draft=name, draft_sha256=hashlib.sha256(text).hexdigest(), audit_dir=str(audit_dir),
            since=since, until=until, max_rows=max_rows,
        )  # fmt: skip
        drafts = _Drafts(path, workspace)
        drafts.load(None if workspace is None else str(workspace))  # a draft that does not load fails first
        rows = source() if source is not None else records(Path(audit_dir))
        for record in _decisions(rows, report, lower, upper):
            report.decisions += 1
            if report.replayed >= max_calls:
                report._skip("over_limit", f"more than {max_calls} calls in the range (--max-calls)", "")
                continue
            _replay_one(record, drafts, report)
    return report


def _check_includes(path: Path) -> None:
    """A confined draft includes no file: the loader would read any path it names, as the server."""

    try:
        includes = parse_policy_at(path)[0].include
    except PolicyError as exc:
        raise ReplayError(f"the draft does not load: {exc}") from None
    if includes:
        raise ReplayError(
            f"include: {includes[0]!r}: a draft replayed here includes no file (the server would read it): "
            "write the layers it needs into the draft, or replay it with `gateway audit replay`"
        )


class _DraftFile:
    """The draft as a file: a given path as it is, YAML text in a private temporary directory."""

    def __init__(self, draft: Path | str) -> None:
        self.draft = draft
        self.tmp: str | None = None

    def __enter__(self) -> tuple[Path, str, bytes]:
        if isinstance(self.draft, Path):
            try:
                text = self.draft.read_bytes()
            except OSError as exc:
                raise ReplayError(f"cannot read the draft {self.draft}: {exc.strerror or exc}") from None
            return self.draft, str(self.draft), text
        self.tmp = tempfile.mkdtemp(prefix="agw-replay-")
        path = Path(self.tmp) / "draft.yaml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        data = self.draft.encode("utf-8")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path, "<draft text>", data

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _decisions(
    rows: Iterable[tuple[Any, int, dict[str, Any] | None, bytes]],
    report: ReplayReport,
    lower: datetime | None,
    upper: datetime | None,
) -> Iterator[dict[str, Any]]:
    """The decision records of the range, streamed in log order."""
    for _, _, record, _ in rows:
        if record is None:
            report.unreadable_lines += 1
            continue
        if record.get("event") not in _REPLAYED or not _a_decision(record):
            continue
        if lower is not None or upper is not None:
            try:
                when = datetime.fromisoformat(str(record.get("ts", "")).replace("Z", "+00:00"))
            except ValueError:
                report._skip("no_time", "the record has no readable time", str(record.get("call_id", "")))
                continue
            when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
            if (lower is not None and when < lower) or (upper is not None and when >= upper):
                continue
        yield record


def _replay_one(record: dict[str, Any], drafts: _Drafts, report: ReplayReport) -> None:

    call_id = str(record.get("call_id") or "")
    tool = str(record.get("tool") or "")
    data = record.get("data") if isinstance(record.get("data"), dict) else {}
    assert isinstance(data, dict)
    if record.get("event") != "decision":
        _replay_network(record, data, drafts, report)
        return
    arguments = record.get("arguments") if isinstance(record.get("arguments"), dict) else {}
    assert isinstance(arguments, dict)
    principal = record.get("principal")
    old = record.get("decision")
    if "hook" in data:
        report._skip("hook", "an agent hook's decision (gateway daemon): not replayed", call_id)
        return
    command = arguments.get("command")
    if tool in DECIDERS:
        _replay_other(record, drafts, report, DECIDERS[tool])
        return
    if tool not in _FAMILY or command is None:
        why = f"the {tool or 'unnamed'} tool's decisions are not command decisions"
        report._skip(f"tool:{tool or '?'}", why, call_id)
        return
    if old not in ("allow", "ask", "deny") or not isinstance(principal, str):
        report._skip("missing_fields", "the record has no decision or principal", call_id)
        return
    if not isinstance(command, str):
        report._skip("command_not_recorded", "the command was recorded only as its size and digest", call_id)
        return
    context = data.get("context") if isinstance(data.get("context"), dict) else None
    env = (context or {}).get("env", arguments.get("env") or {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        report._skip("env_not_recorded", "the call's variables were not recorded whole", call_id)
        return
    if REDACTED in command or REDACTED in env.values():
        why = "the log keeps the command or a variable redacted: it cannot be decided again"
        report._skip("redacted", why, call_id)
        return
    draft = drafts.load(str(context["workspace"]) if context and "workspace" in context else None)
    if isinstance(draft, str):
        report._skip("workspace", draft, call_id)
        return
    if principal not in draft.grants:
        report._skip("principal", f"a principal the draft does not define ({principal})", call_id)
        return
    if context is not None and isinstance(context.get("cwd"), str):
        cwd = Path(context["cwd"])
    elif tool in ("run", "process"):  # before data.context: the call's own cwd, resolved as the gateway does
        given = arguments.get("cwd")
        if given is not None and not isinstance(given, str):
            report._skip("missing_fields", "the record's cwd is not a path", call_id)
            return
        cwd = _resolve_cwd(draft, given)
    else:
        report._skip("no_context", "a session command recorded before data.context: its cwd is unknown", call_id)
        return
    shell = (context or {}).get("shell", arguments.get("shell") or "bash")
    if tool == "run" and shell not in draft.policy.shells:
        reason = Reason("tool", "shell_not_allowed", f"shell {shell!r} is not in the policy's shells")
        decision = Decision(Verdict.DENY, None, (reason,))
    else:
        variables = {str(k): str(v) for k, v in env.items()}
        decision = evaluate(draft, command, principal, cwd, variables, _FAMILY[tool]).decision
    report.replayed += 1
    new = decision.verdict.label
    old_rule = record.get("rule") if isinstance(record.get("rule"), str) else None
    if (old, old_rule) == (new, decision.rule):
        report.unchanged += 1
        return
    first = next((r.message for r in decision.reasons if r.code != "paths_checked"), "")
    row = ChangedCall(call_id, str(record.get("ts", "")), principal, tool, command, str(cwd), first)
    report._change((str(old), old_rule, new, decision.rule), row)


def _a_decision(record: dict[str, Any]) -> bool:
    """Whether a record is a decision to replay: not an allowed connection's end (its decision is
    `egress_allowed`), nor a refusal of the proxy's own checks (a mismatched name, a cap)."""
    if record.get("event") != "egress_connection":
        return True
    data = record.get("data") if isinstance(record.get("data"), dict) else {}
    assert isinstance(data, dict)
    return data.get("decision") == "deny" and data.get("policy_verdict") in ("deny", "ask")


def _replay_network(record: dict[str, Any], data: dict[str, Any], drafts: _Drafts, report: ReplayReport) -> None:
    """A network decision decided again under the draft's `sandbox.network` (nothing connects)."""
    event = record.get("event")
    call_id = str(record.get("call_id") or "")
    draft = drafts.load(None)
    if isinstance(draft, str):
        report._skip("workspace", draft, call_id)
        return
    principal = str(record.get("principal") or "")
    if event == "egress_dns_refused":
        name = data.get("name")
        if not isinstance(name, str) or data.get("why") == "not a host name":
            report._skip("network_fields", "a refused lookup with no name the policy could decide", call_id)
            return
        old, old_rule, subject = "deny", data.get("rule"), f"lookup {name}"
        resolvable = draft.egress.resolvable(name) if draft.egress is not None else draft.policy.sandbox.network is True
        new, new_rule, why = ("allow" if resolvable else "deny"), None, "the draft's network policy"
    else:
        host, port = data.get("host"), data.get("port")
        if not isinstance(host, str) or not isinstance(port, int):
            report._skip("network_fields", "a network record with no host and port", call_id)
            return
        old = "allow" if event == "egress_allowed" else "deny"
        old_rule, subject = data.get("rule"), f"connect {host}:{port}"
        if draft.egress is not None:
            d = draft.egress.decide(host, port)
            new, new_rule, why = d.verdict, d.rule, d.why
        else:
            everything = draft.policy.sandbox.network is True
            new, new_rule = ("allow" if everything else "deny"), None
            why = "the draft's sandbox.network is " + ("true" if everything else "false")
    report.replayed += 1
    old_rule = old_rule if isinstance(old_rule, str) else None
    if (old, old_rule) == (new, new_rule):
        report.unchanged += 1
        return
    row = ChangedCall(call_id, str(record.get("ts", "")), principal, "network", subject, "", why)
    report._change((old, old_rule, new, new_rule), row)


def _replay_other(record: dict[str, Any], drafts: _Drafts, report: ReplayReport, decide: Redecide) -> None:
    """A decision of a family that registered how to decide it again (`DECIDERS`)."""
    call_id = str(record.get("call_id") or "")
    principal, old = record.get("principal"), record.get("decision")
    arguments = record.get("arguments") if isinstance(record.get("arguments"), dict) else None
    data = record.get("data") if isinstance(record.get("data"), dict) else {}
    assert isinstance(data, dict)
    if old not in ("allow", "ask", "deny") or not isinstance(principal, str) or arguments is None:
        report._skip("missing_fields", "the record has no decision, principal or arguments", call_id)
        return
    context = data.get("context") if isinstance(data.get("context"), dict) else None
    draft = drafts.load(str(context["workspace"]) if context and "workspace" in context else None)
    if isinstance(draft, str):
        report._skip("workspace", draft, call_id)
        return
    if principal not in draft.grants:
        report._skip("principal", f"a principal the draft does not define ({principal})", call_id)
        return
    found = decide(draft, principal, arguments, record)
    if isinstance(found, str):
        report._skip(f"{record.get('tool')}:unreplayable", found, call_id)
        return
    decision, what = found
    report.replayed += 1
    new = decision.verdict.label
    old_rule = record.get("rule") if isinstance(record.get("rule"), str) else None
    if (old, old_rule) == (new, decision.rule):
        report.unchanged += 1
        return
    first = next((r.message for r in decision.reasons if r.code != "paths_checked"), "")
    row = ChangedCall(call_id, str(record.get("ts", "")), principal, str(record.get("tool")), what, "", first)
    report._change((str(old), old_rule, new, decision.rule), row)


def _resolve_cwd(policy: CompiledPolicy, cwd: str | None) -> Path:
    """A call's cwd as the gateway resolves it (pipeline.Gateway.resolve_cwd), for records from
    before data.context; a `~user` or a `~` without a home is kept as given (the jail refuses it)."""
    if cwd and cwd.startswith("~"):
        head, _, rest = cwd.partition("/")
        if head == "~" and policy.home is not None:
            return policy.home / rest if rest else policy.home
        return Path(cwd)
    path = Path(cwd) if cwd else policy.workspace
    return path if path.is_absolute() else policy.workspace / path


def describe(report: ReplayReport) -> str:
    """The report for a terminal: counts, then each group with its calls (escaped, never cut)."""

    lines = [
        f"replayed {report.replayed} of {report.decisions} decisions under {report.draft} "
        f"(sha256 {report.draft_sha256[:12]}): {report.changed} would change, {report.unchanged} unchanged, "
        f"{report.skipped} not replayed"
    ]
    for g in report.ordered():
        lines.append(
            f"  {g.old_decision} ({g.old_rule or 'no rule'}) -> {g.new_decision} ({g.new_rule or 'no rule'}): {g.count}"
        )
        for c in g.calls:
            lines.append(f"    {c.ts}  {c.call_id}  {escaped(c.principal)}  {c.tool}  {escaped(c.command)}")
            if c.reason:
                lines.append(f"        {escaped(c.reason)}")
        if g.count > len(g.calls):
            lines.append(f"    ... {g.count - len(g.calls)} more not shown (--max-rows, or --json)")
    for code, s in sorted(report.not_replayed.items()):
        ids = f" (e.g. {', '.join(s.call_ids)})" if s.call_ids else ""
        lines.append(f"  not replayed [{code}]: {s.count}: {s.why}{ids}")
    if report.unreadable_lines:
        lines.append(f"  {report.unreadable_lines} line(s) of the log are not records: see `gateway audit verify`")
    return "\n".join(lines)
