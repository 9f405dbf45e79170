"""The whole pipeline for every tool call (`Gateway`): decide (gateway/decide.py: `evaluate()`,
the stages `gateway check` runs), audit the decision, ask a supervisor when the policy asks,
execute in the sandbox, audit the result.

`Gateway` composes the gate's jobs, each a module of its own and testable alone: deciding a call
(here, with gateway/decide.py), waiting for approval (gateway/approving.py), recording
(gateway/recording.py) and launching (gateway/launching.py). The tool families reach them through
its methods; it imports none of the families (gateway/families.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway import approval_queue, cancellation, families, runfiles, sandbox
from gateway.analysis import Command
from gateway.analysis.git_write import is_git_write
from gateway.approval import Approval, Approver, DenyAll
from gateway.approving import Approvals, NetworkHooks, bind_files
from gateway.audit import AuditUnavailable
from gateway.audit.sink import AuditSink
from gateway.audit.writer import written_call_ids

# the decision stages live in gateway/decide.py (what `gateway check` imports, without the sandbox,
# the audit log and the executors); their names stay importable from here
from gateway.decide import UNFINISHED as UNFINISHED
from gateway.decide import CheckResult as CheckResult
from gateway.decide import _evaluate as _evaluate
from gateway.decide import _strictest as _strictest
from gateway.decide import evaluate as evaluate
from gateway.decide import tool_decision as tool_decision
from gateway.decision import Decision, Reason, Verdict
from gateway.envstore import EnvStore
from gateway.executors import shell

# the jobs' names the tool families and the faces use stay importable from here
from gateway.launching import DEFAULT_CPU_SECONDS as DEFAULT_CPU_SECONDS
from gateway.launching import DEFAULT_DISK_BYTES as DEFAULT_DISK_BYTES
from gateway.launching import DEFAULT_FILE_BYTES as DEFAULT_FILE_BYTES
from gateway.launching import DEFAULT_MEMORY_BYTES as DEFAULT_MEMORY_BYTES
from gateway.launching import DEFAULT_OPEN_FILES as DEFAULT_OPEN_FILES
from gateway.launching import DEFAULT_PIDS as DEFAULT_PIDS
from gateway.launching import DEFAULT_PROCESSES as DEFAULT_PROCESSES
from gateway.launching import DEFAULT_SESSION_IDLE_S as DEFAULT_SESSION_IDLE_S
from gateway.launching import DEFAULT_SESSIONS as DEFAULT_SESSIONS
from gateway.launching import DEFAULT_TMPFS_BYTES as DEFAULT_TMPFS_BYTES
from gateway.launching import Launcher
from gateway.launching import limit_source as limit_source
from gateway.launching import limits as limits
from gateway.launching import sandbox_profile as sandbox_profile
from gateway.launching import unsafe_setup as unsafe_setup
from gateway.log import log
from gateway.policy.compile import CompiledPolicy
from gateway.policy.loader import UnknownPrincipal
from gateway.policy.reload import PolicyTooOld
from gateway.policy.schema import Tool
from gateway.recording import CURRENT, Call, Recorder, denied
from gateway.recording import error as error
from gateway.recording import new_call_id as new_call_id
from gateway.recording import parent_of as parent_of
from gateway.recording import raw_arguments as raw_arguments
from gateway.sandbox import reaper
from gateway.stages import pathjail

APPROVAL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Gated:
    """A call the pipeline let through: the policy it was decided under and its audit base."""

    policy: CompiledPolicy
    base: dict[str, Any]
    commands: tuple[Command, ...] = ()
    """What the decided command runs (the analysis), for the sandbox's plan."""
    bound: tuple[runfiles.BoundFile, ...] = ()
    """The files an approval was bound to (gateway/runfiles.py): checked again right before the
    command starts (`Gateway.still_bound`)."""

    @property
    def git_write(self) -> bool:
        """The call runs git and nothing else: its sandbox leaves .git writable (analysis/git_write.py)."""
        return is_git_write(self.commands)


