"""The ledger in the formats security teams already read: ECS, OCSF, OpenTelemetry (otlp.py).

`to_ecs(record)` and `to_ocsf(record)` map one record to one event; `export()` streams the log
(or a time range of it) through a mapping to a sink, once or following the log (`follow=True`),
resumable from a cursor (follow.py). Everything here is a reader of the ledger: it runs after the
records are on disk, in its own process, and nothing in the gate waits on it.

Redaction applies before anything leaves: every record is redacted again (`records.redact`,
the default secret names and any extra `redact` patterns) before it is mapped, so a pattern
added after a record was written still keeps its value in the log only.

ECS (8.11): each record is one event. `event.id` and `event.hash` are the record's `hash` (the
key a receiver deduplicates on), `event.sequence` its `seq`, `event.action` its event name;
`event.category`/`event.type` say what it is (a decision: `api` + `allowed|denied|info`, with
`process` for a command; a result: `process` `end`; an approval: `api` `allowed|denied`;
policy loads: `configuration` `change`; refusals at the door: `authentication`). A command's
`process.command_line`, `process.args` (the analysed argv when the text runs one program, else
the shell and `-c`), `process.args_count`, `process.name`, `process.working_directory`,
`process.exit_code`, `process.start`/`end`; the deciding rule as `rule.id`/`rule.name`, the
policy's digest as `rule.version`; the principal as `user.name`; the call as
`process.entity_id` (its parent's as `process.parent.entity_id`) and `trace.id` (the trace
otlp.py puts its span in). What ECS has no field for is under `agent_gateway.*`.

OCSF (1.8.0): a command call's records are Process Activity (`class_uid` 1007, category System
Activity): a decision or an answer is a Launch (activity 1) with `action_id` (1 Allowed, 2
Denied), `disposition_id` (1 Allowed, 2 Blocked, 8 Approved, 14 Delayed: asked, 25 Rejected, 27
Error) and the rule as `policy`; a result is a Terminate (activity 2) with `exit_code`. Every
other record is a Base Event (`class_uid` 0) with the tool as `api.operation`. `metadata.uid`
is the record's `hash`, `metadata.correlation_uid` the call id, `metadata.sequence` its `seq`.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import re
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from gateway.audit.calls import Call, Folder, subject
from gateway.audit.follow import Cursor, CursorError, Line, LogReader, Position
from gateway.audit.records import SECRET_NAME, redact
from gateway.audit.selection import Selection
from gateway.version import __version__

ECS_VERSION = "8.11.0"
OCSF_VERSION = "1.8.0"
PRODUCT = "agent-gateway"
COMMAND_TOOLS = frozenset({"run", "session", "process"})
"""Tools whose calls run a command: their records are process events."""
STARTING = frozenset({"decision", "rejected", "error"})
"""The records a call's span starts from (OTLP); a call's later records follow one of them."""
MAX_OPEN_CALLS = 10_000
"""Calls an OTLP export keeps open while it waits for their end; past this the oldest is sent
as it stands (marked incomplete)."""


class ExportFailed(Exception):
    """The sink did not take a batch: nothing past the cursor was acknowledged."""


SECRET_WORDS = (b"token", b"key", b"secret", b"passw", b"credential", b"auth", b"bearer", b"basic")
"""Words a secret-looking name (records.SECRET_NAME) or a secret in free text (records.redact's
patterns) contains, lower case: a record whose line has none of them has nothing to redact."""
Redactor = Callable[[dict[str, Any], bytes | None], dict[str, Any]]


def redactor(patterns: Iterable[str] = ()) -> Redactor:
    """Redact a record again before it leaves: the default secret names plus `patterns`.

    Given the record's line as written, a record whose text names nothing secret-looking (no
    name the patterns match, none of the words a secret in free text needs, no JSON escape that
    could hide one) is passed as it is: redaction could change nothing in it, and walking every
    value of every record is most of an export's time."""
    extra = [p for p in patterns if p]
    names = re.compile("|".join([SECRET_NAME.pattern, *extra]), re.IGNORECASE) if extra else SECRET_NAME
    more = re.compile("|".join(extra), re.IGNORECASE) if extra else None

    def apply(record: dict[str, Any], raw: bytes | None = None) -> dict[str, Any]:
        if raw is not None and b"\\" not in raw:
            lower = raw.lower()
            for word in SECRET_WORDS:
                if word in lower:
                    break
            else:
                if more is None or not more.search(raw.decode("utf-8", "replace")):
                    return record
        out: dict[str, Any] = redact(record, names)
        return out

    return apply


