"""`gateway serve --profile terminal-interface` (seed 003) through the official SDK client:
run_terminal_command, every format_type of format_terminal_output, start_interactive_shell and
the tools that use the shell, replies field by field; shell types the analyser cannot check are
refused with the reason and nothing runs; every line sent to a shell is decided and recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from gateway.audit import verify
from gateway.sandbox.identity import hand_over, sandbox_identity
from gateway.server.profiles import terminal
from tests.server.conftest import audit_records
from tests.server.test_profiles import profile_policy, reply, serve
from tests.server.test_seed_examples import REPO
from tests.server.test_seed_examples import serve as seed_serve


def shell_policy(tmp_path: Path, ws: Path) -> Path:
    """The profile tests' policy, plus cd inside the roots, export of APP_* and exit."""
    f = profile_policy(tmp_path, ws)
    p = yaml.safe_load(f.read_text())
    p["rules"][:0] = [
        {"id": "cd", "decision": "allow", "justification": "change directory inside the roots", "programs": ["cd"],
         "path_args": {"read": "first"}, "examples": {"match": ["cd src"]}},
        {"id": "export", "decision": "allow", "justification": "APP_* only", "programs": ["export"],
         "args": ["APP_[A-Z_]+(=.*)?"], "examples": {"match": ["export APP_MODE=x"], "not_match": ["export PAGER=x"]}},
        {"id": "exit", "decision": "allow", "justification": "ending a shell", "programs": ["exit"],
         "accept_unknown": True, "examples": {"match": ["exit 3"]}},
    ]  # fmt: skip
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f


def test_terminal_lists_the_seeds_tools_and_arguments(tmp_path: Path, ws: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "terminal-interface")) as c:
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}

    tools = asyncio.run(scenario())
    seed = {"run_terminal_command", "format_terminal_output", "start_interactive_shell"}
    assert set(tools) == seed | set(terminal.SHELL_TOOLS) | {"await_call"}
    run = tools["run_terminal_command"]
    assert set(run["properties"]) == {"command", "working_directory", "timeout_seconds", "capture_output"}
    assert run["required"] == ["command"] and run["additionalProperties"] is False
    assert run["properties"]["timeout_seconds"]["default"] == 30 and run["properties"]["capture_output"]["default"]
    start = tools["start_interactive_shell"]
    assert set(start["properties"]) == {"shell_type", "working_directory", "prompt", "startup_commands"}
    assert "required" not in start
    fmt = tools["format_terminal_output"]  # the seed's parameters (codomyrmex MCP_TOOL_SPECIFICATION.md)
    assert set(fmt["properties"]) == {"content", "format_type", "table_headers", "table_rows"}
    assert fmt["required"] == ["content"]
    assert fmt["properties"]["format_type"]["enum"] == ["success", "error", "warning", "info", "table", "json"]


