"""The gateway as the only path: the real Codex CLI and Claude Code, configured as docs/serve.md
says, offer their model no tool that reaches the machine around the gateway.

Each client runs offline against a scripted model on 127.0.0.1 (`ScriptedModel`): the OpenAI
Responses API for Codex, the Anthropic Messages API for Claude Code, both streamed as server-sent
events, as the clients require. The model's replies are scripted; every request the client makes
is kept, so the test reads the tools the client offered the model. The configuration is read
from docs/serve.md's blocks (marked `<!-- clients-test: NAME -->`), so the docs and the test
cannot drift apart; only the gateway's own arguments (policy, workspace, audit directory) are the
test's. The same clients run without that configuration keep their own shell and file tools:
that is the old README's setup, and the assertion the documented one passes fails on it.

The clients are installed by `make clients` (pinned below and in the Makefile) into
`.cache/clients`, or `$AGW_CLIENTS_DIR`. A missing install fails the test, it never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import records, verify
from gateway.sandbox.identity import hand_over
from tests.server.conftest import GATEWAY
from tests.server.test_profile_shell_plugin import PNG

REPO = Path(__file__).resolve().parents[2]
SERVE_DOC = REPO / "docs" / "serve.md"
CODEX_VERSION = "0.169.0"
CLAUDE_VERSION = "2.1.332"
CLIENT_TIMEOUT = 180  # seconds for one client run: start, gateway start, a few model turns, exit
GATEWAY_TOOLS = {"run", "session", "files", "process", "env", "ask_user", "format_output", "await_call"}
# Codex 0.169 tools the documented configuration leaves, each accounted for in docs/serve.md:
# the four reach only the configured MCP servers (the gateway), apply_patch is refused by the
# read-only sandbox (checked below). view_image (any image Codex's user can read) is turned off.
CODEX_LEFT = {"tool_search", "list_mcp_resources", "list_mcp_resource_templates", "read_mcp_resource"}
CODEX_LEFT |= {"apply_patch"}
CLAUDE_LEFT = {"DeferredToolPlaceholder"}  # "reserved placeholder ... never call this tool"


def clients_dir() -> Path:
    return Path(os.environ.get("AGW_CLIENTS_DIR") or REPO / ".cache" / "clients")


def installed(package: str, version: str, binary: str) -> Path:
    """The client's entry point, which must be the pinned version: `make clients` installs it."""
    root = clients_dir()
    manifest = root / "node_modules" / package / "package.json"
    try:
        found = json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):
        found = None
    entry = root / "node_modules" / ".bin" / binary
    if found != version or not entry.exists():
        pytest.fail(
            f"{package}@{version} is not installed under {root} (found {found or 'nothing'}): run `make clients` "
            f"(npm install into {root}), or set AGW_CLIENTS_DIR to a directory where it is installed"
        )
    return entry


def doc_block(name: str) -> str:
    """The fenced block after `<!-- clients-test: NAME -->` in docs/serve.md."""
    match = re.search(rf"<!-- clients-test: {re.escape(name)} -->\n```[a-z]*\n(.*?)```", SERVE_DOC.read_text(), re.S)
    assert match, f"docs/serve.md has no block marked <!-- clients-test: {name} -->"
    return match.group(1)


# --- the scripted model --------------------------------------------------------------------


