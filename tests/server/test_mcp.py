"""The MCP server through the SDK's own client, in memory, in both protocol eras: listing,
allowed and denied calls, supervisor approvals with pending replies, client approvals and
ask_user through elicitation, principals kept apart, many calls in flight, cancellation. The
gateway underneath is real (sandbox, processes, audit files)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, ElicitResult

from gateway import approval_queue
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy
from gateway.server.app import GatewayServer
from gateway.server.specs import SPECS
from tests.server.conftest import audit_records, close_gateway, envelope_of, make_gateway

Elicitor = Callable[[Any, Any], Awaitable[ElicitResult]]


def envelope(r: CallToolResult) -> dict[str, Any]:
    return envelope_of(r)


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro

    return asyncio.run(main())


def answering(*answers: ElicitResult, asked: list[Any] | None = None) -> Elicitor:
    queue = list(answers)

    async def cb(ctx: Any, params: Any) -> ElicitResult:
        if asked is not None:
            asked.append(params)
        return queue.pop(0)

    return cb


@pytest.fixture
def gw(policy: CompiledPolicy, tmp_path: Path) -> Any:
    g = make_gateway(policy, tmp_path, approval_queue.QueueApprover(tmp_path / "approvals", (policy.workspace,)))
    yield g
    close_gateway(g, tmp_path)


# --- listing and schemas ------------------------------------------------------------------------
def test_every_tool_has_a_closed_schema_a_description_and_hints() -> None:
    for spec in SPECS:
        schema = spec.input_schema()
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert "principal" not in schema["properties"] and "tool" not in schema["properties"]
        assert len(spec.description) > 60 and spec.annotations.read_only_hint is not None
    run_schema = next(s for s in SPECS if s.name == "run").input_schema()
    assert run_schema["required"] == ["command"]
    assert run_schema["properties"]["command"]["description"].startswith("The shell text")


def test_listing_shows_only_what_the_principal_may_use(gw: Gateway, era: str) -> None:
    async def names(principal: str) -> set[str]:
        async with Client(GatewayServer(gw, principal).mcp, mode=era) as c:
            return {t.name for t in (await c.list_tools()).tools}

    everything = {s.name for s in SPECS}
    assert run(names("agent")) == everything
    # the reader (level 1) may use run and files, never sessions, processes, env or ask_user
    assert run(names("reader")) == {"run", "files", "format_output", "await_call"}


def test_listed_tools_carry_schema_and_hints(gw: Gateway, era: str) -> None:
    async def scenario() -> None:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["run"].input_schema["additionalProperties"] is False
        assert tools["run"].annotations is not None and tools["run"].annotations.destructive_hint is True
        assert tools["format_output"].annotations is not None and tools["format_output"].annotations.read_only_hint

    run(scenario())


# --- allowed, denied, invalid -----------------------------------------------------------------
def test_allowed_and_denied_calls(gw: Gateway, era: str, tmp_path: Path) -> None:
    async def scenario() -> tuple[CallToolResult, CallToolResult]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            return await c.call_tool("run", {"command": "echo hi"}), await c.call_tool("run", {"command": "curl x"})

    ok, denied = run(scenario())
    assert not ok.is_error and envelope(ok)["stdout"] == "hi\n"
    assert denied.is_error and envelope(denied)["error"]["code"] == "POLICY_DENIED"
    text = denied.content[0].text  # type: ignore[union-attr]
    assert text.startswith("DENIED (POLICY_DENIED) by rule no-curl") and "use the files tool" in text
    decisions = [r for r in audit_records(tmp_path / "audit") if r["event"] == "decision"]
    assert [d["decision"] for d in decisions[-2:]] == ["allow", "deny"]


def test_the_agent_cannot_name_its_principal_or_misspell_a_field(gw: Gateway, era: str, tmp_path: Path) -> None:
    async def scenario() -> list[CallToolResult]:
        async with Client(GatewayServer(gw, "reader").mcp, mode=era) as c:
            return [
                await c.call_tool("run", {"command": "echo x", "principal": "agent"}),
                await c.call_tool("run", {"comand": "echo x"}),
                await c.call_tool("session", {"action": "start"}),  # not the reader's tool
            ]

    smuggled, typo, unlisted = run(scenario())
    assert smuggled.is_error and "principal: set by the gateway" in envelope(smuggled)["error"]["message"]
    assert typo.is_error and "comand" in envelope(typo)["error"]["message"]
    assert unlisted.is_error and envelope(unlisted)["error"]["code"] == "POLICY_DENIED"
    rejected = [r for r in audit_records(tmp_path / "audit") if r["event"] == "rejected"]
    assert len(rejected) == 2 and all(r["principal"] == "reader" for r in rejected)


# --- supervisor approvals -------------------------------------------------------------------
def answer_when_asked(queue: Path, approve: bool, done: threading.Event) -> threading.Thread:
    def supervisor() -> None:
        while not done.is_set():
            for req in approval_queue.pending(queue):
                approval_queue.answer(queue, req["call_id"], approve, "alice", "checked")
                return
            time.sleep(0.05)

    t = threading.Thread(target=supervisor, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("approve", [True, False])
def test_ask_goes_to_the_supervisor_not_the_client(
    gw: Gateway, era: str, tmp_path: Path, ws: Path, approve: bool
) -> None:
    (ws / "victim").write_text("x")
    asked: list[Any] = []
    done = threading.Event()
    answer_when_asked(tmp_path / "approvals", approve, done)

    async def scenario() -> CallToolResult:
        server = GatewayServer(gw, "agent", pending_after_s=30)
        async with Client(server.mcp, mode=era, elicitation_callback=answering(asked=asked)) as c:
            return await c.call_tool("run", {"command": "rm victim"})

    try:
        r = run(scenario())
    finally:
        done.set()
    assert asked == []  # a supervisor-only rule never reaches the agent's client
    if approve:
        assert not r.is_error and not (ws / "victim").exists()
    else:
        assert r.is_error and envelope(r)["error"]["code"] == "APPROVAL_DENIED" and (ws / "victim").exists()
    approval = [x for x in audit_records(tmp_path / "audit") if x["event"] == "approval"][-1]
    assert approval["data"]["by"] == "alice" and approval["data"]["how"] == "queue"


def test_an_unanswered_ask_returns_pending_and_await_call_gets_the_result(
    gw: Gateway, era: str, tmp_path: Path, ws: Path
) -> None:
    (ws / "victim").write_text("x")
    queue = tmp_path / "approvals"

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        server = GatewayServer(gw, "agent", pending_after_s=0.2)
        async with Client(server.mcp, mode=era) as c:
            first = envelope(await c.call_tool("run", {"command": "rm victim"}))
            again = envelope(await c.call_tool("await_call", {"call_id": first["call_id"], "wait_ms": 100}))
            # another principal cannot wait on (or learn) this call
            async with Client(GatewayServer(gw, "other").mcp, mode=era) as other:
                foreign = envelope(await other.call_tool("await_call", {"call_id": first["call_id"], "wait_ms": 0}))
            approval_queue.answer(queue, first["call_id"], True, "alice")
            final = envelope(await c.call_tool("await_call", {"call_id": first["call_id"], "wait_ms": 30_000}))
            return first, again, foreign, final

    first, again, foreign, final = run(scenario())
    assert first["status"] == "pending" and first["approval"]["rule"] == "rm-by-supervisor"
    assert "await_call" in first["next"]
    assert again["status"] == "pending" and again["call_id"] == first["call_id"]
    assert foreign["error"]["code"] == "UNKNOWN_CALL"
    assert final["status"] == "ok" and final["call_id"] == first["call_id"] and not (ws / "victim").exists()


# --- client approval (rules that opt in) ------------------------------------------------------
@pytest.mark.parametrize("action", ["accept", "decline"])
def test_a_client_approvable_rule_asks_the_client_and_records_it_as_attested(
    gw: Gateway, era: str, tmp_path: Path, ws: Path, action: str
) -> None:
    asked: list[Any] = []
    answer = ElicitResult(action=action, content={"approve": True} if action == "accept" else None)  # type: ignore[arg-type]

    async def scenario() -> CallToolResult:
        async with Client(
            GatewayServer(gw, "agent").mcp, mode=era, elicitation_callback=answering(answer, asked=asked)
        ) as c:
            return await c.call_tool("run", {"command": "touch made"})

    r = run(scenario())
    assert len(asked) == 1 and "touch made" in asked[0].message
    approval = [x for x in audit_records(tmp_path / "audit") if x["event"] == "approval"][-1]
    assert approval["data"]["how"] == "client-attested" and approval["data"]["by"] == "client of agent"
    if action == "accept":
        assert not r.is_error and (ws / "made").exists()
    else:
        assert r.is_error and envelope(r)["error"]["code"] == "APPROVAL_DENIED" and not (ws / "made").exists()


def test_a_client_cannot_approve_a_call_that_also_needs_a_supervisor(
    gw: Gateway, era: str, tmp_path: Path, ws: Path
) -> None:
    (ws / "victim").write_text("x")
    asked: list[Any] = []

    async def scenario() -> dict[str, Any]:
        server = GatewayServer(gw, "agent", pending_after_s=0.2)
        cb = answering(ElicitResult(action="accept", content={"approve": True}), asked=asked)
        async with Client(server.mcp, mode=era, elicitation_callback=cb) as c:
            return envelope(await c.call_tool("run", {"command": "touch made; rm victim"}))

    out = run(scenario())
    assert asked == [] and out["status"] == "pending"  # the supervisor decides the whole call
    assert (ws / "victim").exists() and not (ws / "made").exists()
    for req in approval_queue.pending(tmp_path / "approvals"):
        approval_queue.answer(tmp_path / "approvals", req["call_id"], False, "alice")


def test_every_rule_that_asks_must_opt_in_not_just_the_first(gw: Gateway, era: str, tmp_path: Path, ws: Path) -> None:
    asked: list[Any] = []

    async def scenario() -> dict[str, Any]:
        server = GatewayServer(gw, "agent", pending_after_s=0.2)
        cb = answering(ElicitResult(action="accept", content={"approve": True}), asked=asked)
        async with Client(server.mcp, mode=era, elicitation_callback=cb) as c:
            return envelope(await c.call_tool("run", {"command": "touch DEPLOY1"}))

    out = run(scenario())
    assert asked == [] and out["status"] == "pending" and not (ws / "DEPLOY1").exists()
    for req in approval_queue.pending(tmp_path / "approvals"):
        approval_queue.answer(tmp_path / "approvals", req["call_id"], False, "alice")


def test_the_client_form_shows_control_characters_as_escapes(gw: Gateway, era: str, ws: Path) -> None:
    asked: list[Any] = []

    async def scenario() -> None:
        cb = answering(ElicitResult(action="decline"), asked=asked)
        async with Client(GatewayServer(gw, "agent").mcp, mode=era, elicitation_callback=cb) as c:
            await c.call_tool("run", {"command": "touch $'\\e[2J\\e[Hharmless'"})

    run(scenario())
    assert len(asked) == 1 and "\x1b" not in asked[0].message and "\\u{001b}" in asked[0].message
    assert str(ws) in asked[0].message


def test_nobody_is_asked_about_a_call_the_policy_denies(gw: Gateway, era: str) -> None:
    asked: list[Any] = []

    async def scenario() -> CallToolResult:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era, elicitation_callback=answering(asked=asked)) as c:
            return await c.call_tool("run", {"command": "touch x; curl y"})

    r = run(scenario())
    assert asked == [] and r.is_error and envelope(r)["error"]["code"] == "POLICY_DENIED"


def test_without_form_support_a_client_rule_falls_back_to_the_supervisor(gw: Gateway, era: str, ws: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(GatewayServer(gw, "agent", pending_after_s=0.2).mcp, mode=era) as c:
            return envelope(await c.call_tool("run", {"command": "touch made"}))

    assert run(scenario())["status"] == "pending" and not (ws / "made").exists()


# --- ask_user through elicitation -----------------------------------------------------------
def test_ask_user_through_elicitation(gw: Gateway, era: str, tmp_path: Path) -> None:
    asked: list[Any] = []
    cb = answering(
        ElicitResult(action="accept", content={"answer": "blue"}),
        ElicitResult(action="accept", content={"answer": "x1"}),
        ElicitResult(action="decline"),
        asked=asked,
    )

    async def scenario() -> list[dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era, elicitation_callback=cb) as c:
            return [
                envelope(
                    await c.call_tool(
                        "ask_user", {"prompt": "colour?", "validation": {"allowed_values": ["red", "blue"]}}
                    )
                ),
                envelope(await c.call_tool("ask_user", {"prompt": "id?", "validation": {"pattern": "[0-9]+"}})),
                envelope(await c.call_tool("ask_user", {"prompt": "go on?"})),
            ]

    colour, bad, declined = run(scenario())
    assert colour["status"] == "ok" and colour["value"] == "blue"
    assert asked[0].requested_schema["properties"]["answer"]["enum"] == ["red", "blue"]
    assert bad["error"]["code"] == "INVALID_INPUT" and "pattern" in bad["error"]["message"]
    assert declined["error"]["code"] == "USER_CANCELLED"
    results = [r for r in audit_records(tmp_path / "audit") if r["event"] == "result" and r["tool"] == "ask_user"]
    assert results[0]["data"]["answered"] == {"by": "client of agent", "how": "elicitation", "answer": "blue"}


def test_ask_user_without_a_form_capable_client_or_when_denied(gw: Gateway, era: str) -> None:
    asked: list[Any] = []

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            no_forms = envelope(await c.call_tool("ask_user", {"prompt": "name?"}))
        cb = answering(asked=asked)
        async with Client(GatewayServer(gw, "reader").mcp, mode=era, elicitation_callback=cb) as c:
            denied = envelope(await c.call_tool("ask_user", {"prompt": "name?"}))
        return no_forms, denied

    no_forms, denied = run(scenario())
    assert no_forms["error"]["code"] == "NO_USER_CHANNEL" and "elicitation" in no_forms["error"]["message"]
    assert denied["error"]["code"] == "POLICY_DENIED" and asked == []


# --- principals ---------------------------------------------------------------------------------
def test_two_principals_do_not_see_each_others_state(gw: Gateway, era: str) -> None:
    async def scenario() -> dict[str, Any]:
        async with (
            Client(GatewayServer(gw, "agent").mcp, mode=era) as a,
            Client(GatewayServer(gw, "other").mcp, mode=era) as b,
        ):
            await a.call_tool("env", {"action": "set", "name": "APP_MODE", "value": "a-only"})
            sid = envelope(await a.call_tool("session", {"action": "start"}))["session_id"]
            pid = envelope(await a.call_tool("process", {"action": "start", "command": "sleep 30"}))["process"]["id"]
            return {
                "env": envelope(await b.call_tool("env", {"action": "get", "name": "APP_MODE"})),
                "sessions": envelope(await b.call_tool("session", {"action": "list"})),
                "exec": envelope(await b.call_tool("session", {"action": "exec", "session_id": sid, "command": "pwd"})),
                "processes": envelope(await b.call_tool("process", {"action": "list"})),
                "stop": envelope(await b.call_tool("process", {"action": "stop", "process_id": pid})),
                "mine": envelope(await a.call_tool("process", {"action": "get", "process_id": pid})),
            }

    seen = run(scenario())
    assert seen["env"]["error"]["code"] == "ENV_NOT_SET"
    assert seen["sessions"]["sessions"] == [] and seen["processes"]["processes"] == []
    assert seen["exec"]["status"] == "error" and seen["stop"]["status"] == "error"
    assert seen["mine"]["status"] == "ok" and seen["mine"]["process"]["state"] == "running"


def test_a_session_outlives_the_call_that_started_it(gw: Gateway, era: str) -> None:
    # each MCP call runs on its own thread; bwrap's die-with-parent follows the forking thread
    async def scenario() -> dict[str, Any]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            sid = envelope(await c.call_tool("session", {"action": "start"}))["session_id"]
            await c.call_tool(
                "session", {"action": "exec", "session_id": sid, "command": "cd .. 2>/dev/null; echo one"}
            )
            return envelope(await c.call_tool("session", {"action": "exec", "session_id": sid, "command": "echo two"}))

    out = run(scenario())
    assert out["status"] == "ok" and "two" in out["output"], out


def test_a_pathological_grep_pattern_cannot_stall_the_server(gw: Gateway, era: str, ws: Path) -> None:
    (ws / "a.txt").write_text("a" * 20_000 + "\n")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            slow = envelope(await c.call_tool("files", {"action": "grep", "pattern": "(a*)*b"}))
            backref = envelope(await c.call_tool("files", {"action": "grep", "pattern": "(a)\\1"}))
            return slow, backref

    slow, backref = run(scenario())  # with a backtracking engine this would not finish
    assert slow["status"] == "ok" and slow["matches"] == []
    assert backref["error"]["code"] == "INVALID_INPUT" and "RE2" in backref["error"]["message"]


# --- concurrency and cancellation -------------------------------------------------------------
def test_fifty_calls_in_flight_and_the_server_still_answers(gw: Gateway, era: str, ws: Path) -> None:
    server = GatewayServer(gw, "agent")
    peak = 0

    async def scenario() -> list[CallToolResult]:
        nonlocal peak
        async with Client(server.mcp, mode=era) as c:
            calls = [asyncio.create_task(c.call_tool("run", {"command": f"echo {i}; sleep 3"})) for i in range(60)]
            while peak < 50 and not all(t.done() for t in calls):
                peak = max(peak, server.in_flight())
                await asyncio.sleep(0.01)
            # while they all run, the server answers other requests
            listed = await c.list_tools()
            assert listed.tools and not all(t.done() for t in calls)
            return list(await asyncio.gather(*calls))

    results = run(scenario())
    assert peak >= 50
    assert sorted(envelope(r)["stdout"] for r in results) == sorted(f"{i}\n" for i in range(60))


def test_a_cancelled_call_kills_its_command(gw: Gateway, era: str, ws: Path, tmp_path: Path) -> None:
    server = GatewayServer(gw, "agent")

    async def scenario() -> None:
        async with Client(server.mcp, mode=era) as c:
            task = asyncio.create_task(c.call_tool("run", {"command": "echo $$ > pid; sleep 60"}))
            while not (ws / "pid").exists() or not (ws / "pid").read_text().strip():
                await asyncio.sleep(0.05)
            task.cancel()  # the client gives up: the SDK tells the server, which cancels the call
            with pytest.raises(asyncio.CancelledError):
                await task

    run(scenario())
    deadline = time.monotonic() + 30
    while server.in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.in_flight() == 0
    result = [r for r in audit_records(tmp_path / "audit") if r["event"] == "result"][-1]
    assert result["data"]["error"]["code"] == "CALL_CANCELLED"


def test_shutdown_cancels_what_runs_and_keeps_durable_processes(gw: Gateway, tmp_path: Path) -> None:
    server = GatewayServer(gw, "agent")

    async def scenario() -> str:
        async with Client(server.mcp) as c:
            started = envelope(await c.call_tool("process", {"action": "start", "command": "sleep 60"}))
            task = asyncio.create_task(c.call_tool("run", {"command": "sleep 60"}))
            while server.in_flight() == 0:
                await asyncio.sleep(0.02)
            outcome = await asyncio.to_thread(server.shutdown, 0.2)
            assert outcome["cancelled"] == 1 and outcome["unfinished"] == 0
            assert envelope(await task)["error"]["code"] == "CALL_CANCELLED"
            refused = envelope(await c.call_tool("run", {"command": "echo late"}))
            assert refused["error"]["code"] == "SHUTTING_DOWN"
            return str(started["process"]["id"])

    process_id = run(scenario())
    record = json.loads((tmp_path / "state" / "processes" / process_id / "record.json").read_text())
    os.kill(record["pid"], 0)  # still running: the next gateway adopts it


def test_the_gateways_own_records_stay_private_whatever_the_read_roots(tmp_path: Path, ws: Path) -> None:
    import copy

    from gateway.calls import FilesCall, RunCall
    from gateway.policy.compile import compile_policy
    from gateway.policy.schema import Policy
    from tests.server.conftest import POLICY

    wide = copy.deepcopy(POLICY)
    wide["roles"]["dev"]["read_roots"] = [".", ".."]  # the parent holds audit/ and state/
    policy = compile_policy(Policy.model_validate(wide), tmp_path / "policies" / "p.yaml", ws, sha256="wide")
    gw = make_gateway(policy, tmp_path)
    try:
        gw.handle(RunCall(principal="agent", command="echo SECRET_MARKER_77"))
        read = gw.handle(
            FilesCall(principal="agent", action="read", path=str(tmp_path / "audit" / "audit-000001.jsonl"))
        )
        grep = gw.handle(FilesCall(principal="agent", action="grep", path=str(tmp_path), pattern="SECRET_MARKER"))
        cat = gw.handle(RunCall(principal="agent", command=f"cat {tmp_path}/audit/audit-000001.jsonl"))
    finally:
        close_gateway(gw, tmp_path)
    assert read["status"] == "denied" and "gateway's own records" in read["error"]["message"]
    assert grep["status"] == "denied"
    assert "SECRET_MARKER_77" not in json.dumps(cat)  # the sandbox hides the audit directory


def test_a_link_flipped_after_the_decision_never_opens_the_gateways_own_records(tmp_path: Path, ws: Path) -> None:
    """Attack (red team, issue 12): the files tool kept the gateway's records private at decision
    time only. A sandboxed loop flipping `link` between a decoy and the audit log made the read
    that was decided on the decoy open the audit log (read roots reach the parent): 73 of 300
    reads leaked it. Now the executor refuses the gateway's records on the opened file too."""
    import copy

    from gateway.calls import FilesCall, ProcessCall, RunCall
    from gateway.policy.compile import compile_policy
    from gateway.policy.schema import Policy
    from tests.server.conftest import POLICY

    wide = copy.deepcopy(POLICY)
    wide["roles"]["dev"]["read_roots"] = [".", ".."]  # the parent holds audit/ and state/
    wide["rules"].append({"id": "links", "decision": "allow", "justification": "the racer", "programs": ["ln"],
                          "accept_unknown": True, "examples": {"match": ["ln -sfn a b"]}})  # fmt: skip
    policy = compile_policy(Policy.model_validate(wide), tmp_path / "policies" / "p.yaml", ws, sha256="wide")
    gw = make_gateway(policy, tmp_path)
    secret = tmp_path / "audit" / "audit-000001.jsonl"
    (ws / "decoy").write_text("harmless\n")
    try:
        gw.handle(RunCall(principal="agent", command="echo SECRET_MARKER_78"))
        racer = gw.handle(ProcessCall(
            principal="agent", action="start",
            command=f"while true; do ln -sfn decoy {ws}/link; ln -sfn {secret} {ws}/link; done",
        ))  # fmt: skip
        assert racer["status"] == "ok", racer
        seen: dict[str, int] = {}
        leaked = []
        for _ in range(400):
            out = gw.handle(FilesCall(principal="agent", action="read", path="link"))
            code = "ok" if out["status"] == "ok" else out["error"]["code"]
            seen[code] = seen.get(code, 0) + 1
            if "SECRET_MARKER_78" in json.dumps(out) or "policy_loaded" in json.dumps(out):
                leaked.append(out)
                break
    finally:
        close_gateway(gw, tmp_path)
    assert leaked == [], (seen, str(leaked[:1])[:300])
    assert seen.get("ok", 0) > 0 and seen.get("PATH_OUTSIDE_JAIL", 0) > 0, seen  # the link did flip


