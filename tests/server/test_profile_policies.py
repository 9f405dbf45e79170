"""The profiles' shipped policy layers (`policies/profiles/NAME.yaml`), and the attacks on what
they open: `gateway serve --profile NAME` without `--policy` serves the profile's layer (an
explicit `--policy` wins; several profiles get the default and a note); the sandbox's own /proc
is readable only as listed, never through a link, never the gateway's; a `./NAME` program is
jailed as a read (a link out of the roots is refused); a call's variables cannot reach the
protected names; seed 004's supervisor level runs nothing before a supervisor answers. Every call
through the official SDK client against a real `gateway serve`, in the real sandbox."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client, StdioServerParameters

from gateway import decide
from gateway.audit import verify
from gateway.policy import selftest
from gateway.policy.compile import load_policy
from gateway.sandbox.identity import hand_over, sandbox_identity
from tests.server.conftest import GATEWAY, audit_records, env_without_state, gateway_cmd
from tests.server.test_seed_examples import REPO, policy_served, reply, serve

PROFILES = ("methings", "os", "shell-plugin", "terminal-interface", "system-ops")


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_ships_a_layer_over_the_default_whose_examples_and_tests_pass(profile: str) -> None:
    path = REPO / "policies" / "profiles" / f"{profile}.yaml"
    assert yaml.safe_load(path.read_text())["include"] == ["../default.yaml"]
    policy = load_policy(path, REPO / "workspace")
    selftest.check_examples(policy)
    cases = decide.example_decisions(policy, "agent") + decide.test_cases(policy, "agent")
    assert cases and all(c.passed for c in cases), [c.name + ": " + c.detail for c in cases if not c.passed]


def test_an_explicit_policy_wins_over_the_profiles_layer(tmp_path: Path, ws: Path) -> None:
    """`--policy policies/default.yaml --profile methings`: the admin's choice, where sh is only offered."""
    params = serve(tmp_path, ws, "methings")
    params = StdioServerParameters(
        command=params.command, args=[*params.args, "--policy", "policies/default.yaml"], env=params.env, cwd=params.cwd
    )

    async def scenario() -> dict[str, Any]:
        async with Client(params) as c:
            return reply(await c.call_tool("local_run_shell", {"command": "echo hi"}))

    refused = asyncio.run(scenario())
    assert policy_served(tmp_path).endswith("policies/default.yaml")
    assert refused["status"] == "error" and "shell 'sh' is not in the policy's shells" in refused["stderr"]


