"""`gateway serve --profile NAME`: each seed's tool contract, driven through the official SDK
client against the real `gateway serve --stdio` subprocess (real sandbox, real audit log), with
every example call of the seed and the error cases it names, the reply checked field by field.
A profile is an adapter over the one gate: a denial through it is the policy's denial, recorded
like any call."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, ElicitResult

from gateway import approval_queue
from gateway.audit import verify
from gateway.server.profiles import PROFILES, ProfileError, methings, specs_for
from tests.server.conftest import GATEWAY, POLICY, HttpGateway, audit_records, env_without_state, gateway_cmd


def profile_policy(tmp_path: Path, ws: Path, shells: tuple[str, ...] = ("bash",), **tools: dict[str, int]) -> Path:
    """The server tests' policy, plus a rule that lets commands take APP_* variables and a rule
    that runs any program under `bin-*` names (so a missing one reaches the shell: exit 127)."""
    p: dict[str, Any] = copy.deepcopy(POLICY)
    p["rules"].insert(0, {
        "id": "echo-env", "decision": "allow", "justification": "printing a variable",
        "programs": ["printenv"], "env": ["APP_*"], "accept_unknown": True,
        "examples": {"match": ["printenv APP_X"]},
    })  # fmt: skip
    p["rules"].insert(0, {
        "id": "missing", "decision": "allow", "justification": "a program that is not installed",
        "programs": ["nosuchprogram"], "accept_unknown": True, "examples": {"match": ["nosuchprogram"]},
    })  # fmt: skip
    p["tools"].update(tools)
    p["shells"] = list(shells)
    d = tmp_path / "policies"
    d.mkdir(exist_ok=True)
    f = d / "p.yaml"
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f


def serve(tmp_path: Path, policy_file: Path, ws: Path, profile: str, *extra: str) -> StdioServerParameters:
    args = ["serve", "--stdio", "--principal", "agent", "--policy", str(policy_file), "--workspace", str(ws)]
    args += ["--audit-dir", str(tmp_path / "audit"), "--state-dir", str(tmp_path / "approvals")]
    args += ["--process-dir", str(tmp_path / "state"), "--profile", profile, *extra]
    return StdioServerParameters(command=GATEWAY, args=args, env=env_without_state(tmp_path))


def reply(r: CallToolResult) -> dict[str, Any]:
    """A profile's reply: the seed's JSON, alone, in one text block."""
    assert len(r.content) == 1 and r.content[0].type == "text"
    out: dict[str, Any] = json.loads(r.content[0].text)
    return out


def answering(*answers: ElicitResult, asked: list[Any] | None = None) -> Any:
    queue = list(answers)

    async def cb(ctx: Any, params: Any) -> ElicitResult:
        if asked is not None:
            asked.append(params)
        return queue.pop(0)

    return cb


# --- choosing profiles --------------------------------------------------------------------------
def test_profile_names_are_checked() -> None:
    assert [s.name for s in specs_for("system-ops")] == ["run", "ask_user", "await_call"]
    assert [s.name for s in specs_for("gateway")] == [s.name for s in PROFILES["gateway"]]
    with pytest.raises(ProfileError, match="no profile 'nope'"):
        specs_for("nope")
    with pytest.raises(ProfileError, match="gateway and system-ops both have a tool named 'run'"):
        specs_for("gateway,system-ops")
    with pytest.raises(ProfileError, match="NAME"):
        specs_for("system-ops,")


def test_serve_refuses_an_unknown_profile(tmp_path: Path, ws: Path) -> None:
    f = profile_policy(tmp_path, ws)
    out = gateway_cmd(*serve(tmp_path, f, ws, "nope").args, check=False, env=env_without_state(tmp_path))
    assert out.returncode == 2 and "no profile 'nope'" in out.stderr
    assert not (tmp_path / "audit").exists()  # refused before anything was opened or recorded


# --- system-ops (seed 004) ------------------------------------------------------------------------
def test_system_ops_lists_the_seeds_tools_and_arguments(tmp_path: Path, ws: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "system-ops")) as c:
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}

    tools = asyncio.run(scenario())
    assert set(tools) == {"run", "ask_user", "await_call"}
    run = tools["run"]
    assert set(run["properties"]) == {"command", "timeout", "silent", "cwd", "env"}
    assert run["required"] == ["command"] and run["additionalProperties"] is False
    assert run["properties"]["timeout"]["default"] == 30000
    assert run["properties"]["silent"]["default"] is False
    ask = tools["ask_user"]
    assert set(ask["properties"]) == {"prompt", "default", "validation", "password"}
    assert ask["required"] == ["prompt"] and ask["additionalProperties"] is False


def test_system_ops_run_examples_and_error_codes(tmp_path: Path, ws: Path) -> None:
    (ws / "sub").mkdir()
    (ws / "sub").chmod(0o777)

    async def scenario() -> dict[str, CallToolResult]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "system-ops")) as c:
            calls: dict[str, dict[str, Any]] = {
                # the seed's own examples (CaptainPhantasy/Floyd, docs/tools/system.md)
                "ls": {"command": "ls -la"},
                "with_timeout": {"command": "echo tested", "timeout": 60000},
                "with_cwd": {"command": "pwd", "cwd": str(ws / "sub")},
                "with_env": {"command": "printenv APP_ENV", "env": {"APP_ENV": "production"}},  # APP_* allowed
                "ok": {"command": "echo hello"},
                "silent": {"command": "echo hello", "silent": True},
                "cwd_env": {"command": "printenv APP_X", "cwd": "sub", "env": {"APP_X": "42"}},
                "failed": {"command": "echo out; echo err >&2; false"},
                "timeout": {"command": "sleep 30", "timeout": 300},
                "not_found": {"command": "nosuchprogram"},
                "bad_timeout": {"command": "echo x", "timeout": 0},
                "unknown_field": {"command": "echo x", "timeout_ms": 5},
                "denied": {"command": "curl https://example.com"},
                "outside": {"command": "echo x", "cwd": "/etc"},
            }
            return {k: await c.call_tool("run", v) for k, v in calls.items()}

    r = asyncio.run(scenario())
    out = {k: reply(v) for k, v in r.items()}

    ok = out["ok"]
    assert set(ok) == {"success", "data", "call_id"} and ok["success"] is True and not r["ok"].is_error
    # the seed's response, field by field and first: {exit_code, stdout, stderr, timed_out}
    assert list(ok["data"])[:4] == ["exit_code", "stdout", "stderr", "timed_out"]
    assert ok["data"]["exit_code"] == 0 and ok["data"]["stdout"] == "hello\n" and ok["data"]["stderr"] == ""
    assert ok["data"]["timed_out"] is False
    # `ls -la` is the policy's to decide: this one sends listings to the files tool, and says so
    assert out["ls"]["success"] is False and out["ls"]["error"]["code"] == "POLICY_DENIED", out["ls"]
    assert "files" in out["ls"]["error"]["message"] and "data" not in out["ls"]
    assert out["with_timeout"]["data"]["stdout"] == "tested\n" and out["with_timeout"]["data"]["timed_out"] is False
    assert out["with_cwd"]["data"]["stdout"] == f"{ws / 'sub'}\n"
    assert out["with_env"]["data"]["stdout"] == "production\n"
    assert isinstance(ok["data"]["duration_ms"], int) and ok["data"]["cwd"] == str(ws)
    assert {"started_at", "ended_at"} <= set(ok["data"])

    silent = out["silent"]["data"]
    assert silent["exit_code"] == 0 and silent["stdout"] == "" and silent["stderr"] == "" and not silent["timed_out"]
    assert silent["stdout_bytes"] == 6 and silent["stderr_bytes"] == 0

    assert out["cwd_env"]["success"] is True, out["cwd_env"]
    assert out["cwd_env"]["data"]["stdout"] == "42\n" and out["cwd_env"]["data"]["cwd"] == str(ws / "sub")

    failed = out["failed"]
    assert failed["success"] is False and r["failed"].is_error
    assert failed["error"]["code"] == "COMMAND_FAILED" and "1" in failed["error"]["message"]
    assert failed["data"]["exit_code"] == 1
    assert failed["data"]["stdout"] == "out\n" and failed["data"]["stderr"] == "err\n"

    timeout = out["timeout"]
    assert timeout["success"] is False and timeout["error"]["code"] == "COMMAND_TIMEOUT" and r["timeout"].is_error
    assert timeout["data"]["timed_out"] is True

    nf = out["not_found"]
    assert nf["success"] is False and nf["error"]["code"] == "COMMAND_NOT_FOUND" and nf["data"]["exit_code"] == 127

    for k, field in (("bad_timeout", "timeout"), ("unknown_field", "timeout_ms")):
        assert out[k]["success"] is False and r[k].is_error
        assert out[k]["error"]["code"] == "INVALID_INPUT" and field in out[k]["error"]["message"], out[k]
        assert "data" not in out[k]

    denied = out["denied"]
    assert denied["success"] is False and r["denied"].is_error and "data" not in denied
    assert denied["error"]["code"] == "POLICY_DENIED" and denied["error"]["rule"] == "no-curl"
    assert "no network" in denied["error"]["message"]
    assert out["outside"]["error"]["code"] == "PATH_OUTSIDE_JAIL"

    # the same gate: each call's decision is on the record under the run family, the denial too
    records = audit_records(tmp_path / "audit")
    decisions = {r["call_id"]: r for r in records if r["event"] == "decision"}
    d = decisions[denied["call_id"]]
    assert d["tool"] == "run" and d["decision"] == "deny" and d["rule"] == "no-curl"
    assert d["arguments"]["command"] == "curl https://example.com"
    allowed = decisions[ok["call_id"]]
    assert allowed["decision"] == "allow" and allowed["tool"] == "run"
    assert allowed["arguments"]["timeout_ms"] == 30000 and allowed["arguments"]["fail_on_error"] is True  # the seed's
    rejected = [r for r in records if r["event"] == "rejected"]
    assert {r["call_id"] for r in rejected} == {out["bad_timeout"]["call_id"], out["unknown_field"]["call_id"]}
    assert verify(tmp_path / "audit").ok


def test_system_ops_ask_user_examples_and_error_codes(tmp_path: Path, ws: Path) -> None:
    asked: list[Any] = []
    cb = answering(
        ElicitResult(action="accept", content={"answer": "postgres"}),
        ElicitResult(action="accept", content={"answer": ""}),
        ElicitResult(action="accept", content={"answer": "mysql"}),
        ElicitResult(action="accept", content={"answer": "ab"}),
        ElicitResult(action="accept", content={"answer": "abcdefghijk"}),
        ElicitResult(action="accept", content={"answer": "v1.2"}),
        ElicitResult(action="accept", content={"answer": "hunter2hunter2"}),
        ElicitResult(action="decline"),
        ElicitResult(action="accept", content={"answer": "Ada"}),
        ElicitResult(action="accept", content={"answer": ""}),
        ElicitResult(action="accept", content={"answer": "ada@example.com"}),
        ElicitResult(action="accept", content={"answer": "s3cret-pass"}),
        asked=asked,
    )
    calls: list[dict[str, Any]] = [
        {"prompt": "Which database?", "validation": {"allowed_values": ["postgres", "sqlite"]}, "default": "sqlite"},
        {"prompt": "Which database?", "validation": {"allowed_values": ["postgres", "sqlite"]}, "default": "sqlite"},
        {"prompt": "Which database?", "validation": {"allowed_values": ["postgres", "sqlite"]}},
        {"prompt": "Project name?", "validation": {"min_length": 3, "max_length": 10}},
        {"prompt": "Project name?", "validation": {"min_length": 3, "max_length": 10}},
        {"prompt": "Version?", "validation": {"pattern": "[0-9]+\\.[0-9]+\\.[0-9]+"}},
        {"prompt": "Password?", "password": True, "validation": {"min_length": 8}},
        {"prompt": "Continue?"},
        # the seed's own examples (CaptainPhantasy/Floyd, docs/tools/system.md)
        {"prompt": "Enter your name:"},
        {"prompt": "Enter port:", "default": "3000"},
        {"prompt": "Enter email:", "validation": {"pattern": "^[\\w-\\.]+@([\\w-]+\\.)+[\\w-]{2,4}$"}},
        {"prompt": "Enter password:", "password": True},
    ]

    async def scenario() -> list[CallToolResult]:
        async with Client(
            serve(tmp_path, profile_policy(tmp_path, ws), ws, "system-ops"), elicitation_callback=cb
        ) as c:
            out = [await c.call_tool("ask_user", a) for a in calls]
            out.append(await c.call_tool("ask_user", {"question": "old name?"}))  # not the seed's field
            return out

    results = asyncio.run(scenario())
    (chosen, defaulted, not_allowed, short, long, bad_pattern, password, declined, name, port, email, secret,
     unknown) = map(reply, results)  # fmt: skip
    # the seed's examples, its response {value, validated} field by field
    # (`validated` is true only where a `validation` was checked)
    assert name["data"] == {"value": "Ada", "validated": False}
    assert port["data"] == {"value": "3000", "validated": False}
    assert email["data"] == {"value": "ada@example.com", "validated": True}
    assert secret["data"] == {"value": "s3cret-pass", "validated": False}

    assert set(chosen) == {"success", "data", "call_id"}
    assert chosen["success"] is True and chosen["data"] == {"value": "postgres", "validated": True}
    assert asked[0].requested_schema["properties"]["answer"]["enum"] == ["postgres", "sqlite"]
    assert defaulted["data"] == {"value": "sqlite", "validated": True}
    for bad, rule in ((not_allowed, "allowed_values"), (short, "min_length"), (long, "max_length"),
                      (bad_pattern, "pattern")):  # fmt: skip
        assert bad["success"] is False and bad["error"]["code"] == "INVALID_INPUT" and rule in bad["error"]["message"]
    assert password["success"] is True and password["data"] == {"value": "hunter2hunter2", "validated": True}
    assert declined["success"] is False and declined["error"]["code"] == "USER_CANCELLED"
    assert unknown["error"]["code"] == "INVALID_INPUT" and "question" in unknown["error"]["message"]
    assert [r.is_error for r in results] == [False, False, True, True, True, True, False, True] + [False] * 4 + [True]
    assert len(asked) == 12  # nobody is asked an invalid call

    text = (tmp_path / "audit").read_text() if (tmp_path / "audit").is_file() else ""
    records = audit_records(tmp_path / "audit")
    assert "hunter2" not in text + json.dumps(records) and "s3cret" not in text + json.dumps(records)
    results_ = {r["call_id"]: r for r in records if r["event"] == "result" and r["tool"] == "ask_user"}
    assert results_[chosen["call_id"]]["data"]["answered"]["answer"] == "postgres"
    assert verify(tmp_path / "audit").ok


def test_system_ops_supervisor_level_waits_for_a_supervisor_then_answers_in_the_seeds_shape(
    tmp_path: Path, ws: Path
) -> None:
    """The seed's "supervisor" permission level is the policy's ask: `run` from level 2 waits for
    a supervisor (pending, then await_call answers in the seed's shape), and ask_user at that
    level is refused at once (NO_USER_CHANNEL, no supervisor kept waiting)."""
    (ws / "victim").write_text("x")
    (ws / "victim").chmod(0o666)
    f = profile_policy(tmp_path, ws, run={"ask_from": 2}, ask_user={"ask_from": 2})
    queue = tmp_path / "approvals"

    async def scenario() -> tuple[CallToolResult, CallToolResult, CallToolResult, CallToolResult]:
        params = serve(tmp_path, f, ws, "system-ops", "--pending-after", "0.2")
        async with Client(params, elicitation_callback=answering()) as c:
            first = await c.call_tool("run", {"command": "rm victim"})
            call_id = reply(first)["call_id"]
            (row,) = approval_queue.pending(queue)
            assert row["call_id"] == call_id
            await asyncio.to_thread(
                gateway_cmd, "approvals", "approve", call_id, "--state-dir", str(queue), "--by", "alice"
            )
            done = await c.call_tool("await_call", {"call_id": call_id, "wait_ms": 60_000})
            again = await c.call_tool("await_call", {"call_id": call_id, "wait_ms": 0})
            asked = await c.call_tool("ask_user", {"prompt": "name?"})
            return first, done, again, asked

    first, done, again, asked = asyncio.run(scenario())
    pending = reply(first)
    assert pending["success"] is False and not first.is_error
    assert pending["data"]["status"] == "pending" and pending["data"]["call_id"] == pending["call_id"]
    assert pending["data"]["approval"]["waiting_for"] == "supervisor" and "await_call" in pending["data"]["next"]
    result = reply(done)
    assert result == reply(again)
    assert result["success"] is True and result["data"]["exit_code"] == 0 and result["call_id"] == pending["call_id"]
    assert not (ws / "victim").exists()
    no_channel = reply(asked)
    assert no_channel["success"] is False and no_channel["error"]["code"] == "NO_USER_CHANNEL" and asked.is_error
    approval = [r for r in audit_records(tmp_path / "audit") if r["event"] == "approval"]
    assert len(approval) == 1 and approval[0]["data"]["by"] == "alice" and approval[0]["tool"] == "run"


# --- methings (seed 000): the one-shot shells ------------------------------------------------------
def test_methings_run_shell_examples_and_error_cases(tmp_path: Path, ws: Path) -> None:
    f = profile_policy(tmp_path, ws, shells=("bash", "sh"))

    async def scenario() -> tuple[dict[str, Any], dict[str, CallToolResult]]:
        async with Client(serve(tmp_path, f, ws, "methings")) as c:
            tools = {t.name: t.input_schema for t in (await c.list_tools()).tools}
            calls: list[tuple[str, str, dict[str, Any]]] = [
                ("sh", "local_run_shell", {"command": "echo hi"}),
                ("bash", "termux_run_shell", {"command": "echo hi", "cwd": ".", "env": {}}),
                ("exit", "termux_run_shell", {"command": "echo out; echo err >&2; false"}),
                ("timeout", "local_run_shell", {"command": "sleep 30", "timeout_ms": 300}),
                ("too_long", "termux_run_shell", {"command": "echo x", "timeout_ms": 300_001}),
                ("denied", "local_run_shell", {"command": "curl https://example.com"}),
                ("missing", "termux_run_shell", {"command": "nosuchprogram"}),
            ]
            return tools, {k: await c.call_tool(name, args) for k, name, args in calls}

    tools, r = asyncio.run(scenario())
    assert set(tools) == {
        "local_run_shell", "termux_run_shell", "local_shell_session", "termux_shell_session", "termux_fs", "await_call",
    }  # fmt: skip
    for name in ("local_run_shell", "termux_run_shell"):
        schema = tools[name]
        assert set(schema["properties"]) == {"command", "cwd", "timeout_ms", "env"}
        assert schema["properties"]["timeout_ms"]["default"] == 60000
        assert schema["properties"]["timeout_ms"]["maximum"] == 300000
    out = {k: reply(v) for k, v in r.items()}
    for k in ("sh", "bash"):
        assert set(out[k]) == {"status", "exit_code", "stdout", "stderr", "call_id"}
        assert (out[k]["status"], out[k]["exit_code"], out[k]["stdout"], out[k]["stderr"]) == ("ok", 0, "hi\n", "")
    assert (out["exit"]["status"], out["exit"]["exit_code"]) == ("ok", 1) and not r["exit"].is_error
    assert out["exit"]["stdout"] == "out\n" and out["exit"]["stderr"] == "err\n"
    timeout = out["timeout"]
    assert (timeout["status"], timeout["exit_code"], timeout["stderr"]) == (
        "timeout",
        -1,
        "Command timed out after 0.3s",
    )
    assert r["timeout"].is_error
    assert out["too_long"]["status"] == "error" and out["too_long"]["error"]["code"] == "INVALID_INPUT"
    assert "timeout_ms" in out["too_long"]["error"]["message"] and out["too_long"]["exit_code"] == -1
    denied = out["denied"]
    assert (denied["status"], denied["exit_code"], denied["stdout"]) == ("error", -1, "") and r["denied"].is_error
    assert denied["error"]["code"] == "POLICY_DENIED" and denied["error"]["rule"] == "no-curl"
    assert "no network" in denied["stderr"]
    missing = out["missing"]
    assert (missing["status"], missing["exit_code"], missing["error"]["code"]) == ("error", 127, "COMMAND_NOT_FOUND")
    assert "nosuchprogram" in missing["stderr"]

    decisions = {d["call_id"]: d for d in audit_records(tmp_path / "audit") if d["event"] == "decision"}
    assert decisions[out["sh"]["call_id"]]["arguments"]["shell"] == "sh"  # local_run_shell: bash in POSIX mode
    assert decisions[out["bash"]["call_id"]]["arguments"]["shell"] == "bash"
    assert decisions[out["sh"]["call_id"]]["arguments"]["timeout_ms"] == 60000  # the seed's default
    d = decisions[denied["call_id"]]
    assert (d["tool"], d["decision"], d["rule"]) == ("run", "deny", "no-curl")
    assert verify(tmp_path / "audit").ok


def test_methings_sh_needs_the_policys_leave(tmp_path: Path, ws: Path) -> None:
    """local_run_shell is bash in POSIX mode: a policy that lists only bash denies it, like run's sh."""

    async def scenario() -> CallToolResult:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "methings")) as c:
            return await c.call_tool("local_run_shell", {"command": "echo hi"})

    out = reply(asyncio.run(scenario()))
    assert out["status"] == "error" and out["error"]["code"] == "POLICY_DENIED" and "sh" in out["stderr"]