# --- shared pieces ---------------------------------------------------------------------------
def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _ms(ts: Any) -> int | None:
    """An ISO time as milliseconds since the epoch."""
    if not isinstance(ts, str):
        return None
    try:
        when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)


@dataclass(frozen=True)
class Command:
    """What a command call runs, as a process event shows it."""

    line: str
    args: list[str]
    cwd: str | None

    @property
    def name(self) -> str:
        return self.args[0].rsplit("/", 1)[-1] if self.args else ""


def command_of(record: dict[str, Any]) -> Command | None:
    """The command a record is about (its arguments' `command`), with the analysed argv when it
    runs one program, else the shell and `-c` (what the gateway starts)."""
    args = _map(record.get("arguments"))
    line = args.get("command")
    if not isinstance(line, str):
        return None
    data = _map(record.get("data"))
    commands = data.get("commands")
    argv = _map(commands[0]).get("argv") if isinstance(commands, list) and len(commands) == 1 else None
    context = _map(data.get("context"))
    shell = _str(args.get("shell")) or _str(context.get("shell")) or "bash"
    if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
        words = list(argv)
    else:
        words = [shell, "-c", line]
    return Command(line, words, _str(context.get("cwd")) or _str(data.get("cwd")) or _str(args.get("cwd")))


def trace_id_of(call_id: str, origin: dict[str, Any] | None = None) -> str:
    """The trace a call's span is in (32 hex digits): the client's, when it sent a W3C
    `traceparent`, else one derived from the call id (its parent's, for a part of a call)."""
    parent = traceparent(_map(origin).get("traceparent")) if origin else None
    if parent is not None:
        return parent[0]
    return _derived_trace(call_id)


@functools.lru_cache(maxsize=4096)  # a call's records come together: its ids are made once
def _derived_trace(call_id: str) -> str:
    return hashlib.sha256(f"agent-gateway trace {call_id}".encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=4096)
def span_id_of(call_id: str) -> str:
    """A call's span id (16 hex digits), derived from its call id: the same on every export."""
    return hashlib.sha256(f"agent-gateway span {call_id}".encode()).hexdigest()[:16]


_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def traceparent(value: Any) -> tuple[str, str, int] | None:
    """A W3C traceparent's trace id, parent span id and flags (None unless valid and non-zero)."""
    if not isinstance(value, str):
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
        return None
    return m.group(1), m.group(2), int(m.group(3), 16)


_MAPPED_DATA = frozenset({"commands", "context", "origin"})
"""A decision's analysis, context and origin: what the process fields, the trace and the span
already say (`gateway audit query --json` has them whole)."""


def _rest(data: dict[str, Any]) -> dict[str, Any]:
    """A record's `data` without what the mapped fields already carry."""
    if _MAPPED_DATA.isdisjoint(data):
        return data
    return {k: v for k, v in data.items() if k not in _MAPPED_DATA}


def summary(record: dict[str, Any]) -> str:
    """One line saying what a record is (the events' `message`)."""
    parts = [str(record.get("event", "record"))]
    for key in ("principal", "tool", "decision"):
        if _str(record.get(key)):
            parts.append(str(record[key]))
    if _str(record.get("rule")):
        parts.append(f"(rule {record['rule']})")
    if record.get("arguments") is not None:
        parts.append(subject(record.get("arguments")))
    return " ".join(parts)


