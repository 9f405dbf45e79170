"""The whole pipeline for every tool call (`Gateway`): decide (gateway/decide.py: `evaluate()`,
the stages `gateway check` runs), audit the decision, ask a supervisor when the policy asks,
execute in the sandbox, audit the result."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway import approval_queue, cancellation, families, metrics, runfiles, sandbox
from gateway.analysis import Command
from gateway.analysis.git_write import is_git_write
from gateway.approval import CLIENT_SESSION, Approval, ApprovalRequest, Approver, DenyAll
from gateway.audit import AuditLog, AuditUnavailable, origin
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
from gateway.executors.sessions import SessionManager
from gateway.log import log
from gateway.policy.compile import CompiledPolicy
from gateway.policy.loader import UnknownPrincipal
from gateway.policy.schema import Tool
from gateway.sandbox import reaper
from gateway.stages import pathjail

APPROVAL_TIMEOUT_S = 120.0
DEFAULT_SESSIONS = 8
DEFAULT_PROCESSES = 8
DEFAULT_SESSION_IDLE_S = 1800
DEFAULT_MEMORY_BYTES = 2 << 30
DEFAULT_PIDS = 512
DEFAULT_TMPFS_BYTES = 256 << 20
DEFAULT_CPU_SECONDS = 600
DEFAULT_FILE_BYTES = 1 << 30
DEFAULT_OPEN_FILES = 1024
DEFAULT_DISK_BYTES = 10 << 30


@dataclass
class _Call:
    """The call `Gateway.handle` is handling on this thread: its call_id, and whether a record
    naming it has been written. A call a tool handles as several (each line of a session write,
    each startup command) gets its own call_id; their records name this one as `parent`."""

    call_id: str
    recorded: bool = False
    started: float = field(default_factory=time.perf_counter)
    decided: float | None = None
    """When its decision was on disk (perf_counter): the run's latency counts from there."""


_CURRENT: ContextVar[_Call | None] = ContextVar("gateway_call", default=None)


def parent_of(call_id: str) -> str | None:
    """The call that carries `call_id` (the outer call `handle` is handling), or None when
    `call_id` is that call itself or no call is being handled (a keep-alive restart)."""
    current = _CURRENT.get()
    return current.call_id if current is not None and current.call_id != call_id else None


def _mark_recorded(call_id: str) -> None:
    current = _CURRENT.get()
    if current is not None and current.call_id == call_id:
        current.recorded = True


def _timed(call_id: str, tool: str, status: str | None = None) -> None:
    """The call's decision (status None) or result is on disk: its latency, for /metrics (an
    addition under a lock: nothing here waits on a scrape)."""
    current = _CURRENT.get()
    if current is None or current.call_id != call_id:
        return  # a part of a call (its own id) or no call being handled: the outer call counts
    now = time.perf_counter()
    if status is None:
        current.decided = now
        metrics.DECISION_SECONDS.labels(tool).observe(now - current.started)
    elif current.decided is not None:
        metrics.RUN_SECONDS.labels(tool, status).observe(now - current.decided)


_DIGESTED = frozenset({"input", "content", "old", "new", "edits", "value", "default", "answer"})
"""Raw arguments that may carry a secret or bulk (typed input, file content, an env value): a
rejected call's record keeps their size and digest."""