def test_nul_bytes_in_arguments_that_reach_the_os_are_invalid_input(gw: Gateway, era: str) -> None:
    """A NUL byte in a path, a cwd, an env name or value is the caller's mistake (INVALID_INPUT,
    naming the field), never an internal error; in file content it is data."""
    calls: list[tuple[str, dict[str, Any], str]] = [
        ("run", {"command": "echo hi", "env": {"APP_X": "a\0b"}}, "env.APP_X"),
        ("run", {"command": "echo hi", "cwd": "sub\0dir"}, "cwd"),
        ("run", {"command": "echo a\0b"}, "command"),
        ("files", {"action": "read", "path": "a\0b"}, "path"),
        ("files", {"action": "write", "path": "x\0y", "content": "z"}, "path"),
        ("files", {"action": "list", "path": "\0"}, "path"),
        ("session", {"action": "start", "cwd": "a\0"}, "cwd"),
        ("session", {"action": "start", "env": {"APP_\0": "v"}}, "env (a name)"),
        ("process", {"action": "start", "command": "sleep 1", "env": {"APP_Y": "\0"}}, "env.APP_Y"),
        ("process", {"action": "start", "command": "sleep 1", "cwd": "d\0"}, "cwd"),
        ("env", {"action": "set", "name": "APP_Z", "value": "a\0"}, "value"),
    ]

    async def scenario() -> list[dict[str, Any]]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            return [envelope(await c.call_tool(name, args)) for name, args, _ in calls]

    for (name, args, field), out in zip(calls, run(scenario()), strict=True):
        assert out["error"]["code"] == "INVALID_INPUT", (name, args, out)
        assert field in out["error"]["message"] and "NUL" in out["error"]["message"], out

    async def data() -> dict[str, Any]:
        async with Client(GatewayServer(gw, "agent").mcp, mode=era) as c:
            return envelope(await c.call_tool("files", {"action": "write", "path": "nul.bin", "content": "a\0b"}))

    assert run(data())["status"] == "ok"
