"""`register_tools()`: the gated tools on a third-party MCP server built here with the official
SDK (the high-level `MCPServer` and a low-level `Server`), driven by the SDK's client. The
server's own tools keep working; the gateway's go through `Gateway.handle`: the same policy
decides them (a denial is the policy's, recorded) and the audit log records every call."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.server.lowlevel import Server
from mcp.types import CallToolRequestParams, CallToolResult, ListToolsResult, PaginatedRequestParams, TextContent, Tool

from gateway.audit import verify
from gateway.policy.compile import CompiledPolicy
from gateway.server.register import register_tools
from tests.server.conftest import audit_records, close_gateway, envelope_of, make_gateway


def third_party() -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("their-tools")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return server


def lowlevel_third_party() -> Server[Any]:
    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return ListToolsResult(tools=[Tool(name="shout", description="Upper-case text.", input_schema=schema)])

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> CallToolResult:
        assert params.name == "shout"
        return CallToolResult(content=[TextContent(type="text", text=str((params.arguments or {})["text"]).upper())])

    return Server("their-lowlevel-tools", on_list_tools=list_tools, on_call_tool=call_tool)


def text(r: CallToolResult) -> str:
    first = r.content[0]
    assert isinstance(first, TextContent)
    return first.text


def test_an_mcpserver_gains_the_gateway_tools_and_keeps_its_own(policy: CompiledPolicy, tmp_path: Path) -> None:
    gw = make_gateway(policy, tmp_path)
    server = third_party()
    gated = register_tools(server, gw, principal="agent")

    async def scenario() -> dict[str, Any]:
        async with Client(server) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            return {
                "names": names,
                "add": await c.call_tool("add", {"a": 2, "b": 3}),
                "echo": await c.call_tool("run", {"command": "echo hello"}),
                "curl": await c.call_tool("run", {"command": "curl https://example.com"}),
                "bad": await c.call_tool("run", {"command": "echo x", "principal": "other"}),
            }

    try:
        out = asyncio.run(scenario())
    finally:
        gated.shutdown(1.0)
        close_gateway(gw, tmp_path)
    assert "add" in out["names"] and {"run", "session", "files", "process", "env", "await_call"} <= out["names"]
    assert not out["add"].is_error and "5" in text(out["add"])
    echo = envelope_of(out["echo"])
    assert not out["echo"].is_error and echo["status"] == "ok" and echo["stdout"] == "hello\n"
    curl = envelope_of(out["curl"])
    assert out["curl"].is_error and curl["error"]["code"] == "POLICY_DENIED" and curl["rule"] == "no-curl"
    bad = envelope_of(out["bad"])  # the principal is register_tools', never the caller's
    assert out["bad"].is_error and bad["error"]["code"] == "INVALID_INPUT" and "principal" in bad["error"]["message"]

    records = audit_records(tmp_path / "audit")
    decisions = {r["call_id"]: r for r in records if r["event"] == "decision"}
    assert decisions[echo["call_id"]]["principal"] == "agent" and decisions[echo["call_id"]]["decision"] == "allow"
    d = decisions[curl["call_id"]]
    assert (
        d["decision"] == "deny" and d["rule"] == "no-curl" and d["arguments"]["command"] == "curl https://example.com"
    )
    results = [r for r in records if r["event"] == "result" and r["call_id"] == echo["call_id"]]
    assert len(results) == 1
    assert any(r["event"] == "rejected" and r["call_id"] == bad["call_id"] for r in records)
    assert verify(tmp_path / "audit").ok


def test_a_profile_on_someone_elses_server_and_what_a_principal_sees(policy: CompiledPolicy, tmp_path: Path) -> None:
    """A profile's tools, for a principal the policy gives only `run` and `files`: the session
    tools are not listed and a call to one is denied by the policy, recorded."""
    gw = make_gateway(policy, tmp_path)
    server = third_party()
    gated = register_tools(server, gw, principal=lambda: "reader", profile="terminal-interface")

    async def scenario() -> dict[str, Any]:
        async with Client(server) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            return {
                "names": names,
                "run": await c.call_tool("run_terminal_command", {"command": "echo hi", "timeout_seconds": 10}),
                "shell": await c.call_tool("start_interactive_shell", {"shell_type": "bash"}),
            }

    try:
        out = asyncio.run(scenario())
    finally:
        gated.shutdown(1.0)
        close_gateway(gw, tmp_path)
    assert {"add", "run_terminal_command", "format_terminal_output", "await_call"} <= out["names"]
    assert not out["names"] & {"start_interactive_shell", "execute_in_shell", "list_shells"}
    ran = json.loads(text(out["run"]))
    assert ran["success"] is True and ran["return_code"] == 0 and ran["stdout"] == "hi\n"
    shell = json.loads(text(out["shell"]))
    assert out["shell"].is_error and shell["success"] is False and shell["error_code"] == "POLICY_DENIED"
    d = [r for r in audit_records(tmp_path / "audit") if r["event"] == "decision" and r["call_id"] == shell["call_id"]]
    assert d and d[0]["principal"] == "reader" and d[0]["decision"] == "deny" and d[0]["tool"] == "session"


def test_a_lowlevel_server_gains_the_tools(policy: CompiledPolicy, tmp_path: Path) -> None:
    gw = make_gateway(policy, tmp_path)
    server = lowlevel_third_party()
    gated = register_tools(server, gw, principal="agent", profile="os")

    async def scenario() -> dict[str, Any]:
        async with Client(server) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            return {
                "names": names,
                "shout": await c.call_tool("shout", {"text": "hey"}),
                "cmd": await c.call_tool("shell_cmd", {"command": "echo hi"}),
                "curl": await c.call_tool("shell_cmd", {"command": "curl x"}),
            }

    try:
        out = asyncio.run(scenario())
    finally:
        gated.shutdown(1.0)
        close_gateway(gw, tmp_path)
    assert {"shout", "shell_cmd", "stop_daemon", "env_get", "await_call"} <= out["names"]
    assert text(out["shout"]) == "HEY"
    assert text(out["cmd"]).startswith("status: ok\n") and not out["cmd"].is_error
    assert out["curl"].is_error and "error_code: POLICY_DENIED" in text(out["curl"])
    assert any(r["event"] == "decision" and r["decision"] == "deny" for r in audit_records(tmp_path / "audit"))


def test_a_name_the_server_already_has_is_refused(policy: CompiledPolicy, tmp_path: Path) -> None:
    gw = make_gateway(policy, tmp_path)
    server = third_party()

    @server.tool()
    def run(command: str) -> str:
        """Their own run."""
        return command

    try:
        with pytest.raises(ValueError, match="already has tools named run"):
            register_tools(server, gw, principal="agent")
        with pytest.raises(TypeError, match="MCPServer or low-level Server"):
            register_tools(object(), gw, principal="agent")  # type: ignore[arg-type]
    finally:
        close_gateway(gw, tmp_path)
