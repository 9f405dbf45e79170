"""Calls, not records: each call folded from its records into one row a reviewer reads.

A call leaves two to four records (`decision`, then `approval`, then `result`; or one
`rejected`), in order, each naming its `call_id`. `Folder` reads records in log order and keeps
one `Call` per id:

    when          the first record's time; `ended` the last one's
    principal, tool, command (what it was about: the command, or `read .env`, `set NAME`)
    decision      the policy's (`allow`, `ask`, `deny`; a `rejected` call's is its own)
    rule          the deciding rule
    final         the decision that held: an approval's answer, or the policy's
    approved_by   who answered an ask (`how`: queue, tty, session, timeout ...), and their reason
    outcome       ok | error | denied | timeout | withdrawn | void | rejected | interrupted |
                  waiting | running (waiting: asked, not answered yet; running: allowed, no
                  result yet; interrupted: the gateway that ran it died first)
    error         the error code when the call failed or was refused (POLICY_DENIED, ...)
    exit_code, duration_ms, bytes (stdout, stderr and output bytes the result counted)
    parent        the call that carried this one (a line of a session write, a startup command)
    waited_ms     how long an ask waited for its answer (the decision's time to the approval's)

`story()` tells a call's records as the steps a reader follows (decided, asked, answered by
whom, ran, ended): the console's call page reads it.

A call is `closed` once a record ends it (a result, a refusal, a denial, a withdrawal, a
voided approval); an exporter that follows the log sends it then (export.py).

The folder is a reader of the ledger: it trusts nothing in a record beyond its JSON types, and
a record it cannot place (no `call_id`) is left to the record views.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway.audit import journal, timespec
from gateway.audit.selection import Selection, hosts_of

ENDING = journal.ENDS
"""Events that end a call whatever they say (a denying decision or answer ends one too): the
ones the writer's journal counts as an end (a result, an error, a refusal, a withdrawal, a void
approval, an `interrupted` written for a call a crash cut short)."""
_APPROVALS = frozenset({"approval", "approval_withdrawn", "supervisor_answer", "supervisor_answer_refused"})
_BYTES = ("stdout_bytes", "stderr_bytes", "output_bytes")
MAX_SUBJECT = 500
"""Characters of a non-command call's arguments kept as its `command` (a command is kept whole)."""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _shared(value: Any) -> str | None:
    """A short value many calls repeat (a principal, a tool, a rule, a policy's digest), kept
    once however many calls name it (a long-lived fold, the console's, holds every call)."""
    return sys.intern(value) if isinstance(value, str) and value and len(value) <= 128 else _text(value)


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def subject(arguments: Any) -> str:
    """What a call was about, on one line: its command (prefixed with its action when that is
    not the usual one), or its action and the path, name or id it names."""
    args = _map(arguments)
    action = _text(args.get("action"))
    command = args.get("command")
    if isinstance(command, str):
        return f"{action}: {command}" if action not in (None, "run", "start", "send", "exec") else command
    if isinstance(command, dict) and "sha256" in command:  # kept as its size and digest
        return f"(a command of {command.get('chars', '?')} characters, sha256 {str(command['sha256'])[:16]})"
    keys = ("path", "name", "session_id", "process_id", "pattern", "prompt", "input")
    named = next((args[k] for k in keys if _text(args.get(k))), None)
    if action and named:
        return f"{action} {named}"
    if action:
        return action
    if named:
        return str(named)
    shown = json.dumps({k: v for k, v in args.items() if v is not None}, ensure_ascii=False, sort_keys=True)
    return shown if len(shown) <= MAX_SUBJECT else shown[:MAX_SUBJECT] + "..."


