"""Every example of the five seeds (the tool contracts of our profiles), run through its profile
as `make serve PROFILE=...` serves it: a real `gateway serve --profile NAME` with no `--policy`,
so under the profile's shipped layer (`policies/profiles/NAME.yaml` over the default policy),
driven by the official MCP SDK client, each reply checked against the seed's text.

The seeds' placeholders are given real values, as an agent would: `/path/to/project`,
`/path/to/repo` and `/project` are directories of the workspace, `/home/user` is the home (the
workspace, under the default policy), and `12345` is the number of a daemon `shell_cmd`
started. What a seed shows that cannot work as written is listed in docs/tools.md (each
profile's "What still differs" paragraph), and checked here as it does work.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, ElicitResult

from gateway import approval_queue
from gateway.audit import verify
from gateway.sandbox.identity import hand_over
from tests.conftest import PATIENCE_S
from tests.server.conftest import GATEWAY, audit_records, env_without_state, gateway_cmd

REPO = Path(__file__).resolve().parents[2]


def serve(tmp_path: Path, ws: Path, profile: str) -> StdioServerParameters:
    """`gateway serve --profile PROFILE` from the repository, as `make serve` runs it: no --policy."""
    args = ["serve", "--stdio", "--principal", "agent", "--workspace", str(ws), "--profile", profile]
    args += ["--audit-dir", str(tmp_path / "audit"), "--state-dir", str(tmp_path / "approvals")]
    args += ["--process-dir", str(tmp_path / "state"), "--pending-after", "0.5"]
    return StdioServerParameters(command=GATEWAY, args=args, env=env_without_state(tmp_path), cwd=str(REPO))


def reply(r: CallToolResult) -> dict[str, Any]:
    """A profile's reply: the seed's JSON (seed 001: YAML), alone, in one text block."""
    assert len(r.content) == 1 and r.content[0].type == "text", r
    out: dict[str, Any] = yaml.safe_load(r.content[0].text)  # JSON is YAML
    return out


def policy_served(tmp_path: Path) -> str:
    """The policy file the server loaded (its `policy_loaded` record)."""
    loaded = [r for r in audit_records(tmp_path / "audit") if r["event"] == "policy_loaded"]
    return str(loaded[0]["data"]["path"])


def made(ws: Path, files: dict[str, str], dirs: tuple[str, ...] = ()) -> None:
    """Files and directories of the workspace, given to the sandbox's account as `make serve` does."""
    for d in dirs:
        (ws / d).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    hand_over(ws)


