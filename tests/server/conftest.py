"""Shared pieces of the MCP server tests: a policy with three principals and every kind of rule
the server treats differently, gateways built on it, and running the real `gateway` command."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.approval import Approver, DenyAll
from gateway.audit import AuditLog, records, verify
from gateway.calls import ProcessCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from tests.conftest import PATIENCE_S

GATEWAY = str(Path(sys.executable).parent / "gateway")

POLICY: dict[str, Any] = {
    "version": 1,
    "workspace": "../ws",
    "principals": {"agent": {"roles": ["dev"]}, "other": {"roles": ["dev"]}, "reader": {"roles": ["ro"]}},
    "roles": {
        "dev": {"level": 2, "read_roots": ["."], "write_roots": ["."], "limits": {"timeout_ms": 60000}},
        "ro": {"level": 1, "read_roots": ["."]},
    },
    "tools": {
        "run": {"allow_from": 1},
        "session": {"allow_from": 2},
        "files": {"allow_from": 1},
        "processes": {"allow_from": 2},
        "env": {"allow_from": 2},
        "ask_user": {"allow_from": 2},
    },
    "environment": {"allow": ["APP_*"]},
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [
        {
            "id": "basics",
            "decision": "allow",
            "justification": "harmless programs",
            "programs": ["echo", "printf", "cat", "sleep", "true", "false", "pwd"],
            "accept_unknown": True,
            "examples": {"match": ["echo x"]},
        },
        {
            "id": "touch-by-client",
            "decision": "ask",
            "approval": "client",
            "justification": "creating files is low risk: the agent's user may approve it",
            "programs": ["touch"],
            "path_args": {"write": "all"},
            "examples": {"match": ["touch x"]},
        },
        {
            "id": "touch-deploy-by-supervisor",
            "decision": "ask",
            "justification": "deploy markers need a supervisor",
            "programs": ["touch"],
            "args": ["DEPLOY.*"],
            "path_args": {"write": "all"},
            "examples": {"match": ["touch DEPLOY1"], "not_match": ["touch x"]},
        },
        {
            "id": "rm-by-supervisor",
            "decision": "ask",
            "justification": "deleting needs a supervisor",
            "programs": ["rm"],
            "path_args": {"write": "all"},
            "examples": {"match": ["rm x"]},
        },
        {
            "id": "no-curl",
            "decision": "deny",
            "justification": "no network: use the files tool to read docs in the workspace",
            "programs": ["curl"],
            "examples": {"match": ["curl x"]},
        },
    ],
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    hand_over(w)  # sandboxed commands run as the sandbox's account (docs/sandbox.md)
    return w


@pytest.fixture
def policy(ws: Path) -> CompiledPolicy:
    return compile_policy(Policy.model_validate(POLICY), ws.parent / "policies" / "p.yaml", ws, sha256="test")


@pytest.fixture
def policy_file(tmp_path: Path, ws: Path) -> Path:
    d = tmp_path / "policies"
    d.mkdir(exist_ok=True)
    f = d / "p.yaml"
    f.write_text(yaml.safe_dump(POLICY, sort_keys=False))
    return f


def make_gateway(policy: CompiledPolicy, tmp_path: Path, approver: Approver | None = None) -> Gateway:
    return Gateway(policy, AuditLog(tmp_path / "audit"), approver or DenyAll(), state_dir=tmp_path / "state")


def close_gateway(gw: Gateway, tmp_path: Path) -> None:
    for who in ("agent", "other"):
        gw.handle(ProcessCall(principal=who, action="stop_all"))
    gw.close()
    assert verify(tmp_path / "audit").ok


def envelope_of(result: Any) -> dict[str, Any]:
    """The gateway's envelope in an MCP tool result (the SDK's `CallToolResult`, or the raw
    JSON-RPC `result` object): sent once, as the JSON after the text block's summary line."""
    content = result.get("content") if isinstance(result, dict) else result.content
    first = content[0]
    text = first["text"] if isinstance(first, dict) else first.text
    _summary, _, body = text.partition("\n")
    found: dict[str, Any] = json.loads(body)
    return found


def audit_records(audit_dir: Path) -> list[dict[str, Any]]:
    return [r for _, _, r, _ in records(audit_dir) if r]


@pytest.fixture(params=["auto", "legacy"])
def era(request: pytest.FixtureRequest) -> str:
    """Both protocol eras: 2026-07-28 (what clients pick by default) and the initialize handshake."""
    mode: str = request.param
    return mode


def gateway_cmd(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY, *args], capture_output=True, text=True, timeout=60, check=check, env=env)


LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)/mcp")


class HttpGateway:
    """A real `gateway serve --http` on a loopback port, stopped (SIGTERM) by the fixture. The
    server binds port 0 and says which port it got: a port picked here and bound by the server
    later could be taken meanwhile (another test's server, or a client's outgoing connection,
    on a shared machine)."""

    def __init__(
        self, tmp_path: Path, policy_file: Path, ws: Path, extra: tuple[str, ...] = (), nofile: int | None = None
    ) -> None:
        self.tmp = tmp_path
        self.tokens = tmp_path / "tokens" / "tokens.json"
        self.audit = tmp_path / "audit"
        self.queue = tmp_path / "approvals"
        self.policy_file = policy_file
        self.stderr = tmp_path / "serve.err"
        argv = [GATEWAY, "serve", "--http", "127.0.0.1:0", "--tokens", str(self.tokens)]
        argv += ["--policy", str(policy_file), "--workspace", str(ws), "--audit-dir", str(self.audit)]
        argv += ["--state-dir", str(self.queue), "--process-dir", str(tmp_path / "processes"), *extra]
        if nofile is not None:  # the server's soft descriptor limit (prlimit execs the gateway: same pid)
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            keep = "unlimited" if hard == resource.RLIM_INFINITY else hard  # sandboxes set their own
            argv = ["prlimit", f"--nofile={nofile}:{keep}", "--", *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.stderr.open("w"))
        deadline = time.monotonic() + PATIENCE_S
        while (listening := LISTENING.search(self.stderr.read_text())) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway serve did not start: {self.stderr.read_text()}")
            time.sleep(0.1)
        self.port = int(listening.group(1))
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def token(self, principal: str) -> str:
        out = gateway_cmd("token", "create", "--principal", principal, "--tokens", str(self.tokens),
                          "--policy", str(self.policy_file))  # fmt: skip
        return out.stdout.strip().splitlines()[-1]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture
def http_gateway(tmp_path: Path, policy_file: Path, ws: Path) -> Iterator[HttpGateway]:
    server = HttpGateway(tmp_path, policy_file, ws)
    try:
        yield server
    finally:
        server.stop()
        assert verify(server.audit).ok


def env_without_state(tmp_path: Path) -> dict[str, str]:
    """The environment for CLI runs: state under tmp_path, never the user's."""
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg-state")}
