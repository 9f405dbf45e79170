"""Recording a call, one of the gate's jobs (gateway/pipeline.py composes them): which call this
thread is handling (its id, whether a record names it yet, when it started and was decided, for
/metrics), the envelopes that end a call, and the records of a refusal, a failure, a decision and
a result. Nothing executes unless the decision record is on disk: `decision` raises
AuditUnavailable when it is not, and the caller denies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from gateway import families, metrics
from gateway.audit import AuditUnavailable, origin
from gateway.audit.sink import AuditSink
from gateway.decision import Decision


@dataclass
class Call:
    """The call `Gateway.handle` is handling on this thread: its call_id, and whether a record
    naming it has been written. A call a tool handles as several (each line of a session write,
    each startup command) gets its own call_id; their records name this one as `parent`."""

    call_id: str
    recorded: bool = False
    started: float = field(default_factory=time.perf_counter)
    decided: float | None = None
    """When its decision was on disk (perf_counter): the run's latency counts from there."""


CURRENT: ContextVar[Call | None] = ContextVar("gateway_call", default=None)


def current_call_id() -> str | None:
    """The call being handled on this thread (None: none is)."""
    current = CURRENT.get()
    return current.call_id if current is not None else None


def parent_of(call_id: str) -> str | None:
    """The call that carries `call_id` (the outer call `handle` is handling), or None when
    `call_id` is that call itself or no call is being handled (a keep-alive restart)."""
    current = CURRENT.get()
    return current.call_id if current is not None and current.call_id != call_id else None


def mark_recorded(call_id: str) -> None:
    current = CURRENT.get()
    if current is not None and current.call_id == call_id:
        current.recorded = True


def timed(call_id: str, tool: str, status: str | None = None) -> None:
    """The call's decision (status None) or result is on disk: its latency, for /metrics (an
    addition under a lock: nothing here waits on a scrape)."""
    current = CURRENT.get()
    if current is None or current.call_id != call_id:
        return  # a part of a call (its own id) or no call being handled: the outer call counts
    now = time.perf_counter()
    if status is None:
        current.decided = now
        metrics.DECISION_SECONDS.labels(tool).observe(now - current.started)
    elif current.decided is not None:
        metrics.RUN_SECONDS.labels(tool, status).observe(now - current.decided)


_DIGESTED = frozenset({"input", "content", "old", "new", "edits", "value", "default", "answer"})
"""Raw arguments that may carry a secret or bulk (typed input, file content, an env value): a
rejected call's record keeps their size and digest."""


def raw_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """A caller's arguments as sent, for the record of a call refused before its call model
    existed (INVALID_INPUT, BUSY): text that may be a secret is kept as its size and digest."""
    out: dict[str, Any] = {}
    for k, v in arguments.items():
        if k in _DIGESTED and v is not None:
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            data = text.encode("utf-8", "surrogatepass")
            out[k] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        else:
            out[k] = v
    return out


_UNRECORDED = frozenset({"stdout", "stderr", "output", "content", "image", "json", "entries", "matches", "value"})


def new_call_id() -> str:
    """A call's id in the audit log and its envelope."""
    return uuid.uuid4().hex[:16]


def error(call_id: str, status: str, code: str, message: str) -> dict[str, Any]:
    """An envelope ending a call with `code` (docs/tools.md lists the codes)."""
    return {"status": status, "call_id": call_id, "error": {"code": code, "message": message}}


def denied(call_id: str, code: str, decision: Decision) -> dict[str, Any]:
    out = error(call_id, "denied", code, "; ".join(r.message for r in decision.reasons))
    out["rule"] = decision.rule
    out["reasons"] = [r.to_json() for r in decision.reasons]
    return out


class Recorder:
    """What the gate writes to the audit log about a call, and the envelopes that come of it."""

    def __init__(self, audit: AuditSink) -> None:
        self.audit = audit

    def refuse(
        self, call_id: str, principal: str, tool: str, arguments: dict[str, Any], envelope: dict[str, Any]
    ) -> dict[str, Any]:
        """Record a call that ended before the policy decided it (`rejected`: its tool, its
        arguments, the error; `parent` when another call carried it) and return its envelope.
        No call leaves no record: if this one cannot be written, the envelope says so."""
        parent = parent_of(call_id)
        try:
            self.audit.append(
                "rejected", call_id=call_id, principal=principal, tool=tool, arguments=arguments,
                decision="deny" if envelope.get("status") == "denied" else None,
                data={**(envelope.get("error") or {"status": envelope.get("status")}), **origin.current()},
                **({"parent": parent} if parent else {}),
            )  # fmt: skip
            mark_recorded(call_id)
        except AuditUnavailable as exc:
            envelope = {**envelope, "warning": {"code": "AUDIT_UNAVAILABLE", "message": f"not recorded: {exc}"}}
        return envelope

    def failed(self, call: Any, call_id: str, current: Call, envelope: dict[str, Any]) -> dict[str, Any]:
        """Record a call that ended in an exception: `error`, with its arguments when nothing
        recorded them yet. The envelope comes back whatever the log does."""
        given: dict[str, Any] = {}
        if not current.recorded:
            with contextlib.suppress(Exception):
                given = {"arguments": families.arguments(call)}
        with contextlib.suppress(Exception):
            self.audit.append(
                "error", call_id=call_id, principal=call.principal, tool=call.tool, data=envelope["error"], **given
            )
        return envelope

    def decision(
        self, base: dict[str, Any], arguments: dict[str, Any], decision: Decision, data: dict[str, Any] | None
    ) -> None:
        """The decision record, durably; raises AuditUnavailable when it is not on disk."""
        self.audit.append(
            "decision",
            **base,
            arguments=arguments,
            decision=decision.verdict.label,
            rule=decision.rule,
            reasons=[r.to_json() for r in decision.reasons],
            data={**(data or {}), **origin.current()},  # how the call came (MCP): for exporters
        )
        mark_recorded(base["call_id"])
        timed(base["call_id"], base["tool"])

    def result(self, base: dict[str, Any], outcome: dict[str, Any], event: str = "result") -> dict[str, Any]:
        """Audit what happened (without bulky or secret fields) and build the envelope."""
        # the call's own id, even when the outcome is a part's (a line of a session write)
        envelope = {"call_id": base["call_id"], **{k: v for k, v in outcome.items() if k != "call_id"}}
        recorded = {k: v for k, v in outcome.items() if k not in _UNRECORDED}
        for k in ("stdout", "stderr", "output"):
            if isinstance(outcome.get(k), str):
                recorded[f"{k}_bytes"] = len(outcome[k])
        try:
            self.audit.append(event, **base, data=recorded)
        except AuditUnavailable as exc:
            envelope["warning"] = {"code": "AUDIT_UNAVAILABLE", "message": f"the result could not be recorded: {exc}"}
        else:
            timed(base["call_id"], base["tool"], str(outcome.get("status")))
        return envelope
