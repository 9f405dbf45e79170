"""Every tool call leaves a record: each profile's `gateway serve --stdio` is driven through the
official SDK client, every registered tool is called (with the cases that end before any
decision: an unknown session or shell, input that is not a command), and every call_id the
server handed out, nested ones included (`sent`, `startup`), must have a record in the audit log
naming its tool and principal. The outer call of a tool that fans out to per-line calls
(`session` write, `send_shell_input`, `startup_commands`) has its own decision record, and the
per-line records name it as their `parent`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client
from mcp.types import CallToolResult

from gateway.audit import verify
from gateway.server.profiles import PROFILES
from tests.server.conftest import audit_records
from tests.server.test_methings import methings_policy
from tests.server.test_profiles import serve

SHELL = "<shell>"
"""Stands for the session or shell id the profile's start call returned."""


def _body(result: CallToolResult) -> Any:
    """The reply's data, whichever shape the profile answers in (gateway summary line + JSON,
    the seed's JSON alone, or seed 001's YAML)."""
    text = next(c.text for c in result.content if c.type == "text")
    for candidate in (text, text.partition("\n")[2]):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return yaml.safe_load(text)


def call_ids(value: Any) -> list[str]:
    """Every call_id anywhere in a reply (the outer one, and the per-line ones it lists)."""
    found: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "call_id" and isinstance(v, str):
                found.append(v)
            else:
                found += call_ids(v)
    elif isinstance(value, list):
        for v in value:
            found += call_ids(v)
    return found


# (tool, arguments) in order; SHELL is replaced by the id the start call before it returned
CALLS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "gateway": [
        ("run", {"command": "echo hi"}),
        ("session", {"action": "start", "startup_commands": ["echo one", "echo two"]}),
        ("session", {"action": "write", "session_id": SHELL, "input": "echo a\necho b\n"}),
        ("session", {"action": "write", "session_id": SHELL, "input": "no newline"}),
        ("session", {"action": "read", "session_id": "nosuchsession"}),
        ("session", {"action": "exec", "session_id": "nosuchsession", "command": "echo x"}),
        ("files", {"action": "list", "path": "."}),
        ("process", {"action": "list"}),
        ("process", {"action": "get", "process_id": "0123456789abcdef"}),
        ("env", {"action": "list"}),
        ("ask_user", {"prompt": "which?"}),
        ("format_output", {"kind": "info", "message": "m"}),
    ],
    "methings": [
        ("local_run_shell", {"command": "echo hi"}),
        ("termux_run_shell", {"command": "echo hi"}),
        ("local_shell_session", {"action": "start"}),
        ("local_shell_session", {"action": "write", "session_id": SHELL, "input": "echo a\necho b\n"}),
        ("termux_shell_session", {"action": "start"}),
        ("termux_shell_session", {"action": "read", "session_id": "nosuchsession"}),
        ("termux_fs", {"action": "list", "path": "~"}),
    ],
    "os": [
        ("shell_cmd", {"command": "echo hi"}),
        ("stop_daemon", {"pid": 99}),
        ("get_daemon_output", {"pid": 99}),
        ("env_set", {"key": "APP_X", "value": "1"}),
        ("env_get", {"key": "APP_X"}),
        ("env_unset", {"key": "APP_X"}),
    ],
    "shell-plugin": [
        ("write", {"path": "a.txt", "content": "one\n"}),
        ("read", {"path": "a.txt"}),
        ("read_json", {"path": "a.txt"}),
        ("edit", {"path": "a.txt", "edits": [{"search": "one", "replace": "two"}]}),
        ("write_output", {"name": "report", "content": "# r\n"}),
        ("grep", {"pattern": "two"}),
        ("find", {"pattern": "*.txt"}),
        ("ls", {}),
        ("exec", {"command": "echo hi"}),
        ("process_start", {"command": "sleep 30", "name": "s"}),
        ("process_list", {}),
        ("process_get", {"processId": "0123456789abcdef"}),
        ("process_stop", {"processId": "0123456789abcdef"}),
        ("process_stop_all", {}),
    ],
    "terminal-interface": [
        ("run_terminal_command", {"command": "echo hi"}),
        ("format_terminal_output", {"content": "m", "format_type": "info"}),
        ("start_interactive_shell", {"startup_commands": ["echo one"]}),
        ("execute_in_shell", {"shell_id": SHELL, "command": "echo x"}),
        ("send_shell_input", {"shell_id": SHELL, "input": "echo a\necho b\n"}),
        ("send_shell_input", {"shell_id": "nosuchshell", "input": "echo a\n"}),
        ("read_shell_output", {"shell_id": SHELL}),
        ("list_shells", {}),
        ("close_shell", {"shell_id": SHELL}),
        ("execute_in_shell", {"shell_id": SHELL, "command": "echo gone"}),
    ],
    "system-ops": [
        ("run", {"command": "echo hi"}),
        ("ask_user", {"prompt": "which?"}),
    ],
}
FAN_OUT = {("session", "write"), ("local_shell_session", "write"), ("send_shell_input", None),
           ("session", "start"), ("start_interactive_shell", None)}  # fmt: skip


@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_tool_call_of_every_profile_is_recorded(tmp_path: Path, ws: Path, profile: str) -> None:
    (ws / "home").mkdir()
    (ws / "home").chmod(0o777)
    f = methings_policy(tmp_path)  # a home, both shells

    async def scenario() -> tuple[set[str], list[tuple[str, dict[str, Any], Any]]]:
        async with Client(serve(tmp_path, f, ws, profile)) as c:
            listed = {t.name for t in (await c.list_tools()).tools}
            shell = ""
            done = []
            for name, args in CALLS[profile]:
                given = {k: (shell if v == SHELL else v) for k, v in args.items()}
                body = _body(await c.call_tool(name, given))
                found = body.get("session_id") or body.get("shell_id") if isinstance(body, dict) else None
                if isinstance(found, str) and given.get("action", "start") == "start":
                    shell = found
                done.append((name, given, body))
            return listed, done

    listed, done = asyncio.run(scenario())
    assert listed - {"await_call"} == {name for name, _ in CALLS[profile]}  # every registered tool is called

    records = audit_records(tmp_path / "audit")
    by_call: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("call_id"):
            by_call.setdefault(r["call_id"], []).append(r)
    for name, given, body in done:
        ids = call_ids(body)
        assert ids, (name, given, body)
        outer = body.get("call_id") if isinstance(body, dict) else None
        assert isinstance(outer, str), (name, body)
        for cid in ids:  # every call_id the server handed out has a record
            assert cid in by_call, f"{name} {given}: no audit record for call_id {cid} ({body})"
            assert all(r["principal"] == "agent" for r in by_call[cid])
        first = by_call[outer][0]  # the outer call: a decision (or a rejection) naming its tool and arguments
        assert first["event"] in ("decision", "rejected"), (name, first)
        assert first.get("tool") and isinstance(first.get("arguments"), dict), (name, first)
        assert "parent" not in first
        for cid in ids:
            if cid != outer:  # a per-line call points at the call that carried it
                assert all(r.get("parent") == outer for r in by_call[cid]), (name, by_call[cid])
        lines = str(given.get("input", "\n")).endswith("\n") and "nosuch" not in json.dumps(given)
        children = {r["call_id"] for r in records if r.get("parent") == outer}
        assert set(ids) - {outer} <= children
        if (name, given.get("action")) in FAN_OUT and lines:  # it did fan out (a seed's reply may not list them)
            assert children and all(by_call[c][0]["event"] == "decision" for c in children), (name, body)
    assert verify(tmp_path / "audit").ok