def raw_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """A caller's arguments as sent, for the record of a call refused before its call model
    existed (INVALID_INPUT, BUSY): text that may be a secret is kept as its size and digest."""
    out: dict[str, Any] = {}
    for k, v in arguments.items():
        if k in _DIGESTED and v is not None:
            text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
            data = text.encode("utf-8", "surrogatepass")
            out[k] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        else:
            out[k] = v
    return out


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

    The tool families live in `gateway/tools/` (one module each) and register with the gate
    (gateway/families.py: the gate imports none of them); they call `check_command`,
    `authorize` and `record_result` here, so every family passes the same gate.
    """

    def __init__(
        self,
        policy: Any,
        audit: AuditLog,
        approver: Approver | None = None,
        executor: Any = shell.run,
        approval_timeout_s: float = APPROVAL_TIMEOUT_S,
        hidden: tuple[Path, ...] = (),
        state_dir: Path | None = None,
    ) -> None:
        self._policy = policy if callable(policy) else (lambda: policy)
        self.audit = audit
        self.approver = approver or DenyAll()
        self.executor = executor
        self.approval_timeout_s = approval_timeout_s
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
        # "approve for this session": the digests of calls a supervisor approved for the rest of
        # the client session they were asked in (an MCP connection: approval.CLIENT_SESSION). A
        # digest binds principal, tool, command, cwd, env, the files it runs and the policy's
        # hash: the narrowest rule covering that one call, void when the policy changes.
        self._session_approved: dict[tuple[str, str], dict[str, str]] = {}
        """(principal, client session) -> digests a supervisor approved there -> that supervisor
        (each repeat names them). Dropped when the session ends (`end_client_session`)."""
        self._session_lock = threading.Lock()
        self.on_close: list[Callable[[], None]] = []
        """What a tool family keeps for this gateway and ends with it (the upstream connections)."""
        self.env = EnvStore()
        self.sessions = SessionManager(on_event=self._session_event)
        self.sessions.start_reaper()
        # the process manager (gateway/tools/process.py makes it as the gateway starts: families.start)
        self._processes: Any = None
        self._processes_lock = threading.Lock()
        if self.state_dir is not None:  # rehydrate now: adopt what runs, restart keep-alive services
            families.start(self)

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
        current = _Call(call_id)
        token = _CURRENT.set(current)
        try:
            handler = families.handler(call.tool)
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
            else:
                envelope = error(call_id, "denied", "INTERNAL_ERROR", f"{type(exc).__name__}: {exc}")
            return self._failed(call, call_id, current, envelope)
        finally:
            _CURRENT.reset(token)

    def _failed(self, call: Any, call_id: str, current: _Call, envelope: dict[str, Any]) -> dict[str, Any]:
        """Record a call that ended in an exception: `error`, with its arguments when nothing
        recorded them yet. The envelope comes back whatever the log does."""
        given: dict[str, Any] = {}
        if not current.recorded:
            with contextlib.suppress(Exception):
                given = {"arguments": families.arguments(call)}
        with contextlib.suppress(Exception):
            self.audit.append(
                "error", call_id=call_id, principal=call.principal, tool=call.tool, data=envelope["error"], **given
            )
        return envelope

    def refuse(
        self, call_id: str, principal: str, tool: str, arguments: dict[str, Any], envelope: dict[str, Any]
    ) -> dict[str, Any]:
        """Record a call that ended before the policy decided it (`rejected`: its tool, its
        arguments, the error; `parent` when another call carried it) and return its envelope.
        No call leaves no record: if this one cannot be written, the envelope says so."""
        parent = parent_of(call_id)
        try:
            self.audit.append(
                "rejected", call_id=call_id, principal=principal, tool=tool, arguments=arguments,
                decision="deny" if envelope.get("status") == "denied" else None,
                data={**(envelope.get("error") or {"status": envelope.get("status")}), **origin.current()},
                **({"parent": parent} if parent else {}),
            )  # fmt: skip
            _mark_recorded(call_id)
        except AuditUnavailable as exc:
            envelope = {**envelope, "warning": {"code": "AUDIT_UNAVAILABLE", "message": f"not recorded: {exc}"}}
        return envelope

    def close(self) -> None:
        """Kill the sessions; leave durable processes running (the next gateway adopts them)."""
        self.sessions.close()
        if self._processes is not None:
            self._processes.close()
        for end in self.on_close:
            with contextlib.suppress(Exception):
                end()

    # --- the gate -------------------------------------------------------------------------
    def private_dirs(self) -> tuple[Path, ...]:
        """The gateway's own records: the audit log, the approvals queue, its state (every
        principal's process logs). No agent reads them, whatever its read roots say."""
        return tuple(Path(os.path.realpath(p)) for p in (self.audit.directory, *self.hidden))

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
        return evaluate(policy, command, principal, cwd, env, family, sandboxed=True)  # its sandbox masks secrets

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
            files = self._bind_files(policy, principal, cwd, result.analysis.commands, runs_with)
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
            self.audit.append(
                "decision",
                **base,
                arguments=arguments,
                decision=decision.verdict.label,
                rule=decision.rule,
                reasons=[r.to_json() for r in decision.reasons],
                data={**(data or {}), **origin.current()},  # how the call came (MCP): for exporters
            )
        except AuditUnavailable as exc:
            return error(call_id, "denied", "AUDIT_UNAVAILABLE", f"the decision could not be recorded: {exc}")
        _mark_recorded(call_id)
        _timed(call_id, tool)
        if decision.verdict is Verdict.DENY:
            jail = any(r.stage == "pathjail" for r in decision.reasons)
            return _denied(call_id, "PATH_OUTSIDE_JAIL" if jail else "POLICY_DENIED", decision)
        if decision.verdict is Verdict.ASK:
            request = ApprovalRequest.bind(
                call_id, principal, tool, subject, str(cwd), dict(env), decision.rule,
                "; ".join(r.message for r in decision.reasons), policy.sha256,
                tuple(r.rule for r in decision.reasons) or (None,), inherited, files,
            )  # fmt: skip
            client_session = CLIENT_SESSION.get()
            granted_by = self.session_grant(principal, client_session, request.digest)
            if granted_by is not None:
                answer: Approval | None = Approval(True, granted_by, request.digest, "session")
            elif unattended:
                answer = Approval(False, "nobody", request.digest, "unattended", "no supervisor is asked here")
            else:
                asked = time.perf_counter()
                answer = self.approver.decide(request, self.approval_timeout_s)
                answered = "timeout" if answer is None else "allow" if answer.approved else "deny"
                metrics.APPROVAL_WAIT.labels(answered).observe(time.perf_counter() - asked)
            bound = answer is not None and answer.digest == request.digest
            unchanged = self.policy.sha256 == policy.sha256  # approved under another policy: void
            # the stored variables the command will inherit are the ones the supervisor saw
            same_env = inherited is None or self.env.effective(policy, principal) == request.inherited
            gone = cancellation.cancelled()  # the caller went away (or the server stops) while it waited
            granted = answer is not None and answer.approved and bound and unchanged and same_env and not gone
            # approved for the session: kept for this principal in this client session only; a
            # call that came in none (the CLI's single run) has nothing to keep it for
            kept = granted and answer is not None and self.keep_session_grant(principal, client_session, answer)
            note = answer.note if answer is not None else ""
            withdrawn = gone and answer is None  # nobody answered, and nobody ever will: say why
            why_gone = cancellation.reason() or "the call was cancelled (its client went away)"
            try:
                if withdrawn:
                    self.audit.append(
                        "approval_withdrawn", **base, decision="deny", rule=decision.rule,
                        data={"digest": request.digest, "why": why_gone},
                    )  # fmt: skip
                else:
                    self.audit.append(
                        "approval",
                        **base,
                        decision="allow" if granted else "deny",
                        rule=decision.rule,
                        data={
                            "digest": request.digest,
                            "answered": answer is not None,
                            "by": answer.by if answer else None,
                            "how": answer.how if answer else "timeout",
                            "bound": bound,
                            "policy_unchanged": unchanged,
                            **({"reason": note} if note else {}),
                            **({} if same_env else {"env_unchanged": False}),
                            **({"cancelled": True} if gone else {}),
                            **({"files": [f.to_json() for f in files]} if files else {}),
                            **({"client_session": client_session} if client_session else {}),
                            **_session_scope(answer, kept),
                        },
                    )
            except AuditUnavailable as exc:
                return error(call_id, "denied", "AUDIT_UNAVAILABLE", f"the approval could not be recorded: {exc}")
            if gone:
                why = f": {why_gone}" if withdrawn else ""
                return error(
                    call_id, "denied", "CALL_CANCELLED", f"the call was cancelled while it waited for approval{why}"
                )
            if answer is None:
                return error(call_id, "denied", "APPROVAL_TIMEOUT", "no supervisor answered in time")
            if not unchanged:
                return error(call_id, "denied", "APPROVAL_DENIED", "the policy changed after the approval")
            if not same_env and answer.approved:
                why = "the principal's stored variables (the env tool) changed while the call waited for approval"
                return error(call_id, "denied", "APPROVAL_DENIED", why)
            if not granted:
                because = f": {note}" if note else ""
                return error(call_id, "denied", "APPROVAL_DENIED", f"denied by {answer.by}{because}")
            return Gated(policy, base, bound=files)
        return Gated(policy, base)

    def session_grant(self, principal: str, client_session: str | None, digest: str) -> str | None:
        """Who approved the call of `digest` for the rest of `client_session` (None: nobody did,
        or the call comes in no session)."""
        if client_session is None:
            return None
        with self._session_lock:
            return self._session_approved.get((principal, client_session), {}).get(digest)

    def keep_session_grant(self, principal: str, client_session: str | None, answer: Approval) -> bool:
        """Keep an approval "for the session" for `principal` in `client_session`; False (kept
        nowhere) when the answer was not for the session, or the call came in no session."""
        if client_session is None or not answer.how.endswith("-session"):
            return False
        with self._session_lock:
            self._session_approved.setdefault((principal, client_session), {})[answer.digest] = answer.by
        return True

    def end_client_session(self, client_session: str) -> None:
        """The client session ended (its MCP connection closed): every call approved "for the
        session" in it must be asked again, in any other session. Recorded when there were some."""
        with self._session_lock:
            ended = {k: v for k, v in self._session_approved.items() if k[1] == client_session}
            for key in ended:
                del self._session_approved[key]
        for (principal, _), digests in ended.items():
            with contextlib.suppress(AuditUnavailable):
                self.audit.append(
                    "session_approvals_ended", principal=principal,
                    data={"client_session": client_session, "digests": sorted(digests)},
                )  # fmt: skip

    def _bind_files(
        self, policy: CompiledPolicy, principal: str, cwd: Path, commands: tuple[Command, ...],
        env: Mapping[str, str | None],
    ) -> tuple[runfiles.BoundFile, ...]:  # fmt: skip
        grant = policy.grant(principal)
        real = Path(os.path.realpath(cwd))  # the jail checked where it leads; files are named from there
        found = runfiles.named(commands, real, policy.home, env)
        return runfiles.bind(found, (*grant.read_roots, *grant.write_roots))

    def still_bound(self, gated: Gated) -> dict[str, Any] | None:
        """None when every file the call's approval was bound to is as the supervisor saw it,
        read again now (call it as late as the launch allows: right before the command starts).
        Otherwise the approval is void: recorded (`approval_void`) and the denial returned."""
        if not gated.bound:
            return None
        policy, principal = gated.policy, gated.base["principal"]
        grant = policy.grant(principal)
        why = runfiles.changed(gated.bound, (*grant.read_roots, *grant.write_roots), policy.workspace)
        if not why:
            return None
        message = f"approval_void: {'; '.join(why)}"
        with contextlib.suppress(AuditUnavailable):  # denied whether or not it is recorded
            self.audit.append(
                "approval_void", **gated.base, decision="deny",
                data={"why": why, "files": [f.to_json() for f in gated.bound]},
            )  # fmt: skip
        return error(gated.base["call_id"], "denied", "APPROVAL_VOID", message)

    def record_result(
        self, gated: Gated | dict[str, Any], outcome: dict[str, Any], event: str = "result"
    ) -> dict[str, Any]:
        """Audit what happened (without bulky or secret fields) and build the envelope."""
        base = gated.base if isinstance(gated, Gated) else gated
        # the call's own id, even when the outcome is a part's (a line of a session write)
        envelope = {"call_id": base["call_id"], **{k: v for k, v in outcome.items() if k != "call_id"}}
        recorded = {k: v for k, v in outcome.items() if k not in _UNRECORDED}
        for k in ("stdout", "stderr", "output"):
            if isinstance(outcome.get(k), str):
                recorded[f"{k}_bytes"] = len(outcome[k])
        try:
            self.audit.append(event, **base, data=recorded)
        except AuditUnavailable as exc:
            envelope["warning"] = {"code": "AUDIT_UNAVAILABLE", "message": f"the result could not be recorded: {exc}"}
        else:
            _timed(base["call_id"], base["tool"], str(outcome.get("status")))
        return envelope

    def profile(self, policy: CompiledPolicy, principal: str) -> sandbox.Profile:
        """What every executor's sandbox gets from the policy: roots, protected paths, the
        gateway's private directories (never shown), quotas, network, Landlock, and HOME (the
        policy's `home`: `~` means the same to the jail, the files tool and the commands)."""
        home = str(policy.home) if policy.home is not None else None
        hooks = _NetworkHooks(self, principal) if policy.network_of(principal)[1] is not None else None
        return sandbox_profile(policy, principal, self.private_dirs(), home, self._quarantined, hooks)

    def _quarantined(self, event: str, data: dict[str, object]) -> None:
        """The nested-repository watcher moved one aside, tripped, or failed (sandbox/nested.py).
        On a trip (nested repositories put back again and again in one root: something running
        keeps planting them), every session and durable process of each principal that may write there
        is stopped."""
        log.warning(event, **data)
        with contextlib.suppress(AuditUnavailable):
            self.audit.append(event, tool="sandbox", data=data)
        if event != "nested_repository_tripwire":
            return
        where = Path(str(data.get("path", "")))

        def stop() -> None:  # on its own thread: the watcher's lock is held here, and stopping takes others
            with contextlib.suppress(Exception):
                policy = self.policy
                for principal in policy.grants:
                    if any(root == where or root in where.parents for root in policy.grant(principal).write_roots):
                        self._stop_everything_of(principal)

        threading.Thread(target=stop, name="nested-tripwire", daemon=True).start()

    def _stop_everything_of(self, principal: str) -> None:
        for session in self.sessions.of(principal):
            with contextlib.suppress(Exception):
                self.sessions.kill(principal, session.id)
        if self._processes is not None:
            with contextlib.suppress(Exception):
                self._processes.stop_all(principal)
        with contextlib.suppress(AuditUnavailable):
            self.audit.append("principal_stopped", principal=principal, tool="sandbox",
                              data={"why": "nested_repository_tripwire"})  # fmt: skip

    def _session_event(self, event: str, session: Any, data: dict[str, Any]) -> None:
        with contextlib.suppress(AuditUnavailable):
            self.audit.append(
                event, principal=session.principal, tool="session", data={"session_id": session.id, **data}
            )

    def unsafe_setup(self, policy: CompiledPolicy, principal: str) -> str:
        """Why this setup must not execute: the agent could rewrite the audit log, the policy,
        the approvals queue or the gateway's state if one lies inside its write roots."""
        return unsafe_setup(policy, principal, self.audit.directory, self.hidden)


