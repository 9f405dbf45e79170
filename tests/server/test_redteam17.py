"""Red team 17 of the seed profiles (issue 14: "no second path to a shell"): an agent with only a
profile's tools, through the real `gateway serve` and the official SDK client, looking for a call
the gateway answers without recording it (the audit log's rule: no record, no call)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.types import CallToolResult, TextContent

from gateway.audit import verify
from tests.server.conftest import audit_records
from tests.server.test_profiles import profile_policy, serve


def reply(r: CallToolResult) -> dict[str, Any]:
    assert len(r.content) == 1 and isinstance(r.content[0], TextContent)
    out: dict[str, Any] = json.loads(r.content[0].text)
    return out


def test_every_shell_call_is_recorded_even_one_that_reaches_no_session(tmp_path: Path, ws: Path) -> None:
    """A session call whose session id named none of the caller's (a guess at another principal's
    shell, or a closed one), a command sent while the shell was busy, a write without its newline
    and a write of commands to the idle shell were answered with no record of the call: an agent
    could probe for shell ids, or send text the gateway never logged, and the log showed nothing.
    Each now leaves a record under its call_id, naming the session tool."""
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("unknown exec", "execute_in_shell", {"shell_id": "0123456789ab", "command": "rm -rf ."}),
        ("unknown input", "send_shell_input", {"shell_id": "0123456789ab", "input": "ls\n"}),
        ("unknown read", "read_shell_output", {"shell_id": "0123456789ab"}),
        ("unknown close", "close_shell", {"shell_id": "0123456789ab"}),
    ]

    async def scenario() -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "terminal-interface")) as c:
            for label, name, args in calls:
                out[label] = reply(await c.call_tool(name, args))
            started = reply(await c.call_tool("start_interactive_shell", {}))
            out["start"] = started
            sid = started["shell_id"]
            out["commands"] = reply(await c.call_tool("send_shell_input", {"shell_id": sid, "input": "echo a\n"}))
            out["no newline"] = reply(await c.call_tool("send_shell_input", {"shell_id": sid, "input": "echo b"}))
            # the shell stays busy until it is closed (the close kills the sleep)
            out["waits"] = reply(
                await c.call_tool(
                    "execute_in_shell", {"shell_id": sid, "command": "sleep 3600", "timeout_seconds": 0.2}
                )
            )
            out["busy"] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": "echo c"}))
            out["close"] = reply(await c.call_tool("close_shell", {"shell_id": sid}))
            out["closed"] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": "echo d"}))
        return out

    out = asyncio.run(scenario())
    for label in ("unknown exec", "unknown input", "unknown read", "unknown close", "closed"):
        assert out[label]["success"] is False and out[label]["error_code"] == "SESSION_NOT_FOUND", out[label]
    assert out["commands"]["success"] is True and "a" in out["commands"]["output"]
    assert out["no newline"]["error_code"] == "INVALID_INPUT"
    assert out["waits"].get("running") is True, out["waits"]
    assert out["busy"]["error_code"] == "SESSION_BUSY"

    records = audit_records(tmp_path / "audit")
    by_call: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_call.setdefault(str(r.get("call_id")), []).append(r)
    for label, got in out.items():
        mine = by_call.get(got["call_id"], [])
        assert mine, f"{label}: call {got['call_id']} answered with no record"
        assert {r["tool"] for r in mine} == {"session"}, (label, mine)
    for label in ("unknown exec", "unknown input", "unknown read", "unknown close", "closed", "busy", "no newline"):
        (last,) = [r for r in by_call[out[label]["call_id"]] if r["event"] in ("error", "result", "rejected")]
        code = last["data"].get("code") or (last["data"].get("error") or {}).get("code")
        assert code == out[label]["error_code"], (label, last)  # the record says how it ended
    # the write of a command: the write has its own decision and result, the command its own
    # decision, pointing at the write
    write = by_call[out["commands"]["call_id"]]
    assert write[0]["event"] == "decision", write
    (result,) = [r for r in write if r["event"] == "result"]
    line = result["data"]["sent"][0]
    assert line["command"] == "echo a"
    assert by_call[line["call_id"]][0]["event"] == "decision"
    assert by_call[line["call_id"]][0]["parent"] == out["commands"]["call_id"]
    assert verify(tmp_path / "audit").ok


def test_a_byte_offset_past_any_file_is_an_empty_read_not_an_internal_error(tmp_path: Path, ws: Path) -> None:
    """termux_fs read (the files tool's byte mode) with an offset of 2**63 or more answered
    INTERNAL_ERROR 'OverflowError: Python int too large to convert to C long' (a bug in the
    gateway, by its own words), and 2**63-1 an IO_ERROR; 99999999999 was an empty read. Every
    offset at or past the end now reads nothing, the same way."""
    (ws / "f.txt").write_text("hello\n")
    offsets = [6, 99_999_999_999, (1 << 63) - 1, 1 << 63, 10**30]

    async def scenario() -> list[dict[str, Any]]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "methings")) as c:
            return [
                reply(
                    await c.call_tool(
                        "termux_fs", {"action": "read", "path": str(ws / "f.txt"), "offset": o, "max_bytes": 10}
                    )
                )
                for o in offsets
            ]

    for offset, got in zip(offsets, asyncio.run(scenario()), strict=True):
        assert "error" not in got, (offset, got)
        assert got["content"] == "" and got["read_bytes"] == 0 and got["size"] == 6 and got["offset"] == offset
        assert got["truncated"] is False
    records = audit_records(tmp_path / "audit")
    assert not [r for r in records if r["event"] == "error"]


def test_a_files_path_the_jail_cannot_name_is_refused_naming_path_not_cwd(tmp_path: Path, ws: Path) -> None:
    """termux_fs read of `~root/.bashrc` (or `~/x` where the policy sets no home) was refused
    with "cwd '~root/.bashrc': ...": the call has no cwd, so the agent was told to fix a field
    it never sent. The refusal names `path`."""

    async def scenario() -> list[dict[str, Any]]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "methings")) as c:
            return [
                reply(await c.call_tool("termux_fs", {"action": "read", "path": p}))
                for p in ("~root/.bashrc", "~/notes.txt")
            ]

    user, home = asyncio.run(scenario())
    assert user["error"]["code"] == home["error"]["code"] == "PATH_OUTSIDE_JAIL"
    assert user["error"]["message"].startswith("path '~root/.bashrc': only ~"), user
    assert home["error"]["message"].startswith("path '~/notes.txt': the policy sets no home"), home