@dataclass
class ScriptedModel:
    """A model API on 127.0.0.1 that answers each turn with the next scripted reply and keeps
    every request. `kind` is `openai` (Responses API) or `anthropic` (Messages API)."""

    kind: str
    script: list[list[dict[str, Any]]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def turns(self) -> list[dict[str, Any]]:
        """The requests that were model turns (Claude Code also sends a few without tools)."""
        return [r for r in self.requests if "tools" in r]

    def reply(self, body: dict[str, Any]) -> bytes:
        self.requests.append(body)
        turn = len(self.turns()) - 1 if "tools" in body else len(self.script)
        items = self.script[turn] if 0 <= turn < len(self.script) else []
        return self._openai(items) if self.kind == "openai" else self._anthropic(items)

    @staticmethod
    def _event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

    def _openai(self, items: list[dict[str, Any]]) -> bytes:
        n = len(self.requests)
        items = items or [
            {"type": "message", "role": "assistant", "id": f"msg_{n}",
             "content": [{"type": "output_text", "text": "done", "annotations": []}]}
        ]  # fmt: skip
        out = self._event("response.created", {"response": {"id": f"resp_{n}"}})
        for i, item in enumerate(items):
            out += self._event("response.output_item.done", {"output_index": i, "item": item})
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
        return out + self._event("response.completed", {"response": {"id": f"resp_{n}", "usage": usage}})

    def _anthropic(self, blocks: list[dict[str, Any]]) -> bytes:
        blocks = blocks or [{"type": "text", "text": "done"}]
        message = {"id": f"msg_{len(self.requests)}", "type": "message", "role": "assistant", "model": "scripted",
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
        out = self._event("message_start", {"message": message})
        stop = "end_turn"
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                out += self._event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
                out += self._event(
                    "content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": block["text"]}}
                )
            else:
                stop = "tool_use"
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                out += self._event("content_block_start", {"index": i, "content_block": start})
                out += self._event("content_block_delta", {"index": i, "delta": delta})
            out += self._event("content_block_stop", {"index": i})
        out += self._event(
            "message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 1}}
        )
        return out + self._event("message_stop", {})


@pytest.fixture
def model() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(kind: str, script: list[list[dict[str, Any]]]) -> ScriptedModel:
        scripted = ScriptedModel(kind, script)
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # model lists and the like: none here
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if self.path.split("?")[0].endswith("/count_tokens"):
                    answer, kind_ = b'{"input_tokens": 1}', "application/json"
                else:
                    with lock:
                        answer, kind_ = scripted.reply(body), "text/event-stream"
                self.send_response(200)
                self.send_header("Content-Type", kind_)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scripted.server = server
        return scripted

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# --- the gateway the clients spawn -----------------------------------------------------------


@dataclass
class Setup:
    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def audit(self) -> Path:
        return self.root / "audit"

    def gateway_args(self) -> list[str]:
        """`gateway serve --stdio` as docs/serve.md has it, with this test's files."""
        return [
            "serve", "--stdio", "--principal", "agent", "--policy", str(REPO / "policies" / "default.yaml"),
            "--workspace", str(self.workspace), "--audit-dir", str(self.audit),
            "--audit-keys", str(self.root / "audit-keys"), "--process-dir", str(self.root / "state"),
            "--state-dir", str(self.root / "approvals"),
        ]  # fmt: skip

    def audited_commands(self) -> list[str]:
        return [
            str(r.get("arguments", {}).get("command"))
            for _, _, r, _ in records(self.audit)
            if r and r.get("event") == "decision" and r.get("tool") == "run"
        ]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    s = Setup(tmp_path)
    s.workspace.mkdir()
    hand_over(s.workspace)  # sandboxed commands run as the sandbox's account
    (tmp_path / "home").mkdir()
    return s


def run_client(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLIENT_TIMEOUT, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, f"{argv[0]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def tool_names(request: dict[str, Any]) -> set[str]:
    return {str(t.get("name") or t.get("type")) for t in request.get("tools", [])}


# --- Codex -----------------------------------------------------------------------------------


def codex_config(setup: Setup, model_url: str, documented: bool) -> str:
    """config.toml: the scripted model as the provider, then the documented block (or only the
    server block, as the README had it), with this test's gateway arguments."""
    provider = f"""model = "gpt-5.5"
model_provider = "scripted"
[model_providers.scripted]
name = "scripted"
base_url = "{model_url}/v1"
wire_api = "responses"
env_key = "SCRIPTED_MODEL_KEY"
request_max_retries = 0
stream_max_retries = 0
"""
    block = doc_block("codex-config")
    args = "args = " + json.dumps(setup.gateway_args())
    block = re.sub(r"args = \[.*?\]", lambda _: args, block, count=1, flags=re.S)
    block = block.replace("/path/to/agent-gateway/.venv/bin/gateway", GATEWAY)
    if not documented:  # the old README: the server added, nothing else
        block = f'[mcp_servers.agent-gateway]\ncommand = "{GATEWAY}"\n{args}\n'
    top, _, rest = block.partition("\n[")  # root keys must precede the tables
    return f"{top}\n{provider}\n[{rest}" if rest else f"{provider}\n{block}"


def run_codex(setup: Setup, model: ScriptedModel, documented: bool) -> subprocess.CompletedProcess[str]:
    codex = installed("@openai/codex", CODEX_VERSION, "codex")
    home = setup.root / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(codex_config(setup, model.url, documented))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(setup.root / "home"),
        "CODEX_HOME": str(home), "SCRIPTED_MODEL_KEY": "test", "NO_COLOR": "1",
    }  # fmt: skip
    argv = [str(codex), "exec", "--skip-git-repo-check", "--cd", str(setup.workspace), "do the task"]
    return run_client(argv, env, setup.workspace)