def sandbox_profile(
    policy: CompiledPolicy,
    principal: str,
    private: tuple[Path, ...],
    home: str | None,
    report: Callable[[str, dict[str, object]], None] | None = None,
    egress_hooks: Any = None,
) -> sandbox.Profile:
    """The sandbox `principal`'s commands run in: its roots, protected paths, the gateway's
    `private` directories and its user's home (never shown), quotas, network (`egress_hooks`:
    what records a policy network's connections and answers its asks; without, such a network
    stays closed), Landlock; HOME is `home` (None: the sandbox's private one)."""
    grant = policy.grant(principal)
    lim = limits(policy, principal)
    settings = policy.policy.sandbox
    everything, egress = policy.network_of(principal)
    return sandbox.Profile(
        principal=principal,
        read_roots=grant.read_roots,
        write_roots=grant.write_roots,
        protected=grant.protected,
        private=private + (Path(os.path.realpath(Path.home())),),
        quotas=sandbox.Quotas(
            memory_bytes=lim.get("memory_bytes", DEFAULT_MEMORY_BYTES),
            pids=lim.get("pids", DEFAULT_PIDS),
            cpu_seconds=lim.get("cpu_seconds", DEFAULT_CPU_SECONDS),
            file_bytes=lim.get("file_bytes", DEFAULT_FILE_BYTES),
            open_files=lim.get("open_files", DEFAULT_OPEN_FILES),
            tmpfs_bytes=lim.get("tmpfs_bytes", DEFAULT_TMPFS_BYTES),
            disk_bytes=lim.get("disk_bytes", DEFAULT_DISK_BYTES),
            disk_source=limit_source(policy, principal, "disk_bytes"),
        ),
        network=everything,
        egress=egress,
        egress_hooks=egress_hooks,
        landlock="required" if settings.require_landlock else "optional",
        etc=tuple(settings.etc),
        path=tuple(str(p) for p in grant.path),
        report=report,
        home=home,
        deny_read=grant.deny_read,
        deny_write=grant.deny_write,
    )


