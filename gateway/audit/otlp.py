"""Calls as OpenTelemetry spans, sent with the SDK's OTLP exporter (the optional `otel` extra).

One span per tool call, as the GenAI semantic conventions name tool execution:

    name        execute_tool {gen_ai.tool.name}   (the tool's name as the client called it)
    kind        SERVER for a call that came over MCP, else INTERNAL
    time        from the call's first record to its last
    attributes  gen_ai.operation.name = execute_tool, gen_ai.tool.name, gen_ai.tool.call.id (the
                call id), gen_ai.agent.name (the principal), error.type (the gateway's error code;
                `tool_error` for an MCP call, as the MCP conventions say), process.exit.code,
                agent_gateway.* (decision, final decision, rule, outcome, who approved);
                gen_ai.tool.call.arguments only when asked for (`arguments=True`: opt-in, as
                the conventions say), redacted like everything else
    MCP         mcp.method.name = tools/call, jsonrpc.request.id, mcp.session.id,
                mcp.protocol.version, network.transport (pipe for stdio, tcp for HTTP),
                network.protocol.name, when the gateway recorded how the call came
    events      gen_ai.guardrail.result for the policy's decision (result.type `decision`,
                result.value allow|ask|deny, policy.id the policy's digest, policy.rule.id the
                rule, result.reason the reason's code) and one for a supervisor's answer
                (result.type `approval`): the gateway's own values, never translated
    parent      the client's span when the call carried a W3C `traceparent` (in `_meta`), so the
                gateway's span joins the agent's trace; for a part of a call (a line of a
                session write), the carrying call's span

Trace and span ids are derived from the call ids (export.py `trace_id_of`, `span_id_of`):
exporting a call again (at-least-once delivery after a crash) sends the same span.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from gateway.audit.calls import Call
from gateway.audit.export import PRODUCT, ExportFailed, span_id_of, trace_id_of, traceparent
from gateway.version import __version__

SCOPE = InstrumentationScope("gateway.audit.otlp", __version__)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TRANSPORTS = {"stdio": "pipe", "http": "tcp"}


def _ns(ts: str) -> int | None:
    try:
        when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _put(attrs: dict[str, Any], key: str, value: Any) -> None:
    if value is None or value == "":
        return
    if isinstance(value, bool | int | float | str):
        attrs[key] = value
    else:
        attrs[key] = json.dumps(value, ensure_ascii=False, sort_keys=True)


def _guardrail(kind: str, value: str | None, call: Call, record: Mapping[str, Any], ts: int | None) -> Event:
    attrs: dict[str, Any] = {
        "gen_ai.guardrail.component.name": PRODUCT,
        "gen_ai.guardrail.source": "tool_input",
        "gen_ai.guardrail.result.type": kind,
        "gen_ai.guardrail.result.value": value or "unknown",
    }
    _put(attrs, "gen_ai.guardrail.policy.id", record.get("policy_sha256") or call.policy_sha256)
    _put(attrs, "gen_ai.guardrail.policy.rule.id", record.get("rule"))
    if kind == "decision":
        _put(attrs, "gen_ai.guardrail.result.reason", call.reason_code)
    else:
        data: Mapping[str, Any] = record["data"] if isinstance(record.get("data"), dict) else {}
        _put(attrs, "agent_gateway.approval.how", data.get("how"))
        _put(attrs, "agent_gateway.approval.by", data.get("by") if data.get("answered") else None)
    return Event("gen_ai.guardrail.result", attrs, timestamp=ts)


def span_of(call: Call, resource: Resource, arguments: bool = False) -> ReadableSpan:
    """The span of one call (its records kept: `Folder(keep_records=True)`)."""
    origin = call.origin
    tool = str(origin.get("tool") or call.tool or "unknown")
    trace_id = int(trace_id_of(call.parent or call.call_id, origin), 16)
    context = SpanContext(trace_id, int(span_id_of(call.call_id), 16), False, TraceFlags(TraceFlags.SAMPLED))
    parent: SpanContext | None = None
    client = traceparent(origin.get("traceparent"))
    if call.parent:
        parent = SpanContext(trace_id, int(span_id_of(call.parent), 16), False, TraceFlags(TraceFlags.SAMPLED))
    elif client is not None:
        parent = SpanContext(trace_id, int(client[1], 16), True, TraceFlags(client[2] & 1))
    over_mcp = origin.get("transport") in _TRANSPORTS
    attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
    _put(attrs, "gen_ai.tool.call.id", call.call_id)
    _put(attrs, "gen_ai.agent.name", call.principal)
    _put(attrs, "agent_gateway.tool", call.tool)
    _put(attrs, "agent_gateway.decision", call.decision)
    _put(attrs, "agent_gateway.final", call.final)
    _put(attrs, "agent_gateway.rule", call.rule)
    _put(attrs, "agent_gateway.outcome", call.outcome)
    _put(attrs, "agent_gateway.error.code", call.error)
    _put(attrs, "agent_gateway.approved_by", call.approved_by)
    _put(attrs, "agent_gateway.parent", call.parent)
    _put(attrs, "process.exit.code", call.exit_code)
    if not call.closed:
        attrs["agent_gateway.incomplete"] = True
    if over_mcp:
        attrs["mcp.method.name"] = "tools/call"
        attrs["network.transport"] = _TRANSPORTS[str(origin["transport"])]
        if origin.get("transport") == "http":
            attrs["network.protocol.name"] = "http"
        _put(attrs, "jsonrpc.request.id", None if origin.get("request_id") is None else str(origin["request_id"]))
        _put(attrs, "mcp.session.id", origin.get("session_id"))
        _put(attrs, "mcp.protocol.version", origin.get("protocol_version"))
    failed = call.outcome not in ("ok", "running", "waiting")
    if failed:
        attrs["error.type"] = "tool_error" if over_mcp else (call.error or "_OTHER")
    if arguments:
        first = next((r for r in call.records if r.get("arguments") is not None), None)
        if first is not None:
            _put(attrs, "gen_ai.tool.call.arguments", first["arguments"])
    events = []
    for r in call.records:
        ts = _ns(str(r.get("ts", "")))
        if r.get("event") == "decision":
            events.append(_guardrail("decision", r.get("decision"), call, r, ts))
        elif r.get("event") == "approval":
            events.append(_guardrail("approval", r.get("decision"), call, r, ts))
    start = _ns(call.when) or 0
    end = max(_ns(call.ended) or start, start)
    status = Status(StatusCode.ERROR, call.reason or call.error or call.outcome) if failed else Status(StatusCode.UNSET)
    return ReadableSpan(
        f"execute_tool {tool}", context, parent, resource, attrs, events, (),
        SpanKind.SERVER if over_mcp else SpanKind.INTERNAL, None, status, start, end, SCOPE,
    )  # fmt: skip


class SpanSink:
    """Sends finished calls as spans through an SDK span exporter (OTLPSpanExporter, or the
    SDK's in-memory one in tests); a batch the exporter does not take raises ExportFailed."""

    def __init__(self, exporter: SpanExporter, *, host: str = "", arguments: bool = False) -> None:
        self.exporter = exporter
        self.arguments = arguments
        attributes: dict[str, Any] = {"service.name": PRODUCT, "service.version": __version__}
        if host:
            attributes["host.name"] = host
        self.resource = Resource.create(attributes)
        self.sent = 0

    def send_calls(self, calls: list[Call]) -> None:
        if not calls:
            return
        spans = [span_of(c, self.resource, self.arguments) for c in calls]
        result = self.exporter.export(spans)
        if result is not SpanExportResult.SUCCESS:
            raise ExportFailed(f"the OTLP exporter did not take {len(spans)} span(s)")
        self.sent += len(spans)

    def close(self) -> None:
        self.exporter.shutdown()


def otlp_exporter(endpoint: str | None, timeout_s: float = 10.0) -> SpanExporter:
    """The SDK's OTLP/HTTP (protobuf) span exporter. `endpoint` (the full traces URL, e.g.
    http://collector:4318/v1/traces) or, when None, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
    OTEL_EXPORTER_OTLP_ENDPOINT; headers from OTEL_EXPORTER_OTLP_HEADERS (the SDK reads them)."""
    return OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)