def test_codex_documented_config_offers_only_the_gateway(setup: Setup, model: Any) -> None:
    marker = "via-gateway-codex-7d1"
    outside = setup.root / "outside.png"  # an image outside the workspace, which Codex's user can read
    outside.write_bytes(PNG)
    patch = f"*** Begin Patch\n*** Add File: {setup.workspace}/patched.txt\n+around the gateway\n*** End Patch\n"
    script = [
        [{"type": "tool_search_call", "id": "ts_1", "call_id": "call_search", "execution": "client",
          "status": "completed", "arguments": {"query": "run a shell command read files", "limit": 20}}],
        [{"type": "custom_tool_call", "id": "ct_1", "call_id": "call_patch", "name": "apply_patch",
          "input": patch}],
        [{"type": "function_call", "id": "fc_1", "call_id": "call_image", "name": "view_image",
          "arguments": json.dumps({"path": str(outside)})}],
        [{"type": "function_call", "id": "fc_2", "call_id": "call_run", "namespace": "mcp__agent_gateway",
          "name": "run", "arguments": json.dumps({"command": f"echo {marker}"})}],
    ]  # fmt: skip
    scripted = model("openai", script)
    run_codex(setup, scripted, documented=True)

    turns = scripted.turns()
    assert len(turns) == len(script) + 1, f"Codex stopped after {len(turns)} model turns"
    offered = tool_names(turns[0])
    assert offered <= CODEX_LEFT, f"Codex offered tools around the gateway: {sorted(offered - CODEX_LEFT)}"
    assert "exec_command" not in offered and "tool_search" in offered
    # the gateway's tools come through tool_search, and nothing else does
    outputs = {i.get("call_id"): i for i in turns[-1]["input"] if str(i.get("type", "")).endswith("_output")}
    found = outputs["call_search"]["tools"]
    assert [t["name"] for t in found] == ["mcp__agent_gateway"], found
    assert {t["name"] for t in found[0]["tools"]} == GATEWAY_TOOLS
    # Codex's own file tools: the patch is refused and made nothing
    assert "read-only sandbox" in json.dumps(outputs["call_patch"]["output"])
    assert not (setup.workspace / "patched.txt").exists()
    # view_image is off: an image outside the workspace is not read around the gateway (it was)
    assert "view_image" not in offered and "image/png" not in json.dumps(outputs["call_image"]["output"])
    # the gateway's run ran, through the gate, and is on the audit record
    assert marker in json.dumps(outputs["call_run"]["output"]), outputs["call_run"]
    assert f"echo {marker}" in setup.audited_commands()
    assert verify(setup.audit).ok


def test_codex_without_the_documented_config_keeps_its_own_shell(setup: Setup, model: Any) -> None:
    scripted = model("openai", [])
    run_codex(setup, scripted, documented=False)
    offered = tool_names(scripted.turns()[0])
    assert {"exec_command", "write_stdin"} <= offered, offered
    assert not offered <= CODEX_LEFT


# --- Claude Code ------------------------------------------------------------------------------


