"""The official MCP Inspector, a client we did not write, drives `gateway serve`.

Its command-line mode (npm `@modelcontextprotocol/inspector`, pinned below) lists the gateway's tools and calls
`run` over stdio and over streamable HTTP with a bearer token, in both protocol eras it speaks: the legacy
`initialize` handshake (its default, protocol 2025-11-25) and the 2026-07-28 one (`server/discover`). An allowed
command returns its output, a command the policy denies comes back as a tool result with `isError: true`, a wrong
token is refused, and the audit hash chain the calls wrote still verifies.

The package is installed once into a cache outside the repo; without Node.js/npm or the npm registry the tests skip.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.sandbox.identity import hand_over
from tests.conftest import PATIENCE_S
from tests.server.conftest import LISTENING

INSPECTOR_VERSION = "2.12.0"  # checked with Node.js 20.20.2 (the package asks for >= 22.19 but runs on 20)
INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector"
GATEWAY = Path(sys.executable).parent / "gateway"
REPO = Path(__file__).resolve().parents[2]
INSPECTOR_TIMEOUT = 120  # seconds for one Inspector run: connect, one request, exit
TOOL_ERROR_EXIT = 5  # the Inspector CLI's exit code for a tool result with isError: true
AUTH_REQUIRED_EXIT = 3  # ... and for an HTTP 401 it may not answer with an interactive login
ERAS = ["legacy", "modern"]


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agent-gateway" / "inspector"


def _entry_point(prefix: Path) -> Path | None:
    """The Inspector's `mcp-inspector` script inside an npm prefix, or None when it is not installed there."""
    package_dir = prefix / "node_modules" / INSPECTOR_PACKAGE
    try:
        manifest = json.loads((package_dir / "package.json").read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("version") != INSPECTOR_VERSION:
        return None
    bin_field = manifest.get("bin")
    script = bin_field.get("mcp-inspector") if isinstance(bin_field, dict) else None
    entry = package_dir / script if isinstance(script, str) else None
    return entry if entry is not None and entry.is_file() else None


@pytest.fixture(scope="session")
def inspector() -> list[str]:
    """The command that starts the Inspector CLI; installs the pinned package on first use."""
    how = "install Node.js >= 20 with npm (Debian: `apt-get install nodejs npm`) and reach the npm registry"
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(
            f"MCP Inspector tests need `node` and `npm` on PATH, missing: {'node' if node is None else 'npm'}; {how}"
        )
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    major = re.match(r"v(\d+)\.", version)
    if major is None or int(major.group(1)) < 20:
        pytest.skip(f"MCP Inspector {INSPECTOR_VERSION} needs Node.js >= 20, found {version or 'unknown'}; {how}")

    prefix = _cache_root() / INSPECTOR_VERSION
    entry = _entry_point(prefix)
    if entry is None:
        # install beside the final directory, then rename: a half-done install is never mistaken for a good one
        staging = prefix.with_name(f"{INSPECTOR_VERSION}.tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        cmd = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--ignore-scripts"]
        cmd += ["--loglevel=error", "--fetch-retries=2", f"{INSPECTOR_PACKAGE}@{INSPECTOR_VERSION}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            shutil.rmtree(staging, ignore_errors=True)
            pytest.skip(f"`npm install {INSPECTOR_PACKAGE}@{INSPECTOR_VERSION}` took over 600 s; {how}")
        if proc.returncode != 0 or _entry_point(staging) is None:
            shutil.rmtree(staging, ignore_errors=True)
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[:4])
            what = f"{INSPECTOR_PACKAGE}@{INSPECTOR_VERSION}"
            pytest.skip(f"could not install {what} (npm exit {proc.returncode}); {how}:\n{tail}")
        try:
            staging.rename(prefix)
        except OSError:  # another run installed it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
        entry = _entry_point(prefix)
        assert entry is not None, f"{INSPECTOR_PACKAGE} installed but its entry point is missing under {prefix}"
    return [node, str(entry), "--cli"]


@dataclass
class Gateway:
    policy: Path
    workspace: Path
    audit: Path
    home: Path  # HOME for the Inspector, which keeps state under ~/.mcp-inspector

    def files(self) -> list[str]:
        return ["--policy", str(self.policy), "--workspace", str(self.workspace), *self.audit_args()]

    def audit_args(self) -> list[str]:
        return ["--audit-dir", str(self.audit), "--audit-keys", str(self.audit.parent / "audit-keys")]

    def verify_audit(self) -> None:
        proc = subprocess.run(
            [str(GATEWAY), "audit", "verify", *self.audit_args()],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"audit verify failed:\n{proc.stdout}\n{proc.stderr}"
        counted = re.search(r"(\d+) records?", proc.stdout + proc.stderr)
        assert counted is None or int(counted.group(1)) > 0, f"the calls left no audit records:\n{proc.stdout}"


@pytest.fixture
def gw(tmp_path: Path) -> Gateway:
    policies = tmp_path / "policies"
    policies.mkdir()
    for name in ("default.yaml", "default.tests.jsonl"):
        shutil.copy(REPO / "policies" / name, policies / name)
    (tmp_path / "workspace").mkdir()
    hand_over(tmp_path / "workspace")  # sandboxed commands run as the sandbox's account
    (tmp_path / "home").mkdir()
    return Gateway(policies / "default.yaml", tmp_path / "workspace", tmp_path / "audit", tmp_path / "home")


def inspect(inspector: list[str], gw: Gateway, era: str, target: list[str], *request: str) -> tuple[int, Any, str]:
    """Run the Inspector once; returns (exit code, the JSON it printed, its stderr)."""
    cmd = [*inspector, "--format", "json", "--protocol-era", era, *request, *target]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=INSPECTOR_TIMEOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HOME": str(gw.home)},
    )
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        out = None
    return (
        proc.returncode,
        out,
        f"$ {shlex.join(cmd)}\nexit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}",
    )


def texts(result: dict[str, Any]) -> str:
    return "\n".join(block.get("text", "") for block in result.get("content", []) if isinstance(block, dict))


def scenario(inspector: list[str], gw: Gateway, era: str, target: list[str]) -> None:
    code, out, log = inspect(inspector, gw, era, target, "--method", "tools/list")
    assert code == 0 and out is not None, log
    assert "run" in [tool["name"] for tool in out["result"]["tools"]], log

    call = ["--method", "tools/call", "--tool-name", "run", "--tool-arg"]
    code, out, log = inspect(inspector, gw, era, target, *call, "command=echo hi")
    assert code == 0 and out is not None, log
    assert out["result"].get("isError") is not True, log
    assert re.search(r"\bhi\b", texts(out["result"])), log

    code, out, log = inspect(inspector, gw, era, target, *call, "command=curl http://x")
    assert code == TOOL_ERROR_EXIT and out is not None, log  # a tool result saying isError, not a protocol error
    assert out["result"]["isError"] is True, log


@pytest.mark.parametrize("era", ERAS)
def test_inspector_over_stdio(inspector: list[str], gw: Gateway, era: str) -> None:
    # each Inspector run starts its own `gateway serve --stdio`, so the three calls share only the audit log
    # `--` ends the Inspector's options: what follows is the server command, whatever flags it has
    target = ["--", str(GATEWAY), "serve", "--stdio", *gw.files(), "--principal", "agent"]
    scenario(inspector, gw, era, target)
    gw.verify_audit()


@dataclass
class HttpGateway:
    url: str
    token: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


@pytest.fixture
def http_server(gw: Gateway, tmp_path: Path) -> Iterator[HttpGateway]:
    """`gateway serve --http` on a free loopback port, with a bearer token for `agent`."""
    tokens = tmp_path / "tokens.json"
    created = subprocess.run(
        [str(GATEWAY), "token", "create", "--principal", "agent", "--tokens", str(tokens), "--policy", str(gw.policy)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0 and created.stdout.strip(), (
        f"token create failed:\n{created.stdout}\n{created.stderr}"
    )
    token = created.stdout.strip().splitlines()[-1].strip()

    log = tmp_path / "serve.stderr"
    with log.open("w") as err:  # port 0: the server binds a free one and names it (no port picked here to lose)
        proc = subprocess.Popen(
            [str(GATEWAY), "serve", "--http", "127.0.0.1:0", "--tokens", str(tokens), *gw.files()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = HttpGateway("", token, proc, log)
    try:
        deadline = time.monotonic() + PATIENCE_S
        while (listening := LISTENING.search(log.read_text())) is None:
            assert proc.poll() is None, f"gateway serve --http exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"gateway serve --http not ready:\n{log.read_text()}"
            time.sleep(0.1)
        server.url = f"http://127.0.0.1:{listening.group(1)}/mcp"
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("era", ERAS)
def test_inspector_over_streamable_http(inspector: list[str], gw: Gateway, http_server: HttpGateway, era: str) -> None:
    # --stored-auth-only: on a 401 the Inspector fails (exit 3) instead of starting an interactive OAuth login
    target = ["--transport", "http", "--server-url", http_server.url, "--stored-auth-only"]
    scenario(inspector, gw, era, [*target, "--header", f"Authorization: Bearer {http_server.token}"])

    wrong = [*target, "--header", "Authorization: Bearer not-a-token"]
    code, out, log = inspect(inspector, gw, era, wrong, "--method", "tools/list")
    assert code == AUTH_REQUIRED_EXIT and not (out or {}).get("result"), log  # a 401, and no tool list leaked

    assert http_server.proc.poll() is None, f"gateway serve --http died:\n{http_server.log.read_text()}"
    http_server.stop()  # the audit chain is checked as the server leaves it
    gw.verify_audit()
