"""The `process` tool: durable background processes. The command is decided at `start` like a
`run`, and again before every restart (the policy may have changed): a restart the policy now
denies or would ask about does not happen unattended. The mechanics (records, logs, adoption
after a gateway restart, backoff) are in gateway/executors/processes.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import cancellation, envstore, sandbox
from gateway.analysis import analyze
from gateway.analysis.git_write import is_git_write
from gateway.calls import ProcessCall, RunCall
from gateway.executors.processes import ProcessManager, ProcessRecord, Spawnable
from gateway.executors.shell import scrubbed_env, shell_argv
from gateway.log import log
from gateway.pipeline import DEFAULT_PROCESSES, Gated, error, limits, new_call_id, tool_decision
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Tool
from gateway.tools.replies import DEFAULT_REPLY_BYTES, fit_reply

if TYPE_CHECKING:
    from gateway.pipeline import Gateway


def manager(gw: Gateway) -> ProcessManager | None:
    """The gateway's process manager, made (and its records rehydrated) when the gateway starts."""
    if gw.state_dir is None:
        return None
    with gw._processes_lock:
        if gw._processes is None:
            pm = ProcessManager(
                gw.state_dir / "processes",
                build=lambda rec: _build(gw, rec),
                gate=lambda rec, why: _gate(gw, rec, why),
                event=lambda event, rec, data: _event(gw, event, rec, data),
            )
            pm.rehydrate()
            pm.start_monitor()
            gw._processes = pm
        found: ProcessManager = gw._processes
        return found


_decided = threading.local()
"""What the current start or restart was decided as, on the thread that then spawns it (`start`
runs the gate and the spawn on the caller's thread, a restart on the monitor's): `start`, the
(principal, command, cwd) the tool call decided, and `policy`, the snapshot it was decided
under, from which the sandbox is built (never from a policy reloaded since)."""


def _build(gw: Gateway, rec: ProcessRecord) -> Spawnable:
    """The sandbox for a start or restart, from the policy it was decided under."""
    policy: CompiledPolicy | None = getattr(_decided, "policy", None)
    _decided.policy = None
    if policy is None:  # fail closed: never a sandbox from a policy nobody decided under
        raise RuntimeError("no decision for this start")
    analysis = analyze(rec.command)  # the same text the gate decided: the same programs
    git_write = analysis.denial is None and is_git_write(analysis.commands)
    plan, launch = sandbox.start(
        gw.profile(policy, rec.principal), shell_argv(rec.command), Path(rec.cwd), scrubbed_env(rec.env),
        git_write=git_write, die_with_parent=False,
    )  # fmt: skip
    if launch.disk_refusal is not None:  # its write roots are too full to start anything in
        launch.abandon()
        raise sandbox.DiskBudgetRefused(launch.disk_refusal)
    summary = launch.summary(plan)
    config = {
        "command": shell_argv(rec.command),
        "cwd": rec.cwd,
        "env_names": sorted(plan.env),
        "die_with_parent": plan.die_with_parent,
        "landlock_mode": plan.landlock_mode,
        **plan.describe(),
        "held_by": summary,
        "policy_sha256": policy.sha256,
    }
    group = launch.cgroup.name if launch.cgroup is not None else None
    return Spawnable(
        launch.argv,
        plan.env,
        launch.pass_fds,
        launch.started,
        launch.abandon,
        summary=summary,
        config=config,
        cgroup=group,
    )


def _gate(gw: Gateway, rec: ProcessRecord, why: str) -> str | None:
    if why == "start":  # a start this thread's tool call decided: let it through, once
        if getattr(_decided, "start", None) == (rec.principal, rec.command, rec.cwd):
            _decided.start = None
            return None
        return "a start must be decided by the process tool first"
    arguments = {"action": "restart", "process_id": rec.id, "command": rec.command, "cwd": rec.cwd}
    _decided.policy = None
    try:
        policy = gw.policy
        # decided as at start: the call's own variables against the rules; what the env store
        # gave is checked against environment.allow, as every inherited variable is
        own = {k: v for k, v in rec.env.items() if envstore.refusal(policy, k, v) is not None}
        gated = gw.check_command(
            new_call_id(), rec.principal, "process", rec.command, Path(rec.cwd), own, arguments, policy, unattended=True
        )
    except Exception as exc:  # e.g. the principal left the policy: no restart, and say why
        return f"the restart could not be decided: {type(exc).__name__}: {exc}"
    if isinstance(gated, Gated):
        _decided.policy = gated.policy  # the restart's sandbox comes from this same snapshot
        return None
    return str(gated.get("error", {}).get("message", "denied"))


def _event(gw: Gateway, event: str, rec: ProcessRecord, data: dict[str, Any]) -> None:
    try:
        gw.audit.append(event, principal=rec.principal, tool="process", data={"process_id": rec.id, **data})
    except Exception:  # an event of a running process: the process stays; the log reports it
        log.warning("audit_failed", record=event, process_id=rec.id)