def run_claude(setup: Setup, model: ScriptedModel, documented: bool) -> subprocess.CompletedProcess[str]:
    claude = installed("@anthropic-ai/claude-code", CLAUDE_VERSION, "claude")
    config = json.loads(doc_block("claude-mcp-json"))
    server = config["mcpServers"]["agent-gateway"]
    server["command"], server["args"] = GATEWAY, setup.gateway_args()
    config_file = setup.root / "agent-gateway.mcp.json"
    config_file.write_text(json.dumps(config))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(setup.root / "home"),
        "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
    }  # fmt: skip
    if documented:
        words = shlex.split(doc_block("claude-command"))
        while "=" in words[0]:  # leading VAR=value words
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        assert words[0] == "claude", words
        flags = [str(config_file) if w == "agent-gateway.mcp.json" else w for w in words[1:]]
    else:  # the old README: the server added, nothing else
        flags = ["--mcp-config", str(config_file)]
    return run_client([str(claude), "-p", "do the task", *flags], env, setup.workspace)


def test_claude_code_documented_config_offers_only_the_gateway(setup: Setup, model: Any) -> None:
    marker = "via-gateway-claude-3f9"
    script = [
        [
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "mcp__agent-gateway__run",
                "input": {"command": f"echo {marker}"},
            }
        ]
    ]
    scripted = model("anthropic", script)
    run_claude(setup, scripted, documented=True)

    turns = scripted.turns()
    assert len(turns) == 2, f"Claude Code made {len(turns)} model turns"
    offered = tool_names(turns[0])
    ours = {f"mcp__agent-gateway__{name}" for name in GATEWAY_TOOLS}
    assert offered - CLAUDE_LEFT == ours, f"not only the gateway's: {sorted(offered - ours)}"
    results = [c for m in turns[1]["messages"] if isinstance(m["content"], list) for c in m["content"]]
    result = next(c for c in results if c.get("type") == "tool_result")
    assert marker in json.dumps(result["content"]) and not result.get("is_error"), result
    assert f"echo {marker}" in setup.audited_commands()
    assert verify(setup.audit).ok


def test_claude_code_without_the_documented_config_keeps_its_own_tools(setup: Setup, model: Any) -> None:
    scripted = model("anthropic", [])
    run_claude(setup, scripted, documented=False)
    offered = tool_names(scripted.turns()[0])
    assert {"Bash", "Read", "Edit", "Write"} <= offered, offered


def test_clients_are_pinned_in_the_makefile() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert f"CODEX_VERSION := {CODEX_VERSION}\n" in makefile and f"CLAUDE_VERSION := {CLAUDE_VERSION}\n" in makefile


# --- hook mode: the clients' own tools, each call decided by `gateway hook` -------------------

HOOKS_DOC = REPO / "docs" / "hooks.md"
SECRET = "users-secret-3c8e"


def hooks_doc_block(name: str) -> str:
    """The fenced block after `<!-- clients-test: NAME -->` in docs/hooks.md."""
    match = re.search(rf"<!-- clients-test: {re.escape(name)} -->\n```[a-z]*\n(.*?)```", HOOKS_DOC.read_text(), re.S)
    assert match, f"docs/hooks.md has no block marked <!-- clients-test: {name} -->"
    return match.group(1)


def hook_options(setup: Setup, *extra: str) -> list[str]:
    """The gateway's hook arguments for this test (docs/hooks.md's, with the test's own files)."""
    return [
        "--policy", str(REPO / "policies" / "default.yaml"), "--workspace", str(setup.workspace),
        "--audit-dir", str(setup.audit), "--audit-keys", str(setup.root / "audit-keys"),
        "--state-dir", str(setup.root / "state"), *extra,
    ]  # fmt: skip


def hook_decisions(setup: Setup) -> list[dict[str, Any]]:
    return [
        r for _, _, r, _ in records(setup.audit) if r and r.get("event") == "decision" and "hook" in r.get("data", {})
    ]


def stop_hook_daemons(setup: Setup) -> None:
    """The resident gateways the hooks started for this test (their socket is in its state dir)."""
    state = str(setup.root / "state").encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"daemon" in argv and any(a.startswith(state) for a in argv):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGTERM)