def test_run_terminal_command_examples_and_errors(tmp_path: Path, ws: Path) -> None:
    (ws / "sub").mkdir()
    (ws / "sub").chmod(0o777)
    calls: list[dict[str, Any]] = [
        {"command": "echo hello"},
        # the seed's example: {"command": "ls -la", "working_directory": "/path/to/project", ...}
        {"command": "pwd", "working_directory": str(ws / "sub"), "timeout_seconds": 30, "capture_output": True},
        {"command": "echo out; echo err >&2; false"},
        {"command": "echo secret", "capture_output": False},
        {"command": "sleep 30", "timeout_seconds": 0.5},
        {"command": "curl https://example.com"},
        {"command": "echo x", "working_directory": "/etc"},
        {"command": "echo x", "timeout_seconds": 0},
        {"command": "echo x", "cwd": "sub"},
    ]

    async def scenario() -> list[CallToolResult]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "terminal-interface")) as c:
            return [await c.call_tool("run_terminal_command", a) for a in calls]

    results = asyncio.run(scenario())
    ok, cwd, failed, quiet, timeout, denied, outside, bad, unknown = (reply(r) for r in results)
    # the seed's output schema, field by field and in its order (after `success`, the gateway's)
    seed = ["command", "return_code", "stdout", "stderr", "execution_time", "working_directory"]
    assert list(ok) == ["success", *seed, "call_id"] and ok["command"] == "echo hello"
    assert ok["success"] is True and ok["return_code"] == 0 and ok["stdout"] == "hello\n" and ok["stderr"] == ""
    assert isinstance(ok["execution_time"], float) and ok["working_directory"] == str(ws)
    assert cwd["stdout"] == f"{ws / 'sub'}\n" and cwd["working_directory"] == str(ws / "sub")
    assert failed["success"] is False and failed["return_code"] == 1 and "error_code" not in failed
    assert failed["stdout"] == "out\n" and failed["stderr"] == "err\n" and not results[2].is_error
    assert quiet["success"] is True and quiet["stdout"] == "" and quiet["stderr"] == ""
    assert timeout["success"] is False and timeout["error_code"] == "COMMAND_TIMEOUT" and timeout["return_code"] == -1
    assert results[4].is_error
    assert denied["error_code"] == "POLICY_DENIED" and denied["rule"] == "no-curl" and "no network" in denied["error"]
    assert results[5].is_error and "stdout" not in denied
    assert outside["error_code"] == "PATH_OUTSIDE_JAIL"
    assert bad["error_code"] == "INVALID_INPUT" and "timeout_seconds" in bad["error"]
    assert unknown["error_code"] == "INVALID_INPUT" and "cwd" in unknown["error"]

    records = audit_records(tmp_path / "audit")
    decisions = {r["call_id"]: r for r in records if r["event"] == "decision"}
    d = decisions[denied["call_id"]]
    assert d["tool"] == "run" and d["decision"] == "deny" and d["rule"] == "no-curl"
    assert decisions[cwd["call_id"]]["arguments"]["timeout_ms"] == 30_000
    assert decisions[quiet["call_id"]]["arguments"]["capture_output"] is False
    assert verify(tmp_path / "audit").ok


def test_format_terminal_output_every_format_type(tmp_path: Path, ws: Path) -> None:
    calls: list[dict[str, Any]] = [
        {"content": "built", "format_type": "success"},
        {"content": "Error: Connection failed", "format_type": "error"},  # the seed's example
        {"content": "disk almost full", "format_type": "warning"},
        {"content": "3 files"},  # format_type: info by default
        # the seed's example table
        {
            "content": "files",
            "format_type": "table",
            "table_headers": ["Name", "Status", "Size"],
            "table_rows": [["file1.txt", "active", "1.2MB"]],
        },
        {"content": "", "format_type": "table", "table_rows": [["name", "n"], ["bb", "2"]]},  # first row: header
        {"content": '{"b": 1, "a": [1, 2]}', "format_type": "json"},
        {"content": "not json", "format_type": "json"},
        {"content": "x", "format_type": "table"},  # no rows
        {"content": ["x"], "format_type": "success"},
        {"content": "x", "format_type": "rainbow"},
    ]

    async def scenario() -> list[CallToolResult]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "terminal-interface")) as c:
            return [await c.call_tool("format_terminal_output", a) for a in calls]

    results = asyncio.run(scenario())
    out = [reply(r) for r in results]
    seed = ["formatted_content", "format_type", "original_content", "terminal_codes"]  # the seed's output schema
    for i, (code, mark) in enumerate((("32", "✔"), ("31", "❌"), ("33", "⚠"), ("36", "\u2139"))):  # ❌: the seed's
        assert list(out[i]) == ["success", *seed, "call_id"], out[i]
        assert out[i]["success"] is True and out[i]["terminal_codes"] == [f"{code}m", "0m"]
        assert out[i]["formatted_content"] == f"\x1b[{code}m{mark} {calls[i]['content']}\x1b[0m"
        assert out[i]["original_content"] == calls[i]["content"]
    # the seed's example: {"formatted_content": "\u001b[31m❌ Error: Connection failed\u001b[0m",
    #   "format_type": "error", "original_content": "Error: Connection failed", "terminal_codes": ["31m", "0m"]}
    assert out[1]["format_type"] == "error" and out[1]["original_content"] == "Error: Connection failed"
    assert out[3]["format_type"] == "info"
    table = out[4]["formatted_content"]
    assert table.splitlines()[1:] == ["---------  ------  -----", "file1.txt  active  1.2MB"]
    assert table.startswith("\x1b[1mName") and out[4]["terminal_codes"] == ["1m", "0m"]
    assert out[4]["original_content"] == "files" and out[4]["format_type"] == "table"
    assert "bb    2" in out[5]["formatted_content"] and out[5]["formatted_content"].startswith("\x1b[1mname  n")
    assert out[6]["formatted_content"] == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'
    assert out[6]["terminal_codes"] == []
    assert out[7]["formatted_content"] == '"not json"'
    for i, field in ((8, "table_rows"), (9, "content"), (10, "format_type")):
        assert out[i]["success"] is False and out[i]["error_code"] == "INVALID_INPUT" and field in out[i]["error"]
        assert results[i].is_error