class Gateway:
    """The whole pipeline for every tool call: decide, audit, approve, execute, audit.

    Built from a policy source (a callable returning the policy in force, e.g.
    `PolicyHolder.current`), an approver, an audit log and an executor for `run`. `handle(call)`
    never raises: every failure is a result envelope with a stable error code, and is audited
    when the audit log works. Nothing executes unless the decision record is on disk.

    Its jobs are parts of their own: `recorder` (recording.py), `approvals` (approving.py) and
    `launcher` (launching.py); deciding is `decide_command` / `check_command` here.
    The tool families live in `gateway/tools/` (one module each) and register with the gate
    (gateway/families.py: the gate imports none of them); they call `check_command`,
    `authorize` and `record_result` here, so every family passes the same gate.
    """

    def __init__(
        self,
        policy: Any,
        audit: AuditSink,
        approver: Approver | None = None,
        executor: Any = shell.run,
        approval_timeout_s: float = APPROVAL_TIMEOUT_S,
        hidden: tuple[Path, ...] = (),
        state_dir: Path | None = None,
        admit: Callable[[], None] | None = None,
    ) -> None:
        self._policy = policy if callable(policy) else (lambda: policy)
        self._admit = admit
        """Asked before every call; raises PolicyTooOld when no call may be decided now (a fleet's
        gateway cut off from its store past the policy's maximum age: store/policy.py)."""
        self.recorder = Recorder(audit)
        self.approvals = Approvals(approver or DenyAll(), approval_timeout_s, audit, self._policy)
        self.executor = executor
        # the gateway's own state (background processes): outside every write root, hidden
        self.state_dir = Path(os.path.realpath(state_dir)) if state_dir else None
        # directories the sandbox hides besides home and the audit log (e.g. the approvals queue)
        queue_dir = getattr(self.approver, "state_dir", None)
        self.hidden = (*hidden, *((queue_dir,) if queue_dir else ()), *((self.state_dir,) if self.state_dir else ()))
        for private in self.hidden:  # made now: a sandbox started before it existed must not see it later
            Path(private).mkdir(parents=True, exist_ok=True, mode=0o700)
        if queue_dir and hasattr(self.approver, "audit_dir"):
            setattr(self.approver, "audit_dir", os.path.realpath(audit.directory))  # noqa: B010
            self._withdraw_orphans(Path(queue_dir))
        with contextlib.suppress(Exception):  # what runs of the sandboxes of a gateway killed with SIGKILL
            sandbox.quotas.kill_abandoned()
        with contextlib.suppress(Exception):  # cgroups left by sandboxes that ended while no gateway ran
            sandbox.quotas.sweep()
        reaper.start()  # killed sandboxes' orphaned namespace inits come back to be reaped
        self.on_close: list[Callable[[], None]] = []
        """What a tool family keeps for this gateway and ends with it (the upstream connections)."""
        self.env = EnvStore()
        self.launcher = Launcher(audit, self.hidden, self._policy)
        if self.state_dir is not None:  # rehydrate now: adopt what runs, restart keep-alive services
            families.start(self)

    # --- the jobs' parts, under the names the families and faces use ------------------------
    @property
    def audit(self) -> AuditSink:
        return self.recorder.audit

    @audit.setter
    def audit(self, audit: AuditSink) -> None:  # every job records to the same log
        self.recorder.audit = self.approvals.audit = self.launcher.audit = audit

    @property
    def approver(self) -> Approver:
        return self.approvals.approver

    @approver.setter
    def approver(self, approver: Approver) -> None:  # a face wraps it (server/app.py: McpApprover)
        self.approvals.approver = approver

    @property
    def approval_timeout_s(self) -> float:
        return self.approvals.timeout_s

    @property
    def sessions(self) -> Any:
        return self.launcher.sessions

    @property
    def _processes(self) -> Any:
        """The process manager (gateway/tools/process.py makes it as the gateway starts:
        families.start)."""
        return self.launcher.processes

    @_processes.setter
    def _processes(self, manager: Any) -> None:
        self.launcher.processes = manager

    @property
    def _processes_lock(self) -> threading.Lock:
        return self.launcher.processes_lock

    def _withdraw_orphans(self, queue_dir: Path) -> None:
        """Requests a gateway on this audit log left in the queue when it died (SIGKILL): nothing
        will ever run them. Each is recorded as withdrawn, then removed."""
        for req, why in approval_queue.orphans(queue_dir, self.audit.directory):
            try:
                self.audit.append(
                    "approval_withdrawn", call_id=req["call_id"], principal=req.get("principal"),
                    tool=req.get("tool"), policy_sha256=req.get("policy_sha256"), decision="deny",
                    rule=req.get("rule"), data={"digest": req.get("digest"), "why": why},
                )  # fmt: skip
            except AuditUnavailable:
                return  # left for a gateway that can record it (it is not listed meanwhile)
            approval_queue.withdraw(queue_dir, req["call_id"])

    @property
    def policy(self) -> CompiledPolicy:
        current: CompiledPolicy = self._policy()
        return current

    # --- entry --------------------------------------------------------------------------
    def handle(self, call: Any, cancel: threading.Event | None = None) -> dict[str, Any]:
        """Decide, run and audit one call. Setting `cancel` kills what it runs (`current_cancel`)."""
        call_id = new_call_id()
        current = Call(call_id)
        token = CURRENT.set(current)
        try:
            handler = families.handler(call.tool)
            if self._admit is not None:
                self._admit()
            with cancellation.handling(cancel), written_call_ids() as written:
                out: dict[str, Any] = handler(self, call, call_id)
            if not current.recorded and call_id not in written:  # it ended before any record (an unknown session, say)
                out = self.refuse(call_id, call.principal, call.tool, families.arguments(call), out)
            log.info("call", call_id=call_id, principal=call.principal, tool=call.tool, status=out.get("status"),
                     code=(out.get("error") or {}).get("code"))  # fmt: skip
            return out
        except pathjail.PathRefused as exc:  # a cwd that cannot even be named (resolve_cwd)
            envelope = error(call_id, "denied", "PATH_OUTSIDE_JAIL", exc.message)
            return self._failed(call, call_id, current, envelope)
        except Exception as exc:  # fail closed, and say so
            if isinstance(exc, UnknownPrincipal):  # not a bug: who called is not in (this version of) the policy
                envelope = error(call_id, "denied", "UNKNOWN_PRINCIPAL", str(exc))
            elif isinstance(exc, PolicyTooOld):  # the fleet's policy is older than it allows (docs/fleet.md)
                envelope = error(call_id, "denied", "POLICY_TOO_OLD", str(exc))
            else:
                envelope = error(call_id, "denied", "INTERNAL_ERROR", f"{type(exc).__name__}: {exc}")
            return self._failed(call, call_id, current, envelope)
        finally:
            CURRENT.reset(token)

    def _failed(self, call: Any, call_id: str, current: Call, envelope: dict[str, Any]) -> dict[str, Any]:
        return self.recorder.failed(call, call_id, current, envelope)

    def refuse(
        self, call_id: str, principal: str, tool: str, arguments: dict[str, Any], envelope: dict[str, Any]
    ) -> dict[str, Any]:
        """Record a call that ended before the policy decided it (recording.py: `rejected`)."""
        return self.recorder.refuse(call_id, principal, tool, arguments, envelope)

    def close(self) -> None:
        """Kill the sessions; leave durable processes running (the next gateway adopts them)."""
        self.launcher.close()
        for end in self.on_close:
            with contextlib.suppress(Exception):
                end()

    # --- deciding a call ----------------------------------------------------------------
    def private_dirs(self) -> tuple[Path, ...]:
        """The gateway's own records: the audit log, the approvals queue, its state (every
        principal's process logs). No agent reads them, whatever its read roots say."""
        return self.launcher.private_dirs()

    def resolve_cwd(self, policy: CompiledPolicy, cwd: str | None, field: str = "cwd") -> Path:
        """A call's cwd: the workspace when none is given; `~` and `~/...` are the policy's
        `home` (as in a command's paths); other relative paths resolve against the workspace.
        Where it leads is then jailed like any cwd. Raises PathRefused for `~` without a home
        and for `~user`, naming `field` (a files call's `path` resolves the same way)."""
        if cwd and cwd.startswith("~"):
            head, _, rest = cwd.partition("/")
            if head != "~":
                raise pathjail.PathRefused("tilde_user", f"{field} {cwd!r}: only ~ (the policy's home) is understood")
            if policy.home is None:
                raise pathjail.PathRefused("tilde_without_home", f"{field} {cwd!r}: the policy sets no home for ~")
            return policy.home / rest if rest else policy.home
        path = Path(cwd) if cwd else policy.workspace
        return path if path.is_absolute() else policy.workspace / path

    def decide_command(
        self, principal: str, tool: str, command: str, cwd: Path, env: dict[str, str],
        policy: CompiledPolicy, shell: str = "bash",
    ) -> CheckResult:  # fmt: skip
        """The decision on `command` run through `tool` (nothing recorded yet: `check_command`)."""
        family = {"run": Tool.RUN, "session": Tool.SESSION, "process": Tool.PROCESSES}[tool]
        if shell not in policy.policy.shells:
            reason = Reason(
                "tool", "shell_not_allowed", f"shell {shell!r} is not in the policy's shells {policy.policy.shells}"
            )
            return CheckResult(Decision(Verdict.DENY, None, (reason,)), None)
        # its sandbox masks secrets; a run call's bash starts with the environment the gateway builds
        fresh = tool == "run" and shell == "bash"
        return evaluate(policy, command, principal, cwd, env, family, sandboxed=True, fresh_shell=fresh)

    def check_command(
        self,
        call_id: str,
        principal: str,
        tool: str,
        command: str,
        cwd: Path,
        env: dict[str, str],
        arguments: dict[str, Any],
        policy: CompiledPolicy | None = None,
        shell: str = "bash",
        unattended: bool = False,
        decided: CheckResult | None = None,
        started_env: Mapping[str, str | None] | None = None,
    ) -> Gated | dict[str, Any]:
        """Decide `command` (as run through `tool`; or take `decided`, from `decide_command` with
        the same arguments), audit the decision, ask if the policy asks. Returns `Gated` to go
        ahead, or the envelope that ends the call. `started_env`: the code-loading variables
        (runfiles.LOADER_VARIABLES) of the shell a session's text runs in (None: a value known
        only at run time); else the command starts with the stored variables and the call's."""
        policy = policy or self.policy
        result = decided or self.decide_command(principal, tool, command, cwd, env, policy, shell)
        commands = (
            [
                {"argv": c.to_json()["argv"], "redirects": c.to_json().get("redirects", [])}
                for c in result.analysis.commands
            ]
            if result.analysis
            else []
        )
        # what the decision used besides the policy, so `gateway audit replay` can decide the same
        # call again under a draft: the resolved cwd (a session's is its shell's, in no argument),
        # the call's variables, the shell, the workspace and the principal's level and roots
        context = decision_context(policy, principal, cwd, env, shell)
        # run and process start inherit the principal's stored variables: the supervisor sees them
        inherited = self.env.effective(policy, principal) if tool in ("run", "process") and not unattended else None
        files: tuple[runfiles.BoundFile, ...] = ()
        if result.decision.verdict is Verdict.ASK and result.analysis is not None and not unattended:
            # the files of the roots it runs (a script, a makefile, a patch): the supervisor sees
            # them and approves their content; a change before the command starts voids it
            runs_with = started_env if started_env is not None else {**(inherited or {}), **env}
            files = bind_files(policy, principal, cwd, result.analysis.commands, runs_with)
        gated = self.authorize(
            call_id, principal, tool, command, cwd, env, result.decision, arguments, policy,
            {"commands": commands, "context": context}, unattended, inherited, files,
        )  # fmt: skip
        if isinstance(gated, Gated) and result.analysis is not None:
            return replace(gated, commands=result.analysis.commands)
        return gated

    def authorize(
        self,
        call_id: str,
        principal: str,
        tool: str,
        subject: str,
        cwd: Path,
        env: dict[str, str],
        decision: Decision,
        arguments: dict[str, Any],
        policy: CompiledPolicy,
        data: dict[str, Any] | None = None,
        unattended: bool = False,
        inherited: dict[str, str] | None = None,
        files: tuple[runfiles.BoundFile, ...] = (),
    ) -> Gated | dict[str, Any]:
        """Audit `decision` durably, then: deny -> the denial; ask -> the approver; allow -> go.
        `subject` is what a supervisor is asked about (the command, or `files write PATH`).
        `unattended` (a keep_alive restart): nobody is asked, so an ask is a denial. `inherited`:
        the stored variables the command inherits (shown to the supervisor, bound by the digest;
        if they change while the call waits, the approval is void)."""
        unsafe = self.unsafe_setup(policy, principal)
        if unsafe:  # any family could rewrite them (a files write as well as a command)
            return self.refuse(call_id, principal, tool, arguments, error(call_id, "denied", "UNSAFE_SETUP", unsafe))
        parent = parent_of(call_id)  # a line of a session write, a startup command: the call carrying it
        base = {"call_id": call_id, "principal": principal, "tool": tool, "policy_sha256": policy.sha256,
                **({"parent": parent} if parent else {})}  # fmt: skip
        try:
            self.recorder.decision(base, arguments, decision, data)
        except AuditUnavailable as exc:
            return error(call_id, "denied", "AUDIT_UNAVAILABLE", f"the decision could not be recorded: {exc}")
        if decision.verdict is Verdict.DENY:
            jail = any(r.stage == "pathjail" for r in decision.reasons)
            return denied(call_id, "PATH_OUTSIDE_JAIL" if jail else "POLICY_DENIED", decision)
        if decision.verdict is Verdict.ASK:
            ended = self.approvals.ask(
                base, subject, cwd, env, decision, policy, unattended, inherited, files,
                lambda: self.env.effective(policy, principal),
            )  # fmt: skip
            return ended if ended is not None else Gated(policy, base, bound=files)
        return Gated(policy, base)

    # --- waiting for approval (approving.py) ----------------------------------------------
    def session_grant(self, principal: str, client_session: str | None, digest: str) -> str | None:
        return self.approvals.session_grant(principal, client_session, digest)

    def keep_session_grant(self, principal: str, client_session: str | None, answer: Approval) -> bool:
        return self.approvals.keep_session_grant(principal, client_session, answer)

    def end_client_session(self, client_session: str) -> None:
        """The client session ended: its approvals "for the session" end with it."""
        self.approvals.end_client_session(client_session)

    def still_bound(self, gated: Gated) -> dict[str, Any] | None:
        """None when every file the call's approval was bound to is as the supervisor saw it,
        read again now (call it as late as the launch allows: right before the command starts).
        Otherwise the approval is void: recorded (`approval_void`) and the denial returned."""
        return self.approvals.still_bound(gated.policy, gated.base, gated.bound)

    # --- recording (recording.py) ---------------------------------------------------------
    def record_result(
        self, gated: Gated | dict[str, Any], outcome: dict[str, Any], event: str = "result"
    ) -> dict[str, Any]:
        """Audit what happened (without bulky or secret fields) and build the envelope."""
        return self.recorder.result(gated.base if isinstance(gated, Gated) else gated, outcome, event)

    # --- launching (launching.py) ---------------------------------------------------------
    def profile(self, policy: CompiledPolicy, principal: str) -> sandbox.Profile:
        """What every executor's sandbox gets from the policy: roots, protected paths, the
        gateway's private directories (never shown), quotas, network, Landlock, and HOME (the
        policy's `home`: `~` means the same to the jail, the files tool and the commands)."""
        hooks = NetworkHooks(self.approvals, principal) if policy.network_of(principal)[1] is not None else None
        return self.launcher.profile(policy, principal, hooks)

    def unsafe_setup(self, policy: CompiledPolicy, principal: str) -> str:
        """Why this setup must not execute: the agent could rewrite the audit log, the policy,
        the approvals queue or the gateway's state if one lies inside its write roots."""
        return self.launcher.unsafe_setup(policy, principal)


def decision_context(
    policy: CompiledPolicy, principal: str, cwd: Path, env: dict[str, str], shell: str
) -> dict[str, Any]:
    """What a command's decision used besides the policy's rules: recorded with the decision
    (`data.context`) so a replay under a draft decides the same call in the same place."""
    out: dict[str, Any] = {"cwd": str(cwd), "env": dict(env), "shell": shell, "workspace": str(policy.workspace)}
    grant = policy.grants.get(principal)
    if grant is not None:
        out.update(
            level=grant.level,
            read_roots=[str(p) for p in grant.read_roots],
            write_roots=[str(p) for p in grant.write_roots],
        )
    return out
