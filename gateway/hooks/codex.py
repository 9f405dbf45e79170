"""`gateway hook codex --check | --trust`: will Codex run the gateway's hook?

Codex runs a hook from a user or project configuration only once it is trusted: trust is a
`[hooks.state."KEY"] trusted_hash = "sha256:..."` entry in the user's `config.toml`, KEY naming
the hook (its file, event, group and place) and the hash its definition. `codex exec` skips an
untrusted or changed hook without a word, so a hook as configured can be silently off. Codex
itself is the only judge of that, so both verbs ask Codex: its app server (`codex app-server`,
JSON-RPC on stdin/stdout) lists the hooks it found for a directory with their trust
(`hooks/list`), and `--trust` has it write the trust of the gateway's hooks, and of no other,
into the user's configuration (`config/value/write`), as its own review screen does.

`--check` passes when at least one gateway hook for `PreToolUse` is found, and every one found
is enabled, trusted, matches `Bash` and `apply_patch`, and gives the hook at least
MIN_TIMEOUT_S (a hook Codex stops for its time reads as no objection); and Codex's `hooks`
feature is on. Anything else is named, with what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from gateway import fdwait

MIN_TIMEOUT_S = 45
"""The hook client answers within 30 s in the worst case (gateway/hook_client.py, TOTAL_S)."""
TOOLS = ("Bash", "apply_patch")
APP_SERVER_TIMEOUT_S = 60.0
EXIT_OK, EXIT_NOT_RUN, EXIT_USAGE = 0, 1, 2


class CodexError(Exception):
    pass


@dataclass
class Report:
    ok: bool = True
    lines: list[str] = field(default_factory=list)

    def bad(self, line: str) -> None:
        self.ok = False
        self.lines.append("NO   " + line)

    def good(self, line: str) -> None:
        self.lines.append("ok   " + line)


def is_gateway_hook(command: str) -> bool:
    """Whether a hook's command is `... gateway hook codex ...` or `... hook_client.py codex ...`."""
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    for i, word in enumerate(words[:-1]):
        name = os.path.basename(word)
        if name == "hook_client.py" and words[i + 1] == "codex":
            return True
        if name == "gateway" and words[i + 1 : i + 3] == ["hook", "codex"]:
            return True
    return False


