"""Deciding an agent's hook call: the same policy, the same stages as `gateway check` and the
MCP tools, the decision record written before the answer leaves.

A shell command goes through `pipeline.evaluate` (parse, tool family, rules, second opinion,
path jail; the decision cache included); file tools through the files family's path decision
(`tools.files.decide_paths`). On top, as for the MCP tools: nothing the gateway keeps (its audit
log, keys, state) may be named, since here no sandbox hides it; and a setup whose write roots
hold the audit log or the policy is refused outright.

What is different from the MCP tools is who runs the call: the agent does, with its own tool,
after this answer; this gate only decides. An `ask` is the agent's user's to answer (Claude
Code and Gemini CLI prompt them; Codex cannot, so there it is a denial).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.audit import AuditLog, AuditUnavailable
from gateway.decide import evaluate
from gateway.decision import Decision, Reason, Verdict
from gateway.hooks import formats
from gateway.hooks.formats import Answer, HookCall, HookInputError, Paths
from gateway.pipeline import new_call_id, unsafe_setup
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Tool
from gateway.stages.pathjail import PathRefused, settled_realpath
from gateway.tools.files import decide_paths, private_refusal

ADVICE = {
    "deny": "Do not retry it in another form: the policy decides the same way. If it is needed, ask the user.",
    "ask": "The policy asks a person to approve this call.",
}


class HookService:
    def __init__(
        self,
        policy: Callable[[], CompiledPolicy],
        audit: AuditLog,
        principal: str,
        private: tuple[Path, ...] = (),
    ) -> None:
        self._policy = policy
        self.audit = audit
        self.principal = principal
        self.private = tuple(Path(p).resolve() for p in (audit.directory, *private))

    def handle(self, agent: str, raw: bytes) -> Answer:
        """The answer to one hook call, in `agent`'s format. Never raises: any failure is a denial."""
        if agent not in formats.AGENTS:
            return formats.answer("", "deny", f"unknown agent {agent!r}")
        call_id = new_call_id()
        try:
            call = formats.parse(agent, raw)
        except HookInputError as exc:
            reason = Reason("hook", "hook_input_invalid", str(exc))
            return self._record(call_id, agent, None, Decision(Verdict.DENY, None, (reason,)), {}, raw_bytes=len(raw))
        try:
            policy = self._policy()
            decision, data = self.decide(policy, call)
        except Exception as exc:  # fail closed: a broken stage is a denial
            reason = Reason("pipeline", "internal_error", f"{type(exc).__name__}: {exc}")
            decision, data, policy = Decision(Verdict.DENY, None, (reason,)), {}, None
        return self._record(call_id, agent, call, decision, data, policy=policy)

    def decide(self, policy: CompiledPolicy, call: HookCall) -> tuple[Decision, dict[str, Any]]:
        unsafe = unsafe_setup(policy, self.principal, self.private[0], self.private[1:])
        if unsafe:
            return Decision(Verdict.DENY, None, (Reason("setup", "unsafe_setup", unsafe),)), {}
        request = call.request
        if isinstance(request, Paths):
            who = f"{call.tool} ({request.action})"
            try:  # the jail checks real paths: a symlink is decided by where it leads
                paths = [(settled_realpath(p), access) for p, access in request.paths]
            except PathRefused as exc:
                reason = Reason("pathjail", exc.code, exc.message, None, exc.details)
                return Decision(Verdict.DENY, None, (reason,)), {}
            decision = decide_paths(policy, self.principal, who, paths)
            walks = request.action in ("grep", "find", "list")
            if decision.verdict is not Verdict.DENY:
                decision = private_refusal(self.private, who, walks, paths) or decision
            return decision, {}
        result = evaluate(policy, request.command, self.principal, Path(request.cwd), None, Tool.RUN)
        decision = result.decision
        commands = []
        if result.analysis is not None:
            commands = [{"argv": c.to_json()["argv"]} for c in result.analysis.commands]
        if decision.verdict is not Verdict.DENY:
            decision = self._private_paths(decision, request.cwd) or decision
        return decision, {"commands": commands}

    def _private_paths(self, decision: Decision, cwd: str) -> Decision | None:
        """Without a sandbox to hide the gateway's records, a command naming them is refused."""
        named: list[tuple[str, str]] = [(cwd, "read")]
        for r in decision.reasons:
            if r.code == "paths_checked":
                for access in ("read", "write"):
                    named += [(p, access) for p in r.details.get(access, [])]
        return private_refusal(self.private, "the command", False, named)

    def _record(
        self,
        call_id: str,
        agent: str,
        call: HookCall | None,
        decision: Decision,
        data: dict[str, Any],
        policy: CompiledPolicy | None = None,
        raw_bytes: int | None = None,
    ) -> Answer:
        verdict = decision.verdict.label
        message = _message(decision)
        reply = formats.answer(agent, verdict, message)
        hook: dict[str, Any] = {"agent": agent, "told": reply.told}
        if call is not None:
            hook.update(tool=call.tool, session_id=call.session_id, tool_use_id=call.tool_use_id)
        if raw_bytes is not None:
            hook["input_bytes"] = raw_bytes
        family = "files" if call is not None and isinstance(call.request, Paths) else "run"
        try:
            self.audit.append(
                "decision",
                call_id=call_id,
                principal=self.principal,
                tool=family if call is not None else "hook",
                policy_sha256=policy.sha256 if policy is not None else None,
                arguments=call.arguments if call is not None else {},
                decision=verdict,
                rule=decision.rule,
                reasons=[r.to_json() for r in decision.reasons],
                data={**data, "hook": hook},
            )
        except AuditUnavailable as exc:
            with contextlib.suppress(Exception):
                return formats.answer(agent, "deny", f"denied: the decision could not be recorded ({exc})")
            return formats.answer("", "deny", "denied: the decision could not be recorded")
        return reply


def _message(decision: Decision) -> str:
    verdict = decision.verdict.label
    rule = f" (rule: {decision.rule})" if decision.rule else ""
    why = "; ".join(r.message.rstrip(".") for r in decision.reasons if r.code != "paths_checked")
    if verdict == "allow":
        return f"allowed{rule}" + (f": {why}" if why else "")
    return f"{'denied' if verdict == 'deny' else 'needs approval'}{rule}: {why or 'no reason given'}. {ADVICE[verdict]}"
