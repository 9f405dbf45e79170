"""What one request can cost: sizes are checked before anything else, and what is refused is
recorded by size and digest, not in full.

Before: a 3 MB request with a million-element list cost 17 s, 1.2 GB and a 57 MB record; each
`startup_commands` entry's record embedded the whole list (the log grew with the square of its
length); a refused 50 MB command made a 52 MB record.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gateway import approval_queue
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy
from gateway.server.app import GatewayServer
from tests.server.conftest import audit_records, close_gateway, envelope_of, make_gateway


@pytest.fixture
def gw(policy: CompiledPolicy, tmp_path: Path) -> Any:
    g = make_gateway(policy, tmp_path, approval_queue.QueueApprover(tmp_path / "approvals", (policy.workspace,)))
    yield g
    close_gateway(g, tmp_path)


def call(gw: Gateway, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with Client(GatewayServer(gw, "agent").mcp) as c:
            result = await c.call_tool(tool, arguments)
            return envelope_of(result)

    return asyncio.run(main())


def log_bytes(tmp_path: Path) -> int:
    return sum(p.stat().st_size for p in (tmp_path / "audit").glob("audit-*.jsonl"))


def test_a_million_element_list_is_refused_by_its_length(gw: Gateway, tmp_path: Path) -> None:
    before = log_bytes(tmp_path)
    out = call(gw, "session", {"action": "start", "startup_commands": ["true"] * 1_000_000})
    assert out["error"]["code"] == "INVALID_INPUT"
    assert "startup_commands" in out["error"]["message"] and "at most 64" in out["error"]["message"]
    assert log_bytes(tmp_path) - before < 20_000


def test_each_startup_command_is_recorded_alone(gw: Gateway, tmp_path: Path) -> None:
    commands = [f"echo {i} {'x' * 2000}" for i in range(40)]
    out = call(gw, "session", {"action": "start", "startup_commands": commands})
    assert out["status"] == "ok", out
    every = audit_records(tmp_path / "audit")
    decisions = [r for r in every if r["event"] == "decision" and r.get("tool") == "session"]
    exec_records = [r for r in decisions if r.get("arguments", {}).get("command") in commands]
    assert len(exec_records) == 40
    assert all("startup_commands" not in r["arguments"] for r in exec_records)
    assert log_bytes(tmp_path) < 40 * 20_000  # linear in the list, not its square (before: ~6.6 MB)
    call(gw, "session", {"action": "kill", "session_id": out["session_id"]})


def test_an_oversized_command_is_refused_and_recorded_by_digest(gw: Gateway, tmp_path: Path) -> None:
    before = log_bytes(tmp_path)
    out = call(gw, "run", {"command": "echo " + "A" * (3 << 20)})  # 3 MiB: over the 1 MiB cap
    assert out["error"]["code"] == "INVALID_INPUT" and "command" in out["error"]["message"]
    assert log_bytes(tmp_path) - before < 20_000
    near = "echo " + "B" * ((1 << 20) - 10)  # under the cap, over the analyser's 64 KiB: denied
    out = call(gw, "run", {"command": near})
    assert out["status"] == "denied", out
    assert log_bytes(tmp_path) - before < 300_000  # each record keeps at most 64 KiB of it
    assert any(isinstance(r.get("arguments", {}).get("command"), dict) for r in audit_records(tmp_path / "audit"))
