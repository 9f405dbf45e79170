"""The `system-ops` profile (seed 004): `run` and `ask_user`, each replying `{success, data}`.
The seed's text is public: CaptainPhantasy/Floyd, `floyd-wrapper-main/docs/tools/system.md`
("System Operations API"); read for facts only.

    {"success": true,  "data": {...}, "call_id": "..."}
    {"success": false, "error": {"code": "COMMAND_FAILED", "message": "..."}, "data": {...}?, "call_id": "..."}

The seed's error codes: COMMAND_FAILED (a non-zero exit: the seed counts it a failure, so the
call runs with the gateway's `fail_on_error`), COMMAND_TIMEOUT, COMMAND_NOT_FOUND (exit 127),
INVALID_INPUT (bad arguments, or an answer outside `validation`), USER_CANCELLED. The gate's own
codes (POLICY_DENIED, PATH_OUTSIDE_JAIL, APPROVAL_DENIED, ...) come through unchanged in the same
`error` object, with the deciding `rule` and `reasons` for a denial. A call a supervisor must
approve answers `success: false` with `data.status: "pending"` (not an error): `await_call`
with its `call_id` returns the result in this same shape.

The seed's "supervisor" permission level is the policy's `ask` for the tool's family
(docs/tools.md, "system-ops"): the profile grants nothing by itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.calls import AskUserCall, EnvMap, Millis, PathText, RunCall, ShellText, ValidationSpec
from gateway.policy.schema import Tool
from gateway.server.specs import ASKS, RUNS, Spec

NAME = "system-ops"
DEFAULT_TIMEOUT_MS = 30_000

_RUN_DATA = (
    "exit_code", "stdout", "stderr", "stdout_bytes", "stderr_bytes", "duration_ms", "cwd", "started_at",
    "ended_at", "notice", "reply_cut",
)  # fmt: skip
"""The gateway's run fields that go into `data` (stdout_bytes/stderr_bytes: with `silent`)."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Run(_Args):
    """Arguments of seed 004's `run`."""

    command: ShellText
    """The shell command (bash)."""
    timeout: Millis = DEFAULT_TIMEOUT_MS
    """Milliseconds before the command is killed (COMMAND_TIMEOUT); the policy's limits.timeout_ms caps it."""
    silent: bool = False
    """Suppress the output: `stdout` and `stderr` are empty (`stdout_bytes`, `stderr_bytes`: how much there was)."""
    cwd: PathText | None = None
    """Directory to run in (default: the workspace; `~`: the policy's home). Must lie in your roots."""
    env: EnvMap = {}
    """Variables for the command; each named by the policy's environment.allow, or allowed by the
    rules deciding it."""


class AskUser(_Args):
    """Arguments of seed 004's `ask_user`."""

    prompt: str = Field(min_length=1, max_length=4000)
    """The question."""
    default: str | None = Field(default=None, max_length=4000)
    """The answer used when the user just presses enter."""
    validation: ValidationSpec | None = None
    """`pattern` (the whole answer must match), `min_length`, `max_length`, `allowed_values`."""
    password: bool = False
    """Do not echo the answer; it never reaches the audit log."""


def _run_call(args: Run, principal: str) -> RunCall:
    return RunCall(
        principal=principal, command=args.command, cwd=args.cwd, env=args.env, timeout_ms=args.timeout,
        silent=args.silent, fail_on_error=True,
    )  # fmt: skip


def _ask_call(args: AskUser, principal: str) -> AskUserCall:
    return AskUserCall(
        principal=principal, prompt=args.prompt, default=args.default, validation=args.validation,
        password=args.password,
    )  # fmt: skip


def _failure(envelope: dict[str, Any]) -> dict[str, Any]:
    err = envelope.get("error") or {}
    out: dict[str, Any] = {"code": err.get("code", "INTERNAL_ERROR"), "message": err.get("message", "")}
    for k in ("rule", "reasons"):
        if envelope.get(k) is not None:
            out[k] = envelope[k]
    return out


def _reply(envelope: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    status = envelope.get("status")
    call_id = envelope.get("call_id")
    if status == "pending":
        pending = {k: envelope[k] for k in ("call_id", "approval", "next") if k in envelope}
        return {"success": False, "data": {"status": "pending", **pending}, "call_id": call_id}
    if status == "ok":
        return {"success": True, "data": data, "call_id": call_id}
    out: dict[str, Any] = {"success": False, "error": _failure(envelope)}
    if data:
        out["data"] = data
    out["call_id"] = call_id
    return out


def run_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The gateway's run envelope as seed 004's `{success, data}`: the seed's `exit_code`, `stdout`,
    `stderr`, `timed_out` (stdout and stderr empty with `silent`, their sizes in `stdout_bytes` and
    `stderr_bytes`), then the gateway's own fields."""
    data = {k: envelope[k] for k in _RUN_DATA if k in envelope}
    if "exit_code" in envelope or envelope.get("status") == "timeout":  # it ran
        for stream in ("stdout", "stderr"):
            data.setdefault(stream, "")
        data["timed_out"] = envelope.get("status") == "timeout"
        seed = {k: data.pop(k) for k in ("exit_code", "stdout", "stderr", "timed_out") if k in data}
        data = seed | data
    return _reply(envelope, data)


def ask_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The gateway's ask_user envelope as seed 004's `{success, data}`."""
    return _reply(envelope, {k: envelope[k] for k in ("value", "validated") if k in envelope})


_PENDING = (
    " Every command is decided by the gateway's policy and recorded; a denial is success false with "
    "error.code POLICY_DENIED and the rule's justification (follow it, do not retry unchanged). A call "
    "a supervisor must approve returns data.status `pending` and a call_id: call `await_call` with it."
)

SPECS: tuple[Spec, ...] = (
    Spec(
        "run",
        Run,
        Tool.RUN,
        "Run a shell command",
        "Run one bash command in a sandbox and reply {success, data: {exit_code, stdout, stderr, "
        "timed_out, duration_ms}}. A non-zero exit is success false with COMMAND_FAILED (data still has the "
        "output); COMMAND_TIMEOUT after `timeout` ms (default 30000); COMMAND_NOT_FOUND for an "
        "unknown program. `silent` suppresses the output." + _PENDING,
        RUNS,
        resolver="client",
        adapt=_run_call,
        reply=run_reply,
    ),
    Spec(
        "ask_user",
        AskUser,
        Tool.ASK_USER,
        "Ask the user a question",
        "Ask your user a question and wait for the answer: {success, data: {value, validated}}. "
        "`validation` (pattern, min_length, max_length, allowed_values) constrains the answer "
        "(INVALID_INPUT otherwise); `default` is used for an empty answer; `password` keeps it out of "
        "the logs. USER_CANCELLED when the user declines.",
        ASKS,
        resolver="user",
        adapt=_ask_call,
        reply=ask_reply,
    ),
)