# --- ECS ---------------------------------------------------------------------------------------
def _ecs_kind(record: dict[str, Any], is_command: bool) -> tuple[list[str], list[str], str | None]:
    """event.category, event.type and event.outcome for a record."""
    event = str(record.get("event", ""))
    decision = record.get("decision")
    data = _map(record.get("data"))
    verdict = {"allow": "allowed", "deny": "denied"}.get(str(decision), "info")
    outcome = {"allow": "success", "deny": "failure"}.get(str(decision), "unknown")
    if event == "decision":
        return (["api", "process"], [verdict, "info"], outcome) if is_command else (["api"], [verdict], outcome)
    if event in ("approval", "supervisor_answer"):
        if event == "supervisor_answer":
            verdict = "allowed" if data.get("approved") else "denied"
            outcome = "success"
        return (["api", "process"], [verdict, "info"], outcome) if is_command else (["api"], [verdict], outcome)
    if event in ("approval_withdrawn", "approval_void", "rejected", "error", "supervisor_answer_refused"):
        return (["api", "process"], ["denied", "info"], "failure") if is_command else (["api"], ["denied"], "failure")
    if event == "result":
        ok = data.get("status") == "ok" and _int(data.get("exit_code")) in (None, 0)
        return (["process"] if is_command else ["api"]), ["end"], "success" if ok else "failure"
    if event == "interrupted":  # its gateway died first: how it ended is unknown
        return (["process"] if is_command else ["api"]), ["end"], "unknown"
    if event.startswith("egress"):  # a sandboxed command's network connection (the policy's network)
        if decision in ("allow", "deny"):
            return ["network"], [verdict, "connection"] if decision == "allow" else [verdict], outcome
        return ["network"], ["info"], None
    if event.startswith(("policy_", "audit_")):
        return ["configuration"], ["change"], "failure" if event == "policy_rejected" else "success"
    if event in ("auth_refused", "console_login"):
        return ["authentication"], ["start"], "failure" if event == "auth_refused" else "success"
    if event.endswith(("_started", "_start")):
        return ["process"], ["start"], None
    if event.endswith(("_stopped", "_ended", "_exited", "_killed")):
        return ["process"], ["end"], None
    return ["process"], ["info"], None


def to_ecs(record: dict[str, Any], host: str | None = None) -> dict[str, Any]:
    """One record as an ECS event (see the module's docstring). Written for speed: it runs once
    per record of an export."""
    get = record.get
    event_name = get("event")
    event_name = event_name if isinstance(event_name, str) else "record"
    tool, call_id, principal, rule = _str(get("tool")), _str(get("call_id")), _str(get("principal")), _str(get("rule"))
    is_command = call_id is not None and tool in COMMAND_TOOLS
    category, types, outcome = _ecs_kind(record, is_command)
    data = _map(get("data"))
    digest = _str(get("hash"))
    event: dict[str, Any] = {
        "kind": "event", "category": category, "type": types, "action": event_name,
        "dataset": "agent_gateway.audit", "module": "agent_gateway", "provider": PRODUCT,
    }  # fmt: skip
    if outcome:
        event["outcome"] = outcome
    if digest:
        event["id"] = event["hash"] = digest
    seq = get("seq")
    if isinstance(seq, int) and not isinstance(seq, bool):
        event["sequence"] = seq
    reason = _reason(record, data)
    if reason:
        event["reason"] = reason
    out: dict[str, Any] = {
        "@timestamp": get("ts"), "ecs": _ECS, "message": summary(record), "event": event, "observer": _OBSERVER,
    }  # fmt: skip
    if host:
        out["host"] = {"name": host, "hostname": host}
    if principal:
        out["user"] = {"name": principal}
    policy = _str(get("policy_sha256"))
    if rule or policy:
        ruled: dict[str, Any] = {"ruleset": PRODUCT}
        if rule:
            ruled["id"] = ruled["name"] = rule
        if policy:
            ruled["version"] = policy
        out["rule"] = ruled
    process: dict[str, Any] = {}
    if is_command:
        command = command_of(record)
        if command is not None:
            process.update(command_line=command.line, args=command.args, args_count=len(command.args),
                           name=command.name)  # fmt: skip
            if command.cwd:
                process["working_directory"] = command.cwd
        if event_name == "result":
            if _int(data.get("exit_code")) is not None:
                process["exit_code"] = data["exit_code"]
            if _str(data.get("started_at")):
                process["start"] = data["started_at"]
            if _str(data.get("ended_at")):
                process["end"] = data["ended_at"]
            took = data.get("duration_ms")
            if isinstance(took, int | float) and not isinstance(took, bool):
                event["duration"] = int(took * 1_000_000)
            if _str(data.get("cwd")):
                process["working_directory"] = data["cwd"]
        process["entity_id"] = call_id
        if _str(get("parent")):
            process["parent"] = {"entity_id": get("parent")}
        out["process"] = process
    if event_name.startswith("egress") and _str(data.get("host")):
        out["destination"] = {"domain": data["host"], "address": data["host"]}
        if _int(data.get("port")) is not None:
            out["destination"]["port"] = data["port"]
    if call_id:
        origin = data.get("origin")
        out["trace"] = {"id": trace_id_of(_str(get("parent")) or call_id, origin if isinstance(origin, dict) else None)}
        out["span"] = {"id": span_id_of(call_id)}
    error = _map(data.get("error")) if event_name == "result" else data if event_name in ("rejected", "error") else {}
    code = error.get("code")
    if isinstance(code, str) and code:
        message = error.get("message")
        out["error"] = {"code": code, "message": message} if isinstance(message, str) and message else {"code": code}
    approver = _str(data.get("by")) if event_name == "approval" and data.get("answered") else None
    related: dict[str, Any] = {"hash": [digest]} if digest else {}
    if principal or approver:
        related["user"] = sorted({u for u in (principal, approver) if u})
    if related:
        out["related"] = related
    ours: dict[str, Any] = {k: record[k] for k in _OURS if get(k)}
    if event_name == "approval":
        ours["approval"] = {k: data[k] for k in ("answered", "by", "how", "reason", "bound") if k in data}
    if data:
        ours["data"] = _rest(data)
    if get("arguments") is not None:
        ours["arguments"] = record["arguments"]
    if "sig" in record:
        ours["signed"] = True
    out["agent_gateway"] = ours
    return out


