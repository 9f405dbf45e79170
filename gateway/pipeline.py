"""The decision pipeline. `evaluate()` is pure: it runs the decision stages and nothing else (no
prompts, no processes; the only I/O is reading the filesystem to resolve paths). `gateway check`
is exactly this. Execution, approval and audit come with the pipeline issue.

Stages, in order, each able only to make the verdict stricter:

    parse        the analyser: every command, or a denial        (gateway.analysis)
    tool         may this principal use the tool family at all    (casbin)
    permissions  the rule deciding each command                   (stages/permissions.py)
    second       an unconfirmed second opinion: the policy decides (default ask)
    pathjail     every path inside the principal's roots          (stages/pathjail.py)

Any exception inside a stage is a denial with code `internal_error`: fail closed.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway import sandbox
from gateway.analysis import Analysis, Assignment, Word, analyze
from gateway.analysis.hazards import PROTECTED_PREFIXES, PROTECTED_VARIABLES
from gateway.approval import Approval, ApprovalRequest, Approver, DenyAll
from gateway.audit import AuditLog, AuditUnavailable
from gateway.calls import RunCall
from gateway.decision import Decision, Reason, Verdict
from gateway.executors import shell
from gateway.log import log
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Tool
from gateway.stages import pathjail, permissions


@dataclass(frozen=True)
class CheckResult:
    decision: Decision
    analysis: Analysis | None

    def to_json(self) -> dict[str, Any]:
        out = self.decision.to_json()
        out["commands"] = [c.to_json() for c in self.analysis.commands] if self.analysis else []
        if self.analysis is not None:
            out["second_opinion"] = self.analysis.second_opinion.to_json()
        return out


def evaluate(
    policy: CompiledPolicy, command: str, principal: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> CheckResult:
    """The decision for running `command` as `principal` in `cwd` (default: the workspace), with
    `env` set for it (checked like `NAME=value` before every command)."""
    analysis: Analysis | None = None
    try:
        grant = policy.grant(principal)
        analysis = analyze(command)
        if analysis.denial is not None:
            d = analysis.denial
            return CheckResult(
                Decision(Verdict.DENY, None, (Reason("parse", d.code, d.message, None, d.details),)), analysis
            )
        decisions: list[Decision] = []
        tool = Verdict.parse(policy.tool_decision(principal, Tool.RUN).value)
        if tool is not Verdict.ALLOW:
            decisions.append(
                Decision(
                    tool, None, (Reason("tool", f"tool_{tool.label}", f"the run tool is {tool.label} for {principal}"),)
                )
            )
        all_matches: list[list[permissions.Match]] = []
        extra = tuple(Assignment(k, Word(v, (), v)) for k, v in (env or {}).items())
        for name in env or {}:
            if name in PROTECTED_VARIABLES or name.startswith(PROTECTED_PREFIXES) or not name.isidentifier():
                reason = Reason("parse", "protected_variable", f"env: setting {name} is refused")
                return CheckResult(Decision(Verdict.DENY, None, (reason,)), analysis)
        for cmd in analysis.commands:
            if extra and cmd.argv:
                cmd = replace(cmd, assignments=cmd.assignments + extra)
            decision, matches = permissions.decide_command(policy, principal, cmd)
            decisions.append(decision)
            all_matches.append(matches)
        opinion = analysis.second_opinion
        if not opinion.confirmed:
            verdict = Verdict.parse(policy.policy.second_opinion.unconfirmed.value)
            what = ", ".join(opinion.blind_spots) or opinion.detail or opinion.status.value
            decisions.append(
                Decision(
                    verdict,
                    None,
                    (
                        Reason(
                            "second_opinion",
                            f"unconfirmed_{opinion.status.value}",
                            f"the second parser could not confirm the analysis ({what})",
                        ),
                    ),
                )
            )
        decisions.append(pathjail.check(policy, grant, cwd or policy.workspace, analysis.commands, all_matches))
        return CheckResult(_strictest(decisions), analysis)
    except Exception as exc:  # fail closed: a broken stage is a denial, never an allow
        reason = Reason("pipeline", "internal_error", f"{type(exc).__name__}: {exc}")
        return CheckResult(Decision(Verdict.DENY, None, (reason,)), analysis)


def _strictest(decisions: list[Decision]) -> Decision:
    """The strictest verdict; its rule decides. An allow keeps only the rules' reasons."""
    merged = Decision.merge(decisions)
    if merged.verdict is Verdict.ALLOW:
        return merged
    # the rule of a denial is the rule that denied, not an allowing rule of another command
    rule = next((d.rule for d in decisions if d.verdict is merged.verdict and d.rule), None)
    reasons = tuple(r for d in decisions if d.verdict is merged.verdict for r in d.reasons)
    return Decision(merged.verdict, rule, reasons)