def unsafe_setup(policy: CompiledPolicy, principal: str, audit_dir: Path, hidden: tuple[Path, ...]) -> str:
    """Why a gateway with this audit log and these private directories (`hidden`: the approvals
    queue, its state, ...) must not decide for `principal`: one of them, or the policy, lies
    inside the principal's write roots, so the agent could rewrite it. Empty when none does."""
    roots = [(root, str(root), os.path.join(str(root), "")) for root in policy.grant(principal).write_roots]
    sensitive = [("the audit log", audit_dir)]
    sensitive += [("the policy", f.parent) for f in policy.files]  # included files too
    sensitive += [("the approvals queue or the gateway's state", p) for p in hidden]
    for what, path in sensitive:
        real = os.path.realpath(path)  # resolved on every call: a link changed since counts
        for root, name, inside in roots:  # strings: Path.parents cost more than the check (every call)
            if real == name or real.startswith(inside):
                return f"{what} ({real}) lies inside the write root {root}: the agent could rewrite it"
    return ""


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


_UNRECORDED = frozenset({"stdout", "stderr", "output", "content", "image", "json", "entries", "matches", "value"})


def limits(policy: CompiledPolicy, principal: str) -> dict[str, int]:
    """The principal's limits: for each, the largest any of its roles sets."""
    out: dict[str, int] = {}
    for name in policy.policy.principals[principal].roles:
        for key, value in policy.policy.roles[name].limits.model_dump().items():
            if value is not None:
                out[key] = max(out.get(key, 0), value)
    return out