async def read_until(c: Client, tool: str, sid: str, shown: str, done: str) -> str:
    """Read a session until `done` has been shown (bounded generously: the machine is loaded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE_S
    while done not in shown and loop.time() < deadline:
        await asyncio.sleep(0.05)
        shown += reply(await c.call_tool(tool, {"action": "read", "session_id": sid}))["output"]
    return shown


# --- seed 000: methings ----------------------------------------------------------------------------
HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n'


def test_seed_000_methings_examples(tmp_path: Path, ws: Path) -> None:
    made(ws, {"projects/hello.c": HELLO_C, ".bashrc": "export PS1='$ '\n"}, ("methings/server", "project"))
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()[:20]

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "methings")) as c:
            out: dict[str, dict[str, Any]] = {}

            async def call(key: str, tool: str, **args: Any) -> dict[str, Any]:
                out[key] = reply(await c.call_tool(tool, args))
                return out[key]

            # local_run_shell's examples (sh)
            await call("ls", "local_run_shell", command="ls -la")
            await call("id", "local_run_shell", command="id")
            await call("cpuinfo", "local_run_shell", command="cat /proc/cpuinfo | head -20")
            # termux_run_shell's examples (bash)
            await call("ls_methings", "termux_run_shell", command="ls -la ~/methings")
            await call("python", "termux_run_shell", command='python3 -c "import sys; print(sys.version)"')
            await call("apt", "termux_run_shell", command="apt list --installed 2>/dev/null | head -20")
            await call(
                "gcc", "termux_run_shell", command="gcc -o hello hello.c && ./hello", cwd="~/projects",
                timeout_ms=120000,
            )  # fmt: skip
            await call("timeout", "termux_run_shell", command="sleep 30", timeout_ms=1000)
            await call("env", "local_run_shell", command='echo "$MY_VAR"', env={"MY_VAR": "from-env"})

            # termux_shell_session's example flow (a PTY), then the same with local_shell_session (pipes)
            for tool in ("termux_shell_session", "local_shell_session"):
                sid = (await call(f"{tool}.start", tool, action="start", cwd="~/project"))["session_id"]
                await call(f"{tool}.export", tool, action="exec", session_id=sid, command="export MY_VAR=hello")
                await call(f"{tool}.echo", tool, action="exec", session_id=sid, command="echo $MY_VAR")
                for n in range(5):  # each reply holds its own command's output, never one reply late
                    await call(f"{tool}.seq{n}", tool, action="exec", session_id=sid, command=f"echo line-{n}; pwd")
                # "Interactive: answer a prompt": a command waits for its answer, write gives it
                await call(
                    f"{tool}.prompt", tool, action="exec", session_id=sid,
                    command='read -r -p "Continue? " answer; echo "answer=$answer"', timeout=1,
                )  # fmt: skip
                written = await call(f"{tool}.write", tool, action="write", session_id=sid, input="y\n")
                out[f"{tool}.answered"] = {"shown": await read_until(c, tool, sid, written["output"], "answer=y")}
                await call(f"{tool}.kill", tool, action="kill", session_id=sid)

            # termux_fs's examples; then ~/methings is one place for termux_fs and for commands
            await call("fs_list", "termux_fs", action="list", path="~/methings/server", show_hidden=True)
            await call("fs_read", "termux_fs", action="read", path="~/.bashrc")
            await call("fs_write", "termux_fs", action="write", path="~/script.py", content="print('hello')")
            await call("fs_stat", "termux_fs", action="stat", path="~/methings")
            await call("note", "termux_fs", action="write", path="~/methings/note.txt", content="one place\n")
            await call("note_bash", "termux_run_shell", command="cat ~/methings/note.txt")
            await call("note_sh", "local_run_shell", command="cat ~/methings/note.txt")
            return out

    out = asyncio.run(scenario())
    assert policy_served(tmp_path).endswith("policies/profiles/methings.yaml")
    # {"status": "ok", "exit_code": 0, "stdout": "...", "stderr": "..."}
    for key in ("ls", "id", "cpuinfo", "ls_methings", "python", "apt", "gcc", "env", "note_bash", "note_sh"):
        assert list(out[key])[:4] == ["status", "exit_code", "stdout", "stderr"], (key, out[key])
        assert (out[key]["status"], out[key]["exit_code"]) == ("ok", 0), (key, out[key])
    assert out["ls"]["stdout"].startswith("total ") and " methings\n" in out["ls"]["stdout"]
    assert out["id"]["stdout"].startswith("uid=")
    lines = out["cpuinfo"]["stdout"].splitlines()  # the machine's, read through the sandbox's own /proc
    assert len(lines) == 20 and [x for x in lines if "MHz" not in x] == [x for x in cpuinfo if "MHz" not in x]
    assert " server\n" in out["ls_methings"]["stdout"]
    assert re.match(r"3\.\d+\.\d+ ", out["python"]["stdout"])
    assert out["apt"]["stdout"].startswith("Listing...")  # the sandbox shows no package database (docs/tools.md)
    assert out["gcc"]["stdout"] == "hello\n"
    timed_out = out[
        "timeout"
    ]  # {"status": "timeout", "exit_code": -1, "stdout": "", "stderr": "Command timed out after 60s"}
    assert (timed_out["status"], timed_out["exit_code"], timed_out["stderr"]) == (
        "timeout", -1, "Command timed out after 1s",
    )  # fmt: skip
    assert out["env"]["stdout"] == "from-env\n"  # MY_* is the policy's environment.allow

    for tool, nl in (("termux_shell_session", "\r\n"), ("local_shell_session", "\n")):
        start = out[f"{tool}.start"]
        assert re.fullmatch(r"[0-9a-f]{12}", start["session_id"]) and start["output"] == "$ "
        echoed = "echo $MY_VAR\r\n" if tool == "termux_shell_session" else ""  # a terminal echoes the command
        # -> {output: "echo $MY_VAR\r\nhello\r\nuser@localhost:~/project$ ", alive: true}
        assert out[f"{tool}.echo"]["output"] == f"{echoed}hello{nl}$ ", out[f"{tool}.echo"]
        assert out[f"{tool}.echo"]["alive"] is True
        for n in range(5):
            shown = out[f"{tool}.seq{n}"]["output"]
            assert f"line-{n}{nl}{ws / 'project'}{nl}$ " in shown and f"line-{n - 1}" not in shown, (n, shown)
        assert out[f"{tool}.prompt"]["running"] is True
        assert out[f"{tool}.write"]["ok"] is True
        assert "answer=y" in out[f"{tool}.answered"]["shown"]
        assert out[f"{tool}.kill"]["ok"] is True and out[f"{tool}.kill"]["alive"] is False

    assert out["fs_list"]["items"] == []  # -> {items: [{name, is_dir, size, mtime}]}
    read = out["fs_read"]  # -> {content, encoding, size, offset, read_bytes, truncated}
    assert {k: read[k] for k in ("content", "encoding", "size", "offset", "read_bytes", "truncated")} == {
        "content": "export PS1='$ '\n", "encoding": "utf-8", "size": 16, "offset": 0, "read_bytes": 16,
        "truncated": False,
    }  # fmt: skip
    assert out["fs_write"]["size"] == 14 and out["fs_write"]["path"] == "script.py"  # -> {path, size}
    assert (ws / "script.py").read_text() == "print('hello')"
    stat = out["fs_stat"]  # -> {is_file, is_dir, is_link, size, mtime, atime, mode}
    assert {"is_file", "is_dir", "is_link", "size", "mtime", "atime", "mode"} <= set(stat) and stat["is_dir"] is True
    assert out["note_bash"]["stdout"] == out["note_sh"]["stdout"] == "one place\n"
    assert verify(tmp_path / "audit").ok