@pytest.fixture
def hooked(setup: Setup) -> Iterator[Setup]:
    (setup.root / "home" / "secret.txt").write_text(SECRET + "\n")
    yield setup
    stop_hook_daemons(setup)


def codex_hook_config(setup: Setup, model_url: str) -> str:
    provider = f"""model = "gpt-5.5"
model_provider = "scripted"
[model_providers.scripted]
name = "scripted"
base_url = "{model_url}/v1"
wire_api = "responses"
env_key = "SCRIPTED_MODEL_KEY"
request_max_retries = 0
stream_max_retries = 0
"""
    block = hooks_doc_block("codex-hook")
    command = shlex.join([GATEWAY, "hook", "codex", *hook_options(setup)])
    block, n = re.subn(r'^command = ".*"$', lambda _: f"command = {json.dumps(command)}", block, flags=re.M)
    assert n == 1, block
    top, _, tables = block.partition("\n[")  # root keys must precede the tables
    return f"{top}\n{provider}\n[{tables}"


def codex_env(setup: Setup) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(setup.root / "home"),
        "CODEX_HOME": str(setup.root / "codex-home"), "SCRIPTED_MODEL_KEY": "test", "NO_COLOR": "1",
    }  # fmt: skip


def codex_shell(call_id: str, command: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "exec_command",
            "arguments": json.dumps({"cmd": command})}  # fmt: skip


def codex_outputs(scripted: ScriptedModel) -> dict[str, str]:
    """What each shell call gave the model back (the last turn holds them all)."""
    items = scripted.turns()[-1]["input"]
    return {
        str(i.get("call_id")): json.dumps(i.get("output")) for i in items if i.get("type") == "function_call_output"
    }


def gateway_hook_codex(setup: Setup, verb: str) -> subprocess.CompletedProcess[str]:
    codex = installed("@openai/codex", CODEX_VERSION, "codex")
    argv = [GATEWAY, "hook", "codex", verb, "--codex", str(codex), "--cwd", str(setup.workspace)]
    return subprocess.run(argv, env=codex_env(setup), capture_output=True, text=True, timeout=CLIENT_TIMEOUT)


def test_codex_hook_as_documented_is_trusted_checked_and_holds(hooked: Setup, model: Any) -> None:
    """docs/hooks.md's Codex block alone is silently off: `codex exec` skips a hook it does not
    trust, and the agent read what it liked. `gateway hook codex --check` says so; `--trust`
    (Codex's own trust record, written by Codex) turns it on, and then the hook decides every
    shell call and an allowed one runs in the gateway's sandbox."""
    setup = hooked
    subprocess.run(["git", "init", "-q", str(setup.workspace)], check=True, timeout=60)  # a project, as Codex has it
    # writable by both the gateway's sandbox account and Codex's own sandbox (root, unprivileged in
    # its namespace, makes mount points in the workspace): not given to one of them
    setup.workspace.chmod(0o777)
    secret = setup.root / "home" / "secret.txt"
    home = setup.root / "codex-home"
    home.mkdir()
    codex = installed("@openai/codex", CODEX_VERSION, "codex")
    argv = [str(codex), "exec", "--skip-git-repo-check", "--cd", str(setup.workspace), "do the task"]

    untrusted = model("openai", [[codex_shell("call_read", f"cat {secret}")]])
    (home / "config.toml").write_text(codex_hook_config(setup, untrusted.url))
    off = gateway_hook_codex(setup, "--check")
    assert off.returncode == 1 and "not trusted" in off.stdout, off.stdout + off.stderr
    run_client(argv, codex_env(setup), setup.workspace)
    assert SECRET in codex_outputs(untrusted)["call_read"]  # what the documented setup let through
    assert not setup.audit.exists()  # the hook never ran: nothing was decided, nothing recorded

    trusted = gateway_hook_codex(setup, "--trust")
    assert trusted.returncode == 0 and "Codex runs the gateway's hook" in trusted.stdout, trusted.stdout
    assert gateway_hook_codex(setup, "--check").returncode == 0
    script = [[codex_shell("call_read", f"cat {secret}")], [codex_shell("call_run", "id -un; echo made > made.txt")]]
    scripted = model("openai", script)
    config = (home / "config.toml").read_text()  # the trust stays; only the model's address changes
    (home / "config.toml").write_text(config.replace(untrusted.url, scripted.url))
    run_client(argv, codex_env(setup), setup.workspace)
    outputs = codex_outputs(scripted)
    assert SECRET not in outputs["call_read"] and "agent-gateway" in outputs["call_read"], outputs["call_read"]
    assert (setup.workspace / "made.txt").exists(), outputs["call_run"]
    assert (setup.workspace / "made.txt").read_text() == "made\n"
    sandbox_account = pwd.getpwuid((setup.workspace / "made.txt").stat().st_uid).pw_name
    assert sandbox_account in outputs["call_run"]  # it ran as the sandbox's account, in the sandbox
    decided = hook_decisions(setup)
    assert [d["decision"] for d in decided] == ["deny", "allow"], decided
    assert decided[1]["data"]["hook"]["exec"]["sandboxed"] is True
    assert verify(setup.audit).ok