@dataclass(slots=True)
class Call:
    call_id: str
    when: str = ""
    ended: str = ""
    principal: str | None = None
    tool: str | None = None
    command: str = ""
    decision: str | None = None
    rule: str | None = None
    final: str | None = None
    approved_by: str | None = None
    approval_how: str | None = None
    approval_reason: str | None = None
    outcome: str = "running"
    error: str | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    bytes: int | None = None
    parent: str | None = None
    policy_sha256: str | None = None
    reason: str | None = None
    """The first reason the policy gave (its message), for a call it did not simply allow."""
    reason_code: str | None = None
    waited_ms: int | None = None
    """How long an ask waited for its answer (or its timeout): decision to approval."""
    origin: dict[str, Any] = field(default_factory=dict)
    """How the call came (`data.origin` of its first record: MCP transport, session, request
    id, the client's trace context), when the gateway recorded it."""
    closed: bool = False
    first_seq: int | None = None
    last_seq: int | None = None
    first_hash: str = ""
    last_hash: str = ""
    events: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    """The call's records, in order (only when the folder keeps them)."""
    hosts: frozenset[str] = frozenset()
    text_seen: bool = False

    def add(self, r: dict[str, Any], keep: bool) -> None:
        event = str(r.get("event", ""))
        ts = r.get("ts") if isinstance(r.get("ts"), str) else ""
        self.when = self.when or str(ts)
        self.ended = str(ts) or self.ended
        self.events.append(sys.intern(event))
        seq = r.get("seq") if isinstance(r.get("seq"), int) else None
        self.first_seq = self.first_seq if self.first_seq is not None else seq
        self.last_seq = seq if seq is not None else self.last_seq
        digest = r.get("hash") if isinstance(r.get("hash"), str) else ""
        self.first_hash = self.first_hash or str(digest)
        self.last_hash = str(digest) or self.last_hash
        self.principal = self.principal or _shared(r.get("principal"))
        self.tool = self.tool or _shared(r.get("tool"))
        self.parent = self.parent or _text(r.get("parent"))
        self.policy_sha256 = self.policy_sha256 or _shared(r.get("policy_sha256"))
        named = hosts_of(r)
        if named and not named <= self.hosts:
            self.hosts = self.hosts | named
        if keep:
            self.records.append(r)
        data = _map(r.get("data"))
        if not self.origin and isinstance(data.get("origin"), dict):
            self.origin = data["origin"]
        if not self.command and r.get("arguments") is not None:
            self.command = subject(r.get("arguments"))
        if event == "decision" and self.decision is None:
            self.decision = _shared(r.get("decision"))
            self.final = self.decision
            self.rule = _shared(r.get("rule"))
            reasons = r.get("reasons") if isinstance(r.get("reasons"), list) else []
            first = _map(reasons[0]) if reasons else {}
            if self.decision != "allow" and first:
                self.reason, self.reason_code = _text(first.get("message")), _text(first.get("code"))
            self.outcome = {"allow": "running", "ask": "waiting"}.get(str(self.decision), "denied")
            if self.decision == "deny":
                self.error = "POLICY_DENIED"
                self.closed = True
        elif event == "approval":
            if self.decision == "ask" and self.waited_ms is None:
                self.waited_ms = _ms_between(self.when, str(ts))
            self.final = _text(r.get("decision"))
            self.approval_how = _text(data.get("how"))
            self.approved_by = _text(data.get("by")) if data.get("answered") else None
            self.approval_reason = _text(data.get("reason"))
            if self.final != "allow":
                self.outcome = "timeout" if self.approval_how == "timeout" else "denied"
                self.error = "APPROVAL_TIMEOUT" if self.outcome == "timeout" else "APPROVAL_DENIED"
                self.closed = True
            else:
                self.outcome = "running"
        elif event == "approval_withdrawn":
            self.final, self.outcome, self.error = "deny", "withdrawn", "APPROVAL_WITHDRAWN"
            self.approval_reason = _text(data.get("why"))
        elif event == "approval_void":
            self.final, self.outcome, self.error = "deny", "void", "APPROVAL_VOID"
        elif event == "rejected":
            self.decision = self.decision or _text(r.get("decision")) or "rejected"
            self.final = self.final or self.decision
            self.outcome, self.error = "rejected", _text(data.get("code"))
            self.reason = self.reason or _text(data.get("message"))
        elif event == "interrupted":
            self.outcome, self.error = "interrupted", "INTERRUPTED"
            self.reason = self.reason or _text(data.get("why"))
        elif event == "error":
            self.outcome, self.error = "error", _text(data.get("code"))
            self.reason = self.reason or _text(data.get("message"))
        elif event == "result":
            status = _text(data.get("status")) or "ok"
            self.outcome = status
            err = _map(data.get("error"))
            self.error = _text(err.get("code")) or (self.error if status != "ok" else None)
            if isinstance(data.get("exit_code"), int) and not isinstance(data.get("exit_code"), bool):
                self.exit_code = data["exit_code"]
            if isinstance(data.get("duration_ms"), int | float) and not isinstance(data.get("duration_ms"), bool):
                self.duration_ms = int(data["duration_ms"])
            counted = [data[k] for k in _BYTES if isinstance(data.get(k), int) and not isinstance(data.get(k), bool)]
            if counted:
                self.bytes = sum(counted)
        if event in ENDING:
            self.closed = True

    def matches(self, s: Selection) -> bool:
        """The selection holds for this call (selection.py says how a call matches)."""
        return (
            timespec.within(self.when, s.since, s.until)
            and (not s.call_ids or self.call_id in s.call_ids or self.parent in s.call_ids)
            and (s.principal is None or self.principal == s.principal)
            and (s.tool is None or self.tool == s.tool)
            and (s.decision is None or s.decision in (self.decision, self.final))
            and (s.rule is None or self.rule == s.rule)
            and (s.host is None or s.host in self.hosts)
            and (not s.events or bool(s.events.intersection(self.events)))
            and (s.text is None or self.text_seen)
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "call_id": self.call_id, "when": self.when, "ended": self.ended, "principal": self.principal,
            "tool": self.tool, "command": self.command, "decision": self.decision, "rule": self.rule,
            "final": self.final, "approved_by": self.approved_by, "approval_how": self.approval_how,
            "approval_reason": self.approval_reason, "outcome": self.outcome, "error": self.error,
            "exit_code": self.exit_code, "duration_ms": self.duration_ms, "bytes": self.bytes,
            "waited_ms": self.waited_ms, "parent": self.parent, "reason": self.reason,
            "policy_sha256": self.policy_sha256,
            "events": self.events, "first_seq": self.first_seq, "last_seq": self.last_seq, "closed": self.closed,
        }  # fmt: skip
        if self.origin:
            out["origin"] = self.origin
        if self.records:
            out["records"] = self.records
        return out


