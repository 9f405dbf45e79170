"""Shared pieces of the upstream tests: a real upstream MCP server (tests/upstream/servers/
fake_upstream.py, the official SDK) run by the gateway in its sandbox over stdio, or by the test
over streamable HTTP; a policy with rules on its tools; gateways built on it."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import approval_queue
from gateway.audit import open_signed, records, verify
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from tests.conftest import PATIENCE_S

SERVERS = Path(__file__).resolve().parent / "servers"
FAKE = SERVERS / "fake_upstream.py"
SITE = sysconfig.get_paths()["purelib"]
"""The SDK the fake server imports: the test's own, read-only in the server's sandbox (the
venv's interpreter lives under /root, which the sandbox's account cannot reach)."""
SYSTEM_PYTHON = "/usr/bin/python3"
TOKEN = "ghp_" + "Zq7" * 10
TICKETS_AUTH = "Bearer tk_" + "9xY" * 10

RULES: list[dict[str, Any]] = [
    {
        "id": "issues-in-our-org",
        "decision": "allow",
        "justification": "issues in our own organisation only, with short titles",
        "tool": "github.create_issue",
        "arguments": [{"at": "/owner", "equals": "our-org"}, {"at": "/title", "max_length": 50}],
        "examples": {
            "match": ['github.create_issue {"owner": "our-org", "title": "x"}'],
            "not_match": ['github.create_issue {"owner": "evil", "title": "x"}'],
        },
    },
    {
        "id": "partner-issues-ask",
        "decision": "ask",
        "justification": "issues in a partner's repositories need a supervisor",
        "tool": "github.create_issue",
        "arguments": [{"at": "/owner", "equals": "partner-org"}],
    },
    {
        "id": "no-passwords-in-titles",
        "decision": "deny",
        "justification": "a title is public: never put a password in it",
        "tool": "*.create_issue",
        "arguments": [{"at": "/title", "regex": "(?i).*passw(or)?d.*"}],
    },
    {
        "id": "read-inside-the-roots",
        "decision": "allow",
        "justification": "files the principal may read",
        "tool": "github.read_file",
        "arguments": [{"at": "/path", "path": "read"}],
    },
    {
        "id": "never-delete-repos",
        "decision": "deny",
        "justification": "repositories are deleted by people, not agents",
        "tool": "github.delete_repo",
    },
    {
        "id": "github-misc",
        "decision": "allow",
        "justification": "harmless",
        "tool": "github.[wsbi]*",
        "min_level": 2,
    },
    {"id": "crashing", "decision": "allow", "justification": "a test", "tool": "github.crash", "min_level": 2},
    {"id": "fetching", "decision": "allow", "justification": "a test", "tool": "github.fetch", "min_level": 2},
    {
        "id": "renamed-issues",
        "decision": "allow",
        "justification": "the policy would allow it: only its pin stands in the way",
        "tool": "github.open_*",
    },
]


def policy_data(control: Path, **upstream: Any) -> dict[str, Any]:
    github: dict[str, Any] = {
        "command": [SYSTEM_PYTHON, str(FAKE), "stdio", "--site", SITE],
        "env_from": ["GH_TOKEN", "FAKE_CONTROL"],
        "read_roots": [SITE, str(SERVERS), str(control), "."],  # ".": the workspace
        "timeout_ms": 5000,
        "connect_timeout_ms": 30000,
        "result_bytes": 65536,
        "injection_flag": True,
    }
    github.update(upstream)
    return {
        "version": 1,
        "workspace": "../ws",
        "principals": {"agent": {"roles": ["dev"]}, "intern": {"roles": ["ro"]}, "outsider": {"roles": ["none"]}},
        "roles": {
            "dev": {"level": 2, "read_roots": ["."], "write_roots": ["."]},
            "ro": {"level": 1, "read_roots": ["."]},
            "none": {"level": 0, "read_roots": ["."]},
        },
        "tools": {"run": {"allow_from": 1}, "upstream": {"allow_from": 2, "ask_from": 1}},
        "upstreams": {"github": github},
        "rules": copy.deepcopy(RULES),
    }


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    hand_over(w)
    return w


@pytest.fixture
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake server's control file (what it lists), in a directory its sandbox may read; and
    the credentials the gateway passes it."""
    d = tmp_path / "control"
    d.mkdir()
    (d / "control.json").write_text("{}")
    monkeypatch.setenv("FAKE_CONTROL", str(d / "control.json"))
    monkeypatch.setenv("GH_TOKEN", TOKEN)
    monkeypatch.setenv("TICKETS_AUTH", TICKETS_AUTH)
    return d


def steer(control: Path, **wanted: Any) -> None:
    (control / "control.json").write_text(json.dumps(wanted))


@pytest.fixture
def policy_file(tmp_path: Path, ws: Path, control: Path) -> Path:
    d = tmp_path / "policies"
    d.mkdir(exist_ok=True)
    f = d / "p.yaml"
    f.write_text(yaml.safe_dump(policy_data(control), sort_keys=False))
    return f


def compiled(data: dict[str, Any], tmp_path: Path, ws: Path) -> CompiledPolicy:
    return compile_policy(Policy.model_validate(data), tmp_path / "policies" / "p.yaml", ws, sha256="test")


def make_gateway(policy: CompiledPolicy, tmp_path: Path) -> Gateway:
    """A gateway as `gateway serve` builds one: a signed log, the approvals queue, a state
    directory (the pins live there)."""
    audit = open_signed(tmp_path / "audit", tmp_path / "keys")
    queue = approval_queue.QueueApprover(tmp_path / "approvals", (policy.workspace,))
    return Gateway(policy, audit, queue, hidden=(tmp_path / "keys",), state_dir=tmp_path / "state")


@pytest.fixture
def gw(tmp_path: Path, ws: Path, control: Path) -> Iterator[Gateway]:
    g = make_gateway(compiled(policy_data(control), tmp_path, ws), tmp_path)
    yield g
    g.close()
    assert verify(tmp_path / "audit").ok


def audit_records(audit_dir: Path) -> list[dict[str, Any]]:
    return [r for _, _, r, _ in records(audit_dir) if r]


def of_call(audit_dir: Path, call_id: str) -> list[dict[str, Any]]:
    return [r for r in audit_records(audit_dir) if r.get("call_id") == call_id]


LISTENING = re.compile(r"listening on (\d+)")


class HttpUpstream:
    """The fake server over streamable HTTP, in its own process (not sandboxed: an HTTP
    upstream is a server somewhere else)."""

    def __init__(self, tmp_path: Path) -> None:
        self.out = tmp_path / "upstream-http.out"
        env = {k: v for k, v in os.environ.items() if k != "GH_TOKEN"} | {"PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(FAKE), "http"], stdout=self.out.open("w"),
                                     stderr=subprocess.STDOUT, env=env)  # fmt: skip
        deadline = time.monotonic() + PATIENCE_S
        while (found := LISTENING.search(self.out.read_text())) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP upstream did not start: {self.out.read_text()}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{found.group(1)}/mcp"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def http_upstream(tmp_path: Path) -> Iterator[HttpUpstream]:
    up = HttpUpstream(tmp_path)
    yield up
    up.stop()


def sandboxes_of(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (a test's own path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found
