"""Every example of the five seeds (the tool contracts of our profiles), run through its profile
as `make serve PROFILE=...` serves it: a real `gateway serve --profile NAME` with no `--policy`,
so under the profile's shipped layer (`policies/profiles/NAME.yaml` over the default policy),
driven by the official MCP SDK client, each reply checked against the seed's text.

The seeds' placeholders are given real values, as an agent would: `/path/to/project` and
`/project` are directories of the workspace, `/path/to/repo` is the workspace itself (a git
repository: one nested in it would be quarantined, docs/sandbox.md), `/home/user` is the home
(the workspace, under the default policy), and the pid `12345` is the number of a daemon that
`shell_cmd` started (12345 itself is then `DAEMON_NOT_FOUND`, a code the seed names). What a
seed shows that cannot work as written is listed in docs/tools.md (each profile's "What still
differs" paragraph), and checked here as it does work.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
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


# --- seed 001: os ----------------------------------------------------------------------------------
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def test_seed_001_os_examples(tmp_path: Path, ws: Path) -> None:
    made(ws, {"notes.txt": "x\n"})

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "os")) as c:
            out: dict[str, dict[str, Any]] = {}

            async def call(name: str, tool: str, **args: Any) -> dict[str, Any]:
                out[name] = reply(await c.call_tool(tool, args))
                return out[name]

            # shell_cmd({command: 'ls -la /home/user', timeoutSeconds: 10}): the home is the workspace
            await call("ls", "shell_cmd", command=f"ls -la {ws}", timeoutSeconds=10)
            await call("sh", "shell_cmd", command="set -o | grep posix", shell="sh")
            # a daemon to stand for the seed's pid 12345: a command still running after timeoutSeconds
            pid = (await call("daemon", "shell_cmd", command="echo started; sleep 60", timeoutSeconds=1))["pid"]
            await call("output", "get_daemon_output", pid=pid)
            await call("stop", "stop_daemon", pid=pid)
            await call("stop_again", "stop_daemon", pid=pid)
            await call("no_daemon", "stop_daemon", pid=12345)
            await call("path", "env_get", key="PATH")
            await call("set", "env_set", key="MY_VAR", value="hello")
            await call("get", "env_get", key="MY_VAR")
            await call("used", "shell_cmd", command='echo "$MY_VAR"')
            await call("unset", "env_unset", key="MY_VAR")
            await call("gone", "env_get", key="MY_VAR")
            return out

    out = asyncio.run(scenario())
    assert policy_served(tmp_path).endswith("policies/profiles/os.yaml")
    ls = out["ls"]  # status, command, exit_code, stdout, stderr, executed_at
    assert list(ls)[:6] == ["status", "command", "exit_code", "stdout", "stderr", "executed_at"], ls
    assert (ls["status"], ls["command"], ls["exit_code"]) == ("ok", f"ls -la {ws}", 0)
    assert " notes.txt\n" in ls["stdout"] and STAMP.fullmatch(ls["executed_at"])
    assert out["sh"]["status"] == "ok" and "on" in out["sh"]["stdout"]  # sh: bash in POSIX mode, enabled here
    assert out["daemon"]["status"] == "ok" and out["daemon"]["daemon"] is True
    got = out["output"]  # status, pid, output, retrieved_at
    assert list(got)[:4] == ["status", "pid", "output", "retrieved_at"] and got["pid"] == out["daemon"]["pid"]
    assert "started" in got["output"]
    stop = out["stop"]  # status, pid, stopped_at
    assert (
        list(stop)[:3] == ["status", "pid", "stopped_at"]
        and stop["status"] == "ok"
        and STAMP.fullmatch(stop["stopped_at"])
    )
    assert (out["stop_again"]["status"], out["stop_again"]["error_code"]) == ("error", "DAEMON_NOT_RUNNING")
    assert (out["no_daemon"]["status"], out["no_daemon"]["error_code"]) == ("error", "DAEMON_NOT_FOUND")
    path = out["path"]  # ENV_NOT_FOUND; the hint names only this profile's tools
    assert (path["status"], path["error_code"]) == ("error", "ENV_NOT_FOUND")
    assert "env list" not in path["message"] and "env_set" in path["message"], path
    assert list(out["set"])[:4] == ["status", "key", "value", "set_at"] and out["set"]["status"] == "ok"
    assert list(out["get"])[:4] == ["status", "key", "value", "retrieved_at"] and out["get"]["value"] == "hello"
    assert out["used"]["stdout"] == "hello\n"
    assert list(out["unset"])[:3] == ["status", "key", "unset_at"] and out["unset"]["status"] == "ok"
    assert out["gone"]["error_code"] == "ENV_NOT_FOUND"
    for key, r in out.items():  # every hint names a tool of this profile, never the gateway's own
        text = json.dumps(r)
        assert not re.search(r"\b(env list|files read|process output|session read)\b", text), (key, text)
    assert verify(tmp_path / "audit").ok


# --- seed 004: System Operations -------------------------------------------------------------------
def answering(*answers: ElicitResult, asked: list[Any]) -> Any:
    queue = list(answers)

    async def cb(ctx: Any, params: Any) -> ElicitResult:
        asked.append(params)
        return queue.pop(0)

    return cb


def test_seed_004_system_ops_examples_wait_for_a_supervisor(tmp_path: Path, ws: Path) -> None:
    """ "Permission Level: supervisor": each `run` example waits for a supervisor (pending, approved
    with `gateway approvals approve`), then answers as the seed shows; `ask_user` asks the user,
    a password in a form field marked secret, and the answer never reaches the audit log."""
    made(ws, {
        "package.json": json.dumps({"name": "demo", "version": "1.0.0", "scripts": {"test": "echo tests passed"}}),
        "script.js": "console.log(process.env.NODE_ENV, process.env.API_KEY.length)\n",
    })  # fmt: skip
    subprocess.run(["git", "init", "-q", str(ws)], check=True)  # the workspace is the seed's /path/to/repo
    hand_over(ws)
    queue = tmp_path / "approvals"
    secret = "hunter2-s3cret-pass"
    asked: list[Any] = []
    examples: list[dict[str, Any]] = [
        {"command": "ls -la"},
        {"command": "npm test", "timeout": 60000},
        {"command": "git status", "cwd": str(ws)},  # cwd: '/path/to/repo'
        {"command": "node script.js", "env": {"NODE_ENV": "production", "API_KEY": "secret"}},
    ]
    questions: list[dict[str, Any]] = [
        {"prompt": "Enter your name:"},
        {"prompt": "Enter port:", "default": "3000"},
        {"prompt": "Enter email:", "validation": {"pattern": "^[\\w-\\.]+@([\\w-]+\\.)+[\\w-]{2,4}$"}},
        {"prompt": "Enter password:", "password": True},
    ]
    cb = answering(
        ElicitResult(action="accept", content={"answer": "Ada"}),
        ElicitResult(action="accept", content={"answer": ""}),
        ElicitResult(action="accept", content={"answer": "ada@example.com"}),
        ElicitResult(action="accept", content={"answer": secret}),
        asked=asked,
    )

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        async with Client(serve(tmp_path, ws, "system-ops"), elicitation_callback=cb) as c:
            pending, done = [], []
            for args in examples:
                first = reply(await c.call_tool("run", args))
                pending.append(first)
                await asyncio.to_thread(
                    gateway_cmd, "approvals", "approve", first["call_id"], "--state-dir", str(queue), "--by", "alice"
                )
                done.append(reply(await c.call_tool("await_call", {"call_id": first["call_id"], "wait_ms": 120_000})))
            answers = [reply(await c.call_tool("ask_user", q)) for q in questions]
            return pending, done, answers

    pending, done, answers = asyncio.run(scenario())
    assert policy_served(tmp_path).endswith("policies/profiles/system-ops.yaml")
    assert approval_queue.pending(queue) == []
    for first in pending:  # the supervisor level: nothing ran before a supervisor said so
        assert first["success"] is False and first["data"]["status"] == "pending", first
        assert first["data"]["approval"]["waiting_for"] == "supervisor"
    for result in done:  # {success: true, data: {exit_code, stdout, stderr, timed_out}}
        assert result["success"] is True, result
        assert list(result["data"])[:4] == ["exit_code", "stdout", "stderr", "timed_out"]
        assert (result["data"]["exit_code"], result["data"]["timed_out"]) == (0, False)
    ls, npm, git, node = (r["data"]["stdout"] for r in done)
    assert ls.startswith("total ") and " package.json\n" in ls
    assert "tests passed" in npm
    assert "On branch" in git or "No commits yet" in git
    assert node == "production 6\n"
    # ask_user: {success: true, data: {value, validated}}
    assert [a["data"] for a in answers] == [
        {"value": "Ada", "validated": False},
        {"value": "3000", "validated": False},
        {"value": "ada@example.com", "validated": True},
        {"value": secret, "validated": False},
    ]
    field = asked[3].requested_schema["properties"]["answer"]  # password: true: hide the input
    assert field.get("writeOnly") is True and "hidden" in field.get("title", "").lower()
    assert "writeOnly" not in asked[0].requested_schema["properties"]["answer"]
    assert asked[1].requested_schema["properties"]["answer"]["default"] == "3000"
    kept = "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and ws not in p.parents)
    assert secret not in kept  # neither the audit log nor any state the gateway keeps holds the password
    records = audit_records(tmp_path / "audit")
    approvals = [r for r in records if r["event"] == "approval"]
    assert len(approvals) == 4 and {a["data"]["by"] for a in approvals} == {"alice"}
    node_decision = next(r for r in records if r["event"] == "decision" and r["call_id"] == pending[3]["call_id"])
    assert "secret" not in json.dumps(node_decision)  # API_KEY's value is redacted
    assert verify(tmp_path / "audit").ok


# --- seed 002: the shell plugin --------------------------------------------------------------------
def test_seed_002_shell_plugin_examples(tmp_path: Path, ws: Path) -> None:
    """The seed shows behaviours rather than calls: write_output's names under ~/outputs, exec's
    8000-character tails and text block with its notice, process_start's record, grep's rows."""
    made(ws, {"notes.txt": "a\nb\nTODO one\nc\nTODO two\nd\ne\nf\ng\nh\nTODO three\n"})

    async def scenario() -> dict[str, CallToolResult]:
        async with Client(serve(tmp_path, ws, "shell-plugin")) as c:
            out: dict[str, CallToolResult] = {}
            for key, tool, args in [
                ("md", "write_output", {"name": "report", "content": "# one\n"}),
                ("md2", "write_output", {"name": "report", "content": "# two\n"}),
                ("json", "write_output", {"name": "data", "content": '{"k": 1}', "format": "json"}),
                ("exec", "exec", {"command": "seq 1 400000; seq 1 3000 >&2"}),
                ("start", "process_start", {"command": "echo up; sleep 60", "name": "web", "keepAlive": True}),
                ("grep", "grep", {"pattern": "TODO", "path": "notes.txt", "context": 2}),
                ("stop_all", "process_stop_all", {}),
            ]:
                out[key] = await c.call_tool(tool, args)
            return out

    r = asyncio.run(scenario())
    out = {k: reply(v) for k, v in r.items()}
    assert policy_served(tmp_path).endswith("policies/profiles/shell-plugin.yaml")
    names = re.compile(r"outputs/(\d{14})-(report|report-1|data)\.(md|json)")  # YYYYMMDDHHMMSS-name.md, -1
    found = [names.fullmatch(out[k]["path"]) for k in ("md", "md2", "json")]
    assert all(found), [out[k]["path"] for k in ("md", "md2", "json")]
    md, md2, js = (m for m in found if m is not None)
    assert md.group(2) == "report" and md2.group(2) == ("report-1" if md2.group(1) == md.group(1) else "report")
    assert js.group(2, 3) == ("data", "json") and (ws / out["md2"]["path"]).read_text() == "# two\n"

    text = r["exec"].content[0]
    assert text.type == "text" and len(text.text) <= 8000  # the seed's safety limit per text block
    summary = out["exec"]["summary"]
    assert re.search(r"^stdout:\n\.\.\. \([\d,]+ chars truncated from stdout\)\n", summary), summary[:200]
    assert "\n399999\n400000\n\nstderr:\n" in summary and "\n2999\n3000" in summary

    start = out["start"]  # the record: pid, the restart policy, the state; the absolute logPath
    assert {"processId", "name", "pid", "keepAlive", "restartCount", "desiredState", "status", "logPath"} <= set(start)
    assert (start["name"], start["keepAlive"], start["desiredState"], start["status"]) == ("web", True, "running",
                                                                                         "running")  # fmt: skip
    assert isinstance(start["pid"], int) and Path(start["logPath"]).is_absolute()
    assert start["summary"].split("\n")[:4] == [f"Process started: {start['processId']}", "name: web",
                                                f"pid: {start['pid']}", "keepAlive: true"]  # fmt: skip

    rows = out["grep"]["summary"].split("\n")  # overlapping context: each line once, a match as a match
    assert rows == [
        "notes.txt-1-a", "notes.txt-2-b", "notes.txt:3:TODO one", "notes.txt-4-c", "notes.txt:5:TODO two",
        "notes.txt-6-d", "notes.txt-7-e", "notes.txt-9-g", "notes.txt-10-h", "notes.txt:11:TODO three",
    ], rows  # fmt: skip
    assert out["stop_all"]["count"] == 1
    assert verify(tmp_path / "audit").ok


# --- seed 003: terminal_interface ------------------------------------------------------------------
def test_seed_003_terminal_interface_examples(tmp_path: Path, ws: Path) -> None:
    made(ws, {"project/Makefile": "all:\n\t@echo built\n", "README.md": "demo\n"})
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    hand_over(ws)
    project = ws / "project"  # the seed's /path/to/project and /project

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "terminal-interface")) as c:
            out: dict[str, dict[str, Any]] = {}

            async def call(name: str, tool: str, **args: Any) -> dict[str, Any]:
                out[name] = reply(await c.call_tool(tool, args))
                return out[name]

            await call(
                "run", "run_terminal_command", command="ls -la", working_directory=str(project), timeout_seconds=30,
                capture_output=True,
            )  # fmt: skip
            await call("error", "format_terminal_output", content="Error: Connection failed", format_type="error")
            await call(
                "table", "format_terminal_output", content="files", format_type="table",
                table_headers=["Name", "Status", "Size"], table_rows=[["file1.txt", "active", "1.2MB"]],
            )  # fmt: skip
            shell = await call(
                "shell", "start_interactive_shell", shell_type="codomyrmex", working_directory=str(project),
                prompt="codomyrmex> ", startup_commands=[f"cd {project}", "git status"],
            )  # fmt: skip
            sid = shell["shell_id"]
            for word in ("help", "analyze", "build", "deploy"):
                await call(word, "execute_in_shell", shell_id=sid, command=word if word != "build" else "build all")
            await call("pwd", "execute_in_shell", shell_id=sid, command="pwd")
            await call("bash", "start_interactive_shell", shell_type="bash")
            zsh = await call(
                "zsh", "start_interactive_shell", shell_type="zsh", working_directory=str(project),
                startup_commands=[f"cd {project}", "git status"],
            )  # fmt: skip
            await call("zsh_line", "execute_in_shell", shell_id=zsh["shell_id"], command="echo $ZSH_VERSION")
            await call("zsh_qualifier", "execute_in_shell", shell_id=zsh["shell_id"], command="ls *(e:'touch x':)")
            await call("python", "start_interactive_shell", shell_type="python")
            return out

    out = asyncio.run(scenario())
    assert policy_served(tmp_path).endswith("policies/profiles/terminal-interface.yaml")
    run = out["run"]  # command, return_code, stdout, stderr, execution_time, working_directory
    assert [k for k in run if k not in ("success", "call_id")] == [
        "command", "return_code", "stdout", "stderr", "execution_time", "working_directory"]  # fmt: skip
    assert (run["command"], run["return_code"], run["stderr"], run["working_directory"]) == (
        "ls -la", 0, "", str(project))  # fmt: skip
    assert run["stdout"].startswith("total ") and isinstance(run["execution_time"], float)
    assert out["error"] == {  # the seed's example, exactly
        "success": True, "formatted_content": "\u001b[31m❌ Error: Connection failed\u001b[0m", "format_type": "error",
        "original_content": "Error: Connection failed", "terminal_codes": ["31m", "0m"],
        "call_id": out["error"]["call_id"],
    }  # fmt: skip
    assert "file1.txt  active  1.2MB" in out["table"]["formatted_content"]

    shell = out[
        "shell"
    ]  # {shell_id, shell_type, status, working_directory, startup_commands_executed, available_commands}
    assert shell["success"] is True and shell["shell_id"]
    assert (shell["shell_type"], shell["status"], shell["working_directory"]) == ("codomyrmex", "started", str(project))
    assert shell["startup_commands_executed"] == 2 and shell["output"] == "codomyrmex> "
    assert shell["available_commands"] == ["analyze", "build", "deploy", "help"]
    assert "analyze" in out["help"]["output"] and out["help"]["output"].endswith("codomyrmex> ")
    assert out["analyze"]["success"] is True and out["analyze"]["return_code"] == 0
    assert out["build"]["success"] is True and "built\r\n" in out["build"]["output"]  # build all: make all
    assert out["deploy"]["success"] is False and out["deploy"]["error_code"] == "INVALID_INPUT"
    assert "no network" in out["deploy"]["error"]
    assert out["pwd"]["output"].startswith(str(project))
    bash = out["bash"]["available_commands"]  # what can be typed there: the programs the policy's rules allow
    assert {"git", "ls", "cat", "make", "rm"} <= set(bash) and not {"curl", "sudo", "bash"} & set(bash)
    zsh, python = out["zsh"], out["python"]  # a real zsh: the seed's example, a line, a line refused
    assert (zsh["success"], zsh["shell_type"], zsh["startup_commands_executed"]) == (True, "zsh", 2), zsh
    assert out["zsh_line"]["output"].startswith("5.")
    refused = out["zsh_qualifier"]
    assert refused["error_code"] == "POLICY_DENIED" and "*(e:'touch x':)" in refused["error"]
    # a python shell is the interpreter, decided as `python3`: the shipped policy's interpreter-repl refuses it
    assert (python["success"], python["error_code"], python["rule"]) == (False, "POLICY_DENIED", "interpreter-repl")
    assert verify(tmp_path / "audit").ok


def test_seed_003_register_tools_without_arguments(tmp_path: Path) -> None:
    """`from ... import register_tools; register_tools()`: the terminal-interface tools on the
    module's own server, over the gateway `gateway serve --profile terminal-interface` would build
    with its defaults (run here from a copy of the repository's policies)."""
    home = tmp_path / "home"
    shutil.copytree(REPO / "policies", home / "policies")
    (home / "workspace").mkdir(parents=True)
    hand_over(home / "workspace")
    script = (
        "from gateway.server.register import register_tools\n"
        "gated = register_tools()\n"
        "assert register_tools() is gated\n"
        "gated.mcp.run('stdio')\n"
    )
    params = StdioServerParameters(
        command=sys.executable, args=["-c", script], cwd=str(home), env=env_without_state(tmp_path)
    )

    async def scenario() -> tuple[set[str], dict[str, Any]]:
        async with Client(params) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            return names, reply(await c.call_tool("run_terminal_command", {"command": "pwd"}))

    names, ran = asyncio.run(scenario())
    assert {"run_terminal_command", "format_terminal_output", "start_interactive_shell"} <= names
    assert ran["success"] is True and ran["stdout"] == f"{home / 'workspace'}\n"
    assert verify(home / "audit").ok
    loaded = [r for r in audit_records(home / "audit") if r["event"] == "policy_loaded"]
    assert str(loaded[0]["data"]["path"]).endswith("policies/profiles/terminal-interface.yaml")
