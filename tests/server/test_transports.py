"""`gateway serve` as people run it: a real subprocess over stdio, a real HTTP server on a
loopback port with bearer tokens, and the command line around them (tokens, quickstart, bind
checks, shutdown). The SDK's own client talks to it in both protocol eras."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from gateway import approval_queue, tokens
from gateway.audit import verify
from tests.conftest import eventually
from tests.server.conftest import (
    GATEWAY,
    HttpGateway,
    audit_records,
    env_without_state,
    envelope_of,
    gateway_cmd,
)


def envelope(r: CallToolResult) -> dict[str, Any]:
    return envelope_of(r)


def stdio_params(tmp_path: Path, policy_file: Path, ws: Path, principal: str = "agent") -> StdioServerParameters:
    args = ["serve", "--stdio", "--principal", principal, "--policy", str(policy_file), "--workspace", str(ws)]
    args += ["--audit-dir", str(tmp_path / "audit"), "--state-dir", str(tmp_path / "approvals")]
    args += ["--process-dir", str(tmp_path / "state")]
    return StdioServerParameters(command=GATEWAY, args=args, env=env_without_state(tmp_path))


# --- stdio ----------------------------------------------------------------------------------------
def test_stdio_lists_allows_and_denies(tmp_path: Path, policy_file: Path, ws: Path, era: str) -> None:
    async def scenario() -> tuple[set[str], CallToolResult, CallToolResult]:
        async with Client(stdio_params(tmp_path, policy_file, ws), mode=era) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            return (
                names,
                await c.call_tool("run", {"command": "echo hi"}),
                await c.call_tool("run", {"command": "curl x"}),
            )

    names, ok, denied = asyncio.run(scenario())
    assert {"run", "session", "files", "process", "env", "ask_user", "await_call"} <= names
    assert envelope(ok)["stdout"] == "hi\n" and not ok.is_error
    assert denied.is_error and envelope(denied)["rule"] == "no-curl"
    events = [r["event"] for r in audit_records(tmp_path / "audit")]
    # a new signed log opens with its key's pin (`audit_key`), then the policy that decides
    assert events[:2] == ["audit_key", "policy_loaded"] and "server_started" in events
    assert events[-1] == "server_stopped"
    assert verify(tmp_path / "audit").ok


def test_stdio_runs_as_the_principal_on_its_command_line(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    async def scenario() -> set[str]:
        async with Client(stdio_params(tmp_path, policy_file, ws, principal="reader")) as c:
            return {t.name for t in (await c.list_tools()).tools}

    assert asyncio.run(scenario()) == {"run", "files", "format_output", "await_call"}
    where = ["--policy", str(policy_file), "--workspace", str(ws), "--audit-dir", str(tmp_path / "audit")]
    out = gateway_cmd("serve", "--stdio", "--principal", "nobody", *where, check=False, env=env_without_state(tmp_path))
    assert out.returncode == 2 and "no principal 'nobody'" in out.stderr


def test_sigterm_records_the_stop_and_leaves_durable_processes(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    argv = [GATEWAY, *stdio_params(tmp_path, policy_file, ws).args]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env_without_state(tmp_path))  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    def send(msg: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    def reply() -> dict[str, Any]:
        assert proc.stdout is not None
        line: dict[str, Any] = json.loads(proc.stdout.readline())
        return line

    try:  # the legacy handshake by hand: a client that stays connected while the server is stopped
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
              "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})  # fmt: skip
        reply()
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "process",
              "arguments": {"action": "start", "command": "sleep 120"}}})  # fmt: skip
        started = envelope_of(reply()["result"])
        pid = started["process"]["pid"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        os.kill(pid, 0)  # the durable process outlived the server
        stopped = audit_records(tmp_path / "audit")[-1]
        assert stopped["event"] == "server_stopped" and stopped["data"]["how"] == "SIGTERM"
        assert verify(tmp_path / "audit").ok
    finally:
        if proc.poll() is None:
            proc.kill()
        for rec in (tmp_path / "state" / "processes").glob("*/record.json"):
            pid = json.loads(rec.read_text()).get("pid")
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


class StdioByHand:
    """A stdio gateway driven line by line: a client that stays connected while it is stopped."""

    def __init__(self, tmp_path: Path, policy_file: Path, ws: Path, *extra: str) -> None:
        argv = [GATEWAY, *stdio_params(tmp_path, policy_file, ws).args, *extra]
        self.audit = tmp_path / "audit"
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env_without_state(tmp_path))  # fmt: skip
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
                   "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})  # fmt: skip
        self.reply()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the server closed its output without a reply"
        got: dict[str, Any] = json.loads(line)
        return got

    def call(self, id_: int, command: str) -> None:
        self.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": {"name": "run",
                   "arguments": {"command": command, "timeout_ms": 120000}}})  # fmt: skip

    def wait_until_running(self, command: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(r.get("arguments", {}).get("command") == command
                   for r in audit_records(self.audit) if r["event"] == "decision"):  # fmt: skip
                time.sleep(0.3)  # its sandbox starts
                return
            time.sleep(0.05)
        raise AssertionError(f"{command!r} never decided")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def test_sigterm_gives_a_running_call_its_grace_and_its_reply(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    """Before: the stdio task was cancelled at the signal, so a call that finished within the
    grace ran to its end but its reply was never written."""
    server = StdioByHand(tmp_path, policy_file, ws, "--grace", "20")
    try:
        server.call(1, "sleep 2; echo finished")
        server.wait_until_running("sleep 2; echo finished")
        server.proc.send_signal(signal.SIGTERM)
        answer = server.reply()
        assert answer["id"] == 1 and envelope_of(answer["result"])["stdout"] == "finished\n"
        assert server.proc.wait(60) == 0
        stopped = audit_records(server.audit)[-1]
        assert stopped["event"] == "server_stopped" and stopped["data"]["cancelled"] == 0, stopped
    finally:
        server.close()


def test_sigterm_cancels_what_outlives_the_grace_and_counts_it(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    server = StdioByHand(tmp_path, policy_file, ws, "--grace", "1")
    try:
        server.call(1, "sleep 100")
        server.wait_until_running("sleep 100")
        server.proc.send_signal(signal.SIGTERM)
        answer = server.reply()  # the cancelled call is answered too
        assert answer["id"] == 1 and answer["result"]["isError"], answer
        assert server.proc.wait(60) == 0
        stopped = audit_records(server.audit)[-1]
        assert stopped["event"] == "server_stopped" and stopped["data"]["cancelled"] == 1, stopped
    finally:
        server.close()


LONG_WAITS = [
    ("session", {"action": "exec", "command": "sleep 600", "timeout_ms": 3_600_000}),
    ("run", {"command": "sleep 600", "timeout_ms": 60_000, "background_after_ms": 50_000}),  # the policy's cap
]


@pytest.mark.parametrize(("tool", "arguments"), LONG_WAITS, ids=["session-exec", "run-background-after"])
def test_sigterm_ends_a_wait_far_past_the_grace(
    tmp_path: Path, policy_file: Path, ws: Path, tool: str, arguments: dict[str, Any]
) -> None:
    """Attack (red team, issue 12): a session exec waits up to its own timeout_ms (up to a day),
    a run up to its background_after_ms (under the policy's timeout), and both ignored the cancel: on SIGTERM with a
    1 s grace the drain gave up on the call after 10 s more (`unfinished`: 1), its reply was
    never written and shutdown waited 10 s again; a client that left held its call slot as
    long. Now the wait ends at the cancel (the command runs on: in its session, or durable)."""
    server = StdioByHand(tmp_path, policy_file, ws, "--grace", "1")
    try:
        if tool == "session":
            server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "session", "arguments": {"action": "start"}}})  # fmt: skip
            arguments = {**arguments, "session_id": envelope_of(server.reply()["result"])["session_id"]}
        call = {"name": tool, "arguments": arguments}
        server.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        server.wait_until_running("sleep 600")
        server.proc.send_signal(signal.SIGTERM)
        answer = server.reply()  # the cancelled call is answered
        assert answer["id"] == 2, answer
        result = envelope_of(answer["result"])
        assert result.get("error", {}).get("code") == "CALL_CANCELLED" or result.get("backgrounded"), answer
        assert server.proc.wait(60) == 0
        stopped = audit_records(server.audit)[-1]
        assert stopped["event"] == "server_stopped", stopped
        assert stopped["data"]["cancelled"] == 1 and stopped["data"]["unfinished"] == 0, stopped
    finally:
        server.close()
        for rec in (tmp_path / "state").glob("*/record.json"):
            if pid := json.loads(rec.read_text()).get("pid"):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


class StdioOnATerminal(StdioByHand):
    """A stdio gateway whose supervisor is its controlling terminal (`--approver tty`), a pty
    nobody answers."""

    def __init__(self, tmp_path: Path, policy_file: Path, ws: Path, *extra: str) -> None:
        self.master, slave = os.openpty()
        name = os.ttyname(slave)
        os.close(slave)
        real_popen = subprocess.Popen

        def popen(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
            # a session of its own, whose first terminal opened becomes its controlling one
            return real_popen(argv, start_new_session=True, preexec_fn=lambda: os.close(os.open(name, os.O_RDWR)), **kw)

        subprocess.Popen = popen  # type: ignore[assignment,misc]
        try:
            super().__init__(tmp_path, policy_file, ws, "--approver", "tty", *extra)
        finally:
            subprocess.Popen = real_popen  # type: ignore[misc]

    def close(self) -> None:
        super().close()
        os.close(self.master)


def test_sigterm_ends_approvals_waiting_at_the_terminal(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    """Attack (red team, issue 12): with `--approver tty`, a call waiting for the supervisor (and
    the next one, queued for the terminal without any deadline) ignored the cancel: on SIGTERM
    with a 1 s grace their replies were lost, `unfinished` was 2, and exit took 20 s more. Now
    both stop waiting at the cancel (CALL_CANCELLED) and nothing they asked for runs."""
    server = StdioOnATerminal(tmp_path, policy_file, ws, "--grace", "1", "--pending-after", "600",
                              "--approval-timeout", "600")  # fmt: skip
    try:
        for id_, name in ((1, "DEPLOY1"), (2, "DEPLOY2")):
            server.send({"jsonrpc": "2.0", "id": id_, "method": "tools/call",
                         "params": {"name": "run", "arguments": {"command": f"touch {name}"}}})  # fmt: skip
        for name in ("DEPLOY1", "DEPLOY2"):
            server.wait_until_running(f"touch {name}")
        server.proc.send_signal(signal.SIGTERM)
        answers = [server.reply(), server.reply()]
        assert sorted(a["id"] for a in answers) == [1, 2], answers
        assert all(envelope_of(a["result"])["error"]["code"] == "CALL_CANCELLED" for a in answers), answers
        assert server.proc.wait(60) == 0
        stopped = audit_records(server.audit)[-1]
        assert stopped["event"] == "server_stopped", stopped
        # withdrawn at once (they wait for a supervisor), not cancelled when the grace runs out
        assert (stopped["data"]["withdrawn"], stopped["data"]["unfinished"]) == (2, 0), stopped
        assert not (ws / "DEPLOY1").exists() and not (ws / "DEPLOY2").exists()
    finally:
        server.close()


# --- HTTP -----------------------------------------------------------------------------------------
async def call_http(url: str, token: str, era: str, *calls: tuple[str, dict[str, Any]]) -> list[CallToolResult]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=60) as h,
        Client(streamable_http_client(url, http_client=h), mode=era) as c,
    ):
        return [await c.call_tool(name, args) for name, args in calls]


GRACE_CASES = [("20", "sleep 2; echo finished", 0), ("1", "sleep 100", 1)]


@pytest.mark.parametrize(("grace", "command", "cancelled"), GRACE_CASES)
def test_http_sigterm_gives_calls_their_grace_and_counts_what_it_cancels(
    tmp_path: Path, policy_file: Path, ws: Path, grace: str, command: str, cancelled: int
) -> None:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--grace", grace))
    token = server.token("agent")
    got: list[Any] = []

    def client() -> None:
        try:
            got.append(asyncio.run(call_http(server.url, token, "legacy", ("run", {"command": command}))))
        except BaseException as exc:  # what the client saw, asserted below
            got.append(exc)

    caller = threading.Thread(target=client)
    caller.start()
    try:
        StdioByHand.wait_until_running(server, command)  # type: ignore[arg-type]
        assert server.stop() == 0
        caller.join(60)
    finally:
        server.stop(signal.SIGKILL)
    stopped = audit_records(server.audit)[-1]
    assert stopped["event"] == "server_stopped" and stopped["data"]["cancelled"] == cancelled, stopped
    if cancelled == 0:
        assert isinstance(got[0], list) and envelope(got[0][0])["stdout"] == "finished\n", got
    assert verify(server.audit).ok


def test_http_allows_denies_and_refuses_wrong_tokens(http_gateway: HttpGateway, era: str) -> None:
    token = http_gateway.token("agent")
    ok, denied = asyncio.run(
        call_http(http_gateway.url, token, era, ("run", {"command": "echo hi"}), ("run", {"command": "curl x"}))
    )
    assert envelope(ok)["stdout"] == "hi\n" and denied.is_error and envelope(denied)["rule"] == "no-curl"
    for bad in ("agw_not-a-token", ""):
        with pytest.raises(BaseException):  # noqa: B017 (the SDK raises its own group of HTTP errors)
            asyncio.run(call_http(http_gateway.url, bad, era, ("run", {"command": "echo never"})))

    # refusals are written by the front's own thread, soon after the 401 (not before it)
    def refusals() -> list[dict[str, Any]]:
        return [r for r in audit_records(http_gateway.audit) if r["event"] == "auth_refused"]

    assert eventually(lambda: len(refusals()) >= 2), refusals()
    refused = refusals()
    assert {r["data"]["presented"] for r in refused} == {"unknown bearer", "none"}
    assert all(r["data"]["status"] == 401 for r in refused)
    assert "never" not in json.dumps(audit_records(http_gateway.audit))  # nothing ran for them
    assert token not in http_gateway.tokens.read_text() and token not in (http_gateway.audit / "").as_posix()


def test_http_tokens_map_to_principals_that_stay_apart(http_gateway: HttpGateway, era: str) -> None:
    a, b = http_gateway.token("agent"), http_gateway.token("other")
    (set_a,) = asyncio.run(
        call_http(http_gateway.url, a, era, ("env", {"action": "set", "name": "APP_OWNER", "value": "a"}))
    )
    (got_b,) = asyncio.run(call_http(http_gateway.url, b, era, ("env", {"action": "get", "name": "APP_OWNER"})))
    (got_a,) = asyncio.run(call_http(http_gateway.url, a, era, ("env", {"action": "get", "name": "APP_OWNER"})))
    assert envelope(set_a)["status"] == "ok" and envelope(got_a)["value"] == "a"
    assert envelope(got_b)["error"]["code"] == "ENV_NOT_SET"
    principals = {r.get("principal") for r in audit_records(http_gateway.audit) if r["event"] == "decision"}
    assert principals == {"agent", "other"}


def test_http_ask_approved_by_a_supervisor_on_the_command_line(
    http_gateway: HttpGateway, era: str, ws: Path, tmp_path: Path
) -> None:
    (ws / "victim").write_text("x")
    token = http_gateway.token("agent")

    def supervisor() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = approval_queue.pending(http_gateway.queue)
            if rows:
                gateway_cmd("approvals", "approve", rows[0]["call_id"], "--state-dir", str(http_gateway.queue),
                            "--by", "alice")  # fmt: skip
                return
            time.sleep(0.1)

    t = threading.Thread(target=supervisor, daemon=True)
    t.start()
    (first,) = asyncio.run(call_http(http_gateway.url, token, era, ("run", {"command": "rm victim"})))
    out = envelope(first)
    if out["status"] == "pending":  # the supervisor took longer than the server waits: poll
        (done,) = asyncio.run(
            call_http(http_gateway.url, token, era, ("await_call", {"call_id": out["call_id"], "wait_ms": 60_000}))
        )
        out = envelope(done)
    t.join(5)
    assert out["status"] == "ok" and not (ws / "victim").exists()
    approval = [r for r in audit_records(http_gateway.audit) if r["event"] == "approval"][-1]
    assert approval["data"]["by"] == "alice" and approval["decision"] == "allow"


def test_http_fifty_concurrent_calls(http_gateway: HttpGateway) -> None:
    token = http_gateway.token("agent")

    async def scenario() -> list[CallToolResult]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as h:

            async def one(i: int) -> CallToolResult:
                async with Client(streamable_http_client(http_gateway.url, http_client=h)) as c:
                    return await c.call_tool("run", {"command": f"sleep 1; echo {i}"})

            return list(await asyncio.gather(*(one(i) for i in range(50))))

    results = asyncio.run(scenario())
    assert sorted(envelope(r)["stdout"] for r in results) == sorted(f"{i}\n" for i in range(50))
    assert verify(http_gateway.audit).ok


def test_revoked_token_and_dropped_principal_are_refused(
    tmp_path: Path, policy_file: Path, ws: Path, http_gateway: HttpGateway
) -> None:
    token = http_gateway.token("agent")
    (entry,) = tokens.load(http_gateway.tokens)
    gateway_cmd("token", "revoke", entry.id, "--tokens", str(http_gateway.tokens))
    with pytest.raises(BaseException):  # noqa: B017
        asyncio.run(call_http(http_gateway.url, token, "auto", ("run", {"command": "echo x"})))
    mode = http_gateway.tokens.stat().st_mode & 0o777
    assert mode == 0o600


def test_tokens_are_hashed_and_need_a_known_principal(tmp_path: Path, policy_file: Path) -> None:
    path = tmp_path / "t" / "tokens.json"
    out = gateway_cmd("token", "create", "--principal", "ghost", "--tokens", str(path), "--policy", str(policy_file),
                      check=False)  # fmt: skip
    assert out.returncode == 2 and "no principal 'ghost'" in out.stderr
    out = gateway_cmd("token", "create", "--principal", "agent", "--tokens", str(path), "--policy", str(policy_file))
    token = out.stdout.strip()
    assert token.startswith("agw_") and token not in path.read_text()
    assert tokens.TokenStore(path).lookup(token) is not None and tokens.TokenStore(path).lookup(token + "x") is None
    listed = gateway_cmd("token", "list", "--tokens", str(path)).stdout
    assert "agent" in listed and token not in listed


def test_port_0_is_a_free_port_the_server_names(http_gateway: HttpGateway, era: str) -> None:
    """`--http 127.0.0.1:0` listens on a port the kernel picks, and the listening line, the
    server_started record and the client see that port (before, 0 was refused: tests picked a
    free port and the server bound it later, and another process could take it meanwhile)."""
    assert http_gateway.port != 0 and http_gateway.url == f"http://127.0.0.1:{http_gateway.port}/mcp"
    started = [r for r in audit_records(http_gateway.audit) if r["event"] == "server_started"]
    assert started and started[-1]["data"]["port"] == http_gateway.port, started
    (out,) = asyncio.run(call_http(http_gateway.url, http_gateway.token("agent"), era, ("run", {"command": "echo hi"})))
    assert envelope(out)["stdout"] == "hi\n"


def test_binding_beyond_loopback_needs_a_flag(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    out = gateway_cmd("serve", "--http", "0.0.0.0:0", "--policy", str(policy_file), "--workspace",
                      str(ws), "--audit-dir", str(tmp_path / "audit"), "--tokens", str(tmp_path / "t.json"),
                      check=False, env=env_without_state(tmp_path))  # fmt: skip
    assert out.returncode == 2 and "--allow-remote" in out.stderr


def test_quickstart_creates_dirs_and_prints_how_to_connect(tmp_path: Path, policy_file: Path) -> None:
    ws = tmp_path / "ws"
    if ws.exists():
        ws.rmdir()
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--quickstart", "--principal", "agent"))
    try:
        text = server.stderr.read_text()
        token = next(line.split()[1] for line in text.splitlines() if line.strip().startswith("token:"))
        assert server.url in text and '"mcpServers"' in text
        # a line per client with what leaves it only the gateway's tools (docs/serve.md, test_clients.py)
        assert 'claude --tools "" --strict-mcp-config --allowedTools mcp__agent-gateway' in text
        assert "--mcp-config '" in text
        assert "shell_tool = false" in text and "required = true" in text and f"export AGW_TOKEN={token}" in text
        assert ws.is_dir() and server.audit.is_dir()
        (ok,) = asyncio.run(call_http(server.url, token, "auto", ("run", {"command": "echo quick"})))
        assert envelope(ok)["stdout"] == "quick\n"
    finally:
        server.stop()
    assert verify(server.audit).ok


def test_host_header_from_elsewhere_is_refused(http_gateway: HttpGateway) -> None:
    token = http_gateway.token("agent")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {
        "Authorization": f"Bearer {token}",
        "Host": "evil.example",
        "Accept": "application/json, text/event-stream",
    }
    r = httpx2.post(http_gateway.url, json=body, headers=headers, timeout=30)
    assert r.status_code in (400, 403, 421)