def test_several_profiles_get_the_default_policy_and_a_note(tmp_path: Path, ws: Path) -> None:
    args = ["serve", "--stdio", "--principal", "agent", "--workspace", str(ws), "--profile", "methings,os"]
    args += ["--audit-dir", str(tmp_path / "audit"), "--state-dir", str(tmp_path / "approvals")]
    args += ["--process-dir", str(tmp_path / "state")]
    done = subprocess.run(  # stdin at its end at once: the server starts, then stops
        [GATEWAY, *args], cwd=REPO, env=env_without_state(tmp_path), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "the profiles methings, os ship a policy layer each" in done.stderr, done.stderr
    assert "pass --policy FILE" in done.stderr
    assert policy_served(tmp_path).endswith("policies/default.yaml")


# --- the sandbox's own /proc ------------------------------------------------------------------------
def test_proc_is_the_sandboxs_own_and_only_as_listed(tmp_path: Path, ws: Path) -> None:
    """`cat /proc/cpuinfo` (seed 000) and the command's own /proc/self/status work, answered by the
    sandbox's /proc (its PID namespace: a small pid, the sandbox's uid, never the gateway's). Links
    (cwd, root, fd), other processes, writes, listings and the files tool (which runs in the
    gateway) stay refused."""
    hand_over(ws)
    uid = sandbox_identity().uid
    attacks = {
        "cwd_link": "cat /proc/self/cwd/../../../etc/hostname",
        "root_link": "cat /proc/self/root/etc/hostname",
        "fd_link": "cat /proc/self/fd/0",
        "dev_fd": "cat /dev/fd/3",
        "other": "cat /proc/1/environ",
        "environ": "cat /proc/self/environ",
        "dotdot": "cat /proc/self/../1/status",
        "dot": "cat /proc/./cpuinfo",
        "slashes": "cat //proc/cpuinfo",
        "relative": "cd / && cat proc/cpuinfo",
        "glob": "cat /proc/self/stat*",
        "listing": "ls /proc",
        "cd": "cd /proc/self && cat status",
        "write": "echo 1000 > /proc/self/oom_score_adj",
        "overwrite": "echo x > /proc/self/status",
        "redirect_in": "head -1 < /proc/self/mountinfo",
    }

    async def scenario() -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
        async with Client(serve(tmp_path, ws, "methings")) as c:
            own = reply(await c.call_tool("termux_run_shell", {"command": "cat /proc/self/status"}))
            refused = {k: reply(await c.call_tool("termux_run_shell", {"command": v})) for k, v in attacks.items()}
            fs = [
                reply(await c.call_tool("termux_fs", {"action": "read", "path": p}))
                for p in ("/proc/cpuinfo", "/proc/self/status")
            ]
            return own, refused, fs

    own, refused, fs = asyncio.run(scenario())
    assert own["status"] == "ok", own
    fields = dict(line.split(":\t", 1) for line in own["stdout"].splitlines() if ":\t" in line)
    assert fields["Name"] == "cat" and int(fields["Pid"]) < 100 and int(fields["Pid"]) != os.getpid()
    assert fields["Uid"].split("\t")[0] == str(uid)  # the sandbox's account, not the gateway's root
    for key, r in refused.items():
        assert r["status"] == "error" and r["error"]["code"] in ("PATH_OUTSIDE_JAIL", "POLICY_DENIED"), (key, r)
    for r in fs:
        assert r["status"] == "error" and r["error"]["code"] == "PATH_OUTSIDE_JAIL", r
    jailed = [x for x in audit_records(tmp_path / "audit") if x["event"] == "decision" and x["decision"] == "deny"]
    assert len(jailed) >= len(attacks)
    assert verify(tmp_path / "audit").ok


# --- ./NAME programs --------------------------------------------------------------------------------
def test_a_local_program_is_jailed_where_its_link_leads(tmp_path: Path, ws: Path) -> None:
    """methings' layer runs `./hello` (seed 000's example). The agent makes `hello` a link to a
    program outside the roots: the jail reads where it leads and refuses; a real file runs."""
    hand_over(ws)

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "methings")) as c:
            link = "python3 -c \"import os; os.symlink('/usr/bin/id', 'hello')\""
            made = reply(await c.call_tool("termux_run_shell", {"command": link}))
            linked = reply(await c.call_tool("termux_run_shell", {"command": "./hello"}))
            own = "python3 -c \"import os; os.unlink('hello'); open('a.out', 'w').write('echo mine')\""
            await c.call_tool("termux_run_shell", {"command": own})
            await c.call_tool("termux_run_shell", {"command": "chmod +x a.out"})
            ran = reply(await c.call_tool("termux_run_shell", {"command": "./a.out"}))
            return made, linked, ran

    made, linked, ran = asyncio.run(scenario())
    assert made["status"] == "ok", made
    assert linked["status"] == "error" and linked["error"]["code"] == "PATH_OUTSIDE_JAIL", linked
    assert "/usr/bin/id" in linked["stderr"] and "uid=" not in linked["stdout"]
    assert ran["status"] == "ok" and ran["stdout"] == "mine\n", ran


