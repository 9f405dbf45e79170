"""The supervisor's and the reviewer's side, as they use it: the `gateway serve` terminal, the
`gateway approvals` and `gateway audit` commands, each run as a real process against a real
server (issue 15). Every test here failed on the code before it."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import yaml
from mcp.types import CallToolResult

from gateway import approval_queue
from gateway.approval import ApprovalRequest, CallbackApprover
from gateway.audit import verify
from gateway.calls import RunCall
from gateway.policy.compile import CompiledPolicy
from tests.server.conftest import (
    GATEWAY,
    POLICY,
    HttpGateway,
    audit_records,
    close_gateway,
    env_without_state,
    envelope_of,
    gateway_cmd,
    make_gateway,
)
from tests.server.test_transports import call_http

# `rm -rf build/cache`, then enough spaces to push the rest past the list's width
PADDED = "rm -rf build/cache" + " " * 60 + "&& rm -rf src docs"


def envelope(r: CallToolResult) -> dict[str, Any]:
    return envelope_of(r)  # sent once, in the text block


def wait_for(what: str, check: Any, limit: float = 60, agent: list[Any] | None = None) -> Any:
    """`check()` once it is true (a bound only for a broken build: nothing here is timed)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if agent:  # the agent's calls ended first: say what they got
            raise AssertionError(f"never happened: {what}; the agent got {agent}")
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def approvals(server: HttpGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return gateway_cmd("approvals", *args, check=False, env=env_without_state(server.tmp))


def ask_in_background(
    server: HttpGateway, token: str, *calls: tuple[str, dict[str, Any]], era: str = "auto"
) -> list[Any]:
    """The agent's calls in one client session, on a thread (the last one waits for a
    supervisor); results land in the list."""
    got: list[Any] = []

    def agent() -> None:
        try:
            got.append(asyncio.run(call_http(server.url, token, era, *calls)))
        except BaseException as exc:  # what the agent saw, asserted by the test
            got.append(exc)

    threading.Thread(target=agent, daemon=True).start()
    return got


def test_a_waiting_call_is_announced_and_listed_with_its_cut_marked(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        got = ask_in_background(server, server.token("agent"), ("run", {"command": PADDED}))
        (row,) = wait_for("a pending request", lambda: approval_queue.pending(server.queue), agent=got)
        call_id = row["call_id"]
        # the server's terminal says a call waits, and how to answer it
        line = wait_for("the announcement", lambda: [x for x in server.stderr.read_text().splitlines()
                                                     if f"call {call_id} waits for approval" in x])  # fmt: skip
        assert "rule rm-by-supervisor" in line[0] and "...[+" in line[0]
        assert f"gateway approvals show --state-dir {server.queue} {call_id}" in server.stderr.read_text()
        # the list never cuts silently: the row says how much more there is, and where to read it
        listed = approvals(server, "list", "--state-dir", str(server.queue)).stdout.splitlines()
        (mine,) = [x for x in listed if x.startswith(call_id)]
        hidden = len(PADDED) - 60
        assert mine.endswith(f"...[+{hidden} chars: approvals show {call_id}]"), mine
        assert "rm -rf build/cache" in mine
        shown = approvals(server, "show", call_id, "--state-dir", str(server.queue)).stdout
        assert PADDED in shown  # `show` has all of it
        assert approvals(server, "deny", call_id, "--state-dir", str(server.queue)).returncode == 0
        wait_for("the agent's answer", lambda: got)
    finally:
        server.stop()
    assert verify(server.audit).ok


def test_line_breaks_are_escaped_in_the_list(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        # (the analyser refuses other control characters; a line break and a tab are shell syntax)
        sneaky = "rm -f a.txt\n\trm -f b.txt"
        got = ask_in_background(server, server.token("agent"), ("run", {"command": sneaky}))
        (row,) = wait_for("a pending request", lambda: approval_queue.pending(server.queue), agent=got)
        out = approvals(server, "list", "--state-dir", str(server.queue)).stdout
        (mine,) = [x for x in out.splitlines() if x.startswith(row["call_id"])]
        assert mine.endswith("rm -f a.txt\\n\\trm -f b.txt"), out  # one row, the whole command
        approvals(server, "deny", row["call_id"], "--state-dir", str(server.queue))
        wait_for("the agent's answer", lambda: got)
    finally:
        server.stop()


def test_show_prints_the_environment_the_command_runs_with(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        got = ask_in_background(
            server,
            server.token("agent"),
            ("env", {"action": "set", "name": "APP_MODE", "value": "production"}),
            ("env", {"action": "set", "name": "APP_LEVEL", "value": "1"}),
            ("run", {"command": "rm -f x"}),
        )
        (row,) = wait_for("a pending request", lambda: approval_queue.pending(server.queue), agent=got)
        shown = approvals(server, "show", row["call_id"], "--state-dir", str(server.queue)).stdout
        assert "APP_MODE=production    (stored (env tool))" in shown, shown
        assert "APP_LEVEL=1    (stored (env tool))" in shown, shown
        assert "env:       {}" not in shown
        approvals(server, "approve", row["call_id"], "--state-dir", str(server.queue))
        wait_for("the agent's answer", lambda: got)
        assert not isinstance(got[0], BaseException), got
        assert envelope(got[0][-1])["status"] == "ok"
    finally:
        server.stop()


def test_deny_reason_reaches_the_agent_and_the_audit_and_options_go_before_the_id(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        (ws / "victim").write_text("x")
        got = ask_in_background(server, server.token("agent"), ("run", {"command": "rm victim"}))
        (row,) = wait_for("a pending request", lambda: approval_queue.pending(server.queue), agent=got)
        call_id = row["call_id"]
        why = "keep victim: it is the fixture"
        # options first, the id last, as people type it
        out = approvals(server, "deny", "--state-dir", str(server.queue), "--reason", why, "--by", "alice", call_id)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"denied {call_id} as alice"), out.stdout
        (result,) = wait_for("the agent's answer", lambda: got)[0]
        error = envelope(result)["error"]
        assert error["code"] == "APPROVAL_DENIED" and why in error["message"], error
        approval = next(r for r in audit_records(server.audit) if r["event"] == "approval")
        assert approval["data"]["reason"] == why and approval["data"]["by"] == "alice"
        # and the reviewer reads it without --json
        shown = gateway_cmd("audit", "show", call_id, "--audit-dir", str(server.audit),
                            env=env_without_state(tmp_path)).stdout  # fmt: skip
        assert "rm victim" in shown and f"by alice (queue): {why}" in shown, shown
        assert (ws / "victim").exists()
    finally:
        server.stop()


def test_approve_takes_its_options_before_the_id(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    out = gateway_cmd("approvals", "approve", "--state-dir", str(queue), "0123abcd", check=False,
                      env=env_without_state(tmp_path))  # fmt: skip
    assert out.returncode == 2 and "no pending request 0123abcd" in out.stderr, out.stderr


def test_a_rejected_policy_edit_is_printed_with_its_line(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    server = HttpGateway(tmp_path, policy_file, ws)
    try:
        broken = yaml.safe_dump(POLICY, sort_keys=False).replace("decision: deny", "decision: dny")
        policy_file.write_text(broken)
        line_no = next(n for n, x in enumerate(broken.splitlines(), 1) if "decision: dny" in x)
        said = wait_for("the rejection on the terminal", lambda: [x for x in server.stderr.read_text().splitlines()
                                                                  if "policy edit rejected" in x])  # fmt: skip
        assert f"{policy_file}:{line_no}:" in said[0] and "dny" in said[0], said
        assert any(r["event"] == "policy_rejected" for r in audit_records(server.audit))
    finally:
        server.stop()


def test_an_unwritable_audit_log_is_printed(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    server = HttpGateway(tmp_path, policy_file, ws)
    try:
        token = server.token("agent")
        (log,) = sorted(server.audit.glob("audit-*.jsonl"))
        with log.open("a") as f:
            f.write('{"forged": 1}\n')  # a record nobody signed: the writer will not extend the log
        (out,) = asyncio.run(call_http(server.url, token, "auto", ("run", {"command": "echo x"})))
        assert envelope(out)["error"]["code"] == "AUDIT_UNAVAILABLE"
        said = wait_for("the notice", lambda: [x for x in server.stderr.read_text().splitlines()
                                               if "the audit log cannot be written" in x])  # fmt: skip
        assert "every call is denied" in said[0]
    finally:
        server.stop()


# --- orphaned requests ---------------------------------------------------------------------------
def stdio_server(tmp_path: Path, policy_file: Path, ws: Path, grace: str = "30") -> subprocess.Popen[bytes]:
    argv = [GATEWAY, "serve", "--stdio", "--principal", "agent", "--policy", str(policy_file), "--workspace", str(ws)]
    argv += ["--audit-dir", str(tmp_path / "audit"), "--state-dir", str(tmp_path / "approvals")]
    argv += ["--process-dir", str(tmp_path / "state"), "--grace", grace, "--pending-after", "600"]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env_without_state(tmp_path))  # fmt: skip


def send(proc: subprocess.Popen[bytes], *messages: dict[str, Any]) -> None:
    assert proc.stdin is not None
    for m in messages:
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", **m}) + "\n").encode())
    proc.stdin.flush()


def ask_over_stdio(proc: subprocess.Popen[bytes], command: str) -> None:
    """A legacy-era client: initialize, then a call the policy asks a supervisor about."""
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    send(proc, {"id": 1, "method": "initialize", "params": hello}, {"method": "notifications/initialized"},
         {"id": 2, "method": "tools/call", "params": {"name": "run", "arguments": {"command": command}}})  # fmt: skip


def test_a_stdio_client_that_leaves_withdraws_its_waiting_request(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    (ws / "victim").write_text("x")
    proc = stdio_server(tmp_path, policy_file, ws, grace="30")
    try:
        ask_over_stdio(proc, "rm victim")
        (row,) = wait_for("a pending request", lambda: approval_queue.pending(tmp_path / "approvals"))
        assert proc.stdin is not None
        proc.stdin.close()  # the client exits: end of input
        proc.wait(60)
    finally:
        proc.kill()
    assert approval_queue.pending(tmp_path / "approvals") == []
    assert not list((tmp_path / "approvals").glob("*.request.json"))
    records = [r for r in audit_records(tmp_path / "audit") if r.get("call_id") == row["call_id"]]
    assert [r["event"] for r in records] == ["decision", "approval_withdrawn"], records
    assert "end of input" in records[-1]["data"]["why"]
    assert (ws / "victim").exists()
    assert verify(tmp_path / "audit").ok


def test_a_request_of_a_killed_gateway_is_not_approvable_and_recorded_withdrawn(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    (ws / "victim").write_text("x")
    proc = stdio_server(tmp_path, policy_file, ws)
    try:
        ask_over_stdio(proc, "rm victim")
        (row,) = wait_for("a pending request", lambda: approval_queue.pending(tmp_path / "approvals"))
        proc.send_signal(signal.SIGKILL)  # as a client that kills its server before any grace
        proc.wait(60)
    finally:
        proc.kill()
    queue = str(tmp_path / "approvals")
    env = env_without_state(tmp_path)
    listed = gateway_cmd("approvals", "list", "--state-dir", queue, env=env).stdout
    assert row["call_id"] not in listed and "no pending approvals" in listed
    out = gateway_cmd("approvals", "approve", row["call_id"], "--state-dir", queue, check=False, env=env)
    assert out.returncode == 2 and "withdrawn" in out.stderr and "nothing would run" in out.stderr, out.stderr
    # the next gateway on this queue and log records why, and clears it
    again = stdio_server(tmp_path, policy_file, ws)
    assert again.stdin is not None
    again.stdin.close()
    again.wait(60)
    withdrawn = [r for r in audit_records(tmp_path / "audit") if r["event"] == "approval_withdrawn"]
    assert [r["call_id"] for r in withdrawn] == [row["call_id"]]
    assert "ended without withdrawing it" in withdrawn[0]["data"]["why"]
    assert not list((tmp_path / "approvals").glob("*.request.json"))
    assert (ws / "victim").exists()


# --- tokens --------------------------------------------------------------------------------------
def quickstart(tmp_path: Path, policy_file: Path, ws: Path) -> HttpGateway:
    return HttpGateway(tmp_path, policy_file, ws, extra=("--quickstart", "--principal", "agent"))


def test_quickstart_keeps_its_token_across_restarts(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    first = quickstart(tmp_path, policy_file, ws)
    try:
        text = first.stderr.read_text()
        token = next(line.split()[1] for line in text.splitlines() if line.strip().startswith("token:"))
        assert token.startswith("agw_")
    finally:
        first.stop()
    second = quickstart(tmp_path, policy_file, ws)
    try:
        text = second.stderr.read_text()
        assert token not in text  # shown once
        (entry,) = [e for e in json.loads(second.tokens.read_text())["tokens"] if e["label"] == "quickstart"]
        assert f"the quickstart token {entry['id']}" in text and "is still in use" in text
        assert "gateway token create --principal agent" in text
        (ok,) = asyncio.run(call_http(second.url, token, "auto", ("run", {"command": "echo still"})))
        assert envelope(ok)["stdout"] == "still\n"
    finally:
        second.stop()


def test_a_start_that_cannot_listen_changes_no_token_and_records_nothing(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        tokens = tmp_path / "tokens" / "tokens.json"
        argv = ["serve", "--http", f"127.0.0.1:{port}", "--quickstart", "--principal", "agent", "--tokens", str(tokens)]
        argv += ["--policy", str(policy_file), "--workspace", str(ws), "--audit-dir", str(tmp_path / "audit")]
        argv += ["--state-dir", str(tmp_path / "approvals"), "--process-dir", str(tmp_path / "state")]
        out = gateway_cmd(*argv, check=False, env=env_without_state(tmp_path))
    assert out.returncode == 2 and f"127.0.0.1:{port}" in out.stderr, out.stderr
    assert not tokens.exists() or json.loads(tokens.read_text())["tokens"] == []
    events = [r["event"] for r in audit_records(tmp_path / "audit")] if (tmp_path / "audit").exists() else []
    assert "server_started" not in events and "server_stopped" not in events, events


def test_static_tokens_advertise_no_oauth_server(http_gateway: HttpGateway) -> None:
    base = http_gateway.url.removesuffix("/mcp")
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource",
                 "/.well-known/oauth-authorization-server"):  # fmt: skip
        assert httpx2.get(base + path, timeout=30).status_code == 404, path
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": "Bearer agw_wrong", "Accept": "application/json, text/event-stream"}
    refused = httpx2.post(http_gateway.url, json=body, headers=headers, timeout=30)
    assert refused.status_code == 401
    challenge = refused.headers.get("www-authenticate", "")
    assert challenge.startswith("Bearer") and "resource_metadata" not in challenge, challenge


def test_an_approval_is_void_when_the_stored_environment_changes_while_it_waits(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    (ws / "victim").write_text("x")
    gw = make_gateway(policy, tmp_path)
    gw.env.set("agent", "APP_MODE", "test")
    seen: list[ApprovalRequest] = []

    def supervisor(request: ApprovalRequest) -> bool:
        seen.append(request)
        gw.env.set("agent", "APP_MODE", "production")  # another call of the agent, meanwhile
        return True

    gw.approver = CallbackApprover(supervisor, "alice")
    try:
        out = gw.handle(RunCall(principal="agent", command="rm victim"))
    finally:
        close_gateway(gw, tmp_path)
    assert seen[0].inherited == {"APP_MODE": "test"}  # what the supervisor was shown
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_DENIED", out
    assert "stored variables" in out["error"]["message"]
    assert (ws / "victim").exists()