def limit_source(policy: CompiledPolicy, principal: str, key: str) -> str:
    """Where the principal's limit `key` comes from, for a message: the role that sets the
    largest (as `limits` takes it), or the gateway's default."""
    best: tuple[int, str] | None = None
    for name in policy.policy.principals[principal].roles:
        value = getattr(policy.policy.roles[name].limits, key)
        if value is not None and (best is None or value > best[0]):
            best = (value, name)
    return f"limits.{key} of role {best[1]}" if best else f"the default limits.{key} (no role of {principal} sets it)"


def _session_scope(answer: Approval | None, kept: bool) -> dict[str, Any]:
    """What an approval record says about "for the session": kept (in the record's
    `client_session`), or asked for where there is no session to keep it in."""
    if answer is None or not answer.how.endswith("-session"):
        return {}
    if kept:
        return {"scope": "session"}
    return {"scope": "once", "session_scope_refused": "the call came in no client session: approved this once"}


def new_call_id() -> str:
    """A call's id in the audit log and its envelope."""
    return uuid.uuid4().hex[:16]


def error(call_id: str, status: str, code: str, message: str) -> dict[str, Any]:
    """An envelope ending a call with `code` (docs/tools.md lists the codes)."""
    return {"status": status, "call_id": call_id, "error": {"code": code, "message": message}}