def test_interactive_shell_every_line_decided(tmp_path: Path, ws: Path) -> None:
    (ws / "sub" / "inner").mkdir(parents=True)
    for d in (ws / "sub", ws / "sub" / "inner"):
        d.chmod(0o777)

    async def scenario() -> dict[str, CallToolResult]:
        async with Client(serve(tmp_path, shell_policy(tmp_path, ws), ws, "terminal-interface")) as c:
            got: dict[str, CallToolResult] = {}
            for kind in ("zsh", "fish", "python"):
                got[kind] = await c.call_tool("start_interactive_shell", {"shell_type": kind})
            got["none"] = await c.call_tool("list_shells", {})
            got["start"] = await c.call_tool("start_interactive_shell", {
                "shell_type": "bash", "working_directory": "sub", "prompt": "$ ",
                "startup_commands": ["export APP_MODE=test", "cd inner"],
            })  # fmt: skip
            sid = reply(got["start"])["shell_id"]
            got["exec"] = await c.call_tool("execute_in_shell", {"shell_id": sid, "command": "echo $APP_MODE; pwd"})
            got["denied"] = await c.call_tool("execute_in_shell", {"shell_id": sid, "command": "curl x"})
            got["typed"] = await c.call_tool("send_shell_input", {"shell_id": sid, "input": "curl https://x\n"})
            got["slow"] = await c.call_tool(
                "execute_in_shell", {"shell_id": sid, "command": "sleep 1; echo done", "timeout_seconds": 0.2}
            )
            got["read"] = await c.call_tool("read_shell_output", {"shell_id": sid})
            got["list"] = await c.call_tool("list_shells", {})
            got["bad_start"] = await c.call_tool("start_interactive_shell", {"startup_commands": ["curl x", "echo no"]})
            got["busy"] = await c.call_tool("execute_in_shell", {"shell_id": sid, "command": "echo x"})
            other = reply(got["bad_start"])["shell_id"]
            got["exit"] = await c.call_tool("execute_in_shell", {"shell_id": other, "command": "exit 3"})
            got["gone"] = await c.call_tool("execute_in_shell", {"shell_id": other, "command": "echo x"})
            got["close"] = await c.call_tool("close_shell", {"shell_id": sid})
            got["after"] = await c.call_tool("list_shells", {})
            got["unknown"] = await c.call_tool("read_shell_output", {"shell_id": "nosuch"})
            return got

    r = asyncio.run(scenario())
    out = {k: reply(v) for k, v in r.items()}
    refused = out["fish"]
    assert refused["success"] is False and refused["error_code"] == "INVALID_INPUT" and r["fish"].is_error
    assert "'fish' is refused" in refused["error"] and "bash" in refused["error"] and "shell_id" not in refused
    zsh = out["zsh"]  # a zsh shell runs only where the policy's shells name it (this one: bash only)
    assert zsh["success"] is False and zsh["error_code"] == "POLICY_DENIED" and "policy's shells" in zsh["error"]
    python = out["python"]  # the interpreter is decided as `python3`: this policy names no rule for it
    assert python["success"] is False and python["error_code"] == "POLICY_DENIED" and "python3" in python["error"]
    assert out["none"] == {"success": True, "shells": [], "call_id": out["none"]["call_id"]}  # nothing started

    start = out["start"]
    assert start["success"] is True and not r["start"].is_error
    # the seed's output schema: shell_id, shell_type, status "started", working_directory,
    # startup_commands_executed, available_commands
    assert start["status"] == "started" and start["shell_type"] == "bash"
    assert start["working_directory"] == str(ws / "sub")
    assert start["startup_commands_executed"] == 2 and [s["status"] for s in start["startup_results"]] == ["ok", "ok"]
    # what can be typed in it: the programs the policy's rules allow (or ask about) for this principal
    # (curl is only denied: not there)
    assert start["available_commands"] == ["cat", "cd", "echo", "exit", "export", "false", "nosuchprogram",
                                           "printenv", "printf", "pwd", "rm", "sleep", "touch", "true"]  # fmt: skip
    assert start["shell_tools"] == list(terminal.SHELL_TOOLS) and start["output"] == "$ "
    assert {"shell_id", "call_id"} <= set(start)

    ran = out["exec"]
    assert ran["success"] is True and ran["return_code"] == 0 and ran["working_directory"] == str(ws / "sub" / "inner")
    assert ran["output"] == f"test\r\n{ws / 'sub' / 'inner'}\r\n$ "
    for k in ("denied", "typed"):
        assert out[k]["success"] is False and out[k]["error_code"] == "POLICY_DENIED" and r[k].is_error
        assert out[k]["rule"] == "no-curl"
    assert out["slow"]["success"] is True and out["slow"]["running"] is True
    assert out["read"]["success"] is True and "alive" in out["read"]
    listed = out["list"]["shells"]
    assert [s["shell_id"] for s in listed] == [start["shell_id"]] and listed[0]["status"] == "active"

    bad = out["bad_start"]
    assert bad["success"] is False and bad["error_code"] == "POLICY_DENIED" and bad["startup_commands_executed"] == 0
    assert len(bad["startup_results"]) == 1  # the first denial stops the rest: `echo no` never ran
    assert out["busy"]["error_code"] == "SESSION_BUSY" and r["busy"].is_error  # the slow command still runs
    assert out["exit"]["success"] is False and "error_code" not in out["exit"] and not r["exit"].is_error
    assert out["exit"]["return_code"] == 3 and out["exit"]["alive"] is False
    assert out["gone"]["success"] is False and out["gone"]["error_code"] in ("SESSION_ENDED", "SESSION_NOT_FOUND")
    assert out["close"]["success"] is True and out["close"]["status"] == "closed"
    assert out["after"]["shells"] == []
    assert out["unknown"]["error_code"] == "SESSION_NOT_FOUND"

    records = audit_records(tmp_path / "audit")
    decided = [(r["arguments"].get("command"), r["decision"]) for r in records
               if r["event"] == "decision" and r["tool"] == "session" and r["arguments"].get("command")]  # fmt: skip
    assert ("export APP_MODE=test", "allow") in decided and ("cd inner", "allow") in decided
    assert ("curl x", "deny") in decided and ("curl https://x", "deny") in decided
    assert ("echo no", "allow") not in decided and ("echo no", "deny") not in decided
    rejected = {r["call_id"] for r in records if r["event"] == "rejected"}
    assert out["fish"]["call_id"] in rejected
    assert verify(tmp_path / "audit").ok