def _ms_between(start: str, end: str) -> int | None:
    """Milliseconds from one record's `ts` to another's (None when either is not a time)."""
    try:
        a = datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0, round((b - a).total_seconds() * 1000))


class Folder:
    """Folds records, in log order, into calls. `keep_records`: each call keeps its records
    (to expand a row); `selection`: its text filter is looked for in every record as it passes."""

    def __init__(self, selection: Selection | None = None, keep_records: bool = False) -> None:
        self.selection = selection or Selection()
        self.keep_records = keep_records
        self.calls: dict[str, Call] = {}

    def add(self, record: dict[str, Any], raw: bytes | None = None) -> Call | None:
        """Take one record; returns its call (None for a record about no call)."""
        call_id = record.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            return None
        call = self.calls.get(call_id)
        if call is None:
            call = self.calls[call_id] = Call(call_id)
        call.add(record, self.keep_records)
        if self.selection.text is not None and not call.text_seen:
            call.text_seen = self.selection.has_text(record, raw)
        return call

    def pop(self, call_id: str) -> Call | None:
        """Forget a call (a follower, once it has sent it): its later records start a new row."""
        return self.calls.pop(call_id, None)

    def matching(self) -> Iterator[Call]:
        """The calls the selection keeps, in the order they began."""
        return (c for c in self.calls.values() if c.matches(self.selection))


def fold(
    records: Iterable[tuple[dict[str, Any], bytes | None]],
    selection: Selection | None = None,
    keep_records: bool = False,
) -> list[Call]:
    """Every call of `records` ((record, raw line) pairs, in log order) that `selection` keeps."""
    folder = Folder(selection, keep_records)
    for record, raw in records:
        folder.add(record, raw)
    return list(folder.matching())


