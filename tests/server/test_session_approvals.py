""" "Approve for the session" holds in the client session it was given in, for that principal,
and ends with it (issue 23, point 6). Before, a supervisor's session approval was kept for the
gateway's whole life: a new MCP connection got the same command approved without anyone being
asked. Here two real MCP client sessions (the SDK's streamable HTTP client) talk to a real
`gateway serve --http`, and the supervisor answers with the real `gateway approvals` command."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway import approval_queue
from gateway.policy.compile import CompiledPolicy
from gateway.server.app import GatewayServer
from tests.conftest import PATIENCE_S, eventually
from tests.server.conftest import HttpGateway, audit_records, close_gateway, envelope_of, gateway_cmd, make_gateway

ASKS = "touch DEPLOY1"  # the test policy's supervisor rule (touch-deploy-by-supervisor)


def answer_when_asked(server: HttpGateway, *flags: str, approve: bool = True) -> threading.Thread:
    """A supervisor at `gateway approvals`: answers the first request for ASKS that appears."""

    def supervise() -> None:
        asked = eventually(
            lambda: next((r for r in approval_queue.pending(server.queue) if r["command"] == ASKS), None), PATIENCE_S
        )
        verb = "approve" if approve else "deny"
        gateway_cmd("approvals", verb, asked["call_id"], "--state-dir", str(server.queue), "--by", "alice", *flags)

    t = threading.Thread(target=supervise, daemon=True)
    t.start()
    return t


async def until_done(c: Client, out: dict[str, Any]) -> dict[str, Any]:
    """The call's result, following a `pending` reply with await_call."""
    while out.get("status") == "pending":
        out = envelope_of(await c.call_tool("await_call", {"call_id": out["call_id"]}))
    return out


def test_a_session_approval_holds_in_its_session_only_and_ends_with_it(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    server = HttpGateway(tmp_path, policy_file, ws)
    token = server.token("agent")
    try:

        async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=PATIENCE_S) as h:
                async with Client(streamable_http_client(server.url, http_client=h), mode="legacy") as first:
                    supervisor = answer_when_asked(server, "--session")
                    approved = await until_done(first, envelope_of(await first.call_tool("run", {"command": ASKS})))
                    supervisor.join(PATIENCE_S)
                    again = envelope_of(await first.call_tool("run", {"command": ASKS}))  # asks nobody
                # a new connection of the same principal: the supervisor is asked again (and says no)
                async with Client(streamable_http_client(server.url, http_client=h), mode="legacy") as second:
                    supervisor = answer_when_asked(server, approve=False)
                    other = await until_done(second, envelope_of(await second.call_tool("run", {"command": ASKS})))
                    supervisor.join(PATIENCE_S)
            return [approved, again], other

        (approved, again), other = asyncio.run(scenario())
        assert approved["status"] == "ok" and again["status"] == "ok", (approved, again)
        assert other["status"] == "denied" and other["error"]["code"] == "APPROVAL_DENIED", other
        assert "alice" in other["error"]["message"]
        ended = eventually(lambda: [r for r in audit_records(server.audit) if r["event"] == "session_approvals_ended"])
    finally:
        server.stop()
    records = audit_records(server.audit)
    answers = [r["data"] for r in records if r["event"] == "approval"]
    assert [(a["how"], a.get("scope")) for a in answers] == [
        ("queue-session", "session"),
        ("session", None),
        ("queue", None),
    ]
    first_session, second_session = answers[0]["client_session"], answers[2]["client_session"]
    assert answers[1]["client_session"] == first_session and second_session != first_session
    assert first_session.startswith("mcp-") and "Mcp-Session-Id" in first_session
    assert ended[0]["principal"] == "agent" and ended[0]["data"]["client_session"] == first_session


def test_without_a_session_an_approval_for_the_session_approves_the_one_call(
    policy: CompiledPolicy, tmp_path: Path
) -> None:
    """The 2026-07-28 protocol has no sessions: each request stands alone. A supervisor's
    "for the session" there approves that call, and the record says so."""
    queue = tmp_path / "approvals"
    gw = make_gateway(policy, tmp_path, approval_queue.QueueApprover(queue, (policy.workspace,)))
    server = GatewayServer(gw, "agent")

    def supervise(approve: bool, scope: str) -> threading.Thread:
        def answer() -> None:
            asked = eventually(lambda: next(iter(approval_queue.pending(queue)), None), PATIENCE_S)
            approval_queue.answer(queue, asked["call_id"], approve, "alice", scope=scope)

        t = threading.Thread(target=answer, daemon=True)
        t.start()
        return t

    async def scenario() -> list[dict[str, Any]]:
        out = []
        async with Client(server.mcp, mode="auto") as c:
            for approve, scope in ((True, "session"), (False, "once")):
                supervisor = supervise(approve, scope)
                out.append(await until_done(c, envelope_of(await c.call_tool("run", {"command": ASKS}))))
                supervisor.join(PATIENCE_S)
        return out

    try:
        first, second = asyncio.run(scenario())
    finally:
        close_gateway(gw, tmp_path)
    assert first["status"] == "ok" and second["error"]["code"] == "APPROVAL_DENIED", (first, second)
    answers = [r["data"] for r in audit_records(tmp_path / "audit") if r["event"] == "approval"]
    assert answers[0]["scope"] == "once" and "no client session" in answers[0]["session_scope_refused"]
    assert "client_session" not in answers[0] and answers[1]["how"] == "queue"
