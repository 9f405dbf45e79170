"""Seed 003's `shell_type: zsh` (issue 26, point 5) through `gateway serve --profile
terminal-interface` (the shipped policy) and the official SDK client: a real zsh in the sandbox
runs the lines zsh reads as bash does, decided as bash text; a line zsh reads otherwise is denied
with the reason that names the construct, recorded, and never reaches the shell.

Before: every zsh shell was refused outright (`shell_type: 'zsh' is refused`). The attacks below
are lines the bash analysis allows under the shipped policy (tests/analysis/test_zsh.py shows
each one), so a zsh that ran them unchecked would run code through a glob, rewire PATH, or leave
a function zsh calls on its own."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from mcp import Client

from gateway.audit import verify
from gateway.sandbox.identity import hand_over
from tests.server.conftest import audit_records
from tests.server.test_seed_examples import reply, serve

ATTACKS: dict[str, str] = {
    # line: a word of the reason
    "ls *(e:'touch qualified':)": "*(e:'touch qualified':)",
    "echo =ls": "=cmd",
    "path=(. $path)": "path",
    "set -A path .": "set -A",
    "fpath=(.)": "fpath",
    "TRAPEXIT() { touch trapped; }": "TRAPEXIT",
    "TRAPDEBUG() { touch trapped; }": "TRAPDEBUG",
    "chpwd() { touch hooked; }": "chpwd",
    "precmd() { touch hooked; }": "precmd",
    "command_not_found_handler() { touch hooked; }": "command_not_found_handler",
    "chpwd_functions=(f)": "chpwd_functions",
    "set -o kshglob": "set -o kshglob",
    "set -F": "set -F",
    "read path": "path",
    "for path in a; do echo $path; done": "path",
    "printf -v path x": "path",
    "unset -m 'p*'": "unset -m",
    "(( path = 1 ))": "path",
    "> made.txt": "NULLCMD",
    "echo $HOME:h": "modifier",
    "ls file<1-5>.txt": "file<1-5>.txt",
    "echo hi >! f": "otherwise than bash",
    "cd old new": "cd",
    "x=~root": "~",
    # red team (redzsh): each ran in a zsh session before (the next test shows what they did)
    "timeout 10>/dev/null sh echo": "descriptors 0-9",
    "ch\\pwd() { touch hooked; }": "chpwd",
    "T\\RAPZERR() { touch trapped; }": "TRAPZERR",
    "b\\uiltin() { touch shadowed; }": "builtin",
    "shift path": "shift",
    "set -x": "nonce",
    "ARGV0=git-push": "ARGV0",
    "echo ${x:-{a,b}}": "braces",
}
"""Each a line the shipped policy allows as bash text (tests/analysis/test_zsh.py)."""


def test_a_zsh_shell_runs_the_seeds_example_and_lines_read_alike(tmp_path: Path, ws: Path) -> None:
    """The seed's example (`startup_commands: ["cd /project", "git status"]`) in a zsh shell, then
    lines a zsh user types that bash reads alike, run by a real zsh (its version, its `=~`)."""
    project = ws / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (project / "a.py").write_text("print(1)\n")
    hand_over(ws)

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "terminal-interface")) as c:
            out: dict[str, dict[str, Any]] = {}
            out["start"] = reply(await c.call_tool("start_interactive_shell", {
                "shell_type": "zsh", "working_directory": str(project), "prompt": "% ",
                "startup_commands": [f"cd {project}", "git status"],
            }))  # fmt: skip
            sid = out["start"]["shell_id"]
            lines = {
                "version": "echo zsh $ZSH_VERSION",
                "regex": "[[ abc =~ b ]] && echo matched",
                "loop": "for f in *.py; do echo found $f; done",
                "export": "export NODE_ENV=hello",
                "var": "echo $NODE_ENV",
                "split": "x='one two'; printf '<%s>' $x; echo",
                "cd": "cd ..",
                "pwd": "pwd",
                "status": "false",
                "exit": "exit 4",
            }
            for key, line in lines.items():
                out[key] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": line}))
            return out

    out = asyncio.run(scenario())
    start = out["start"]
    assert start["success"] is True and start["shell_type"] == "zsh" and start["status"] == "started", start
    assert start["startup_commands_executed"] == 2 and start["working_directory"] == str(project)
    assert "git" in start["available_commands"]
    assert "Untracked files" in start["startup_results"][1]["output"]  # git status
    assert out["version"]["output"].startswith("zsh 5."), out["version"]  # a real zsh ran it
    assert out["regex"]["output"] == "matched\r\n% "
    assert out["loop"]["output"] == "found a.py\r\n% "
    assert out["var"]["output"] == "hello\r\n% ", out["export"]  # the shell keeps its variables
    assert out["split"]["output"] == "<one><two>\r\n% "  # split as bash splits (SH_WORD_SPLIT)
    assert out["pwd"]["output"] == f"{ws}\r\n% " and out["pwd"]["working_directory"] == str(ws)
    assert out["status"]["success"] is False and out["status"]["return_code"] == 1
    assert out["exit"]["return_code"] == 4 and out["exit"]["alive"] is False  # the EXIT trap's marker
    assert verify(tmp_path / "audit").ok


def test_zsh_lines_read_otherwise_are_denied_with_the_reason(tmp_path: Path, ws: Path) -> None:
    """Every attack is denied before the shell sees it (POLICY_DENIED, the reason naming the
    construct, recorded as a decision), and none of them left its mark: no file made by a glob
    qualifier, a trap or a hook (each checked after a later command and the shell's exit)."""

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "terminal-interface")) as c:
            out: dict[str, dict[str, Any]] = {}
            sid = reply(await c.call_tool("start_interactive_shell", {"shell_type": "zsh"}))["shell_id"]
            for line in ATTACKS:
                out[line] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": line}))
            out["after"] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": "ls"}))
            out["exit"] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": "exit"}))
            return out

    out = asyncio.run(scenario())
    wrong = {
        line: out[line].get("error") or out[line].get("output")
        for line, word in ATTACKS.items()
        if not (
            out[line].get("error_code") == "POLICY_DENIED"
            and word in out[line]["error"]
            and "zsh" in out[line]["error"]
        )
    }
    assert not wrong, wrong
    assert out["after"]["success"] is True and out["after"]["output"] == ""  # nothing made, nothing ran
    assert out["exit"]["alive"] is False
    assert [p.name for p in ws.iterdir() if p.name != ".git"] == []
    records = audit_records(tmp_path / "audit")
    denied = {
        r["arguments"].get("command")
        for r in records
        if r["event"] == "decision" and r["decision"] == "deny" and r["reasons"][0]["stage"] == "zsh"
    }
    assert denied == set(ATTACKS)
    assert verify(tmp_path / "audit").ok