_ECS = {"version": ECS_VERSION}
_OBSERVER = {"product": PRODUCT, "vendor": PRODUCT, "type": "gateway", "version": __version__}
_OURS = ("call_id", "tool", "decision", "parent", "prev")


def _reason(record: dict[str, Any], data: dict[str, Any]) -> str | None:
    """Why, in a person's words: the first reason, a withdrawal's why, an error's message."""
    reasons = record.get("reasons")
    if isinstance(reasons, list) and reasons and isinstance(reasons[0], dict):
        message = reasons[0].get("message")
        if isinstance(message, str) and message:
            return message
    for value in (data.get("why"), data.get("message"), _map(data.get("error")).get("message")):
        if isinstance(value, str) and value:
            return value
    return None


# --- OCSF --------------------------------------------------------------------------------------
_DISPOSITIONS = {1: "Allowed", 2: "Blocked", 8: "Approved", 14: "Delayed", 25: "Rejected", 27: "Error", 0: "Unknown"}
_ACTIONS = {0: "Unknown", 1: "Allowed", 2: "Denied", 99: "Other"}
_STATUS = {0: "Unknown", 1: "Success", 2: "Failure"}


def _ocsf_verdict(record: dict[str, Any]) -> tuple[int, int, int]:
    """action_id, disposition_id and status_id of a call's record."""
    event = str(record.get("event", ""))
    decision = record.get("decision")
    data = _map(record.get("data"))
    if event == "decision":
        return {"allow": (1, 1, 1), "deny": (2, 2, 2), "ask": (99, 14, 0)}.get(str(decision), (0, 0, 0))
    if event == "approval":
        return (1, 8, 1) if decision == "allow" else (2, 2, 2)
    if event in ("approval_withdrawn", "approval_void"):
        return 2, 2, 2
    if event == "rejected":
        return 2, 25, 2
    if event == "error":
        return 2, 27, 2
    if event == "result":
        ok = data.get("status") == "ok" and _int(data.get("exit_code")) in (None, 0)
        return 1, 1, 1 if ok else 2
    return 0, 0, 0