def _start(gw: Gateway, pm: ProcessManager, policy: CompiledPolicy, principal: str, command: str, cwd: Path,
           env: dict[str, str], keep_alive: bool, name: str | None) -> dict[str, Any]:  # fmt: skip
    """Start what the call decided under `policy`: its limits and its sandbox come from it too.
    The manager runs the gate and the spawn on this thread; what this call decided is handed to
    them here (concurrent starts of the same command each pass their own decision)."""
    _decided.start = (principal, command, str(cwd))
    _decided.policy = policy
    try:
        return pm.start(
            principal, command, str(cwd), env, keep_alive, name,
            limits(policy, principal).get("processes", DEFAULT_PROCESSES),
        )  # fmt: skip
    finally:
        _decided.start = None
        _decided.policy = None


def handle(gw: Gateway, call: ProcessCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    pm = manager(gw)
    if pm is None:
        return error(call_id, "error", "PROCESSES_UNAVAILABLE", "the gateway runs without a state directory")
    arguments = call.model_dump(exclude={"tool", "principal"}, exclude_none=True)
    if call.action == "start":
        assert call.command is not None
        cwd = gw.resolve_cwd(policy, call.cwd)
        gated = gw.check_command(call_id, call.principal, "process", call.command, cwd, call.env, arguments, policy)
        if not isinstance(gated, Gated):
            return gated
        void = gw.still_bound(gated)  # the files an approval was bound to, right before the start
        if void is not None:
            return void
        env = {**gw.env.effective(policy, call.principal), **call.env}
        out = _start(gw, pm, gated.policy, call.principal, call.command, cwd, env, call.keep_alive, call.name)
        return gw.record_result(gated, out)
    decision = tool_decision(policy, call.principal, Tool.PROCESSES)
    subject = f"process {call.action} {call.process_id or ''}".strip()
    gated = gw.authorize(call_id, call.principal, "process", subject, policy.workspace, {}, decision, arguments, policy)
    if not isinstance(gated, Gated):
        return gated
    if call.action == "list":
        out = pm.list(call.principal)
    elif call.action == "stop_all":
        out = pm.stop_all(call.principal)
    else:
        assert call.process_id is not None
        if call.action == "get":
            out = pm.get(call.principal, call.process_id)
        elif call.action == "output":
            out = _fit(
                gw, gated.policy, call.principal, call_id, pm.output(call.principal, call.process_id, call.max_bytes)
            )
        else:
            out = pm.stop(call.principal, call.process_id)
    return gw.record_result(gated, out)


def _fit(gw: Gateway, policy: CompiledPolicy, principal: str, call_id: str, out: dict[str, Any]) -> dict[str, Any]:
    """A log's tail bounded as a run's stdout is (`limits.reply_bytes`, what was read saved whole
    for the files tool); `max_bytes` chooses how much of the log is read."""
    limit = limits(policy, principal).get("reply_bytes") or DEFAULT_REPLY_BYTES
    return fit_reply(gw, principal, call_id, out, limit, ("output",))


def run_in_background(
    gw: Gateway, call: RunCall, call_id: str, gated: Gated, cwd: Path, env: dict[str, str], after_ms: int
) -> dict[str, Any]:
    """`run` with background_after_ms: the command runs as a durable process; if it is still
    running after `after_ms`, the process tools take it over and the result says which id."""
    pm = manager(gw)
    if pm is None:
        out = {"status": "error", "error": {"code": "PROCESSES_UNAVAILABLE", "message": "no state directory"}}
        return gw.record_result(gated, out)
    started = _start(gw, pm, gated.policy, call.principal, call.command, cwd, env, False, None)
    if started.get("status") != "ok":
        return gw.record_result(gated, started)
    pid = started["process"]["id"]
    finished = pm.wait_for(call.principal, pid, after_ms / 1000, cancellation.current_cancel())
    record = pm.get(call.principal, pid)
    tail = pm.output(call.principal, pid, limits(gated.policy, call.principal).get("output_bytes") or (1 << 20))
    result: dict[str, Any] = {"status": "ok", "cwd": str(cwd), "output": tail.get("output", "")}
    # a run's reply, whichever way it ended: its output within the role's reply_bytes like any run's
    # (the log's tail up to output_bytes was sent whole: 1 MB, 4 MB once the os profile's YAML escaped it)
    result = _fit(gw, gated.policy, call.principal, call_id, result)
    if finished:
        result["exit_code"] = record.get("process", {}).get("exit_code")
        result["backgrounded"] = False
    else:
        result["backgrounded"] = True
        result["process_id"] = pid
        result["process_number"] = started["process"].get("number")
        still = f"still running after {after_ms} ms: process output / stop with process_id {pid}"
        result["notice"] = f"{still}; {result['notice']}" if result.get("notice") else still
    return gw.record_result(gated, result)