def test_the_zsh_loop_keeps_its_options(tmp_path: Path, ws: Path) -> None:
    """What a line could still do is bounded by the loop's own zsh: `=cmd`, glob qualifiers and
    aliases are off and stay off (the lines that turn them on are refused): shown from inside,
    with the options zsh reports."""

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "terminal-interface")) as c:
            sid = reply(await c.call_tool("start_interactive_shell", {"shell_type": "zsh"}))["shell_id"]
            out = {}
            for key, line in (("equals", "echo =ls"), ("setopt", "setopt equals"),
                              ("options", "[[ -o equals || -o bareglobqual || -o aliases ]] && echo on || echo off"),
                              ("split", "[[ -o shwordsplit && -o shnullcmd ]] && echo on || echo off")):  # fmt: skip
                out[key] = reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": line}))
            return out

    out = asyncio.run(scenario())
    assert out["equals"]["error_code"] == "POLICY_DENIED" and out["setopt"]["error_code"] == "POLICY_DENIED"
    assert out["options"]["output"] == "off\r\n", out["options"]
    assert out["split"]["output"] == "on\r\n", out["split"]


def test_zsh_lines_that_ran_unchecked_do_nothing(tmp_path: Path, ws: Path) -> None:
    """Red team (redzsh): lines that got through the check and what they did in a real zsh. A
    descriptor above 9 (`10>`) is an argument to zsh, so `timeout 10>/dev/null sh echo` (bash: the
    wrapper over `echo`) ran the shell `sh` on a file; an escaped name (`ch\\pwd`) defined the hook
    zsh runs on every cd; `shift path` shortened PATH; `set -x` printed the loop's end marker with
    its nonce; and `y=path=5; (( y ))` (zsh evaluates y's value as arithmetic, assigning path) made
    `ls` run the workspace's 5/ls. Now each is refused, or meets a read-only parameter."""
    made = "printf '/usr/bin/touch pwned_sh\\n' > echo; mkdir 5; "
    made += "printf '#!/bin/sh\\n/usr/bin/touch pwned_path\\n' > 5/ls; chmod +x 5/ls"
    lines = {
        "made": made,
        "path": "echo $PATH",
        "fd": "timeout 10>/dev/null sh echo",
        "hook": "ch\\pwd() { /usr/bin/touch pwned_hook; }",
        "cd": "cd .",
        "shift": "shift path",
        "trace": "set -x",
        "traced": "echo traced",
        "arith": "y=path=5; (( y ))",
        "arith2": "y=PATH=5; (( y ))",
        "ls": "ls",
        "path2": "echo $PATH",
    }

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "terminal-interface")) as c:
            sid = reply(await c.call_tool("start_interactive_shell", {"shell_type": "zsh"}))["shell_id"]
            return {
                key: reply(await c.call_tool("execute_in_shell", {"shell_id": sid, "command": line}))
                for key, line in lines.items()
            }

    out = asyncio.run(scenario())
    assert out["made"]["success"] is True, out["made"]
    for key in ("fd", "hook", "shift", "trace"):
        assert out[key].get("error_code") == "POLICY_DENIED" and "zsh" in out[key]["error"], (key, out[key])
    assert out["traced"]["output"] == "traced\r\n", out["traced"]  # no trace, no nonce
    for key in ("arith", "arith2"):
        assert "read-only variable" in out[key]["output"], (key, out[key])
    assert out["path2"]["output"] == out["path"]["output"] and out["ls"]["output"] == "5  echo\r\n", out
    assert sorted(p.name for p in ws.iterdir() if p.name.startswith("pwned")) == []
