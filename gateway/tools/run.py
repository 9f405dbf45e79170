"""The `run` tool: one shell command through the whole pipeline, in the sandbox."""

from __future__ import annotations

import contextlib
import functools
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway import sandbox
from gateway.analysis.git_write import is_git_write
from gateway.calls import RunCall
from gateway.cancellation import current_cancel
from gateway.decision import Verdict
from gateway.pipeline import Gated, limits
from gateway.policy.schema import Tool
from gateway.tools import process
from gateway.tools.replies import DEFAULT_REPLY_BYTES, fit_reply

if TYPE_CHECKING:
    from gateway.pipeline import Gateway


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def handle(gw: Gateway, call: RunCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    cwd = gw.resolve_cwd(policy, call.cwd)
    arguments = call.model_dump(exclude={"tool", "principal"})
    decided = gw.decide_command(call.principal, "run", call.command, cwd, call.env, policy, call.shell)
    record = functools.partial(
        gw.check_command, call_id, call.principal, "run", call.command, cwd, call.env, arguments, policy, call.shell,
        decided=decided,
    )  # fmt: skip
    gated: list[Gated] = []
    if decided.decision.verdict is not Verdict.ALLOW or call.background_after_ms is not None:
        first = record()  # a denial, a question to a supervisor, a hand-over: recorded first
        if not isinstance(first, Gated):
            return first
        gated.append(first)
    env = {**gw.env.effective(policy, call.principal), **call.env}
    lim = limits(policy, call.principal)
    cap = lim.get("timeout_ms") or 120_000
    timeout = min(call.timeout_ms or cap, cap)
    if call.background_after_ms is not None and call.background_after_ms < timeout:
        if policy.tool_decision(call.principal, Tool.PROCESSES).value != "allow":
            why = f"background_after_ms hands the command to the process tool, which {call.principal} may not use"
            return gw.record_result(gated[0], {"status": "denied", "error": {"code": "POLICY_DENIED", "message": why}})
        if call.shell != "bash" or not call.capture_output:
            why = "background_after_ms runs with bash and captures output to the process log"
            return gw.record_result(gated[0], {"status": "error", "error": {"code": "INVALID_INPUT", "message": why}})

        void = gw.still_bound(gated[0])
        if void is not None:
            return void
        return process.run_in_background(gw, call, call_id, gated[0], cwd, env, call.background_after_ms)

    def verify() -> None:
        """An approved call bound to files it runs: they are read again once its sandbox is built,
        right before the command is let go; a change since the approval voids it."""
        void = gw.still_bound(gated[0])
        if void is not None:
            raise _NotRecorded(void)

    def release() -> None:
        """An allowed call's decision is recorded while its sandbox is built (the command is held
        until this returns): the fsync overlaps bwrap's setup, and nothing runs unrecorded."""
        made = record()
        if not isinstance(made, Gated):
            raise _NotRecorded(made)
        gated.append(made)

    started_at, t0 = now_iso(), time.monotonic()
    try:
        outcome = gw.executor(
            call.command,
            cwd,
            gw.profile(policy, call.principal),
            env=env,
            timeout_ms=timeout,
            output_bytes=lim.get("output_bytes") or (1 << 20),
            git_write=is_git_write(decided.analysis.commands if decided.analysis else ()),
            **({"posix": True} if call.shell == "sh" else {}),
            **({} if call.capture_output else {"capture": False}),
            **({"cancel": cancel} if (cancel := current_cancel()) is not None else {}),
            **({"release": verify} if gated and gated[0].bound else {} if gated else {"release": release}),
        )
    except _NotRecorded as refused:
        return refused.envelope
    except sandbox.SandboxUnavailable as exc:
        outcome = {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": str(exc)}}
    except Exception:
        if not gated:  # the decision goes on record before the error does
            with contextlib.suppress(Exception):
                record()
        raise
    if not gated:  # it ended before its sandbox existed (a bad cwd, a sandbox that cannot start)
        made = record()
        if not isinstance(made, Gated):
            return made
        gated.append(made)
    outcome = shape(outcome, call, started_at, t0, str(cwd))
    if outcome.get("status") == "timeout":
        outcome["timeout_ms"] = timeout  # the limit that ended it, after the policy's cap
    outcome = fit_reply(gw, call.principal, call_id, outcome, lim.get("reply_bytes") or DEFAULT_REPLY_BYTES)
    return gw.record_result(gated[0], outcome)


class _NotRecorded(Exception):
    """The decision could not be recorded (or the setup is unsafe): the held command never ran."""

    def __init__(self, envelope: dict[str, Any]) -> None:
        super().__init__(envelope.get("error", {}).get("message", "not recorded"))
        self.envelope = envelope


def shape(outcome: dict[str, Any], call: RunCall, started_at: str, t0: float, cwd: str) -> dict[str, Any]:
    """The run envelope's common fields, and the caller's output choices."""
    outcome = dict(outcome)
    outcome["started_at"] = started_at
    outcome["ended_at"] = now_iso()
    outcome.setdefault("duration_ms", int((time.monotonic() - t0) * 1000))
    outcome["cwd"] = cwd
    if call.silent:
        for k in ("stdout", "stderr"):
            if k in outcome:
                outcome[f"{k}_bytes"] = len(outcome.pop(k).encode())
    code = outcome.get("exit_code")
    if call.fail_on_error and outcome.get("status") == "ok" and code not in (None, 0):
        outcome["status"] = "error"
        outcome["error"] = {"code": "COMMAND_FAILED", "message": f"exited with {code}"}
    return outcome
