"""bash evaluates a variable's value as arithmetic: `y=PATH=5; (( y ))` assigns PATH though the
text never writes `PATH=` (which the gate refuses by name), and `ls` then ran the agent's own
./5/ls (a red team found it through a zsh session, then in bash). Every shell the gateway starts
makes the protected variables read-only first (executors/shell.py READONLY), so the program the
gate decided is the one that runs: through `run`, a session and a background process, under the
shipped policy, in the real sandbox, over the MCP server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from gateway.sandbox.identity import hand_over
from tests.conftest import eventually
from tests.server.conftest import envelope_of
from tests.server.test_profiles import serve

POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
PLANT = "mkdir -p 5 && printf '#!/bin/sh\\n/usr/bin/touch pwned\\n' > 5/ls && chmod +x 5/ls"
ROUTES = [
    "y=PATH=5; (( y )); ls",
    "y=PATH=5; : $(( y )); ls",
    "y=PATH=5; [[ y -eq 0 ]]; ls",
    "y=PATH=5; z=(1 2); : ${z[y]}; ls",
]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    hand_over(w)
    return w


async def _calls(tmp_path: Path, ws: Path, *todo: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    async with Client(serve(tmp_path, POLICY, ws, "gateway")) as c:
        for name, args in todo:
            out.append(envelope_of(await c.call_tool(name, args)))
    return out


@pytest.mark.parametrize("text", ROUTES)
def test_a_run_cannot_change_path_through_arithmetic(tmp_path: Path, ws: Path, text: str) -> None:
    planted, ran = asyncio.run(_calls(tmp_path, ws, ("run", {"command": PLANT}), ("run", {"command": text})))
    assert planted["status"] == "ok", planted
    assert ran["status"] == "ok", ran  # decided as `ls`: it runs, as /usr/bin/ls
    assert "readonly variable" in ran["stderr"], ran
    assert not (ws / "pwned").exists()


def test_a_session_cannot_change_path_for_its_later_commands(tmp_path: Path, ws: Path) -> None:
    async def go() -> list[dict[str, Any]]:
        async with Client(serve(tmp_path, POLICY, ws, "gateway")) as c:
            planted = envelope_of(await c.call_tool("run", {"command": PLANT}))
            sid = envelope_of(await c.call_tool("session", {"action": "start"}))["session_id"]
            steps = ["y=PATH=5; (( y ))", "ls", "echo $PATH"]
            done = [envelope_of(await c.call_tool("session", {"action": "exec", "session_id": sid, "command": s}))
                    for s in steps]  # fmt: skip
            return [planted, *done]

    planted, assigned, listed, path = asyncio.run(go())
    assert planted["status"] == "ok" and listed["status"] == "ok", (planted, listed)
    assert "readonly variable" in assigned["output"], assigned
    assert path["output"].strip().split(":")[0] != "5", path
    assert not (ws / "pwned").exists()


def test_a_background_process_cannot_change_path_through_arithmetic(tmp_path: Path, ws: Path) -> None:
    async def go() -> list[dict[str, Any]]:
        async with Client(serve(tmp_path, POLICY, ws, "gateway")) as c:
            planted = envelope_of(await c.call_tool("run", {"command": PLANT}))
            command = ROUTES[0] + "; echo end > done"
            started = envelope_of(await c.call_tool("process", {"action": "start", "command": command}))
            return [planted, started]

    planted, started = asyncio.run(go())
    assert planted["status"] == "ok" and started["status"] == "ok", (planted, started)
    assert eventually(lambda: (ws / "done").exists())  # written once `ls` has ended
    assert not (ws / "pwned").exists()
