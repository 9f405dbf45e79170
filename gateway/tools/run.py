"""The `run` tool: one shell command through the whole pipeline, in the sandbox."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway import sandbox
from gateway.calls import RunCall
from gateway.cancellation import current_cancel
from gateway.pipeline import Gated, limits
from gateway.policy.schema import Tool

if TYPE_CHECKING:
    from gateway.pipeline import Gateway


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def handle(gw: Gateway, call: RunCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    cwd = gw.resolve_cwd(policy, call.cwd)
    arguments = call.model_dump(exclude={"tool", "principal"})
    gated = gw.check_command(call_id, call.principal, "run", call.command, cwd, call.env, arguments, policy, call.shell)
    if not isinstance(gated, Gated):
        return gated
    env = {**gw.env.effective(policy, call.principal), **call.env}
    lim = limits(policy, call.principal)
    cap = lim.get("timeout_ms") or 120_000
    timeout = min(call.timeout_ms or cap, cap)
    if call.background_after_ms is not None and call.background_after_ms < timeout:
        from gateway.tools import process

        if policy.tool_decision(call.principal, Tool.PROCESSES).value != "allow":
            why = f"background_after_ms hands the command to the process tool, which {call.principal} may not use"
            return gw.record_result(gated, {"status": "denied", "error": {"code": "POLICY_DENIED", "message": why}})
        if call.shell != "bash" or not call.capture_output:
            why = "background_after_ms runs with bash and captures output to the process log"
            return gw.record_result(gated, {"status": "error", "error": {"code": "INVALID_INPUT", "message": why}})

        return process.run_in_background(gw, call, gated, cwd, env, call.background_after_ms)
    started_at, t0 = now_iso(), time.monotonic()
    try:
        outcome = gw.executor(
            call.command,
            cwd,
            gw.profile(policy, call.principal),
            env=env,
            timeout_ms=timeout,
            output_bytes=lim.get("output_bytes") or (1 << 20),
            git_write=gated.git_write,
            **({"posix": True} if call.shell == "sh" else {}),
            **({} if call.capture_output else {"capture": False}),
            **({"cancel": cancel} if (cancel := current_cancel()) is not None else {}),
        )
    except sandbox.SandboxUnavailable as exc:
        outcome = {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": str(exc)}}
    outcome = shape(outcome, call, started_at, t0, str(cwd))
    return gw.record_result(gated, outcome)


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