def to_ocsf(record: dict[str, Any], host: str | None = None) -> dict[str, Any]:
    """One record as an OCSF event (see the module's docstring)."""
    event_name = str(record.get("event", "record"))
    tool = _str(record.get("tool"))
    data = _map(record.get("data"))
    command = command_of(record)
    call_id = _str(record.get("call_id"))
    is_process = tool in COMMAND_TOOLS and call_id is not None
    time_ms = _ms(record.get("ts")) or 0
    digest = _str(record.get("hash"))
    metadata: dict[str, Any] = {
        "version": OCSF_VERSION,
        "product": {"name": PRODUCT, "vendor_name": PRODUCT, "version": __version__},
        "log_name": "audit", "event_code": event_name, "original_time": record.get("ts"),
        "profiles": ["security_control"] if call_id else [],
    }  # fmt: skip
    if digest:
        metadata["uid"] = digest
    if call_id:
        metadata["correlation_uid"] = call_id
    if _int(record.get("seq")) is not None:
        metadata["sequence"] = record["seq"]
    out: dict[str, Any] = {"time": time_ms, "metadata": metadata, "message": summary(record)}
    out["device"] = {"type_id": 0, "type": "Unknown", **({"hostname": host, "name": host} if host else {})}
    if _str(record.get("principal")):
        out["actor"] = {"user": {"name": record["principal"]}, "app_name": PRODUCT}
    else:
        out["actor"] = {"app_name": PRODUCT}
    severity = {"deny": 3, "ask": 2}.get(str(record.get("decision")), 1)
    out["severity_id"], out["severity"] = severity, {1: "Informational", 2: "Low", 3: "Medium"}[severity]
    if call_id:
        action, disposition, status = _ocsf_verdict(record)
        out.update(action_id=action, action=_ACTIONS[action], disposition_id=disposition,
                   disposition=_DISPOSITIONS[disposition], status_id=status, status=_STATUS[status])  # fmt: skip
        rule = _str(record.get("rule"))
        if rule or _str(record.get("policy_sha256")):
            named = (("uid", rule), ("name", rule or "policy"), ("version", record.get("policy_sha256")))
            out["policy"] = {k: v for k, v in named if v}
    error = _map(data.get("error")) if event_name == "result" else data if event_name in ("rejected", "error") else {}
    if _str(error.get("code")):
        out["status_code"] = error["code"]
    reasons = record.get("reasons") if isinstance(record.get("reasons"), list) else []
    detail = (_str(_map(reasons[0]).get("message")) if reasons else None) or _str(error.get("message"))
    if detail:
        out["status_detail"] = detail
    if is_process:
        terminate = event_name in ("result", "interrupted")
        activity, activity_name = (2, "Terminate") if terminate else (1, "Launch")
        out.update(class_uid=1007, class_name="Process Activity", category_uid=1, category_name="System Activity")
        process: dict[str, Any] = {"uid": call_id}
        if command is not None:
            process.update(cmd_line=command.line, name=command.name)
            if command.cwd:
                process["working_directory"] = command.cwd
        if _str(record.get("parent")):
            process["parent_process"] = {"uid": record["parent"]}
        if terminate:
            if _int(data.get("exit_code")) is not None:
                out["exit_code"] = data["exit_code"]
            start, end = _ms(data.get("started_at")), _ms(data.get("ended_at"))
            if start is not None:
                out["start_time"] = start
                process["created_time"] = start
            if end is not None:
                out["end_time"] = end
                process["terminated_time"] = end
            if isinstance(data.get("duration_ms"), int | float) and not isinstance(data.get("duration_ms"), bool):
                out["duration"] = int(data["duration_ms"])
            if _str(data.get("cwd")):
                process["working_directory"] = data["cwd"]
        out["process"] = process
    else:
        activity, activity_name = 99, "Other"
        out.update(class_uid=0, class_name="Base Event", category_uid=0, category_name="Uncategorized")
        if tool:
            out["api"] = {"operation": tool, "service": {"name": PRODUCT}}
    out["activity_id"], out["activity_name"] = activity, activity_name
    out["type_uid"] = out["class_uid"] * 100 + activity
    out["type_name"] = f"{out['class_name']}: {activity_name}"
    unmapped: dict[str, Any] = {k: record[k] for k in ("event", "tool", "decision", "prev") if record.get(k)}
    if data:
        unmapped["data"] = _rest(data)
    if record.get("arguments") is not None:
        unmapped["arguments"] = record["arguments"]
    out["unmapped"] = unmapped
    return out


