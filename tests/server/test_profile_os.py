"""`gateway serve --profile os` (seed 001) through the official SDK client: every tool of the
seed, its YAML replies field by field, the daemon numbers over the gateway's durable processes
(per principal: another principal's number is not yours), the seed's error codes, and the gate:
a denied command is the policy's denial, recorded like any call."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import yaml
from mcp import Client
from mcp.types import CallToolResult, TextContent

from gateway.audit import verify
from gateway.server.profiles import os_tools
from tests.server.conftest import HttpGateway, audit_records
from tests.server.test_profiles import profile_policy, serve


def raw(r: CallToolResult) -> str:
    assert len(r.content) == 1 and isinstance(r.content[0], TextContent)
    return r.content[0].text


def yaml_reply(r: CallToolResult) -> dict[str, Any]:
    """The seed's YAML, alone, in one text block, `status` first."""
    text = raw(r)
    assert text.startswith("status: "), text
    out: dict[str, Any] = yaml.safe_load(text)
    return out


def test_os_lists_the_seeds_tools_and_arguments(tmp_path: Path, ws: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "os")) as c:
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}

    tools = asyncio.run(scenario())
    seed = {"shell_cmd", "stop_daemon", "get_daemon_output", "env_get", "env_set", "env_unset"}
    assert set(tools) == seed | {"await_call"}
    cmd = tools["shell_cmd"]
    assert set(cmd["properties"]) == {"command", "shell", "bufferSize", "timeoutSeconds"}
    assert cmd["required"] == ["command"] and cmd["additionalProperties"] is False
    assert cmd["properties"]["shell"]["default"] == "bash"
    assert cmd["properties"]["bufferSize"]["default"] == os_tools.DEFAULT_BUFFER_LINES
    assert cmd["properties"]["bufferSize"]["default"] == 500  # the seed's implementation's default
    # the seed's parameter names (longrun-ai/dominds, main/tools/prompts/os/en/tools.md)
    assert set(tools["stop_daemon"]["properties"]) == {"pid"}
    assert set(tools["get_daemon_output"]["properties"]) == {"pid", "stream"}
    for name in ("stop_daemon", "get_daemon_output"):
        assert tools[name]["properties"]["pid"]["type"] == "integer" and tools[name]["required"] == ["pid"]
    assert set(tools["env_set"]["properties"]) == {"key", "value"}
    assert set(tools["env_get"]["properties"]) == set(tools["env_unset"]["properties"]) == {"key"}


