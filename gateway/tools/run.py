"""The `run` tool: one shell command through the whole pipeline, in the sandbox."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import sandbox
from gateway.analysis.git_write import is_git_write
from gateway.calls import RunCall
from gateway.cancellation import current_cancel
from gateway.decision import Verdict
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
        from gateway.tools import process

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


DEFAULT_REPLY_BYTES = 30_000
"""Bytes of each output stream a `run` reply carries at most (`limits.reply_bytes`)."""
HEAD_SHARE = 10
"""A cut stream keeps its first 1/HEAD_SHARE and its tail: the end is what an agent needs most."""
KEEP_SAVED = 64
"""Saved outputs kept per principal (the oldest go first)."""


def fit_reply(
    gw: Gateway, principal: str, call_id: str, outcome: dict[str, Any], limit: int,
    streams: tuple[str, ...] = ("stdout", "stderr"),
) -> dict[str, Any]:  # fmt: skip
    """Cut each output stream (`streams`: the outcome's text fields) over `limit` bytes to its
    head and a longer tail, and say so in `notice`: how much was left out, and where the whole of
    it (as the executor kept it, within `limits.output_bytes`) is saved for the files tool. The
    saved copy lives in the gateway's own state (`outputs/PRINCIPAL/`), which no sandbox sees and
    only the gateway writes; the files tool lets that principal, and no other, read it. Without a
    state directory nothing is saved. Used by run, session (exec, write, read) and process
    (output) replies."""
    cut = [k for k in streams if isinstance(outcome.get(k), str) and len(outcome[k].encode()) > limit]
    if not cut:
        return outcome
    outcome = dict(outcome)
    from gateway.tools.files import saved_outputs_dir

    where = saved_outputs_dir(gw, principal)
    notes = []
    for k in cut:
        data = outcome[k].encode()
        saved = _save(where, f"{call_id}.{k}.txt", data) if where is not None else None
        head = limit // HEAD_SHARE
        tail = limit - head
        left_out = len(data) - head - tail
        outcome[k] = (
            data[:head].decode("utf-8", "ignore")
            + f"\n[... {left_out} bytes of {k} not shown ...]\n"
            + data[-tail:].decode("utf-8", "ignore")
        )
        outcome.setdefault("reply_cut", {})[k] = {"bytes": len(data), "shown": head + tail, "saved": saved}
        how = (
            f"the whole of it is in {saved}: files read with path {saved!r} (offset/limit in lines, "
            "or max_bytes), or files grep there"
            if saved
            else "nothing was saved (the gateway has no state directory): rerun with the output "
            "redirected to a file in the workspace, or piped through tail/grep"
        )
        notes.append(f"{k}: {len(data)} bytes, {left_out} not shown (the first {head} and last {tail} are); {how}")
    dropped = outcome.get("dropped_bytes") or {}
    if isinstance(dropped, int):  # a session's one stream
        dropped = {cut[0]: dropped}
    if any(dropped.get(k) for k in cut):
        kept = "the last" if isinstance(outcome.get("dropped_bytes"), int) else "the first and last"
        notes.append(
            f"the executor kept {kept} limits.output_bytes of each stream; "
            f"what it dropped ({', '.join(f'{k}: {dropped[k]}' for k in cut if dropped.get(k))}) is gone"
        )
    notice = "; ".join(notes)
    outcome["notice"] = f"{outcome['notice']}; {notice}" if outcome.get("notice") else notice
    return outcome


def _save(where: Path, name: str, data: bytes) -> str | None:
    """Write `data` to `where/name` (the gateway's own directory, mode 0700), keep the newest
    KEEP_SAVED files there. Returns the path, or None when it could not be written."""
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = where / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        kept = sorted(where.iterdir(), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[KEEP_SAVED:]:
            with contextlib.suppress(OSError):
                old.unlink()
        return str(path)
    except OSError:
        return None


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
