"""Red team of the seed profiles (issue 14): an agent with only a profile's tools, through the
real `gateway serve` and the official SDK client, trying to break a reply's bound, to run text
the policy did not decide, or to crash a reply out of its envelope."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import yaml
from mcp import Client
from mcp.types import CallToolResult, TextContent

from gateway.policy.compile import CompiledPolicy
from gateway.server.register import register_tools
from tests.server.conftest import audit_records, close_gateway, envelope_of, make_gateway
from tests.server.test_profiles import profile_policy, serve
from tests.server.test_register_tools import third_party

OUTPUT_BYTES = 256 * 1024


def small_output_policy(tmp_path: Path, ws: Path) -> Path:
    """The profile tests' policy, with the dev role's output_bytes at 256 KiB."""
    f = profile_policy(tmp_path, ws)
    p = yaml.safe_load(f.read_text())
    p["roles"]["dev"]["limits"]["output_bytes"] = OUTPUT_BYTES
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f


def text_of(r: CallToolResult) -> str:
    first = r.content[0]
    assert isinstance(first, TextContent)
    return first.text


def test_grep_context_cannot_multiply_a_reply_past_the_roles_output_bytes(tmp_path: Path, ws: Path) -> None:
    """Each match carries up to 20 lines of context, so max_results bounded nothing: 10,000
    matches of 500-character lines made a 106 MB reply that the server took two minutes to send,
    every other call waiting. The matches' text now stops at the role's output_bytes."""
    (ws / "big.txt").write_text(("x" * 500 + "\n") * 600)  # 300 KB: 600 matches, each with 20 lines around

    async def scenario() -> tuple[CallToolResult, CallToolResult]:
        async with Client(serve(tmp_path, small_output_policy(tmp_path, ws), ws, "gateway")) as c:
            whole = await c.call_tool("files", {"action": "grep", "pattern": "x", "context": 10, "max_results": 600})
            few = await c.call_tool("files", {"action": "grep", "pattern": "x", "context": 2, "max_results": 3})
            return whole, few

    whole, few = asyncio.run(scenario())
    assert len(text_of(whole).encode()) < OUTPUT_BYTES + 64 * 1024  # was 6.4 MB
    body = json.loads(text_of(whole).partition("\n")[2])
    assert body["status"] == "ok" and body["truncated"] is True and 0 < len(body["matches"]) < 600
    assert len(body["matches"][-1]["after"]) == 10  # what is shown is whole
    small = json.loads(text_of(few).partition("\n")[2])
    assert [m["line"] for m in small["matches"]] == [1, 2, 3] and small["matches"][2]["before"] == ["x" * 500] * 2


def test_shell_cmd_timeout_seconds_keeps_a_runs_reply_bound(tmp_path: Path, ws: Path) -> None:
    """shell_cmd with timeoutSeconds is a run handed to the process tools: its reply carried the
    log's tail up to output_bytes (1 MB), where the same command without it gets the role's
    reply_bytes (30,000). Now both are cut the same way, the whole output saved for the files tool."""

    async def scenario() -> list[CallToolResult]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "os")) as c:
            plain = await c.call_tool("shell_cmd", {"command": "printf '%*s' 200000 ''"})
            handed = await c.call_tool("shell_cmd", {"command": "printf '%*s' 200000 ''", "timeoutSeconds": 30})
            return [plain, handed]

    plain, handed = asyncio.run(scenario())
    assert len(text_of(plain)) < 40_000
    assert len(text_of(handed)) < 40_000  # was 200,000
    out = yaml.safe_load(text_of(handed))
    assert out["status"] == "ok" and out["reply_cut"]["output"]["bytes"] == 200_000
    saved = out["reply_cut"]["output"]["saved"]
    assert Path(saved).read_bytes() == b" " * 200_000


def test_register_tools_a_failing_principal_function_refuses_with_an_envelope(
    policy: CompiledPolicy, tmp_path: Path
) -> None:
    """register_tools with a principal function (the server's own authentication): one that
    raises, or answers something other than a name, refuses the gated call UNAUTHENTICATED in the
    gateway's envelope, and the server's own tools stay listed. It reached the SDK as a bare
    "Error executing tool run", and tools/list failed for the server's own tools too."""
    gw = make_gateway(policy, tmp_path)
    server = third_party()
    who: list[Any] = []

    def principal() -> Any:
        if isinstance(who[0], Exception):
            raise who[0]
        return who[0]

    gated = register_tools(server, gw, principal=principal)

    async def scenario() -> list[tuple[set[str], CallToolResult]]:
        out = []
        async with Client(server) as c:
            for value in (RuntimeError("session store down"), 5, ""):
                who[:] = [value]
                names = {t.name for t in (await c.list_tools()).tools}
                out.append((names, await c.call_tool("run", {"command": "echo hi"})))
        return out

    try:
        results = asyncio.run(scenario())
    finally:
        gated.shutdown(1.0)
        close_gateway(gw, tmp_path)
    for names, r in results:
        assert names == {"add"} and r.is_error
        assert envelope_of(r)["error"]["code"] == "UNAUTHENTICATED"
    assert not any(r.get("tool") == "run" for r in audit_records(tmp_path / "audit"))  # nothing ran


def test_format_terminal_output_of_deeply_nested_json_is_invalid_input(tmp_path: Path, ws: Path) -> None:
    """JSON text nested 100,000 deep made format_terminal_output (and the gateway's own
    format_output) fail with INTERNAL_ERROR (RecursionError): the input is at fault, and says so."""
    deep = "[" * 100_000 + "]" * 100_000

    async def scenario() -> list[CallToolResult]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "terminal-interface,gateway")) as c:
            return [
                await c.call_tool("format_terminal_output", {"format_type": "json", "content": deep}),
                await c.call_tool("format_output", {"kind": "json", "message": deep}),
            ]

    profile, own = asyncio.run(scenario())
    out = json.loads(text_of(profile))
    assert profile.is_error and out["error_code"] == "INVALID_INPUT" and "nests too deeply" in out["error"]
    env = json.loads(text_of(own).partition("\n")[2])
    assert own.is_error and env["error"]["code"] == "INVALID_INPUT" and env["error"]["message"].startswith("message:")


def test_a_principal_the_policy_does_not_define_is_unknown_principal_not_internal_error(
    policy: CompiledPolicy, tmp_path: Path
) -> None:
    """A principal function (or a token) naming a principal the policy does not define: the call
    is denied UNKNOWN_PRINCIPAL and audited; it was INTERNAL_ERROR, "a bug in the gateway"."""
    gw = make_gateway(policy, tmp_path)
    server = third_party()
    gated = register_tools(server, gw, principal=lambda: "nobody")

    async def scenario() -> CallToolResult:
        async with Client(server) as c:
            return await c.call_tool("run", {"command": "echo hi"})

    try:
        r = asyncio.run(scenario())
    finally:
        gated.shutdown(1.0)
        close_gateway(gw, tmp_path)
    env = envelope_of(r)
    assert r.is_error and env["status"] == "denied" and env["error"]["code"] == "UNKNOWN_PRINCIPAL"
    assert "'nobody'" in env["error"]["message"] and "agent" in env["error"]["message"]
    (rec,) = [x for x in audit_records(tmp_path / "audit") if x.get("call_id") == env["call_id"]]
    assert rec["event"] == "error" and rec["principal"] == "nobody"