def test_os_shell_cmd_daemons_env_and_error_codes(tmp_path: Path, ws: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("shell_cmd", {"command": "echo hi; echo err >&2"}),  # 0
        ("shell_cmd", {"command": "printf '1\\n2\\n3\\n4\\n'", "bufferSize": 2}),  # 1
        ("shell_cmd", {"command": "echo out; false"}),  # 2
        ("shell_cmd", {"command": "echo started; sleep 60", "timeoutSeconds": 1}),  # 3: a daemon
        ("get_daemon_output", {"pid": 1}),  # 4
        ("shell_cmd", {"command": "echo quick", "timeoutSeconds": 30}),  # 5: ends in time
        ("stop_daemon", {"pid": 1}),  # 6
        ("stop_daemon", {"pid": 1}),  # 7: DAEMON_NOT_RUNNING
        ("get_daemon_output", {"pid": 7}),  # 8: DAEMON_NOT_FOUND
        ("stop_daemon", {"pid": 7}),  # 9: DAEMON_NOT_FOUND
        ("shell_cmd", {"command": "echo x", "shell": "zsh"}),  # 10: refused
        ("shell_cmd", {"command": "curl https://example.com"}),  # 11: denied
        ("shell_cmd", {"command": "nosuchprogram"}),  # 12
        ("env_set", {"key": "APP_X", "value": "42"}),  # 13
        ("env_get", {"key": "APP_X"}),  # 14
        ("shell_cmd", {"command": "printenv APP_X"}),  # 15: later commands inherit it
        ("env_unset", {"key": "APP_X"}),  # 16
        ("env_get", {"key": "APP_X"}),  # 17: ENV_NOT_FOUND
        ("env_set", {"key": "LD_PRELOAD", "value": "/x.so"}),  # 18: denied
        ("shell_cmd", {"command": "echo x", "timeout": 5}),  # 19: not the seed's argument
        ("shell_cmd", {"command": "sleep 30", "shell": "sh", "timeoutSeconds": 1}),  # 20: sh is not in shells
        # the seed's own examples (tools.md "Usage Examples", scenarios.md)
        ("shell_cmd", {"command": f"ls -la {ws}", "timeoutSeconds": 10}),  # 21: the policy's to decide
        ("shell_cmd", {"command": f"cat {ws / 'notes.txt'}"}),  # 22: scenarios.md "View file contents"
        ("env_get", {"key": "PATH"}),  # 23: not one of yours
        ("env_set", {"key": "MY_VAR", "value": "hello"}),  # 24: not a name the policy allows
        ("env_unset", {"key": "MY_VAR"}),  # 25
        ("shell_cmd", {"command": "sleep 1; echo done", "timeoutSeconds": 0}),  # 26: 0 is no tracking
        ("shell_cmd", {"command": f"cat {ws / 'lines.txt'}", "bufferSize": 0}),  # 27: 0 is the default, 500
    ]

    (ws / "notes.txt").write_text("n\n")
    (ws / "lines.txt").write_text("".join(f"{i}\n" for i in range(1, 601)))

    async def scenario() -> list[CallToolResult]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "os")) as c:
            return [await c.call_tool(name, args) for name, args in calls]

    results = asyncio.run(scenario())
    out = [yaml_reply(r) for r in results]

    ok = out[0]  # the seed's shell_cmd reply, field by field and in its order
    assert list(ok)[:6] == ["status", "command", "exit_code", "stdout", "stderr", "executed_at"], ok
    assert not results[0].is_error and ok["status"] == "ok" and ok["command"] == "echo hi; echo err >&2"
    assert ok["exit_code"] == 0 and ok["stdout"] == "hi\n" and ok["stderr"] == "err\n"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", ok["executed_at"])  # the seed's timestamp format
    assert {"duration_ms", "cwd", "call_id"} <= set(ok) and ok["cwd"] == str(ws)
    assert "stdout: |\n  hi\n" in raw(results[0])  # multi-line text as a YAML block

    assert out[1]["stdout"] == "3\n4\n" and out[1]["stdout_lines_dropped"] == 2
    assert out[2]["status"] == "ok" and out[2]["exit_code"] == 1 and out[2]["stdout"] == "out\n"

    daemon = out[3]
    assert daemon["status"] == "ok" and daemon["pid"] == 1 and daemon["daemon"] is True and not results[3].is_error
    assert daemon["command"] == "echo started; sleep 60" and daemon["output"] == "started\n"
    assert "executed_at" in daemon and "pid 1" in daemon["message"]
    got = out[4]  # the seed's get_daemon_output reply: status, pid, output, retrieved_at
    assert list(got)[:4] == ["status", "pid", "output", "retrieved_at"] and got["status"] == "ok"
    assert got["pid"] == 1 and got["output"] == "started\n" and got["running"] is True and got["state"] == "running"
    quick = out[5]
    assert quick["status"] == "ok" and quick["exit_code"] == 0 and quick["stdout"] == "quick\n"
    assert quick["merged_output"] is True and "pid" not in quick
    stopped = out[6]  # the seed's stop_daemon reply: status, pid, stopped_at
    assert list(stopped)[:3] == ["status", "pid", "stopped_at"] and stopped["status"] == "ok"
    assert stopped["pid"] == 1 and stopped["state"] == "stopped"

    for i, code in ((7, "DAEMON_NOT_RUNNING"), (8, "DAEMON_NOT_FOUND"), (9, "DAEMON_NOT_FOUND")):
        assert results[i].is_error and list(out[i])[:3] == ["status", "error_code", "message"], out[i]
        assert out[i]["status"] == "error" and out[i]["error_code"] == code
    assert out[7]["pid"] == 1 and "not running" in out[7]["message"]
    assert out[8]["pid"] == 7 and "no daemon 7" in out[8]["message"]

    zsh = out[10]
    assert zsh["error_code"] == "INVALID_INPUT" and "zsh" in zsh["message"] and "bash" in zsh["message"]
    denied = out[11]
    assert denied["error_code"] == "POLICY_DENIED" and denied["rule"] == "no-curl" and "no network" in denied["message"]
    nf = out[12]
    # the seed's errors.md: SHELL_COMMAND_FAILED for a command that does not exist (the gateway's code in cause)
    assert nf["error_code"] == "SHELL_COMMAND_FAILED" and nf["cause"] == "COMMAND_NOT_FOUND" and results[12].is_error
    assert nf["exit_code"] == 127

    # the seed's env replies: env_set {status, key, value, set_at}, env_get {.., retrieved_at}, env_unset {.., unset_at}
    assert list(out[13])[:4] == ["status", "key", "value", "set_at"] and out[13]["status"] == "ok"
    assert out[13]["key"] == "APP_X" and out[13]["value"] == "42"
    assert list(out[14])[:4] == ["status", "key", "value", "retrieved_at"] and out[14]["value"] == "42"
    assert out[15]["stdout"] == "42\n"
    assert list(out[16])[:3] == ["status", "key", "unset_at"] and out[16]["was_set"] is True
    assert out[17]["error_code"] == "ENV_NOT_FOUND" and "APP_X" in out[17]["message"] and results[17].is_error
    assert out[18]["error_code"] == "POLICY_DENIED" and results[18].is_error
    assert out[19]["error_code"] == "INVALID_INPUT" and "timeout" in out[19]["message"]
    assert out[20]["status"] == "error" and out[20]["error_code"] in ("POLICY_DENIED", "INVALID_INPUT")
    # the seed's examples, through the gate
    # no rule lists here; the hint names no tool this profile lacks (the gateway's files tool)
    assert out[21]["error_code"] == "POLICY_DENIED" and "files tool" not in out[21]["message"]
    assert out[22]["status"] == "ok" and out[22]["command"] == f"cat {ws / 'notes.txt'}" and out[22]["stdout"] == "n\n"
    assert out[23]["error_code"] == "ENV_NOT_FOUND"  # the host's PATH is not a variable of the principal's
    assert out[24]["status"] == "error" and out[24]["error_code"] == "POLICY_DENIED"
    assert out[25]["status"] == "ok" and out[25]["was_set"] is False
    assert out[26]["status"] == "ok" and out[26]["stdout"] == "done\n" and "daemon" not in out[26]
    assert "merged_output" not in out[26]  # ran as a plain run, not through the process tools
    assert out[27]["stdout"].startswith("101\n") and out[27]["stdout_lines_dropped"] == 100

    # the same gate: the run family decided the commands, the processes family the daemons
    records = audit_records(tmp_path / "audit")
    decisions = {r["call_id"]: r for r in records if r["event"] == "decision"}
    d = decisions[denied["call_id"]]
    assert d["tool"] == "run" and d["decision"] == "deny" and d["rule"] == "no-curl"
    assert decisions[daemon["call_id"]]["arguments"]["background_after_ms"] == 1000
    assert decisions[stopped["call_id"]]["tool"] == "process"
    assert decisions[out[8]["call_id"]]["arguments"]["process_id"] == "daemon-7"  # decided and recorded too
    rejected = {r["call_id"] for r in records if r["event"] == "rejected"}
    assert {zsh["call_id"], out[19]["call_id"]} <= rejected
    assert verify(tmp_path / "audit").ok


