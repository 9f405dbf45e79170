"""`gateway serve --profile methings` (seed 000) through the official SDK client, against the real
`gateway serve --stdio` subprocess: the seed's sessions (`local_shell_session` over pipes,
`termux_shell_session` on a PTY) and `termux_fs`, with every example call of the seed and the
error cases, each reply checked field by field. Both are adapters over the gateway's `session`
and `files` tools: each command is decided like a `run`, each path is jailed, and every call is
recorded."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
from pathlib import Path
from typing import Any

import yaml
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from gateway.audit import verify
from gateway.sandbox.identity import hand_over
from tests.server.conftest import GATEWAY, POLICY, audit_records, env_without_state, gateway_cmd

SESSION_ARGS = {"action", "session_id", "command", "input", "cwd", "rows", "cols", "timeout", "env"}
FS_ARGS = {"action", "path", "content", "encoding", "max_bytes", "offset", "show_hidden", "parents", "recursive"}


def methings_policy(tmp_path: Path, home: str | None = "home", **limits: int) -> Path:
    """The server tests' policy with a home (`ws/home`), both shells, seq, and the role's limits."""
    p: dict[str, Any] = copy.deepcopy(POLICY)
    p["rules"][0]["programs"] += ["seq", "read", "export", "stty", "set", "grep", "exit"]
    p["roles"]["dev"]["limits"] |= limits
    p["shells"] = ["bash", "sh"]
    if home is not None:
        p["home"] = home
    d = tmp_path / "policies"
    d.mkdir(exist_ok=True)
    f = d / "p.yaml"
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f


def serve(tmp_path: Path, policy_file: Path, ws: Path) -> StdioServerParameters:
    args = ["serve", "--stdio", "--principal", "agent", "--policy", str(policy_file), "--workspace", str(ws)]
    args += ["--audit-dir", str(tmp_path / "audit"), "--state-dir", str(tmp_path / "approvals")]
    args += ["--process-dir", str(tmp_path / "state"), "--profile", "methings", "--pending-after", "0.2"]
    return StdioServerParameters(command=GATEWAY, args=args, env=env_without_state(tmp_path))


def reply(r: CallToolResult) -> dict[str, Any]:
    """A profile's reply: the seed's JSON, alone, in one text block."""
    assert len(r.content) == 1 and r.content[0].type == "text"
    out: dict[str, Any] = json.loads(r.content[0].text)
    return out


def made_home(ws: Path, *dirs: str) -> Path:
    home = ws / "home"
    for d in ("", *dirs):
        for part in [*reversed((home / d).relative_to(ws).parents[:-1]), (home / d).relative_to(ws)]:
            (ws / part).mkdir(exist_ok=True)
            hand_over(ws / part)  # the sandbox's account may write there, as the agent's commands do
    return home


# --- the sessions ---------------------------------------------------------------------------------
def test_sessions_follow_the_seeds_example_flow(tmp_path: Path, ws: Path) -> None:
    home = made_home(ws, "project")
    f = methings_policy(tmp_path)
    answered: list[str] = []

    async def scenario() -> tuple[dict[str, Any], dict[str, CallToolResult]]:
        async with Client(serve(tmp_path, f, ws)) as c:
            tools = {t.name: t.input_schema for t in (await c.list_tools()).tools}
            r: dict[str, CallToolResult] = {}

            async def call(key: str, tool: str, **args: Any) -> dict[str, Any]:
                r[key] = await c.call_tool(tool, args)
                return reply(r[key])

            t = "termux_shell_session"
            sid = (await call("start", t, action="start", cwd="~/project"))["session_id"]
            await call("export", t, action="exec", session_id=sid, command="export MY_VAR=hello")
            await call("echo", t, action="exec", session_id=sid, command="echo $MY_VAR; pwd")
            await call("prompt", t, action="exec", session_id=sid, command="read answer; echo got=$answer", timeout=1)
            shown = (await call("write", t, action="write", session_id=sid, input="y\n")).get("output", "")
            running = True
            for _ in range(2400):  # the program answers in its own time: read until the prompt is back
                if shown.endswith("$ ") and not running:  # (the prompt comes before the shell says it is done)
                    break
                await asyncio.sleep(0.05)
                got = await call("read", t, action="read", session_id=sid)
                shown, running = shown + got["output"], got["running"]
            answered.append(shown)
            await call("resize", t, action="resize", session_id=sid, rows=50, cols=132)
            await call("stty", t, action="exec", session_id=sid, command="stty size")
            await call("denied", t, action="exec", session_id=sid, command="curl https://example.com")
            await call("too_long", t, action="exec", session_id=sid, command="true", timeout=301)
            await call("exit", t, action="exec", session_id=sid, command="exit 3")
            await call("after_exit", t, action="exec", session_id=sid, command="true")

            local = "local_shell_session"
            lid = (await call("local_start", local, action="start"))["session_id"]
            await call("local_exec", local, action="exec", session_id=lid, command="set -o | grep posix")
            await call("local_resize", local, action="resize", session_id=lid, rows=30, cols=100)
            await call("local_list", local, action="list")
            await call("termux_list", t, action="list")
            await call("local_read", local, action="read", session_id=lid)
            await call("kill", local, action="kill", session_id=lid)
            await call("unknown", local, action="exec", session_id="nosuchsession", command="true")
            await call("no_command", local, action="exec", session_id=lid)
            return tools, r

    tools, r = asyncio.run(scenario())
    out = {k: reply(v) for k, v in r.items()}
    assert {"local_shell_session", "termux_shell_session", "termux_fs"} <= set(tools)
    for name in ("local_shell_session", "termux_shell_session"):
        schema = tools[name]
        assert set(schema["properties"]) == SESSION_ARGS
        assert (schema["properties"]["timeout"]["default"], schema["properties"]["timeout"]["maximum"]) == (30, 300)
        assert schema["properties"]["action"]["enum"] == ["start", "exec", "write", "read", "resize", "kill", "list"]

    start = out["start"]
    assert set(start) == {"session_id", "output", "call_id"} and start["output"] == "$ "  # the initial prompt
    echo = out["echo"]
    assert set(echo) == {"output", "alive", "exit_code", "running", "call_id"}
    lines = echo["output"].replace("\r\n", "\n").split("\n")
    # the command first, as a terminal echoes it (seed 000: "echo $MY_VAR\r\nhello\r\n..."); ~/project
    # is the home's, not a literal "~"
    assert lines == ["echo $MY_VAR; pwd", "hello", str(home / "project"), "$ "]
    assert echo["output"].startswith("echo $MY_VAR; pwd\r\nhello\r\n")
    assert (echo["alive"], echo["exit_code"], echo["running"]) == (True, 0, False)
    assert out["prompt"]["running"] is True and out["prompt"]["alive"] is True  # waits for its answer
    assert "action read" in out["prompt"]["notice"] and "session read" not in out["prompt"]["notice"]
    assert out["write"]["ok"] is True and not r["write"].is_error
    assert "got=y" in answered[0]  # the answer reached the program
    assert out["resize"] == {"ok": True, "rows": 50, "cols": 132, "call_id": out["resize"]["call_id"]}
    assert out["stty"]["output"].startswith("stty size\r\n50 132")
    denied = out["denied"]
    assert denied["status"] == "error" and r["denied"].is_error
    assert (denied["error"]["code"], denied["error"]["rule"]) == ("POLICY_DENIED", "no-curl")
    assert out["too_long"]["error"]["code"] == "INVALID_INPUT" and "timeout" in out["too_long"]["error"]["message"]
    assert (out["exit"]["exit_code"], out["exit"]["alive"]) == (3, False)
    assert out["after_exit"]["status"] == "error" and r["after_exit"].is_error

    assert "posix" in out["local_exec"]["output"] and "on" in out["local_exec"]["output"]  # sh: bash in POSIX mode
    resized = out["local_resize"]  # accepted, with no effect: a pipe has no terminal
    assert (resized["ok"], resized["resized"], r["local_resize"].is_error) == (True, False, False)
    (listed,) = out["local_list"]["sessions"]  # each tool lists its own kind of session
    assert set(listed) == {"session_id", "alive", "idle_seconds", "uptime_seconds"}
    assert listed["session_id"] == out["local_start"]["session_id"] and listed["alive"] is True
    assert out["termux_list"]["sessions"] == []  # its one session ended with exit 3; the pipe one is not its
    assert out["local_read"] == {
        "output": "", "alive": True, "exit_code": 0, "running": False, "call_id": out["local_read"]["call_id"],
    }  # fmt: skip
    assert out["kill"]["ok"] is True and out["kill"]["alive"] is False
    assert out["unknown"]["status"] == "error" and out["unknown"]["error"]["code"] == "SESSION_NOT_FOUND"
    assert out["no_command"]["error"]["code"] == "INVALID_INPUT" and "command" in out["no_command"]["error"]["message"]

    decisions = {d["call_id"]: d for d in audit_records(tmp_path / "audit") if d["event"] == "decision"}
    d = decisions[denied["call_id"]]
    assert (d["tool"], d["decision"], d["rule"]) == ("session", "deny", "no-curl")
    assert decisions[out["echo"]["call_id"]]["arguments"]["command"] == "echo $MY_VAR; pwd"
    assert decisions[out["echo"]["call_id"]]["arguments"]["timeout_ms"] == 30_000  # the seed's 30 s default
    assert verify(tmp_path / "audit").ok


def test_a_sessions_cwd_is_the_home_by_default_and_relative_to_it(tmp_path: Path, ws: Path) -> None:
    """The seed's paths mean the principal's home: a session started without a cwd starts in
    `~` (the policy's home), and a relative cwd is under `~`, as termux_fs's paths are; a
    policy without a home refuses, naming it. (On main both started in the workspace.)"""
    home = made_home(ws, "project")
    (ws / "project").mkdir()  # a workspace directory of the same name: not the one meant
    f = methings_policy(tmp_path)

    async def scenario() -> list[dict[str, Any]]:
        async with Client(serve(tmp_path, f, ws)) as c:
            out = []
            for tool, cwd in (("termux_shell_session", None), ("local_shell_session", "project")):
                start = {"action": "start", **({"cwd": cwd} if cwd else {})}
                sid = reply(await c.call_tool(tool, start))["session_id"]
                args = {"action": "exec", "session_id": sid, "command": "pwd"}
                out.append(reply(await c.call_tool(tool, args)))
            return out

    default, relative = asyncio.run(scenario())
    assert default["output"].replace("\r", "").splitlines()[:2] == ["pwd", str(home)], default  # echoed first
    assert relative["output"].splitlines()[0] == str(home / "project"), relative

    (tmp_path / "nohome").mkdir()
    g = methings_policy(tmp_path / "nohome", home=None)

    async def without_home() -> dict[str, Any]:
        async with Client(serve(tmp_path / "nohome", g, ws)) as c:
            return reply(await c.call_tool("local_shell_session", {"action": "start"}))

    refused = asyncio.run(without_home())
    assert refused["status"] == "error" and "home" in refused["error"]["message"], refused


def test_a_long_session_output_is_cut_and_the_rest_is_read_through_termux_fs(tmp_path: Path, ws: Path) -> None:
    """`seq 1 400000` in a session: the reply holds the policy's reply_bytes, head and tail, and says
    where the whole (what the session kept, limits.output_bytes) is; termux_fs reads it there."""
    made_home(ws)
    f = methings_policy(tmp_path, output_bytes=8 << 20)
    whole = "".join(f"{i}\n" for i in range(1, 400_001))

    async def scenario() -> tuple[CallToolResult, dict[str, Any], dict[str, Any]]:
        async with Client(serve(tmp_path, f, ws)) as c:
            sid = reply(await c.call_tool("local_shell_session", {"action": "start"}))["session_id"]
            r = await c.call_tool(
                "local_shell_session", {"action": "exec", "session_id": sid, "command": "seq 1 400000"}
            )
            saved = reply(r)["reply_cut"]["output"]["saved"]
            first = reply(await c.call_tool("termux_fs", {"action": "read", "path": saved}))
            size = len(whole) + len("$ ")
            last = {"action": "read", "path": saved, "offset": size - 20, "max_bytes": 20}
            return r, first, reply(await c.call_tool("termux_fs", last))

    r, first, last = asyncio.run(scenario())
    out = reply(r)
    assert len(r.content[0].text.encode()) < 40_000, len(r.content[0].text)  # 30 KB JSON-escaped; was 2.6 MB
    assert out["output"].startswith("1\n2\n") and out["output"].endswith("399999\n400000\n$ ")
    cut = out["reply_cut"]["output"]
    assert (cut["bytes"], cut["shown"]) == (len(whole) + 2, 30_000)
    assert "termux_fs read" in out["notice"] and cut["saved"] in out["notice"]
    assert (first["read_bytes"], first["truncated"], first["next_offset"]) == (30_000, True, 30_000)
    assert first["content"] == whole[:30_000] and "limits.reply_bytes" in first["notice"]
    assert last["content"] == whole[-18:] + "$ " and last["truncated"] is False


# --- termux_fs ------------------------------------------------------------------------------------
def test_termux_fs_examples_and_error_cases(tmp_path: Path, ws: Path) -> None:
    home = made_home(ws, "methings/server")
    (home / "methings/server/.env").write_text("X=1\n")
    (home / "methings/server/app.py").write_text("print(1)\n")
    (home / ".bashrc").write_text("export PS1='$ '\n")
    f = methings_policy(tmp_path)
    blob = bytes(range(256)) * 4
    mtime = (home / "methings/server/app.py").stat().st_mtime

    async def scenario() -> tuple[dict[str, Any], dict[str, CallToolResult]]:
        async with Client(serve(tmp_path, f, ws)) as c:
            tools = {t.name: t.input_schema for t in (await c.list_tools()).tools}
            calls: list[tuple[str, dict[str, Any]]] = [
                ("list", {"action": "list", "path": "~/methings/server", "show_hidden": True}),
                ("list_plain", {"action": "list", "path": "methings/server"}),
                ("read_rc", {"action": "read", "path": "~/.bashrc"}),
                ("write", {"action": "write", "path": "~/script.py", "content": "print('hello')"}),
                ("stat", {"action": "stat", "path": "~/methings"}),
                ("stat_file", {"action": "stat", "path": "script.py"}),
                ("read", {"action": "read", "path": "script.py", "offset": 6, "max_bytes": 7}),
                (
                    "write_bin",
                    {
                        "action": "write",
                        "path": "blob.bin",
                        "encoding": "base64",
                        "content": base64.b64encode(blob).decode(),
                    },
                ),
                ("read_bin", {"action": "read", "path": "~/blob.bin"}),
                ("mkdir", {"action": "mkdir", "path": "a/b/c"}),
                ("mkdir_no_parents", {"action": "mkdir", "path": "x/y", "parents": False}),
                ("outside", {"action": "read", "path": "/etc/passwd"}),
                ("up_and_out", {"action": "read", "path": "../../etc/hostname"}),
                ("tilde_user", {"action": "read", "path": "~root/.bashrc"}),
                ("missing", {"action": "read", "path": "nope.txt"}),
                ("no_content", {"action": "write", "path": "x.txt"}),
                ("too_much", {"action": "read", "path": "x.txt", "max_bytes": (10 << 20) + 1}),
                ("bad_action", {"action": "chmod", "path": "x.txt"}),
            ]
            r = {k: await c.call_tool("termux_fs", a) for k, a in calls}
            # every delete is decided as the `rm` that would do it: the policy's rule asks a supervisor
            for k, a in [
                ("delete", {"action": "delete", "path": "~/script.py"}),
                ("delete_full", {"action": "delete", "path": "~/methings"}),
                ("delete_tree", {"action": "delete", "path": "~/methings", "recursive": True}),
            ]:
                r[f"{k}_pending"] = await c.call_tool("termux_fs", a)
                cid = reply(r[f"{k}_pending"])["call_id"]
                await asyncio.to_thread(
                    gateway_cmd, "approvals", "approve", cid, "--state-dir", str(tmp_path / "approvals"), "--by", "al"
                )
                r[k] = await c.call_tool("await_call", {"call_id": cid, "wait_ms": 60_000})
            return tools, r

    tools, r = asyncio.run(scenario())
    out = {k: reply(v) for k, v in r.items()}
    schema = tools["termux_fs"]["properties"]
    assert set(schema) == FS_ARGS
    assert (schema["max_bytes"]["default"], schema["max_bytes"]["maximum"]) == (1 << 20, 10 << 20)
    assert schema["parents"]["default"] is True and schema["recursive"]["default"] is False

    items = {i["name"]: i for i in out["list"]["items"]}
    assert set(items) == {".env", "app.py"} and set(items["app.py"]) == {"name", "is_dir", "size", "mtime"}
    assert (items["app.py"]["is_dir"], items["app.py"]["size"]) == (False, 9)
    assert abs(items["app.py"]["mtime"] - mtime) < 1e-5  # seconds since the epoch (to the microsecond)
    assert [i["name"] for i in out["list_plain"]["items"]] == ["app.py"]  # no dotfiles unless asked
    rc = out["read_rc"]
    assert set(rc) == {"content", "encoding", "size", "offset", "read_bytes", "truncated", "call_id"}
    assert (rc["content"], rc["encoding"], rc["size"], rc["offset"], rc["read_bytes"], rc["truncated"]) == (
        "export PS1='$ '\n", "utf-8", 16, 0, 16, False,
    )  # fmt: skip
    assert out["write"] == {"path": "home/script.py", "size": 14, "call_id": out["write"]["call_id"]}
    stat = out["stat"]
    assert set(stat) == {"is_file", "is_dir", "is_link", "size", "mtime", "atime", "mode", "call_id"}
    assert (stat["is_file"], stat["is_dir"], stat["is_link"]) == (False, True, False)
    assert isinstance(stat["mtime"], float) and isinstance(stat["atime"], float)
    assert (out["stat_file"]["is_file"], out["stat_file"]["size"]) == (True, 14)
    part = out["read"]
    assert (part["content"], part["offset"], part["read_bytes"], part["truncated"]) == ("'hello'", 6, 7, True)
    binary = out["read_bin"]  # base64 chosen by itself for bytes that are not text
    assert binary["encoding"] == "base64" and base64.b64decode(binary["content"]) == blob
    assert out["mkdir"]["ok"] is True and (home / "a/b/c").is_dir()  # parents by default
    assert out["mkdir_no_parents"]["error"]["code"] == "FILE_NOT_FOUND"
    for k in ("delete", "delete_full", "delete_tree"):
        pending = out[f"{k}_pending"]
        assert pending["status"] == "pending" and pending["approval"]["rule"] == "rm-by-supervisor", pending
        assert "await_call" in pending["next"] and not r[f"{k}_pending"].is_error
        assert out[k]["call_id"] == pending["call_id"]  # await_call answers in termux_fs's shape
    assert out["delete"] == {
        "ok": True, "path": "home/script.py", "deleted": "file", "entries": 0, "call_id": out["delete"]["call_id"],
    }  # fmt: skip
    assert not (home / "script.py").exists()
    assert out["delete_full"]["error"]["code"] == "DIRECTORY_NOT_EMPTY" and r["delete_full"].is_error
    assert out["delete_tree"]["ok"] is True and out["delete_tree"]["entries"] == 3 and not (home / "methings").exists()
    for k in ("outside", "up_and_out"):
        assert out[k]["status"] == "error" and out[k]["error"]["code"] == "PATH_OUTSIDE_JAIL", out[k]
        assert r[k].is_error
    assert out["tilde_user"]["error"]["code"] == "PATH_OUTSIDE_JAIL" and "~" in out["tilde_user"]["error"]["message"]
    assert out["missing"]["error"]["code"] == "FILE_NOT_FOUND"
    assert out["no_content"]["error"]["code"] == "INVALID_INPUT" and "content" in out["no_content"]["error"]["message"]
    assert out["too_much"]["error"]["code"] == "INVALID_INPUT" and "max_bytes" in out["too_much"]["error"]["message"]
    assert out["bad_action"]["error"]["code"] == "INVALID_INPUT" and "action" in out["bad_action"]["error"]["message"]

    decisions = {d["call_id"]: d for d in audit_records(tmp_path / "audit") if d["event"] == "decision"}
    tree = decisions[out["delete_tree"]["call_id"]]
    assert (tree["tool"], tree["decision"], tree["rule"]) == ("files", "ask", "rm-by-supervisor")
    assert tree["arguments"]["recursive"] is True
    assert decisions[out["outside"]["call_id"]]["decision"] == "deny"
    assert verify(tmp_path / "audit").ok


def test_termux_fs_reads_of_a_big_file_are_bounded(tmp_path: Path, ws: Path) -> None:
    """A 10 MB file never reaches the agent whole by default: without max_bytes a read holds the
    policy's reply_bytes and says where to go on; with it, at most the policy's output_bytes."""
    home = made_home(ws)
    big = home / "big.log"
    big.write_bytes(b"".join(b"line %07d\n" % i for i in range(1, 800_001)))  # 10.4 MB
    f = methings_policy(tmp_path, reply_bytes=5000, output_bytes=2 << 20)

    async def scenario() -> list[CallToolResult]:
        async with Client(serve(tmp_path, f, ws)) as c:
            first = await c.call_tool("termux_fs", {"action": "read", "path": "big.log"})
            on = reply(first)["next_offset"]
            second = await c.call_tool("termux_fs", {"action": "read", "path": "big.log", "offset": on})
            asked = await c.call_tool("termux_fs", {"action": "read", "path": "big.log", "max_bytes": 10 << 20})
            return [first, second, asked]

    first, second, asked = asyncio.run(scenario())
    one, two, many = reply(first), reply(second), reply(asked)
    assert len(first.content[0].text) < 6000
    assert (one["read_bytes"], one["size"], one["truncated"], one["next_offset"]) == (
        5000,
        big.stat().st_size,
        True,
        5000,
    )
    assert "limits.reply_bytes" in one["notice"] and "offset 5000" in one["notice"]
    assert two["content"].startswith(big.read_bytes()[5000:5010].decode()) and two["offset"] == 5000
    assert (many["read_bytes"], many["truncated"]) == (2 << 20, True)  # the policy's read limit, said so
    assert "limits.output_bytes" in many["notice"]


def test_termux_fs_home_paths_need_the_policys_home(tmp_path: Path, ws: Path) -> None:
    """Without a home, `~` and relative paths have nothing to mean: refused, naming the home; an
    absolute path inside the roots still works."""
    (ws / "x.txt").write_text("hi")
    f = methings_policy(tmp_path, home=None)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(serve(tmp_path, f, ws)) as c:
            rel = reply(await c.call_tool("termux_fs", {"action": "read", "path": "x.txt"}))
            absolute = reply(await c.call_tool("termux_fs", {"action": "read", "path": os.fspath(ws / "x.txt")}))
            return rel, absolute

    rel, absolute = asyncio.run(scenario())
    assert rel["status"] == "error" and "home" in rel["error"]["message"]
    assert absolute["content"] == "hi"