APPROVAL_TIMEOUT_S = 120.0


class Gateway:
    """The whole pipeline for one tool call: decide, audit, approve, execute, audit.

    Built from a policy source (a callable returning the policy in force, e.g.
    `PolicyHolder.current`), an approver, an audit log and an executor. `handle(call)` never
    raises: every failure is a result envelope with a stable error code, and is audited when the
    audit log works. Nothing executes unless the decision record is on disk.
    """

    def __init__(
        self,
        policy: Any,
        audit: AuditLog,
        approver: Approver | None = None,
        executor: Any = shell.run,
        approval_timeout_s: float = APPROVAL_TIMEOUT_S,
        hidden: tuple[Path, ...] = (),
    ) -> None:
        self._policy = policy if callable(policy) else (lambda: policy)
        self.audit = audit
        self.approver = approver or DenyAll()
        self.executor = executor
        self.approval_timeout_s = approval_timeout_s
        # directories the sandbox hides besides home and the audit log (e.g. the approvals queue)
        queue_dir = getattr(self.approver, "state_dir", None)
        self.hidden = (*hidden, *((queue_dir,) if queue_dir else ()))
        # "approve for this session": the digests of calls a supervisor approved for the rest of
        # this gateway's life. A digest binds tool, command, cwd, env and the policy's hash: the
        # narrowest rule covering that one call, void when the policy changes.
        self._session_approved: set[str] = set()

    def handle(self, call: RunCall) -> dict[str, Any]:
        call_id = uuid.uuid4().hex[:16]
        try:
            out = self._handle(call, call_id)
            log.info("call", call_id=call_id, principal=call.principal, tool=call.tool, status=out.get("status"),
                     code=(out.get("error") or {}).get("code"))  # fmt: skip
            return out
        except Exception as exc:  # fail closed, and say so
            envelope = _error(call_id, "denied", "INTERNAL_ERROR", f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):  # the envelope must come back whatever the log does
                self.audit.append(
                    "error", call_id=call_id, principal=call.principal, tool=call.tool, data=envelope["error"]
                )
            return envelope

    def _handle(self, call: RunCall, call_id: str) -> dict[str, Any]:
        policy: CompiledPolicy = self._policy()
        cwd = Path(call.cwd) if call.cwd else policy.workspace
        if not cwd.is_absolute():
            cwd = policy.workspace / cwd
        unsafe = self._unsafe_setup(policy, call.principal)
        if unsafe:
            return _error(call_id, "denied", "UNSAFE_SETUP", unsafe)
        result = evaluate(policy, call.command, call.principal, cwd, call.env)
        decision = result.decision
        base = {"call_id": call_id, "principal": call.principal, "tool": call.tool, "policy_sha256": policy.sha256}
        arguments = call.model_dump(exclude={"tool", "principal"})
        try:
            self.audit.append(
                "decision",
                **base,
                arguments=arguments,
                decision=decision.verdict.label,
                rule=decision.rule,
                reasons=[r.to_json() for r in decision.reasons],
                data={
                    "commands": [
                        {"argv": c.to_json()["argv"], "redirects": c.to_json().get("redirects", [])}
                        for c in result.analysis.commands
                    ]
                    if result.analysis
                    else []
                },
            )
        except AuditUnavailable as exc:
            return _error(call_id, "denied", "AUDIT_UNAVAILABLE", f"the decision could not be recorded: {exc}")
        if decision.verdict is Verdict.DENY:
            jail = any(r.stage == "pathjail" for r in decision.reasons)
            return _denied(call_id, "PATH_OUTSIDE_JAIL" if jail else "POLICY_DENIED", decision)
        if decision.verdict is Verdict.ASK:
            request = ApprovalRequest.bind(
                call_id, call.principal, call.tool, call.command, str(cwd), dict(call.env), decision.rule,
                "; ".join(r.message for r in decision.reasons), policy.sha256,
            )  # fmt: skip
            if request.digest in self._session_approved:
                answer: Approval | None = Approval(True, "session", request.digest, "session")
            else:
                answer = self.approver.decide(request, self.approval_timeout_s)
            bound = answer is not None and answer.digest == request.digest
            unchanged = self._policy().sha256 == policy.sha256  # approved under another policy: void
            granted = answer is not None and answer.approved and bound and unchanged
            if granted and answer is not None and answer.how.endswith("-session"):
                self._session_approved.add(answer.digest)
            try:
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
                    },
                )
            except AuditUnavailable as exc:
                return _error(call_id, "denied", "AUDIT_UNAVAILABLE", f"the approval could not be recorded: {exc}")
            if answer is None:
                return _error(call_id, "denied", "APPROVAL_TIMEOUT", "no supervisor answered in time")
            if not unchanged:
                return _error(call_id, "denied", "APPROVAL_DENIED", "the policy changed after the approval")
            if not granted:
                return _error(call_id, "denied", "APPROVAL_DENIED", f"denied by {answer.by}")
        grant = policy.grant(call.principal)
        role_limits = _limits(policy, call.principal)
        timeout = min(
            call.timeout_ms or role_limits.get("timeout_ms") or 120_000, role_limits.get("timeout_ms") or 10**9
        )
        try:
            outcome = self.executor(
                call.command,
                cwd,
                grant.write_roots,
                env=dict(call.env),
                home=policy.home,
                timeout_ms=timeout,
                output_bytes=role_limits.get("output_bytes") or (1 << 20),
                read_only=grant.protected,
                network=policy.policy.sandbox.network,
                hidden=(Path.home(), self.audit.directory, *self.hidden),
                read_roots=grant.read_roots,
                limits=sandbox.Limits(
                    cpu_seconds=role_limits.get("cpu_seconds") or sandbox.Limits.cpu_seconds,
                    file_bytes=role_limits.get("file_bytes") or sandbox.Limits.file_bytes,
                    open_files=role_limits.get("open_files") or sandbox.Limits.open_files,
                ),
            )
        except sandbox.SandboxUnavailable as exc:
            outcome = {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": str(exc)}}
        envelope = {"call_id": call_id, **outcome}
        try:
            self.audit.append(
                "result",
                **base,
                data={k: v for k, v in outcome.items() if k not in ("stdout", "stderr")}
                | {"stdout_bytes": len(outcome.get("stdout", "")), "stderr_bytes": len(outcome.get("stderr", ""))},
            )
        except AuditUnavailable as exc:
            envelope["warning"] = {"code": "AUDIT_UNAVAILABLE", "message": f"the result could not be recorded: {exc}"}
        return envelope

    def _unsafe_setup(self, policy: CompiledPolicy, principal: str) -> str:
        """Why this setup must not execute: the agent could rewrite the audit log, the policy or
        the approvals queue if one of them lies inside its write roots."""
        roots = policy.grant(principal).write_roots
        sensitive = [("the audit log", self.audit.directory)]
        sensitive += [("the policy", f.parent) for f in policy.files]  # included files too
        sensitive += [("the approvals queue", p) for p in self.hidden]
        for what, path in sensitive:
            real = Path(os.path.realpath(path))
            for root in roots:
                if real == root or root in real.parents:
                    return f"{what} ({real}) lies inside the write root {root}: the agent could rewrite it"
        return ""


def _limits(policy: CompiledPolicy, principal: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in policy.policy.principals[principal].roles:
        for key, value in policy.policy.roles[name].limits.model_dump().items():
            if value is not None:
                out[key] = max(out.get(key, 0), value)
    return out


def _error(call_id: str, status: str, code: str, message: str) -> dict[str, Any]:
    return {"status": status, "call_id": call_id, "error": {"code": code, "message": message}}


def _denied(call_id: str, code: str, decision: Decision) -> dict[str, Any]:
    out = _error(call_id, "denied", code, "; ".join(r.message for r in decision.reasons))
    out["rule"] = decision.rule
    out["reasons"] = [r.to_json() for r in decision.reasons]
    return out