def _denied(call_id: str, code: str, decision: Decision) -> dict[str, Any]:
    out = error(call_id, "denied", code, "; ".join(r.message for r in decision.reasons))
    out["rule"] = decision.rule
    out["reasons"] = [r.to_json() for r in decision.reasons]
    return out


class _NetworkHooks:
    """What a sandbox's resolver and proxy (sandbox/egress) use of the gate: the audit log, and
    the approvals of a host under `ask` (the same approver, console and queue as a call's ask)."""

    def __init__(self, gateway: Gateway, principal: str) -> None:
        self.gateway = gateway
        self.principal = principal
        self.client_session = CLIENT_SESSION.get()  # the session of the call whose sandbox this is

    def current_call(self) -> str | None:
        current = _CURRENT.get()
        return current.call_id if current is not None else None

    def record(self, event: str, call_id: str | None, principal: str, data: dict[str, Any]) -> None:
        self.gateway.audit.append(
            event, call_id=call_id, principal=principal, tool="network", policy_sha256=self.gateway.policy.sha256,
            data=data,
        )  # fmt: skip

    def ask(
        self, call_id: str | None, principal: str, host: str, port: int, command: str, cancel: threading.Event
    ) -> tuple[bool, str, str]:
        gw = self.gateway
        policy = gw.policy
        egress = policy.network_of(principal)[1]
        decision = egress.decide(host, port) if egress is not None else None
        if decision is None or decision.verdict != "ask":  # the policy changed while it waited: decide again
            return (decision is not None and decision.verdict == "allow"), "the policy", "decided again"
        asked = new_call_id()
        why = f"the command {command[:200]!r} wants to reach {host}:{port} ({decision.why})"
        request = ApprovalRequest.bind(
            asked, principal, "network", f"connect {host}:{port}", "", {}, decision.rule, why, policy.sha256,
            (decision.rule,),
        )  # fmt: skip
        granted_by = gw.session_grant(principal, self.client_session, request.digest)
        if granted_by is not None:
            answer: Approval | None = Approval(True, granted_by, request.digest, "session")
        else:
            with cancellation.handling(cancel):  # the sandbox ending withdraws the question
                answer = gw.approver.decide(request, gw.approval_timeout_s)
        bound = answer is not None and answer.digest == request.digest
        unchanged = gw.policy.sha256 == policy.sha256
        withdrawn = cancel.is_set()
        granted = answer is not None and answer.approved and bound and unchanged and not withdrawn
        if granted and answer is not None:
            gw.keep_session_grant(principal, self.client_session, answer)
        how = "withdrawn: the sandbox ended" if withdrawn else answer.how if answer is not None else "timeout"
        by = answer.by if answer is not None else "nobody"
        gw.audit.append(
            "approval", call_id=asked, principal=principal, tool="network", policy_sha256=policy.sha256,
            decision="allow" if granted else "deny", rule=decision.rule,
            **({"parent": call_id} if call_id else {}),
            data={"host": host, "port": port, "digest": request.digest, "answered": answer is not None, "by": by,
                  "how": how, "bound": bound, "policy_unchanged": unchanged,
                  **({"reason": answer.note} if answer is not None and answer.note else {})},
        )  # fmt: skip
        return granted, by, "approved" if granted else ("no answer in time" if answer is None else "denied")