MAPPINGS: dict[str, Callable[[dict[str, Any], str | None], dict[str, Any]]] = {
    "jsonl": lambda record, host: record,
    "ecs": to_ecs,
    "ocsf": to_ocsf,
}


# --- sinks and the loop ------------------------------------------------------------------------
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _line(item: Any) -> bytes:
    """One event as a compact JSON line: by orjson, or by the standard library for what orjson
    refuses (an integer past 64 bits, a lone surrogate)."""
    try:
        return orjson.dumps(item) + b"\n"
    except TypeError:
        return _encode(item).encode("utf-8", "surrogatepass") + b"\n"


class Sink(Protocol):
    """Where exported items go. `send` returns once they are taken (raises ExportFailed)."""

    def send(self, items: list[Any]) -> None: ...


@dataclass
class LineSink:
    """JSON lines on a stream (stdout): taken once written and flushed."""

    stream: IO[str]
    sent: int = 0

    def send(self, items: list[Any]) -> None:
        if not items:
            return
        try:
            data = b"".join(_line(i) for i in items)
            binary = getattr(self.stream, "buffer", None)
            if binary is not None:
                self.stream.flush()
                binary.write(data)
                binary.flush()
            else:
                self.stream.write(data.decode("utf-8", "surrogatepass"))
                self.stream.flush()
        except OSError as exc:
            raise ExportFailed(f"the output could not be written: {exc.strerror or exc}") from exc
        self.sent += len(items)


class CallSink(Protocol):
    """A sink of finished calls (otlp.py's)."""

    def send_calls(self, calls: list[Call]) -> None: ...


@dataclass
class Report:
    records: int = 0
    """Records read."""
    sent: int = 0
    """Events or spans the sink took."""
    unreadable: list[str] = field(default_factory=list)
    """Where lines that are not records were (file:offset), at most a few."""
    unreadable_count: int = 0


class LineSource(Protocol):
    """Where an export reads lines from: the log's files (follow.LogReader) or the fleet's store."""

    position: Position
    signed: bool | None

    def read(self, max_bytes: int = ...) -> list[Line]: ...


def _unreadable(report: Report, line: Line) -> None:
    report.unreadable_count += 1
    if len(report.unreadable) < 5:
        report.unreadable.append(f"{line.start.file}:{line.start.offset}")


def export(
    directory: Path,
    fmt: str,
    sink: Sink | CallSink,
    selection: Selection | None = None,
    *,
    cursor: Cursor | None = None,
    follow: bool = False,
    redact_patterns: Iterable[str] = (),
    interval_s: float = 0.5,
    stop: Callable[[], bool] = lambda: False,
    max_open_calls: int = MAX_OPEN_CALLS,
    source: LineSource | None = None,
) -> Report:
    """Send the log's records (`jsonl`, `ecs`, `ocsf`: to a `Sink`) or calls (`otlp`: to a
    `CallSink`) that `selection` keeps, from the cursor's position (or the start), saving the
    cursor after each batch the sink took. With `follow`, wait for new records until `stop()`.
    Raises ExportFailed (the sink refused; the cursor stays where the sink last took), and
    CursorError (follow.py). `source`: read the records from it instead of the files in
    `directory` (the fleet's store: gateway/store/reader.py; no cursor there)."""
    selection = selection or Selection()
    clean = redactor(redact_patterns)
    collecting = gc.isenabled()
    gc.disable()  # records hold no cycles: the cyclic collector would only walk every batch again and again
    try:
        return _export(directory, fmt, sink, selection, clean, cursor, follow, interval_s, stop, max_open_calls, source)
    finally:
        if collecting:
            gc.enable()


