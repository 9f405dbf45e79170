"""Replies that fit an agent's context (issue 14), beyond `run`: a session's output, a process's
log and a file read are bounded by the policy's `limits.reply_bytes` by default, with a notice
that says how much was left out and how to read the rest, through the SDK's own client with the
real gateway underneath. Each test failed on the code before: the session answered with all it
had kept (1 MiB), `process output` with all it was asked for, and a files read with 1 MiB."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.types import CallToolResult

from gateway.pipeline import Gateway
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.server.app import GatewayServer
from tests.server.conftest import POLICY, close_gateway, envelope_of, make_gateway

WHOLE = "".join(f"{i}\n" for i in range(1, 400_001))  # `seq 1 400000`: 2.6 MB


def gateway_with(ws: Path, tmp_path: Path, **limits: int) -> Gateway:
    dev = {**POLICY["roles"]["dev"], "limits": {"timeout_ms": 60000, **limits}}
    basics = {**POLICY["rules"][0], "programs": [*POLICY["rules"][0]["programs"], "seq"]}
    policy = Policy.model_validate(
        {**POLICY, "roles": {**POLICY["roles"], "dev": dev}, "rules": [basics, *POLICY["rules"][1:]]}
    )
    return make_gateway(compile_policy(policy, tmp_path / "p.yaml", ws, sha256="b"), tmp_path)


def size(r: CallToolResult) -> int:
    return len(r.model_dump_json(by_alias=True, exclude_none=True).encode())


def test_a_sessions_long_output_is_bounded_and_saved(ws: Path, tmp_path: Path) -> None:
    gw = gateway_with(ws, tmp_path, output_bytes=8 << 20)  # the session keeps all 2.6 MB

    async def scenario() -> tuple[CallToolResult, dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp) as c:
            sid = envelope_of(await c.call_tool("session", {"action": "start"}))["session_id"]
            r = await c.call_tool("session", {"action": "exec", "session_id": sid, "command": "seq 1 400000"})
            saved = envelope_of(r)["reply_cut"]["output"]["saved"]
            tail = envelope_of(await c.call_tool("files", {"action": "read", "path": saved, "offset": 399_990}))
            return r, tail

    try:
        r, tail = asyncio.run(scenario())
    finally:
        close_gateway(gw, tmp_path)
    out = envelope_of(r)
    assert size(r) < 45_000, size(r)  # was 2.6 MB
    assert out["output"].startswith("1\n2\n") and out["output"].endswith("399999\n400000\n")
    assert out["reply_cut"]["output"] == {
        "bytes": len(WHOLE),
        "shown": 30_000,
        "saved": out["reply_cut"]["output"]["saved"],
    }
    assert "not shown" in out["output"] and "files read" in out["notice"] and out["exit_code"] == 0
    assert tail["content"] == "".join(f"{i}\n" for i in range(399_990, 400_001))


def test_a_process_log_read_is_bounded_and_saved(ws: Path, tmp_path: Path) -> None:
    gw = gateway_with(ws, tmp_path, reply_bytes=4000)

    async def scenario() -> tuple[CallToolResult, dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp) as c:
            started = envelope_of(await c.call_tool("process", {"action": "start", "command": "seq 1 400000"}))
            pid = started["process"]["id"]
            for _ in range(2400):  # until it has ended: its whole log is written (a bound: 2 minutes)
                got = envelope_of(await c.call_tool("process", {"action": "get", "process_id": pid}))
                if got["process"]["state"] not in ("running", "starting"):
                    break
                await asyncio.sleep(0.05)
            r = await c.call_tool("process", {"action": "output", "process_id": pid, "max_bytes": 1 << 20})
            saved = envelope_of(r)["reply_cut"]["output"]["saved"]
            return r, envelope_of(await c.call_tool("files", {"action": "stat", "path": saved}))

    try:
        r, stat = asyncio.run(scenario())
    finally:
        close_gateway(gw, tmp_path)
    out = envelope_of(r)
    assert size(r) < 8000, size(r)  # was the whole MiB asked for
    assert out["output"].endswith("399999\n400000\n") and out["truncated"] is True
    assert out["reply_cut"]["output"]["bytes"] == 1 << 20 and out["reply_cut"]["output"]["shown"] == 4000
    assert stat["size"] == 1 << 20 and "files read" in out["notice"]


def test_a_big_file_read_is_bounded_unless_a_size_is_asked(ws: Path, tmp_path: Path) -> None:
    big = ws / "big.log"
    text = "".join(f"{i:08d} {'x' * 90}\n" for i in range(105_000))  # 10.5 MB in lines of 100 bytes
    big.write_text(text)
    gw = gateway_with(ws, tmp_path)

    async def scenario() -> list[CallToolResult]:
        async with Client(GatewayServer(gw, "agent").mcp) as c:
            return [
                await c.call_tool("files", {"action": "read", "path": "big.log"}),
                await c.call_tool("files", {"action": "read", "path": "big.log", "max_bytes": 10 << 20}),
                await c.call_tool("files", {"action": "read", "path": "big.log", "limit": 100}),
            ]

    try:
        lines, asked, few = asyncio.run(scenario())
    finally:
        close_gateway(gw, tmp_path)
    out = envelope_of(lines)
    assert size(lines) < 40_000, size(lines)  # was 1 MiB: 2000 lines, or the read limit
    assert out["truncated"] is True and out["content"] == text[:30_000]  # 300 whole lines
    assert (out["lines"], out["next_offset"]) == (300, 301)
    assert "limits.reply_bytes" in out["notice"] and f"offset {out['next_offset']}" in out["notice"]
    many = envelope_of(asked)  # asked for 10 MB: the policy's read limit (output_bytes), said so
    assert (many["bytes"], many["truncated"]) == (1 << 20, True) and "limits.output_bytes" in many["notice"]
    assert envelope_of(few)["lines"] == 100 and "notice" not in envelope_of(few)  # what was asked, whole