class AppServer:
    """A `codex app-server` of its own, spoken to in JSON-RPC lines."""

    def __init__(self, codex: str, cwd: str) -> None:
        try:
            self.proc = subprocess.Popen(
                [codex, "app-server"], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise CodexError(f"{codex} app-server did not start: {exc.strerror or exc}") from None
        self._next = 0
        self._buffer = b""
        self.call("initialize", {"clientInfo": {"name": "agent-gateway", "title": "agent-gateway", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "initialized"})

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise CodexError(f"codex app-server went away: {exc.strerror or exc}") from None

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """The result of one request (notifications in between are skipped)."""
        self._next += 1
        ident = self._next
        self._send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        until = time.monotonic() + APP_SERVER_TIMEOUT_S
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            line, nl, rest = self._buffer.partition(b"\n")
            if nl:
                self._buffer = rest
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict) and message.get("id") == ident:
                    if "error" in message:
                        raise CodexError(f"codex app-server refused {method}: {message['error']}")
                    return message.get("result")
                continue
            left = until - time.monotonic()
            if left <= 0:
                raise CodexError(f"codex app-server did not answer {method} within {APP_SERVER_TIMEOUT_S:.0f} s")
            if fdwait.readable(fd, left):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise CodexError(f"codex app-server ended before answering {method}")
                self._buffer += chunk

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def hooks_of(server: AppServer, cwd: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Codex's hooks for `cwd`, and its warnings and errors about them."""
    result = server.call("hooks/list", {"cwds": [cwd]})
    hooks: list[dict[str, Any]] = []
    notes: list[str] = []
    for entry in (result or {}).get("data", []):
        hooks += [h for h in entry.get("hooks", []) if isinstance(h, dict)]
        notes += [str(n) for n in (*entry.get("warnings", []), *entry.get("errors", []))]
    return hooks, notes


def check(codex: str, cwd: str, hooks: list[dict[str, Any]], notes: list[str]) -> Report:
    report = Report()
    ours = [h for h in hooks if is_gateway_hook(str(h.get("command") or ""))]
    pre = [h for h in ours if h.get("eventName") == "preToolUse"]
    for note in notes:
        report.lines.append(f"     codex says: {note}")
    if not pre:
        report.bad(
            f"Codex finds no agent-gateway PreToolUse hook for {cwd}: add the block of docs/hooks.md to "
            "~/.codex/config.toml (a project's .codex/config.toml counts only in a project Codex trusts)"
        )
    for h in pre:
        where = f"{h.get('sourcePath')} ({h.get('key')})"
        matcher = h.get("matcher")
        missed = [t for t in TOOLS if matcher and not re.search(str(matcher), t)]
        timeout = h.get("timeoutSec")
        if not h.get("enabled", False):
            report.bad(f"{where}: disabled in Codex's configuration (hooks.state: enabled = false)")
        elif h.get("trustStatus") not in ("trusted", "managed"):
            state = "changed since it was trusted" if h.get("trustStatus") == "modified" else "not trusted"
            report.bad(
                f"{where}: {state}, so Codex skips it (`codex exec` without a word): run "
                "`gateway hook codex --trust`, or trust it in Codex's own review (`codex`, then /hooks)"
            )
        elif missed:
            report.bad(f"{where}: its matcher {matcher!r} does not match {', '.join(missed)}: Codex would not ask it")
        elif not isinstance(timeout, int | float) or timeout < MIN_TIMEOUT_S:
            report.bad(
                f"{where}: timeout {timeout} s; the gate may take up to 30 s, and a hook Codex stops reads "
                f"as no objection: set timeout = 60 (at least {MIN_TIMEOUT_S})"
            )
        else:
            report.good(f"{where}: trusted, enabled, for {', '.join(TOOLS)}, timeout {timeout} s")
    feature = _hooks_feature(codex, cwd)
    if feature is False:
        report.bad("Codex's `hooks` feature is off (features.hooks = false): no hook runs")
    elif feature is None:
        report.lines.append("     could not read Codex's feature list (`codex features list`)")
    return report


def _hooks_feature(codex: str, cwd: str) -> bool | None:
    try:
        out = subprocess.run(
            [codex, "features", "list"], cwd=cwd, capture_output=True, text=True, timeout=APP_SERVER_TIMEOUT_S
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["hooks"] and words[-1] in ("true", "false"):
            return words[-1] == "true"
    return None


def trust(server: AppServer, hooks: list[dict[str, Any]]) -> list[str]:
    """Have Codex record trust for the gateway's hooks (and no other). Returns their keys."""
    wanted = {
        str(h["key"]): {"trusted_hash": str(h["currentHash"])}
        for h in hooks
        if is_gateway_hook(str(h.get("command") or ""))
        and h.get("trustStatus") in ("untrusted", "modified")
        and h.get("key")
        and h.get("currentHash")
    }
    if wanted:
        server.call("config/value/write", {"keyPath": "hooks.state", "mergeStrategy": "upsert", "value": wanted})
    return sorted(wanted)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="gateway hook codex", description="will Codex run the gateway's hook?")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="say whether Codex will run it (exit 0) or not (exit 1)")
    what.add_argument("--trust", action="store_true", help="have Codex trust the gateway's hooks, then check")
    ap.add_argument("--codex", help="the codex program (default: codex on PATH)")
    ap.add_argument("--cwd", default=os.getcwd(), help="the project Codex runs in (default: here)")
    args = ap.parse_args(argv)
    codex = args.codex or shutil.which("codex")
    if not codex:
        print("gateway hook codex: no codex on PATH: give it with --codex PATH")
        return EXIT_USAGE
    cwd = os.path.abspath(args.cwd)
    try:
        server = AppServer(codex, cwd)
        try:
            hooks, notes = hooks_of(server, cwd)
            if args.trust:
                for key in trust(server, hooks):
                    print(f"trusted  {key}")
                hooks, notes = hooks_of(server, cwd)
        finally:
            server.close()
        report = check(codex, cwd, hooks, notes)
    except CodexError as exc:
        print(f"gateway hook codex: {exc}")
        return EXIT_USAGE
    print("\n".join(report.lines))
    print("=> Codex runs the gateway's hook" if report.ok else "=> Codex will NOT run the gateway's hook as configured")
    return EXIT_OK if report.ok else EXIT_NOT_RUN