def test_methings_timeout_names_the_limit_in_seconds() -> None:
    envelope = {
        "status": "timeout", "call_id": "c1", "exit_code": None, "stdout": "partial", "stderr": "",
        "timeout_ms": 60000, "error": {"code": "COMMAND_TIMEOUT", "message": "killed after 60000 ms"},
    }  # fmt: skip
    assert methings.run_reply(envelope) == {
        "status": "timeout", "exit_code": -1, "stdout": "partial", "stderr": "Command timed out after 60s",
        "call_id": "c1",
    }  # fmt: skip


def test_http_serves_the_profile_chosen(tmp_path: Path, ws: Path) -> None:
    """`--profile` over HTTP (what `make serve PROFILE=...` runs): the seed's tools, behind the token."""
    from tests.server.test_transports import call_http

    server = HttpGateway(tmp_path, profile_policy(tmp_path, ws), ws, extra=("--profile", "system-ops"))
    try:
        token = server.token("agent")
        ok, denied = asyncio.run(
            call_http(server.url, token, "auto", ("run", {"command": "echo hi"}), ("run", {"command": "curl x"}))
        )
        assert "profile system-ops" in server.stderr.read_text()
    finally:
        server.stop()
    assert reply(ok)["success"] is True and reply(ok)["data"]["stdout"] == "hi\n"
    assert reply(denied)["error"]["code"] == "POLICY_DENIED" and denied.is_error
    assert verify(server.audit).ok