def test_os_daemon_numbers_are_each_principals_own(tmp_path: Path, ws: Path) -> None:
    """Over HTTP, one server, two principals: each has its own daemon 1; `other` asking for
    `agent`'s number reaches its own daemon or none, never agent's."""
    from tests.server.test_transports import call_http

    server = HttpGateway(tmp_path, profile_policy(tmp_path, ws), ws, extra=("--profile", "os"))
    try:
        agent, other = server.token("agent"), server.token("other")
        started = asyncio.run(
            call_http(server.url, agent, "auto", ("shell_cmd", {"command": "sleep 60", "timeoutSeconds": 1}))
        )
        theirs = asyncio.run(
            call_http(server.url, other, "auto", ("stop_daemon", {"pid": 1}), ("get_daemon_output", {"pid": 1}),
                      ("shell_cmd", {"command": "sleep 60", "timeoutSeconds": 1}))
        )  # fmt: skip
        mine = asyncio.run(call_http(server.url, agent, "auto", ("get_daemon_output", {"pid": 1})))
        after = asyncio.run(call_http(server.url, other, "auto", ("stop_daemon", {"pid": 1})))
        asyncio.run(call_http(server.url, agent, "auto", ("stop_daemon", {"pid": 1})))
    finally:
        server.stop()
    assert yaml_reply(started[0])["pid"] == 1
    stop, output, own = (yaml_reply(r) for r in theirs)
    assert stop["error_code"] == "DAEMON_NOT_FOUND" and output["error_code"] == "DAEMON_NOT_FOUND"
    assert own["daemon"] is True and own["pid"] == 1  # other's own first daemon
    still = yaml_reply(mine[0])
    assert still["status"] == "ok" and still["running"] is True  # agent's was not stopped by other
    assert yaml_reply(after[0])["status"] == "ok"  # other stopped its own daemon 1
    assert verify(server.audit).ok


