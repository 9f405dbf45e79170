"""What an agent meets over MCP (issue 14), through the SDK's own client in both protocol eras,
with the real gateway underneath: replies that fit an agent's context, ask_user answers outside
their rules, ask_user under a supervisor-level policy, and await_call asked twice. Every test
here failed on the code before its fix."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, ElicitResult

from gateway import approval_queue
from gateway.audit import AuditLog
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.server.app import GatewayServer
from tests.server.conftest import POLICY, audit_records, close_gateway, envelope_of, make_gateway


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro

    return asyncio.run(main())


def answering(*answers: ElicitResult) -> Any:
    queue = list(answers)

    async def cb(ctx: Any, params: Any) -> ElicitResult:
        return queue.pop(0)

    return cb


@pytest.fixture
def gw(policy: CompiledPolicy, tmp_path: Path) -> Any:
    g = make_gateway(policy, tmp_path, approval_queue.QueueApprover(tmp_path / "approvals", (policy.workspace,)))
    yield g
    close_gateway(g, tmp_path)


# --- replies that fit an agent ------------------------------------------------------------------
def reply_bytes(r: CallToolResult) -> int:
    return len(r.model_dump_json(by_alias=True, exclude_none=True).encode())


def with_limits(ws: Path, tmp_path: Path, **limits: int) -> Gateway:
    dev = {**POLICY["roles"]["dev"], "limits": {"timeout_ms": 60000, **limits}}
    basics = {**POLICY["rules"][0], "programs": [*POLICY["rules"][0]["programs"], "seq"]}
    rules = [basics, *POLICY["rules"][1:]]
    policy = Policy.model_validate({**POLICY, "roles": {**POLICY["roles"], "dev": dev}, "rules": rules})
    return make_gateway(compile_policy(policy, tmp_path / "p.yaml", ws, sha256="r"), tmp_path)


def test_a_long_output_is_bounded_sent_once_and_saved_whole(ws: Path, tmp_path: Path, era: str) -> None:
    gw = with_limits(ws, tmp_path, output_bytes=8 << 20)  # the executor keeps all 2.6 MB

    async def scenario() -> tuple[CallToolResult, dict[str, Any], dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            r = await c.call_tool("run", {"command": "seq 1 400000"})
            saved = envelope_of(r)["reply_cut"]["stdout"]["saved"]
            tail = envelope_of(await c.call_tool("files", {"action": "read", "path": saved, "offset": 399_990}))
            stat = envelope_of(await c.call_tool("files", {"action": "stat", "path": saved}))
            return r, tail, stat

    try:
        r, tail, stat = run(scenario())
    finally:
        close_gateway(gw, tmp_path)
    out = envelope_of(r)
    assert r.structured_content is None and len(r.content) == 1  # the envelope once, as text
    assert reply_bytes(r) < 45_000, reply_bytes(r)  # was the output twice; now 30 KB, JSON-escaped
    assert out["stdout"].endswith("399999\n400000\n") and out["stdout"].startswith("1\n2\n")
    cut = out["reply_cut"]["stdout"]
    assert cut["bytes"] == len("".join(f"{i}\n" for i in range(1, 400_001))) and cut["shown"] == 30_000
    assert "not shown" in out["stdout"] and "files read" in out["notice"] and cut["saved"] in out["notice"]
    assert tail["status"] == "ok" and tail["content"].endswith("400000\n"), tail  # all of it, through the files tool
    assert stat["status"] == "ok" and stat["size"] == cut["bytes"]


def test_the_policy_sets_the_reply_limit_and_only_the_owner_reads_the_saved_output(
    ws: Path, tmp_path: Path, era: str
) -> None:
    gw = with_limits(ws, tmp_path, reply_bytes=2000)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            out = envelope_of(await c.call_tool("run", {"command": "seq 1 3000"}))
        saved = out["reply_cut"]["stdout"]["saved"]
        async with Client(GatewayServer(gw, "other").mcp, mode=era) as c:
            foreign = envelope_of(await c.call_tool("files", {"action": "read", "path": saved}))
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            overwrite = envelope_of(await c.call_tool("files", {"action": "write", "path": saved, "content": "x"}))
        return out, foreign, overwrite

    try:
        out, foreign, overwrite = run(scenario())
    finally:
        close_gateway(gw, tmp_path)
    assert out["reply_cut"]["stdout"]["shown"] == 2000 and len(out["stdout"]) < 2100
    assert foreign["status"] == "denied"  # another principal's saved output is the gateway's own record
    assert overwrite["status"] == "denied"  # read-only, even for its owner


# --- ask_user: answers outside the rules --------------------------------------------------------
@pytest.mark.parametrize(
    ("validation", "given", "rule"),
    [({"min_length": 5}, "abc", "min_length"), ({"allowed_values": ["red", "blue"]}, "green", "allowed_values")],
)
def test_an_out_of_range_answer_gets_an_envelope_and_a_record(
    gw: Gateway, era: str, tmp_path: Path, validation: dict[str, Any], given: str, rule: str
) -> None:
    cb = answering(ElicitResult(action="accept", content={"answer": given}))

    async def scenario() -> CallToolResult:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era, elicitation_callback=cb) as c:
            return await c.call_tool("ask_user", {"prompt": "value?", "validation": validation})

    r = run(scenario())  # was an SDK error: no envelope, no record
    out = envelope_of(r)
    assert r.is_error and out["error"]["code"] == "INVALID_INPUT" and rule in out["error"]["message"]
    results = [x for x in audit_records(tmp_path / "audit") if x["event"] == "result" and x["tool"] == "ask_user"]
    assert results[-1]["call_id"] == out["call_id"] and results[-1]["data"]["error"]["code"] == "INVALID_INPUT"
    assert results[-1]["data"]["answered"]["answer"] == given


# --- ask_user under a supervisor-level policy ------------------------------------------------------
def test_ask_user_that_a_supervisor_must_approve_is_refused_at_once(ws: Path, tmp_path: Path, era: str) -> None:
    tools = {**POLICY["tools"], "ask_user": {"ask_from": 1}}
    policy = compile_policy(Policy.model_validate({**POLICY, "tools": tools}), tmp_path / "p.yaml", ws, sha256="s")
    queue = tmp_path / "approvals"
    gw = Gateway(policy, AuditLog(tmp_path / "audit"), approval_queue.QueueApprover(queue, (ws,)),
                 approval_timeout_s=20, state_dir=tmp_path / "state")  # fmt: skip
    asked: list[Any] = []

    async def ask(ctx: Any, params: Any) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept", content={"answer": "x"})

    async def scenario() -> dict[str, Any]:
        async with Client(GatewayServer(gw, "agent", pending_after_s=60).mcp, mode=era, elicitation_callback=ask) as c:
            return envelope_of(await c.call_tool("ask_user", {"prompt": "name?"}))

    try:
        out = run(scenario())
    finally:
        close_gateway(gw, tmp_path)
    # was: the supervisor was asked and waited on, then NO_USER_CHANNEL (or APPROVAL_TIMEOUT)
    assert out["error"]["code"] == "NO_USER_CHANNEL" and asked == [], out
    events = [x["event"] for x in audit_records(tmp_path / "audit") if x.get("call_id") == out["call_id"]]
    assert events == ["decision"] and approval_queue.pending(queue) == []


# --- await_call answers again -------------------------------------------------------------------
def test_await_call_answers_again_after_the_result_was_fetched(gw: Gateway, era: str, ws: Path, tmp_path: Path) -> None:
    (ws / "victim").write_text("x")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent", pending_after_s=0.2).mcp, mode=era) as c:
            first = envelope_of(await c.call_tool("run", {"command": "rm victim"}))
            approval_queue.answer(tmp_path / "approvals", first["call_id"], True, "alice")
            fetched = envelope_of(await c.call_tool("await_call", {"call_id": first["call_id"], "wait_ms": 30_000}))
            again = envelope_of(await c.call_tool("await_call", {"call_id": first["call_id"], "wait_ms": 0}))
            return first, fetched, again

    first, fetched, again = run(scenario())
    assert first["status"] == "pending" and fetched["status"] == "ok"
    assert again == fetched  # was UNKNOWN_CALL, though results are kept for an hour