def _export(
    directory: Path, fmt: str, sink: Sink | CallSink, selection: Selection, clean: Redactor, cursor: Cursor | None,
    follow: bool, interval_s: float, stop: Callable[[], bool], max_open_calls: int, source: LineSource | None,
) -> Report:  # fmt: skip
    host = socket.gethostname()
    if cursor is not None and source is not None:
        raise CursorError("--cursor is for the files of one host: an export from the store starts from its beginning")
    if cursor is not None:
        cursor.check(directory)
    reader: LineSource = source or LogReader(
        directory, cursor.position if cursor else Position(), cursor.signed if cursor else None
    )
    report = Report()
    everything = selection.everything
    send: Callable[[list[Any]], None] = sink.send_calls if fmt == "otlp" else sink.send  # type: ignore[union-attr]
    folder = Folder(selection, keep_records=True) if fmt == "otlp" else None
    open_at: dict[str, Position] = {}  # otlp: where each open call's first record starts
    sent_through = cursor.sent_through if cursor else 0
    while not stop():  # a stop is taken between batches: the cursor holds the last one
        lines = reader.read()
        if cursor is not None:
            cursor.signed = reader.signed
        if not lines:
            if not follow or stop():
                break
            gc.collect()  # idle: what cycles there are (an exception's traceback) go now
            time.sleep(interval_s)
            continue
        report.records += len(lines)
        if folder is None:
            batch = []
            for line in lines:
                if line.record is None:
                    _unreadable(report, line)
                elif everything or selection.matches(line.record, line.raw):
                    batch.append(MAPPINGS[fmt](clean(line.record, line.raw), host))
            _deliver(send, batch, follow, stop, interval_s)
            report.sent += len(batch)
            if cursor is not None:
                cursor.advance(lines[-1], reader.position)
                cursor.save()
        else:
            done: list[Call] = []
            last_seq = sent_through
            for line in lines:
                if line.record is None:
                    _unreadable(report, line)
                    continue
                record = clean(line.record, line.raw)
                seq = _int(record.get("seq")) or 0
                last_seq = max(last_seq, seq)
                if record.get("call_id") not in folder.calls and record.get("event") not in STARTING:
                    continue  # a late record of a call sent already, or begun before where this export began
                call = folder.add(record, line.raw)
                if call is None:
                    continue
                open_at.setdefault(call.call_id, line.start)
                if call.closed:
                    folder.pop(call.call_id)
                    open_at.pop(call.call_id, None)
                    if seq > sent_through and call.matches(selection):
                        done.append(call)
            while len(open_at) > max_open_calls:  # the oldest waits no longer: sent as it stands
                oldest = next(iter(open_at))
                open_at.pop(oldest)
                stale = folder.pop(oldest)
                if stale is not None and stale.matches(selection):
                    done.append(stale)
            _deliver(send, done, follow, stop, interval_s)
            report.sent += len(done)
            sent_through = last_seq
            if cursor is not None:
                resume = min(open_at.values()) if open_at else reader.position
                cursor.advance(lines[-1], resume, sent_through)
                cursor.save()
    if folder is not None and folder.calls and cursor is None and not follow:
        # a one-off export of a range: calls still open at its end are sent as they stand
        rest = [c for c in folder.calls.values() if c.matches(selection)]
        send(rest)
        report.sent += len(rest)
    return report


def _deliver(
    send: Callable[[list[Any]], None], items: list[Any], follow: bool, stop: Callable[[], bool], interval_s: float
) -> None:
    """Hand a batch to the sink. Following the log, a batch the sink refuses is tried again
    (waiting longer each time, up to a minute) until it is taken or `stop()`; once, it fails."""
    wait = max(interval_s, 0.1)
    while True:
        try:
            send(items)
            return
        except ExportFailed as exc:
            if not follow or stop():
                raise
            print(f"gateway audit export: {exc}; trying again in {wait:.0f} s", file=sys.stderr, flush=True)
            time.sleep(wait)
            wait = min(wait * 2, 60.0)


def warn_unreadable(report: Report, stream: IO[str] = sys.stderr) -> None:
    if report.unreadable_count:
        print(
            f"gateway audit: {report.unreadable_count} line(s) of the log are not records (at "
            f"{', '.join(report.unreadable)}): skipped; see `gateway audit verify`",
            file=stream,
        )