_ANSWERS = {"queue": "from the approvals queue", "queue-session": "for the rest of the session",
            "session": "already approved for this session", "tty": "at the gateway's terminal",
            "client": "by the agent's own client (client-attested)", "timeout": "nobody answered in time",
            "deny-all": "no supervisor is configured: denied"}  # fmt: skip


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def story(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A call's records as the steps a reader follows, in order: `{ts, seq, event, step, text}`,
    `step` one of decided, asked, answered, refused, withdrawn, ran, ended, noted. The text is
    plain (a face escapes it for its medium); nothing of a record is left out of the call's page
    (the raw records stay one click away)."""
    steps: list[dict[str, Any]] = []

    def add(r: dict[str, Any], step: str, text: str, ts: Any = None) -> None:
        steps.append({"ts": ts if ts is not None else r.get("ts"), "seq": r.get("seq"), "event": r.get("event"),
                      "step": step, "text": text})  # fmt: skip

    asked: str | None = None
    for r in records:
        event, data = r.get("event"), _map(r.get("data"))
        rule = _text(r.get("rule"))
        reasons = [_map(x) for x in r.get("reasons") or [] if isinstance(x, dict)] if isinstance(
            r.get("reasons"), list) else []  # fmt: skip
        if event == "decision":
            decision = str(r.get("decision") or "?")
            what = subject(r.get("arguments"))
            by = f"rule {rule}" if rule else "no rule (a stage decided)"
            why = next((str(x.get("message")) for x in reasons if x.get("message") and decision != "allow"), "")
            add(r, "decided", f"{decision} by {by}: {what}" + (f" (why: {why})" if why else ""))
            if decision == "ask":
                asked = str(r.get("ts") or "")
                add(r, "asked", f"waiting for a supervisor's answer ({'rule ' + rule if rule else 'a stage asks'})")
        elif event == "supervisor_answer":
            verb = "approved" if data.get("approved") else "denied"
            scope = " for the session" if data.get("scope") == "session" else ""
            reason = f": {data['reason']}" if _text(data.get("reason")) else ""
            who = data.get("supervisor", "?")
            add(r, "answered", f"{who} {verb}{scope} in the console (via {data.get('via', '?')}){reason}")
        elif event == "supervisor_answer_refused":
            add(r, "refused", f"{data.get('supervisor', '?')}'s answer did not take: {data.get('why', '')}")
        elif event == "approval":
            how = _text(data.get("how")) or "?"
            verb = "approved" if r.get("decision") == "allow" else "denied"
            who = f"{verb} by {data.get('by')}" if data.get("answered") else f"{verb}, unanswered"
            waited = _ms_between(asked, str(r.get("ts") or "")) if asked else None
            voided = [k for k in ("bound", "policy_unchanged", "env_unchanged") if data.get(k) is False]
            text = f"{who} ({_ANSWERS.get(how, how)})"
            if _text(data.get("reason")):
                text += f": {data['reason']}"
            if waited is not None:
                text += f"; waited {waited / 1000:.1f} s"
            if voided:
                text += f"; void: {', '.join(voided)} no longer held"
            add(r, "answered", text)
        elif event in ("approval_withdrawn", "approval_void"):
            why = data.get("why") or data.get("changed") or ""
            add(r, "withdrawn", f"{event.replace('_', ' ')}: {why}".rstrip(": "))
        elif event == "rejected":
            add(r, "ended", f"refused before it was decided: {data.get('code', '?')}: {data.get('message', '')}")
        elif event == "result":
            status = _text(data.get("status")) or "ok"
            took, code = _number(data.get("duration_ms")), _number(data.get("exit_code"))
            sizes = [f"{data[k]} B {k.removesuffix('_bytes')}" for k in _BYTES if _number(data.get(k))]
            started = _text(data.get("started_at"))
            ran = "ran" + (f" for {took} ms" if took is not None else "") + (f" in {data['cwd']}" if _text(
                data.get("cwd")) else "")  # fmt: skip
            if started or took is not None:
                add(r, "ran", ran, started)
            err = _map(data.get("error"))
            end = status + (f", exit {code}" if code is not None else "")
            if err:
                end += f": {err.get('code', '?')}: {err.get('message', '')}"
            add(r, "ended", end + (f" ({', '.join(sizes)})" if sizes else ""), _text(data.get("ended_at")))
        elif event == "error":
            add(r, "ended", f"error {data.get('code', '?')}: {data.get('message', '')}")
        elif event == "interrupted":
            add(r, "ended", f"interrupted: {data.get('why', 'the gateway that ran it ended first')}")
        else:
            shown = json.dumps(data, ensure_ascii=False, sort_keys=True, default=str) if data else ""
            add(r, "noted", f"{event}" + (f": {shown[:MAX_SUBJECT]}" if shown else ""))
    return steps
