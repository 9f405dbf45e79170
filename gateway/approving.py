"""Waiting for approval, one of the gate's jobs (gateway/pipeline.py composes them): a call the
policy asks about goes to the approver (a terminal, the queue, the console, the MCP client), and
comes back granted only if the answer is bound to this very call (its digest), the policy has not
changed, the stored variables it inherits are the ones the supervisor saw, and its caller is
still there. An approval "for the session" is kept for that principal in that client session
only. The files an asked command runs are bound to the approval (gateway/runfiles.py) and read
again right before it starts (`still_bound`). A sandbox's network asks come here too.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway import cancellation, metrics, runfiles
from gateway.analysis import Command
from gateway.approval import CLIENT_SESSION, Approval, ApprovalRequest, Approver
from gateway.audit import AuditUnavailable
from gateway.audit.sink import AuditSink
from gateway.decision import Decision
from gateway.policy.compile import CompiledPolicy
from gateway.recording import current_call_id, error, new_call_id


class Approvals:
    """The approver a gate asks, how long it waits, and the approvals kept "for the session"."""

    def __init__(
        self, approver: Approver, timeout_s: float, audit: AuditSink, policy: Callable[[], CompiledPolicy]
    ) -> None:
        self.approver = approver
        self.timeout_s = timeout_s
        self.audit = audit
        self.current_policy = policy
        # "approve for this session": the digests of calls a supervisor approved for the rest of
        # the client session they were asked in (an MCP connection: approval.CLIENT_SESSION). A
        # digest binds principal, tool, command, cwd, env, the files it runs and the policy's
        # hash: the narrowest rule covering that one call, void when the policy changes.
        self._session_approved: dict[tuple[str, str], dict[str, str]] = {}
        """(principal, client session) -> digests a supervisor approved there -> that supervisor
        (each repeat names them). Dropped when the session ends (`end_client_session`)."""
        self._session_lock = threading.Lock()

    def ask(
        self,
        base: dict[str, Any],
        subject: str,
        cwd: Path,
        env: dict[str, str],
        decision: Decision,
        policy: CompiledPolicy,
        unattended: bool,
        inherited: dict[str, str] | None,
        files: tuple[runfiles.BoundFile, ...],
        inherited_now: Callable[[], dict[str, str]],
    ) -> dict[str, Any] | None:
        """Ask about the call of `base` (its decision recorded) and record the answer. None: it
        is granted; else the envelope that ends it. `inherited_now`: the stored variables the
        command would inherit now (they must be the ones the supervisor saw)."""
        call_id, principal, tool = base["call_id"], base["principal"], base["tool"]
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
            answer = self.approver.decide(request, self.timeout_s)
            answered = "timeout" if answer is None else "allow" if answer.approved else "deny"
            metrics.APPROVAL_WAIT.labels(answered).observe(time.perf_counter() - asked)
        bound = answer is not None and answer.digest == request.digest
        unchanged = self.current_policy().sha256 == policy.sha256  # approved under another policy: void
        # the stored variables the command will inherit are the ones the supervisor saw
        same_env = inherited is None or inherited_now() == request.inherited
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
                        **session_scope(answer, kept),
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
        return None

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

    def still_bound(
        self, policy: CompiledPolicy, base: dict[str, Any], bound: tuple[runfiles.BoundFile, ...]
    ) -> dict[str, Any] | None:
        """None when every file the call's approval was bound to is as the supervisor saw it,
        read again now. Otherwise the approval is void: recorded (`approval_void`) and the
        denial returned."""
        if not bound:
            return None
        grant = policy.grant(base["principal"])
        why = runfiles.changed(bound, (*grant.read_roots, *grant.write_roots), policy.workspace)
        if not why:
            return None
        message = f"approval_void: {'; '.join(why)}"
        with contextlib.suppress(AuditUnavailable):  # denied whether or not it is recorded
            self.audit.append(
                "approval_void", **base, decision="deny",
                data={"why": why, "files": [f.to_json() for f in bound]},
            )  # fmt: skip
        return error(base["call_id"], "denied", "APPROVAL_VOID", message)


def bind_files(
    policy: CompiledPolicy, principal: str, cwd: Path, commands: tuple[Command, ...], env: Mapping[str, str | None]
) -> tuple[runfiles.BoundFile, ...]:
    """The files of the principal's roots an asked command runs, read and bound (runfiles.py)."""
    grant = policy.grant(principal)
    real = Path(os.path.realpath(cwd))  # the jail checked where it leads; files are named from there
    found = runfiles.named(commands, real, policy.home, env)
    return runfiles.bind(found, (*grant.read_roots, *grant.write_roots))


def session_scope(answer: Approval | None, kept: bool) -> dict[str, Any]:
    """What an approval record says about "for the session": kept (in the record's
    `client_session`), or asked for where there is no session to keep it in."""
    if answer is None or not answer.how.endswith("-session"):
        return {}
    if kept:
        return {"scope": "session"}
    return {"scope": "once", "session_scope_refused": "the call came in no client session: approved this once"}


class NetworkHooks:
    """What a sandbox's resolver and proxy (sandbox/egress) use of the gate: the audit log, and
    the approvals of a host under `ask` (the same approver, console and queue as a call's ask)."""

    def __init__(self, approvals: Approvals, principal: str) -> None:
        self.approvals = approvals
        self.principal = principal
        self.client_session = CLIENT_SESSION.get()  # the session of the call whose sandbox this is

    def current_call(self) -> str | None:
        return current_call_id()

    def record(self, event: str, call_id: str | None, principal: str, data: dict[str, Any]) -> None:
        self.approvals.audit.append(
            event, call_id=call_id, principal=principal, tool="network",
            policy_sha256=self.approvals.current_policy().sha256, data=data,
        )  # fmt: skip

    def ask(
        self, call_id: str | None, principal: str, host: str, port: int, command: str, cancel: threading.Event
    ) -> tuple[bool, str, str]:
        approvals = self.approvals
        policy = approvals.current_policy()
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
        granted_by = approvals.session_grant(principal, self.client_session, request.digest)
        if granted_by is not None:
            answer: Approval | None = Approval(True, granted_by, request.digest, "session")
        else:
            with cancellation.handling(cancel):  # the sandbox ending withdraws the question
                answer = approvals.approver.decide(request, approvals.timeout_s)
        bound = answer is not None and answer.digest == request.digest
        unchanged = approvals.current_policy().sha256 == policy.sha256
        withdrawn = cancel.is_set()
        granted = answer is not None and answer.approved and bound and unchanged and not withdrawn
        if granted and answer is not None:
            approvals.keep_session_grant(principal, self.client_session, answer)
        how = "withdrawn: the sandbox ended" if withdrawn else answer.how if answer is not None else "timeout"
        by = answer.by if answer is not None else "nobody"
        approvals.audit.append(
            "approval", call_id=asked, principal=principal, tool="network", policy_sha256=policy.sha256,
            decision="allow" if granted else "deny", rule=decision.rule,
            **({"parent": call_id} if call_id else {}),
            data={"host": host, "port": port, "digest": request.digest, "answered": answer is not None, "by": by,
                  "how": how, "bound": bound, "policy_unchanged": unchanged,
                  **({"reason": answer.note} if answer is not None and answer.note else {})},
        )  # fmt: skip
        return granted, by, "approved" if granted else ("no answer in time" if answer is None else "denied")