CODEX_SKIPS = {
    "no hook": "Codex finds no agent-gateway PreToolUse hook",
    "disabled": "disabled in Codex's configuration (hooks.state: enabled = false)",
    "matcher": "its matcher '^Bash$' does not match apply_patch: Codex would not ask it",
    "timeout": "timeout 10 s; the gate may take up to 30 s",
    "feature off": "Codex's `hooks` feature is off (features.hooks = false): no hook runs",
}


@pytest.mark.parametrize("how", list(CODEX_SKIPS))
def test_codex_hook_check_names_each_way_codex_would_skip_the_hook(hooked: Setup, how: str) -> None:
    """Trusted or not, a hook Codex will not run (or not for every shell and patch call, or not
    long enough to answer) leaves the agent as free as no hook at all, without a word from
    `codex exec`. `gateway hook codex --check` asks the real Codex and names each such way, with
    what to change, and exits 1; `--trust` fixes only what trust fixes."""
    setup = hooked
    subprocess.run(["git", "init", "-q", str(setup.workspace)], check=True, timeout=60)
    home = setup.root / "codex-home"
    home.mkdir()
    config = codex_hook_config(setup, "http://127.0.0.1:9")  # (no model is asked anything)
    if how == "no hook":
        config = 'model = "gpt-5.5"\n'
    elif how == "matcher":
        config = config.replace('matcher = "^(Bash|apply_patch)$"', 'matcher = "^Bash$"')
    elif how == "timeout":
        config = config.replace("\ntimeout = 60\n", "\ntimeout = 10\n")
    elif how == "feature off":
        config += "\n[features]\nhooks = false\n"
    assert config != codex_hook_config(setup, "http://127.0.0.1:9") or how == "disabled"
    (home / "config.toml").write_text(config)
    trusted = gateway_hook_codex(setup, "--trust")
    if how == "disabled":  # trusted by Codex, then switched off in its own configuration
        assert trusted.returncode == 0, trusted.stdout + trusted.stderr
        text, n = re.subn(r'^(\[hooks\.state\."[^\n]*"\]\n)', r"\1enabled = false\n",
                          (home / "config.toml").read_text(), count=1, flags=re.M)  # fmt: skip
        assert n == 1, text
        (home / "config.toml").write_text(text)
    checked = gateway_hook_codex(setup, "--check")
    out = checked.stdout + checked.stderr
    assert checked.returncode == 1, out
    assert CODEX_SKIPS[how] in out and "Codex will NOT run the gateway's hook as configured" in out, out


def claude_hook_settings(setup: Setup, timeout: int | None = None, *extra: str) -> Path:
    """docs/hooks.md's settings.json for Claude Code, with the test's gateway arguments."""
    settings = json.loads(hooks_doc_block("claude-hook"))
    (group,) = settings["hooks"]["PreToolUse"]
    (hook,) = group["hooks"]
    hook["command"] = shlex.join([GATEWAY, "hook", "claude-code", *hook_options(setup, *extra)])
    if timeout is not None:
        hook["timeout"] = timeout
    path = setup.root / "claude-settings.json"
    path.write_text(json.dumps(settings))
    return path


