"""`gateway audit export`: ECS and OCSF events checked against their published field
definitions, OpenTelemetry spans through the SDK's in-memory exporter and through a real
OTLP/HTTP receiver, redaction before anything leaves, and the streaming form: following the log,
resuming from a cursor, at least once, never past a record that could still vanish, and never
on a log that changed under the cursor.

The ledger comes from a real gateway behind the real MCP server (the SDK's client, in memory),
signed as `gateway serve` signs it."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.approval import CallbackApprover
from gateway.audit import AuditLog, canonical, digest, open_signed, records
from gateway.audit.export import SECRET_WORDS, export, span_id_of, to_ecs, to_ocsf
from gateway.audit.follow import Cursor
from gateway.audit.otlp import SpanSink
from gateway.audit.records import _IN_TEXT_HINT, SECRET_NAME
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy
from gateway.server.app import GatewayServer
from tests.conftest import eventually

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def cli(audit: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "audit", *args, "--audit-dir", str(audit)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "XDG_STATE_HOME": str(audit.parent / "state"), **kw.pop("env", {})}, **kw,
    )  # fmt: skip


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def served(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> Path:
    """A signed log of calls made over MCP (one with the client's trace context) and directly."""
    audit = tmp_path / "audit"
    gw = Gateway(policy, open_signed(audit, tmp_path / "keys"), CallbackApprover(lambda request: True, who="alice"))
    server = GatewayServer(gw, "agent")

    async def calls() -> None:
        async with Client(server.mcp) as c:
            await c.call_tool("run", {"command": "echo hello"}, meta={"traceparent": TRACEPARENT})  # type: ignore[typeddict-unknown-key]
            await c.call_tool("run", {"command": "rm -f victim"})
            await c.call_tool("run", {"command": "curl https://example.com"})
            await c.call_tool("run", {"timeout_ms": 5})  # no command: rejected before the policy

    asyncio.run(calls())
    gw.handle(RunCall(principal="agent", command="python3 -c 'import sys; sys.exit(3)'"))
    gw.close()
    return audit


def by_command(calls: list[Any]) -> dict[str, Any]:
    return {c.command if hasattr(c, "command") else c["command"]: c for c in calls}


# --- ECS, against its published field definitions ------------------------------------------------
# ECS 8.11.0 (elastic/ecs generated/ecs/ecs_flat.yml): every field of the field sets the export
# uses, name -> type ("[]": an array). Fields under agent_gateway.* are ours (a custom namespace).
ECS_FIELDS = {
    "@timestamp": "date", "destination.address": "keyword", "destination.domain": "keyword",
    "destination.port": "long", "ecs.version": "keyword", "error.code": "keyword", "error.id": "keyword",
    "error.message": "match_only_text", "error.stack_trace": "wildcard", "error.type": "keyword",
    "event.action": "keyword", "event.agent_id_status": "keyword", "event.category": "keyword[]",
    "event.code": "keyword", "event.created": "date", "event.dataset": "keyword", "event.duration": "long",
    "event.end": "date", "event.hash": "keyword", "event.id": "keyword", "event.ingested": "date",
    "event.kind": "keyword", "event.module": "keyword", "event.original": "keyword", "event.outcome": "keyword",
    "event.provider": "keyword", "event.reason": "keyword", "event.reference": "keyword",
    "event.risk_score": "float", "event.risk_score_norm": "float", "event.sequence": "long",
    "event.severity": "long", "event.start": "date", "event.timezone": "keyword", "event.type": "keyword[]",
    "event.url": "keyword", "host.architecture": "keyword", "host.domain": "keyword", "host.hostname": "keyword",
    "host.id": "keyword", "host.ip": "ip[]", "host.mac": "keyword[]", "host.name": "keyword",
    "host.pid_ns_ino": "keyword", "host.type": "keyword", "host.uptime": "long", "labels": "object",
    "message": "match_only_text", "observer.egress": "object", "observer.hostname": "keyword",
    "observer.ingress": "object", "observer.ip": "ip[]", "observer.mac": "keyword[]", "observer.name": "keyword",
    "observer.product": "keyword", "observer.serial_number": "keyword", "observer.type": "keyword",
    "observer.vendor": "keyword", "observer.version": "keyword", "process.args": "keyword[]",
    "process.args_count": "long", "process.command_line": "wildcard", "process.end": "date",
    "process.entity_id": "keyword", "process.env_vars": "keyword[]", "process.executable": "keyword",
    "process.exit_code": "long", "process.interactive": "boolean", "process.io": "object",
    "process.name": "keyword", "process.parent.entity_id": "keyword", "process.pgid": "long",
    "process.pid": "long", "process.start": "date", "process.title": "keyword", "process.tty": "object",
    "process.uptime": "long", "process.vpid": "long", "process.working_directory": "keyword",
    "related.hash": "keyword[]", "related.hosts": "keyword[]", "related.ip": "ip[]", "related.user": "keyword[]",
    "rule.author": "keyword[]", "rule.category": "keyword", "rule.description": "keyword", "rule.id": "keyword",
    "rule.license": "keyword", "rule.name": "keyword", "rule.reference": "keyword", "rule.ruleset": "keyword",
    "rule.uuid": "keyword", "rule.version": "keyword", "span.id": "keyword", "tags": "keyword[]",
    "trace.id": "keyword", "user.domain": "keyword", "user.email": "keyword", "user.full_name": "keyword",
    "user.hash": "keyword", "user.id": "keyword", "user.name": "keyword", "user.roles": "keyword[]",
}  # fmt: skip
# the allowed values of the categorisation fields, and the types each category expects
ECS_KINDS = {"alert", "asset", "enrichment", "event", "metric", "state", "pipeline_error", "signal"}
ECS_OUTCOMES = {"failure", "success", "unknown"}
ECS_CATEGORY_TYPES = {
    "api": {"access", "admin", "allowed", "change", "creation", "deletion", "denied", "end", "info", "start", "user"},
    "authentication": {"start", "end", "info"},
    "configuration": {"access", "change", "creation", "deletion", "info"},
    "process": {"access", "change", "end", "info", "start"},
    "network": {"access", "allowed", "connection", "denied", "end", "info", "protocol", "start"},
}  # fmt: skip


def flat(event: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for k, v in event.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and name not in ECS_FIELDS:
            yield from flat(v, name + ".")
        else:
            yield name, v


def check_ecs_type(name: str, value: Any) -> None:
    kind = ECS_FIELDS[name]
    if kind.endswith("[]"):
        assert isinstance(value, list) and value, name
        kind, values = kind[:-2], value
    else:
        assert not isinstance(value, list), name
        values = [value]
    for v in values:
        if kind in ("keyword", "wildcard", "match_only_text"):
            assert isinstance(v, str), name
        elif kind == "long":
            assert isinstance(v, int) and not isinstance(v, bool), name
        elif kind == "date":
            datetime.fromisoformat(v.replace("Z", "+00:00"))
        elif kind == "object":
            assert isinstance(v, dict), name


def test_ecs_events_use_only_published_fields(served: Path) -> None:
    out = cli(served, "export", "--format", "ecs")
    assert out.returncode == 0, out.stderr
    events = lines(out.stdout)
    assert len(events) == len([r for _, _, r, _ in records(served) if r])
    for e in events:
        for name, value in flat(e):
            if name.startswith("agent_gateway."):
                continue
            assert name in ECS_FIELDS, f"{name} is not an ECS field"
            check_ecs_type(name, value)
        ev = e["event"]
        assert ev["kind"] in ECS_KINDS and ev.get("outcome", "unknown") in ECS_OUTCOMES
        expected = set().union(*(ECS_CATEGORY_TYPES[c] for c in ev["category"]))
        assert set(ev["type"]) <= expected, (ev["category"], ev["type"])
        assert all(ECS_CATEGORY_TYPES[c] & set(ev["type"]) for c in ev["category"])
        assert ev["id"] == ev["hash"] == e["related"]["hash"][0]  # the idempotency key: the record's hash
    decisions = {e["process"]["command_line"]: e for e in events if e["event"]["action"] == "decision"}
    echo, curl = decisions["echo hello"], decisions["curl https://example.com"]
    assert echo["process"]["args"] == ["echo", "hello"] and echo["process"]["args_count"] == 2
    assert echo["event"]["type"] == ["allowed", "info"] and echo["event"]["outcome"] == "success"
    assert (curl["event"]["type"][0], curl["event"]["outcome"], curl["rule"]["id"]) == ("denied", "failure", "net")
    assert echo["user"]["name"] == "agent" and echo["rule"]["version"] == "test"
    assert echo["trace"]["id"] == CLIENT_TRACE  # the agent's own trace, as the span's
    exits = {
        e["process"]["entity_id"]: e["process"].get("exit_code") for e in events if e["event"]["action"] == "result"
    }
    assert sorted(exits.values()) == [0, 0, 3]


# --- OCSF, against the Process Activity class --------------------------------------------------
# OCSF 1.8.0 (ocsf/ocsf-schema): Process Activity (1007, extends System Activity, extends the Base
# Event) and the objects the export fills, each with every attribute the schema defines.
OCSF_PROCESS_ACTIVITY = {
    "action": "optional", "action_id": "recommended", "activity_id": "required", "activity_name": "optional",
    "actor": "required", "actual_permissions": "recommended", "ai_model": "recommended", "api": "optional",
    "attacks": "optional", "authorizations": "optional", "category_name": "optional", "category_uid": "required",
    "class_name": "optional", "class_uid": "required", "cloud": "profile", "confidence": "optional",
    "confidence_id": "recommended", "confidence_score": "optional", "count": "optional", "device": "required",
    "disposition": "optional", "disposition_id": "recommended", "duration": "optional", "end_time": "optional",
    "enrichments": "optional", "exit_code": "recommended", "firewall_rule": "optional",
    "injection_type": "recommended", "injection_type_id": "recommended", "is_alert": "recommended",
    "launch_type": "recommended", "launch_type_id": "recommended", "malware": "optional",
    "malware_scan_info": "optional", "message": "recommended", "message_context": "optional",
    "metadata": "required", "module": "recommended", "observables": "recommended", "osint": "profile",
    "policy": "optional", "process": "required", "raw_data": "optional", "raw_data_hash": "optional",
    "raw_data_size": "optional", "requested_permissions": "recommended", "risk_details": "optional",
    "risk_level": "optional", "risk_level_id": "optional", "risk_score": "optional", "severity": "optional",
    "severity_id": "required", "start_time": "optional", "status": "recommended", "status_code": "recommended",
    "status_detail": "recommended", "status_id": "recommended", "time": "required", "timezone_offset": "recommended",
    "type_name": "optional", "type_uid": "required", "unmapped": "optional",
}  # fmt: skip
OCSF_BASE_REQUIRED = {"activity_id", "category_uid", "class_uid", "metadata", "severity_id", "time", "type_uid"}
OCSF_OBJECTS = {
    "metadata": {"correlation_uid", "data_classification", "data_classifications", "debug", "event_code", "extension",
                 "extensions", "is_truncated", "labels", "log_format", "log_level", "log_name", "log_provider",
                 "log_source", "log_version", "logged_time", "loggers", "modified_time", "original_event_uid",
                 "original_time", "processed_time", "product", "profiles", "reporter", "sequence", "source", "tags",
                 "tenant_uid", "total_queued_duration", "transformation_info_list", "transmit_time", "type", "uid",
                 "untruncated_size", "version"},
    "product": {"cpe_name", "data_classification", "data_classifications", "feature", "lang", "name", "path", "uid",
                "url_string", "vendor_name", "version"},
    "actor": {"app_name", "app_uid", "authorizations", "idp", "invoked_by", "process", "session", "user"},
    "user": {"account", "credential_uid", "display_name", "domain", "email_addr", "forward_addr", "full_name",
             "groups", "has_mfa", "ldap_person", "name", "org", "phone_number", "programmatic_credentials",
             "risk_level", "risk_level_id", "risk_score", "type", "type_id", "uid", "uid_alt"},
    "process": {"ancestry", "cmd_line", "container", "cpid", "created_time", "environment_variables", "file",
                "integrity", "integrity_id", "lineage", "loaded_modules", "name", "namespace_pid", "parent_process",
                "path", "pid", "ptid", "sandbox", "session", "terminated_time", "tid", "uid", "user",
                "working_directory", "xattributes"},
    "policy": {"data", "desc", "group", "is_applied", "name", "type", "uid", "version"},
    "api": {"group", "operation", "request", "response", "service", "token", "version"},
    "service": {"labels", "name", "tags", "uid", "version"},
    "device": {"hostname", "name", "type", "type_id", "uid", "ip", "os", "domain"},  # of its 60: the ones we fill
}  # fmt: skip
OCSF_ENUMS = {
    "activity_id": {0, 1, 2, 3, 4, 5, 99}, "action_id": {0, 1, 2, 99}, "status_id": {0, 1, 2, 99},
    "severity_id": {0, 1, 2, 3, 4, 5, 6, 99}, "disposition_id": set(range(28)) | {99},
}  # fmt: skip


def check_ocsf_object(kind: str, value: dict[str, Any]) -> None:
    assert set(value) <= OCSF_OBJECTS[kind], (kind, set(value) - OCSF_OBJECTS[kind])
    for k, v in value.items():
        if k in ("product", "user", "policy", "api", "service"):
            check_ocsf_object(k, v)
        elif k == "parent_process":
            check_ocsf_object("process", v)


def test_ocsf_events_follow_the_process_activity_class(served: Path) -> None:
    out = cli(served, "export", "--format", "ocsf")
    assert out.returncode == 0, out.stderr
    events = lines(out.stdout)
    for e in events:
        assert e["type_uid"] == e["class_uid"] * 100 + e["activity_id"]
        assert set(e) >= OCSF_BASE_REQUIRED and {"version", "product"} <= set(e["metadata"])
        for name, allowed in OCSF_ENUMS.items():
            assert e.get(name, 0) in allowed, name
        if e["class_uid"] == 1007:
            assert e["category_uid"] == 1 and e["activity_id"] in (1, 2)
            assert set(e) <= set(OCSF_PROCESS_ACTIVITY)
            assert {k for k, v in OCSF_PROCESS_ACTIVITY.items() if v == "required"} <= set(e)
            assert e["process"]["uid"] == e["metadata"]["correlation_uid"]  # at least one of pid, uid, cpid
        else:
            assert (e["class_uid"], e["category_uid"], e["activity_id"]) == (0, 0, 99)
        for kind in ("metadata", "actor", "device", "process", "policy", "api"):
            if kind in e:
                check_ocsf_object(kind, e[kind])
    launches = {
        (e["process"].get("cmd_line"), e["metadata"]["event_code"]): e for e in events if e["class_uid"] == 1007
    }
    rm_asked, rm_answer = (
        launches[("rm -f victim", "decision")],
        next(e for e in events if e["metadata"]["event_code"] == "approval"),
    )
    assert (rm_asked["action_id"], rm_asked["disposition_id"], rm_asked["disposition"]) == (99, 14, "Delayed")
    assert (rm_answer["action_id"], rm_answer["disposition_id"], rm_answer["disposition"]) == (1, 8, "Approved")
    curl = launches[("curl https://example.com", "decision")]
    assert (curl["action_id"], curl["disposition_id"], curl["policy"]["uid"]) == (2, 2, "net")
    ended = [e for e in events if e["activity_id"] == 2]
    assert sorted(e["exit_code"] for e in ended) == [0, 0, 3] and all(e["duration"] >= 0 for e in ended)
    rejected = next(e for e in events if e["metadata"]["event_code"] == "rejected")
    assert (rejected["disposition_id"], rejected["status_code"]) == (25, "INVALID_INPUT")
    assert len({e["metadata"]["uid"] for e in events}) == len(events)  # each record's hash, once


# --- OpenTelemetry -------------------------------------------------------------------------------
def test_one_span_per_call_named_as_the_genai_conventions_say(served: Path) -> None:
    memory = InMemorySpanExporter()
    report = export(served, "otlp", SpanSink(memory))
    spans = {s.attributes["gen_ai.tool.call.id"]: s for s in memory.get_finished_spans()}  # type: ignore[index]
    calls = by_command([json.loads(line) for line in cli(served, "calls", "--json").stdout.splitlines()])
    assert report.sent == len(spans) == len(calls) == 5
    for call in calls.values():
        span = spans[call["call_id"]]
        assert span.name == "execute_tool run"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"  # type: ignore[index]
        assert span.attributes["gen_ai.tool.name"] == "run"  # type: ignore[index]
        assert span.attributes["gen_ai.agent.name"] == "agent"  # type: ignore[index]
        assert span.context.span_id == int(span_id_of(call["call_id"]), 16)
        assert "gen_ai.tool.call.arguments" not in span.attributes  # type: ignore[operator]  # opt-in only
    echo = spans[calls["echo hello"]["call_id"]]
    # it came over MCP with the client's trace context: a server span, child of the client's span
    assert echo.kind is SpanKind.SERVER and echo.parent is not None and echo.parent.is_remote
    assert (echo.context.trace_id, echo.parent.span_id) == (int(CLIENT_TRACE, 16), int(CLIENT_SPAN, 16))
    assert echo.attributes["mcp.method.name"] == "tools/call"  # type: ignore[index]
    assert echo.attributes["network.transport"] == "pipe"  # type: ignore[index]
    assert echo.attributes["jsonrpc.request.id"]  # type: ignore[index]
    assert echo.status.status_code is StatusCode.UNSET and echo.attributes["process.exit.code"] == 0  # type: ignore[index]
    [guard] = echo.events
    assert guard.name == "gen_ai.guardrail.result"
    assert dict(guard.attributes or {}).items() >= {
        "gen_ai.guardrail.result.type": "decision", "gen_ai.guardrail.result.value": "allow",
        "gen_ai.guardrail.policy.rule.id": "anything", "gen_ai.guardrail.policy.id": "test",
        "gen_ai.guardrail.component.name": "agent-gateway",
    }.items()  # fmt: skip
    rm = spans[calls["rm -f victim"]["call_id"]]
    assert [(e.attributes or {})["gen_ai.guardrail.result.value"] for e in rm.events] == ["ask", "allow"]
    assert (rm.events[1].attributes or {})["agent_gateway.approval.by"] == "alice"
    curl = spans[calls["curl https://example.com"]["call_id"]]
    assert curl.status.status_code is StatusCode.ERROR and curl.attributes["error.type"] == "tool_error"  # type: ignore[index]
    direct = spans[calls["python3 -c 'import sys; sys.exit(3)'"]["call_id"]]
    # not over MCP: an internal span in a trace of its own, with the gateway's error code
    assert direct.kind is SpanKind.INTERNAL and direct.parent is None and "mcp.method.name" not in direct.attributes  # type: ignore[operator]
    assert direct.attributes["process.exit.code"] == 3  # type: ignore[index]
    again = InMemorySpanExporter()
    export(served, "otlp", SpanSink(again))  # sent again (at least once): the same spans
    assert {s.context.span_id for s in again.get_finished_spans()} == {s.context.span_id for s in spans.values()}


class Receiver:
    """A small OTLP/HTTP receiver: takes ExportTraceServiceRequest protobufs at /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.status = 200
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if owner.status == 200 and self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    for rs in request.resource_spans:
                        for ss in rs.scope_spans:
                            owner.spans.extend((rs.resource, s) for s in ss.spans)
                self.send_response(owner.status if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in kvs}


def test_spans_reach_a_real_otlp_http_receiver(served: Path, receiver: Receiver, tmp_path: Path) -> None:
    out = cli(served, "export", "--format", "otlp", "--endpoint", receiver.url, "--arguments")
    assert out.returncode == 0, out.stderr
    assert len(receiver.spans) == 5 and "5 span(s) sent" in out.stderr
    resource, echo = next((r, s) for r, s in receiver.spans if attributes(s.attributes).get("process.exit.code") == 0
                          and s.trace_id.hex() == CLIENT_TRACE)  # fmt: skip
    assert attributes(resource.attributes)["service.name"] == "agent-gateway"
    assert echo.name == "execute_tool run" and echo.parent_span_id.hex() == CLIENT_SPAN
    assert json.loads(attributes(echo.attributes)["gen_ai.tool.call.arguments"])["command"] == "echo hello"
    assert [e.name for e in echo.events] == ["gen_ai.guardrail.result"]
    # nothing is sent unless somebody says where
    unset = {k: "" for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")}
    nowhere = cli(served, "export", "--format", "otlp", env=unset)
    assert nowhere.returncode == 2 and "needs --endpoint" in nowhere.stderr


def test_a_receiver_that_refuses_leaves_the_cursor_where_it_was(
    served: Path, receiver: Receiver, tmp_path: Path
) -> None:
    cursor = tmp_path / "otlp.cursor"
    receiver.status = 400  # not retried by the exporter: refused at once
    out = cli(served, "export", "--format", "otlp", "--endpoint", receiver.url, "--cursor", str(cursor))
    assert out.returncode == 1 and "did not take" in out.stderr
    assert not cursor.exists() and receiver.spans == []
    receiver.status = 200
    out = cli(served, "export", "--format", "otlp", "--endpoint", receiver.url, "--cursor", str(cursor))
    assert out.returncode == 0, out.stderr
    assert len(receiver.spans) == 5
    out = cli(served, "export", "--format", "otlp", "--endpoint", receiver.url, "--cursor", str(cursor))
    assert out.returncode == 0 and len(receiver.spans) == 5  # nothing new: nothing sent again


# --- redaction before anything leaves ------------------------------------------------------------
def test_nothing_leaves_unredacted(tmp_path: Path, receiver: Receiver) -> None:
    """A log written before a name was redacted (or by a writer that did not know it): the
    values stay in the log, and no export carries them."""
    audit = tmp_path / "audit"
    audit.mkdir()
    fields = [
        {"ts": "2026-11-25T10:00:00.000000Z", "event": "decision", "call_id": "c1", "principal": "agent",
         "tool": "run", "decision": "allow", "rule": "deploy",
         "arguments": {"command": "deploy --api-key sk-live-1234567890 now", "env": {"DEPLOY_TOKEN": "tok-abcdef"}},
         "data": {"customer_id": "cust-998877", "context": {"env": {"GITHUB_TOKEN": "ghp-secretvalue"}}}},
        {"ts": "2026-11-25T10:00:01.000000Z", "event": "result", "call_id": "c1", "principal": "agent",
         "tool": "run", "data": {"status": "ok", "exit_code": 0, "customer_id": "cust-998877"}},
    ]  # fmt: skip
    prev, text = "", ""
    for seq, f in enumerate(fields, 1):
        r = {**f, "seq": seq, "prev": prev}
        r["hash"] = prev = digest(r)
        text += canonical(r) + "\n"
    (audit / "audit-000001.jsonl").write_text(text)
    secrets = ("sk-live-1234567890", "tok-abcdef", "ghp-secretvalue", "cust-998877")
    for fmt in ("jsonl", "ecs", "ocsf"):
        out = cli(audit, "export", "--format", fmt, "--redact", "customer")
        assert out.returncode == 0 and len(lines(out.stdout)) == 2, out.stderr
        assert not [s for s in secrets if s in out.stdout], fmt
        assert "[REDACTED]" in out.stdout
    for verb in ("query", "calls"):
        out = cli(audit, verb, "--format", "jsonl", "--redact", "customer")
        assert not [s for s in secrets if s in out.stdout], verb
    out = cli(audit, "export", "--format", "otlp", "--endpoint", receiver.url, "--arguments", "--redact", "customer")
    assert out.returncode == 0 and len(receiver.spans) == 1, out.stderr
    sent = str([(s.attributes, s.events) for _, s in receiver.spans])
    assert "deploy --api-key" in sent and not [s for s in secrets if s in sent]
    assert all(s in (audit / "audit-000001.jsonl").read_text() for s in secrets)  # the log itself is untouched


# --- following the log, resumable, at least once ---------------------------------------------------
def test_follow_resumes_from_its_cursor_and_never_skips(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    audit, cursor, got = tmp_path / "audit", tmp_path / "ecs.cursor", tmp_path / "got.jsonl"
    log = open_signed(audit, tmp_path / "keys")
    for n in range(5):
        log.append("note", data={"n": n})

    def follower() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "audit", "export", "--follow", "--format", "ecs",
             "--cursor", str(cursor), "--audit-dir", str(audit)],
            stdout=got.open("ab"), stderr=subprocess.PIPE,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        )  # fmt: skip

    def sent() -> list[int]:
        return [e["event"]["sequence"] for e in lines(got.read_text())]

    proc = follower()
    assert eventually(lambda: len(set(sent())) >= 5)
    for n in range(5, 10):  # written while it follows
        log.append("note", data={"n": n})
    assert eventually(lambda: len(set(sent())) >= 10)
    proc.send_signal(signal.SIGKILL)  # no goodbye: the cursor is whatever it last saved
    proc.wait(60)
    before_kill = max(sent())
    for n in range(10, 15):  # written while nobody follows
        log.append("note", data={"n": n})
    proc = follower()
    last = max(r["seq"] for _, _, r, _ in records(audit) if r)
    assert eventually(lambda: last in sent())
    proc.send_signal(signal.SIGTERM)  # a clean stop: the batch in hand is finished and its cursor saved
    assert proc.wait(60) == 0
    seqs = sent()
    written = [r["seq"] for _, _, r, _ in records(audit) if r]  # the writer's own pin first, then 15 notes
    assert sorted(set(seqs)) == written and len(written) >= 15  # every record, at least once
    assert all(a < b or b <= before_kill for a, b in itertools.pairwise(seqs))  # in order; repeats only at the restart
    assert json.loads(cursor.read_text())["seq"] == written[-1]


def test_a_commit_still_being_written_is_not_sent(tmp_path: Path) -> None:
    """Records after the last signature (a commit half written, or cut by a crash and moved
    aside by `repair` later) never leave: they may never be part of the log."""
    audit = tmp_path / "audit"
    log = open_signed(audit, tmp_path / "keys")
    for n in range(3):
        log.append("note", data={"n": n})
    signed = [r for _, _, r, _ in records(audit) if r]
    last = signed[-1]
    unsigned = {"ts": last["ts"], "event": "note", "data": {"n": "unsigned"}, "seq": last["seq"] + 1,
                "prev": last["hash"]}  # fmt: skip
    unsigned["hash"] = digest(unsigned)
    with (audit / "audit-000001.jsonl").open("a") as f:
        f.write(canonical(unsigned) + "\n")
    out = cli(audit, "export", "--format", "jsonl")
    assert [r["seq"] for r in lines(out.stdout)] == [r["seq"] for r in signed]


def test_a_log_changed_under_the_cursor_stops_the_export(tmp_path: Path) -> None:
    """A cursor names the last record it sent by place and hash. If the log there is another
    (rewritten, truncated and refilled, swapped for a copy), the export stops and says so:
    going on from the same offset would skip or repeat records without anybody knowing."""
    audit, cursor = tmp_path / "audit", tmp_path / "c"
    log = AuditLog(audit)
    for n in range(4):
        log.append("note", data={"n": n})
    assert cli(audit, "export", "--cursor", str(cursor)).returncode == 0
    del log
    for f in audit.glob("audit-*.jsonl"):
        f.unlink()
    log = AuditLog(audit)
    for n in range(6):
        log.append("note", data={"n": f"rewritten {n}"})
    out = cli(audit, "export", "--cursor", str(cursor))
    assert out.returncode == 2 and out.stdout == ""
    assert "no longer holds seq 4" in out.stderr and "gateway audit verify" in out.stderr
    assert Cursor.load(cursor, "jsonl").seq == 4  # left as it was
    other = cli(audit, "export", "--format", "ecs", "--cursor", str(cursor))
    assert other.returncode == 2 and "is for --format jsonl" in other.stderr


def test_a_network_connection_is_a_network_event() -> None:
    allowed = {"ts": "2026-11-25T10:00:00.000000Z", "event": "egress_allowed", "call_id": "c", "principal": "agent",
               "tool": "run", "decision": "allow",
               "rule": "pypi", "data": {"host": "pypi.org", "port": 443, "via": "connect"}}  # fmt: skip
    e = to_ecs(allowed)
    assert (e["event"]["category"], e["event"]["type"]) == (["network"], ["allowed", "connection"])
    assert e["destination"] == {"domain": "pypi.org", "address": "pypi.org", "port": 443}
    for name, value in flat({k: v for k, v in e.items() if k != "agent_gateway"}):
        assert name in ECS_FIELDS, name
        check_ecs_type(name, value)
    denied = to_ecs({**allowed, "event": "egress_denied", "decision": "deny"})
    assert (denied["event"]["type"], denied["event"]["outcome"]) == (["denied"], "failure")


def test_mappings_take_any_record_without_failing() -> None:
    """A record of any shape the log may hold (old versions, other events) maps to a valid event."""
    odd = [{}, {"event": 3, "ts": None}, {"event": "result", "tool": "run", "call_id": "x", "data": "not a map"},
           {"event": "decision", "tool": "run", "call_id": "y", "arguments": {"command": {"omitted": "x"}},
            "data": {"commands": "nope"}}]  # fmt: skip
    for r in odd:
        assert to_ecs(r)["ecs"]["version"] and to_ocsf(r)["metadata"]["version"]


def test_the_quick_look_for_secrets_covers_every_name_and_text_pattern() -> None:
    """A record skips the redaction walk only when its line holds none of these words: each
    alternative of the secret-name pattern and of the free-text hint must contain one."""
    for pattern in (SECRET_NAME.pattern, _IN_TEXT_HINT.pattern.removeprefix("(?i)")):
        for alternative in pattern.split("|"):
            assert any(w.decode() in alternative.lower() for w in SECRET_WORDS), alternative


def test_an_open_call_waits_for_its_end_and_each_call_is_sent_once(tmp_path: Path) -> None:
    """OTLP with a cursor: a call still asked is not sent half; once it ends, the next export
    sends it whole (both guardrail events), and nothing sent before is sent again."""
    audit, cursor_file = tmp_path / "audit", tmp_path / "otlp.cursor"
    log = AuditLog(audit)
    call = {"principal": "agent", "tool": "run", "policy_sha256": "p1"}
    log.append("decision", call_id="a", decision="allow", rule="r", arguments={"command": "true"}, **call)
    log.append("result", call_id="a", data={"status": "ok", "exit_code": 0}, **call)
    log.append("decision", call_id="b", decision="ask", rule="rm", arguments={"command": "rm x"}, **call)
    log.append("decision", call_id="c", decision="deny", rule="net", arguments={"command": "curl x"}, **call)

    def run() -> list[Any]:
        memory = InMemorySpanExporter()
        export(audit, "otlp", SpanSink(memory), cursor=Cursor.load(cursor_file, "otlp"))
        return list(memory.get_finished_spans())

    first = run()
    assert sorted(str(s.attributes["gen_ai.tool.call.id"]) for s in first) == ["a", "c"]  # type: ignore[index]
    assert run() == []  # nothing new
    log.append("approval", call_id="b", decision="allow", rule="rm", data={"answered": True, "by": "alice"}, **call)
    log.append("result", call_id="b", data={"status": "ok", "exit_code": 0}, **call)
    log.append("supervisor_answer_refused", call_id="a", data={"why": "late"}, **call)  # a call sent already
    (b,) = run()
    assert b.attributes["gen_ai.tool.call.id"] == "b" and b.attributes["agent_gateway.approved_by"] == "alice"  # type: ignore[index]
    assert [(e.attributes or {})["gen_ai.guardrail.result.type"] for e in b.events] == ["decision", "approval"]
    assert run() == []


def test_what_the_fast_json_refuses_is_still_read_and_written(tmp_path: Path) -> None:
    """orjson reads and writes the lines; an integer past 64 bits (valid JSON it refuses) goes
    through the standard library, so no record is lost or changed."""
    audit = tmp_path / "audit"
    audit.mkdir()
    fields = {"ts": "2026-11-25T10:00:00.000000Z", "event": "note", "data": {"big": 2**70, "small": -(2**70)}}
    r = {**fields, "seq": 1, "prev": ""}
    r["hash"] = digest(r)
    (audit / "audit-000001.jsonl").write_text(canonical(r) + "\n", encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "export", "--audit-dir", str(audit)],
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (got,) = lines(out.stdout)
    assert got["data"] == {"big": 2**70, "small": -(2**70)} and got["hash"] == r["hash"]
