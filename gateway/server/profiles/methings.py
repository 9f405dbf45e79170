"""The `methings` profile (seed 000), first slice: `local_run_shell` (`/bin/sh`-style: bash in
POSIX mode, so the policy's `shells` must list `sh`) and `termux_run_shell` (bash).

    {"command": "ls", "cwd": "src", "timeout_ms": 60000, "env": {"APP_MODE": "test"}}
    {"status": "ok", "exit_code": 0, "stdout": "...", "stderr": "", "call_id": "..."}
    {"status": "timeout", "exit_code": -1, "stdout": "...", "stderr": "Command timed out after 60s", "call_id": "..."}

A non-zero exit is `status: ok` with its exit code, as a shell reports it. What the seed has no
status for (a denial, an unknown program, a sandbox that cannot start, invalid arguments) is
`status: error`, `exit_code` (-1 when nothing ran, 127 for an unknown program), the message
in `stderr`, and the gateway's `error` object (code, message, and the deciding `rule` and
`reasons` for a denial). A call a supervisor must approve is `status: pending` with its
`call_id`: `await_call` returns the result in this same shape.
"""

from __future__ import annotations

from typing import Any, Literal

from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from gateway.calls import EnvMap, PathText, RunCall, ShellText
from gateway.policy.schema import Tool
from gateway.server.specs import Spec

NAME = "methings"
DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 300_000


class RunShell(BaseModel):
    """Arguments of seed 000's `local_run_shell` and `termux_run_shell`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    command: ShellText
    """The shell command."""
    cwd: PathText | None = None
    """Directory to run in (default: the workspace; relative: against it; `~`: the policy's home)."""
    timeout_ms: int = Field(default=DEFAULT_TIMEOUT_MS, gt=0, le=MAX_TIMEOUT_MS)
    """Milliseconds before the command is killed (default 60000, at most 300000; the policy may cap it lower)."""
    env: EnvMap = {}
    """Variables for the command; each must be allowed by the rules deciding it."""


def _adapter(shell: Literal["bash", "sh"]) -> Any:
    def adapt(args: RunShell, principal: str) -> RunCall:
        return RunCall(
            principal=principal, command=args.command, cwd=args.cwd, env=args.env, timeout_ms=args.timeout_ms,
            shell=shell,
        )  # fmt: skip

    return adapt


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


def run_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The gateway's run envelope as seed 000's `{status, exit_code, stdout, stderr}`."""
    status = envelope.get("status")
    call_id = envelope.get("call_id")
    stdout = envelope.get("stdout", "")
    if status == "ok":
        out = {
            "status": "ok",
            "exit_code": envelope.get("exit_code"),
            "stdout": stdout,
            "stderr": envelope.get("stderr", ""),
        }
    elif status == "timeout" and (envelope.get("error") or {}).get("code") == "COMMAND_TIMEOUT":
        limit = int(envelope.get("timeout_ms") or DEFAULT_TIMEOUT_MS)
        out = {
            "status": "timeout",
            "exit_code": -1,
            "stdout": stdout,
            "stderr": f"Command timed out after {_seconds(limit)}",
        }
    elif status == "pending":
        out = {"status": "pending", "exit_code": -1, "stdout": "", "stderr": str(envelope.get("next", ""))}
        out |= {k: envelope[k] for k in ("approval", "next") if k in envelope}
    else:
        err = envelope.get("error") or {}
        code = envelope.get("exit_code")
        stderr = envelope.get("stderr") if code is not None and envelope.get("stderr") else err.get("message", "")
        out = {"status": "error", "exit_code": code if code is not None else -1, "stdout": stdout, "stderr": stderr}
        out["error"] = {k: v for k, v in err.items() if k in ("code", "message")}
        out["error"] |= {k: envelope[k] for k in ("rule", "reasons") if envelope.get(k) is not None}
    for k in ("notice", "reply_cut"):
        if k in envelope:
            out[k] = envelope[k]
    out["call_id"] = call_id
    return out


_GATE = (
    " Every command is decided by the gateway's policy, runs in a sandbox and is recorded; a denial "
    "is status error with error.code POLICY_DENIED and the rule's justification (follow it, do not "
    "retry unchanged). A call a supervisor must approve returns status `pending` and a call_id: call "
    "`await_call` with it."
)
_HINTS = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)

SPECS: tuple[Spec, ...] = (
    Spec(
        "local_run_shell",
        RunShell,
        Tool.RUN,
        "Run a shell command (sh)",
        "Run one command with a POSIX sh (bash in POSIX mode) and return {status, exit_code, stdout, "
        "stderr}. timeout_ms defaults to 60000 (at most 300000); on timeout status is `timeout` and "
        "exit_code -1." + _GATE,
        _HINTS,
        resolver="client",
        adapt=_adapter("sh"),
        reply=run_reply,
    ),
    Spec(
        "termux_run_shell",
        RunShell,
        Tool.RUN,
        "Run a shell command (bash)",
        "Run one bash command and return {status, exit_code, stdout, stderr}. timeout_ms defaults to "
        "60000 (at most 300000); on timeout status is `timeout` and exit_code -1." + _GATE,
        _HINTS,
        resolver="client",
        adapt=_adapter("bash"),
        reply=run_reply,
    ),
)