def run_claude_hooked(setup: Setup, model: ScriptedModel, settings: Path) -> None:
    """Claude Code with its own tools, the hook deciding each call; Bash itself is allowed, as a
    user who leaves the decisions to the gateway has it."""
    claude = installed("@anthropic-ai/claude-code", CLAUDE_VERSION, "claude")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(setup.root / "home"),
        "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
    }  # fmt: skip
    argv = [str(claude), "-p", "do the task", "--settings", str(settings), "--allowedTools", "Bash"]
    run_client(argv, env, setup.workspace)


def claude_bash(ident: str, command: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": ident, "name": "Bash", "input": {"command": command, "description": "step"}}


def claude_results(scripted: ScriptedModel) -> dict[str, dict[str, Any]]:
    """Each tool call's result, as Claude Code gave it back to the model."""
    found: dict[str, dict[str, Any]] = {}
    for message in scripted.turns()[-1]["messages"]:
        if isinstance(message["content"], list):
            for c in message["content"]:
                if c.get("type") == "tool_result":
                    found[c["tool_use_id"]] = c
    return found


def test_claude_code_hook_takes_home_as_its_shell_does_and_runs_calls_in_the_sandbox(hooked: Setup, model: Any) -> None:
    """Through the real Claude Code, as docs/hooks.md configures it: `~` is the user's home (the
    shipped policy's `home` is the workspace: the jail read `~/.ssh` as a workspace path and let
    it through), and an allowed `make`, whose Makefile reads a file outside the roots, runs in
    the gateway's sandbox instead of as the user."""
    setup = hooked
    (setup.root / "home" / ".ssh").mkdir()
    (setup.root / "home" / ".ssh" / "id_ed25519").write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n")
    (setup.workspace / "Makefile").write_text(f"all:\n\t@cat {setup.root / 'home' / 'secret.txt'}\n")
    setup.workspace.chmod(0o777)  # the sandbox's account writes here (Claude Code runs as root here)
    script = [
        [claude_bash("toolu_key", "head -c 400 ~/.ssh/id_ed25519")],
        [claude_bash("toolu_make", "make -s")],
    ]
    scripted = model("anthropic", script)
    run_claude_hooked(setup, scripted, claude_hook_settings(setup))
    results = claude_results(scripted)
    assert SECRET not in json.dumps(results), results
    assert "outside the read roots" in json.dumps(results["toolu_key"]["content"])
    assert "No such file" in json.dumps(results["toolu_make"]["content"]), results["toolu_make"]
    decided = hook_decisions(setup)
    assert [d["decision"] for d in decided] == ["deny", "allow"]
    assert decided[1]["data"]["hook"]["exec"]["sandboxed"] is True
    runs = [r for _, _, r, _ in records(setup.audit) if r and r.get("event") == "result"]
    assert [r["call_id"] for r in runs] == [decided[1]["call_id"]]


def test_claude_code_hook_answers_before_claude_gives_up(hooked: Setup, model: Any) -> None:
    """A hook Claude Code stops for its time reads as no objection, and the call runs. A command
    the gate takes long to decide got through that way when the hook's limit (here 15 s) was under
    the client's 20 s wait; now the gateway denies at its deadline (10 s), inside the limit."""
    setup = hooked
    slow = "; ".join([f"cd d{i}" for i in range(1400)] + [f"cat x{i}" for i in range(1400)] + ["echo ran > ran.txt"])
    assert len(slow) < 65536
    script = [[claude_bash("toolu_warm", "true")], [claude_bash("toolu_slow", slow)]]
    scripted = model("anthropic", script)
    run_claude_hooked(setup, scripted, claude_hook_settings(setup, 15))
    assert not (setup.workspace / "ran.txt").exists()
    assert "deadline" in json.dumps(claude_results(scripted)["toolu_slow"]["content"])