def test_os_a_supervisors_ask_is_pending_then_await_call_answers_in_yaml(tmp_path: Path, ws: Path) -> None:
    """Under a policy that asks a supervisor about `run`: shell_cmd answers `status: pending` in
    the seed's YAML, and await_call returns the approved result in that same shape."""
    from gateway import approval_queue
    from tests.server.conftest import gateway_cmd
    from tests.server.test_profiles import answering

    f = profile_policy(tmp_path, ws, run={"ask_from": 2})
    queue = tmp_path / "approvals"

    async def scenario() -> tuple[CallToolResult, CallToolResult]:
        async with Client(
            serve(tmp_path, f, ws, "os", "--pending-after", "0.2"), elicitation_callback=answering()
        ) as c:
            first = await c.call_tool("shell_cmd", {"command": "echo approved"})
            call_id = yaml_reply(first)["call_id"]
            (row,) = approval_queue.pending(queue)
            assert row["call_id"] == call_id
            await asyncio.to_thread(
                gateway_cmd, "approvals", "approve", call_id, "--state-dir", str(queue), "--by", "alice"
            )
            return first, await c.call_tool("await_call", {"call_id": call_id, "wait_ms": 60_000})

    first, done = asyncio.run(scenario())
    pending = yaml_reply(first)
    assert pending["status"] == "pending" and not first.is_error and "await_call" in pending["next"]
    assert pending["approval"]["waiting_for"] == "supervisor"
    result = yaml_reply(done)
    assert result["status"] == "ok" and result["stdout"] == "approved\n" and result["exit_code"] == 0
    assert result["call_id"] == pending["call_id"]
    approval = [r for r in audit_records(tmp_path / "audit") if r["event"] == "approval"]
    assert len(approval) == 1 and approval[0]["data"]["by"] == "alice" and approval[0]["tool"] == "run"


def test_daemon_numbers_survive_a_gateway_restart_and_stay_the_principals_own(tmp_path: Path, ws: Path) -> None:
    """The numbers live with the process records: a restarted gateway (same state directories)
    finds the daemon that ran on by its number, gives the next daemon a new number (never one
    given before), and another principal's number 1 is not this one's."""
    f = profile_policy(tmp_path, ws)

    async def first() -> dict[str, Any]:
        async with Client(serve(tmp_path, f, ws, "os")) as c:
            return yaml_reply(await c.call_tool("shell_cmd", {"command": "echo up; sleep 120", "timeoutSeconds": 1}))

    started = asyncio.run(first())
    assert started["daemon"] is True and started["pid"] == 1, started

    async def second() -> list[dict[str, Any]]:  # a new gateway process on the same state
        async with Client(serve(tmp_path, f, ws, "os")) as c:
            calls = [
                ("get_daemon_output", {"pid": 1}),
                ("shell_cmd", {"command": "echo two; sleep 120", "timeoutSeconds": 1}),
                ("stop_daemon", {"pid": 1}),
            ]
            return [yaml_reply(await c.call_tool(n, a)) for n, a in calls]

    got, again, stopped = asyncio.run(second())
    assert got["status"] == "ok" and got["pid"] == 1 and got["running"] is True and got["output"] == "up\n", got
    assert again["daemon"] is True and again["pid"] == 2, again  # 1 is never given again
    assert stopped["status"] == "ok" and stopped["pid"] == 1, stopped

    other = serve(tmp_path, f, ws, "os")
    other.args[other.args.index("agent")] = "other"

    async def as_other() -> list[dict[str, Any]]:
        async with Client(other) as c:
            return [yaml_reply(await c.call_tool(n, {"pid": 2})) for n in ("get_daemon_output", "stop_daemon")]

    for reply in asyncio.run(as_other()):  # agent's daemon 2 is nothing of other's
        assert reply["status"] == "error" and reply["error_code"] == "DAEMON_NOT_FOUND", reply

    async def last() -> dict[str, Any]:
        async with Client(serve(tmp_path, f, ws, "os")) as c:
            return yaml_reply(await c.call_tool("stop_daemon", {"pid": 2}))

    assert asyncio.run(last())["status"] == "ok"  # still agent's, still running
    started_records = [r for r in audit_records(tmp_path / "audit") if r["event"] == "process_started"]
    assert verify(tmp_path / "audit").ok and len(started_records) == 2