def test_a_python_shell_where_the_policy_allows_the_interpreter(tmp_path: Path, ws: Path) -> None:
    """shell_type python is the interpreter the policy decides as `python3` (no script: it reads
    its input). Under the shipped layer the rule interpreter-repl refuses it, with its reason; a
    layer over it that allows the bare interpreter gets a real REPL on a terminal, whose every line
    is recorded in full and runs in the sandbox (its boundary: the sandbox's account, no file
    outside the roots)."""
    hand_over(ws)
    layer = tmp_path / "python-shell.yaml"
    layer.write_text(yaml.safe_dump({
        "version": 1,
        "include": [str(REPO / "policies" / "profiles" / "terminal-interface.yaml")],
        "rules": [
            {"id": "interpreter-repl", "decision": "deny", "justification": "no REPL but python3's",
             "programs": ["node", "perl", "ruby", "php", "lua", "irb"], "args": [],
             "examples": {"match": ["node"]}},
            {"id": "python-script", "decision": "ask", "justification": "node scripts only, here",
             "programs": ["node"], "first_arg": ["[\\w./-]+\\.js"], "examples": {"match": ["node a.js"]}},
            {"id": "python-shell", "decision": "allow", "justification": "a Python shell, in the sandbox",
             "programs": ["python3"], "args": [], "examples": {"match": ["python3"], "not_match": ["python3 x.py"]}},
        ],
    }))  # fmt: skip

    async def scenario(policy: list[str]) -> dict[str, dict[str, Any]]:
        params = seed_serve(tmp_path / policy[0], ws, "terminal-interface")
        params = StdioServerParameters(command=params.command, args=[*params.args, *policy[1:]], env=params.env,
                                       cwd=params.cwd)  # fmt: skip
        async with Client(params) as c:
            out: dict[str, dict[str, Any]] = {}
            out["start"] = reply(await c.call_tool("start_interactive_shell", {"shell_type": "python"}))
            sid = out["start"].get("shell_id")
            if sid:
                for key, line in (("set", "x = 6 * 7"), ("print", "print(x)"), ("uid", "import os; print(os.getuid())"),
                                  ("shadow", "open('/etc/shadow').read()")):  # fmt: skip
                    out[key] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": line}))
                out["close"] = reply(await c.call_tool("close_shell", {"shell_id": sid}))
            return out

    (tmp_path / "shipped").mkdir()
    (tmp_path / "allowed").mkdir()
    refused = asyncio.run(scenario(["shipped"]))["start"]
    assert refused["success"] is False and refused["error_code"] == "POLICY_DENIED", refused
    assert refused["rule"] == "interpreter-repl"
    out = asyncio.run(scenario(["allowed", "--policy", str(layer)]))
    start = out["start"]
    assert start["success"] is True and start["shell_type"] == "python", start
    assert start["available_commands"] == []
    assert start["output"] == ">>> ", start
    assert out["set"]["output"] == "x = 6 * 7\r\n>>> "  # the terminal echoes the line, then the prompt
    assert out["print"]["output"] == "print(x)\r\n42\r\n>>> "
    assert out["uid"]["output"].splitlines()[1] == str(sandbox_identity().uid)
    assert "PermissionError" in out["shadow"]["output"] or "FileNotFoundError" in out["shadow"]["output"]
    assert out["close"]["success"] is True
    records = audit_records(tmp_path / "allowed" / "audit")
    lines = [
        r["arguments"]["command"] for r in records if r["event"] == "decision" and r["arguments"].get("as") == "python"
    ]
    assert lines == ["x = 6 * 7", "print(x)", "import os; print(os.getuid())", "open('/etc/shadow').read()"]
    started = next(r for r in records if r["event"] == "decision" and r["arguments"].get("action") == "start")
    assert started["rule"] == "python-shell"
    assert verify(tmp_path / "allowed" / "audit").ok