# --- a call's variables -----------------------------------------------------------------------------
def test_a_calls_variables_never_reach_the_protected_names(tmp_path: Path, ws: Path) -> None:
    """A name the policy's environment.allow covers needs no rule's leave (MY_*); a protected name
    (LD_PRELOAD, BASH_ENV, PATH) and a name outside the list are refused, and nothing runs."""
    hand_over(ws)
    bad = [{"LD_PRELOAD": "/tmp/x.so"}, {"BASH_ENV": "/tmp/x"}, {"PATH": "/tmp"}, {"GIT_SSH_COMMAND": "id"},
           {"MY_VAR": "ok", "PYTHONPATH": "/tmp"}]  # fmt: skip

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with Client(serve(tmp_path, ws, "methings")) as c:
            ok = reply(await c.call_tool("local_run_shell", {"command": 'echo "$MY_VAR"', "env": {"MY_VAR": "x"}}))
            refused = [reply(await c.call_tool("termux_run_shell", {"command": "touch ran", "env": e})) for e in bad]
            return ok, refused

    ok, refused = asyncio.run(scenario())
    assert ok["status"] == "ok" and ok["stdout"] == "x\n"
    for r in refused:
        assert r["status"] == "error" and r["error"]["code"] == "POLICY_DENIED", r
    assert not (ws / "ran").exists()


# --- seed 004's supervisor level --------------------------------------------------------------------
def test_the_supervisor_level_runs_nothing_before_a_supervisor_answers(tmp_path: Path, ws: Path) -> None:
    """Under system-ops' layer every run waits: a command the default policy would run at once
    (`touch`) has not run while it waits, and does not run once a supervisor denies it."""
    hand_over(ws)
    queue = tmp_path / "approvals"

    async def scenario() -> tuple[dict[str, Any], bool, dict[str, Any]]:
        async with Client(serve(tmp_path, ws, "system-ops")) as c:
            first = reply(await c.call_tool("run", {"command": "touch before-approval"}))
            waited = (ws / "before-approval").exists()
            await asyncio.to_thread(
                gateway_cmd, "approvals", "deny", first["call_id"], "--state-dir", str(queue), "--reason", "no"
            )
            done = reply(await c.call_tool("await_call", {"call_id": first["call_id"], "wait_ms": 120_000}))
            return first, waited, done

    first, waited, done = asyncio.run(scenario())
    assert first["data"]["status"] == "pending" and waited is False
    assert done["success"] is False and done["error"]["code"] == "APPROVAL_DENIED", done
    assert not (ws / "before-approval").exists()
    decision = next(r for r in audit_records(tmp_path / "audit") if r["event"] == "decision")
    assert decision["decision"] == "ask" and json.dumps(decision).count("supervisor") >= 1


def test_a_family_that_asks_makes_every_example_asked_and_still_catches_a_broken_one(tmp_path: Path) -> None:
    """Seed 004's level (`tools: {run: {ask_from: 1}}`): an allow rule's example is asked about, as
    rule and family say together; an example another rule denies still fails the policy's test."""
    base = {
        "version": 1, "principals": {"agent": {"roles": ["dev"]}},
        "roles": {"dev": {"level": 1, "read_roots": ["."], "write_roots": ["."]}},
        "tools": {"run": {"ask_from": 1}},
        "rules": [
            {"id": "echo", "decision": "allow", "justification": "printing", "programs": ["echo"],
             "accept_unknown": True, "examples": {"match": ["echo hi"]}},
            {"id": "touch", "decision": "allow", "justification": "files", "programs": ["touch"],
             "path_args": {"write": "all"}, "examples": {"match": ["touch ../outside"]}},
        ],
    }  # fmt: skip
    (tmp_path / "ws").mkdir()
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({**base, "workspace": "ws"}))
    cases = {c.name: c for c in decide.example_decisions(load_policy(f, tmp_path / "ws"), "agent")}
    assert cases["echo: 'echo hi' is allow for agent"].passed
    broken = cases["touch: 'touch ../outside' is allow"]  # the jail denies it: not what the rule says
    assert not broken.passed and "deny" in broken.detail
