"""The `ask_user` tool: the agent asks its human a question through the approver channel (the
terminal; the MCP server adds elicitation). A password answer never reaches the audit log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.approval import Question
from gateway.calls import AskUserCall, ValidationSpec
from gateway.decision import Decision, Reason, Verdict
from gateway.pipeline import Gated, error, tool_decision
from gateway.policy.schema import Tool
from gateway.regex import safe_regex

if TYPE_CHECKING:
    from gateway.pipeline import Gateway

DEFAULT_TIMEOUT_MS = 300_000


def hint(v: ValidationSpec | None) -> str:
    if v is None:
        return ""
    parts = []
    if v.allowed_values:
        parts.append("one of: " + ", ".join(v.allowed_values))
    if v.pattern:
        parts.append(f"matching {v.pattern}")
    if v.min_length is not None:
        parts.append(f"at least {v.min_length} characters")
    if v.max_length is not None:
        parts.append(f"at most {v.max_length} characters")
    return "; ".join(parts)


def invalid(value: str, v: ValidationSpec | None) -> str | None:
    """Which validation rule `value` breaks, or None."""
    if v is None:
        return None
    if v.allowed_values is not None and value not in v.allowed_values:
        return f"allowed_values: the answer is not one of {v.allowed_values}"
    if v.pattern is not None and safe_regex(v.pattern).fullmatch(value) is None:
        return f"pattern: the answer does not match {v.pattern}"
    if v.min_length is not None and len(value) < v.min_length:
        return f"min_length: the answer is shorter than {v.min_length}"
    if v.max_length is not None and len(value) > v.max_length:
        return f"max_length: the answer is longer than {v.max_length}"
    return None


def handle(gw: Gateway, call: AskUserCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    if call.validation and call.validation.pattern:
        try:
            safe_regex(call.validation.pattern)
        except ValueError as exc:
            return error(call_id, "error", "INVALID_INPUT", f"validation.pattern: {exc}")
    arguments = call.model_dump(exclude={"tool", "principal"})
    decision = tool_decision(policy, call.principal, Tool.ASK_USER)
    closed = getattr(gw.approver, "user_channel_closed", None)
    nobody = closed() if decision.verdict is Verdict.ASK and callable(closed) else None
    if nobody is not None:
        # a supervisor would approve the question, but no human could then be asked it (over
        # MCP the form comes before the call, so before any supervisor): refused at once,
        # recorded, and no supervisor is kept waiting for nothing
        why = f"no channel reaches your user: {nobody.note or 'nobody can be asked here'}"
        refusal = Decision(Verdict.DENY, None, (Reason("tool", "no_user_channel", why),))
        denied = gw.authorize(
            call_id, call.principal, "ask_user", f"ask_user {call.prompt}", policy.workspace, {}, refusal,
            arguments, policy,
        )  # fmt: skip
        if isinstance(denied, Gated):  # cannot happen: a denial never passes
            return error(call_id, "denied", "INTERNAL_ERROR", "a refusal passed the gate")
        if denied.get("error", {}).get("code") == "POLICY_DENIED":
            return error(call_id, "error", "NO_USER_CHANNEL", why)
        return denied
    gated = gw.authorize(
        call_id,
        call.principal,
        "ask_user",
        f"ask_user {call.prompt}",
        policy.workspace,
        {},
        decision,
        arguments,
        policy,
    )
    if not isinstance(gated, Gated):
        return gated
    ask = getattr(gw.approver, "ask_user", None)
    if ask is None:
        out = error(
            call_id, "error", "NO_USER_CHANNEL", "no channel reaches a human here (start with a terminal or over MCP)"
        )
        return gw.record_result(gated, out)
    question = Question(call_id, call.principal, call.prompt, call.default, call.password, hint(call.validation))
    answer = ask(question, (call.timeout_ms or DEFAULT_TIMEOUT_MS) / 1000)
    if answer is None:
        return gw.record_result(gated, error(call_id, "timeout", "USER_TIMEOUT", "the user did not answer in time"))
    if answer.how == "no-channel":  # e.g. an MCP client without elicitation (forms)
        why = f"no channel reaches your user: {answer.note or 'nobody can be asked here'}"
        return gw.record_result(gated, error(call_id, "error", "NO_USER_CHANNEL", why))
    if answer.value is None:
        return gw.record_result(gated, error(call_id, "error", "USER_CANCELLED", "the user cancelled"))
    value = answer.value if answer.value != "" or call.default is None else call.default
    problem = invalid(value, call.validation)
    recorded: dict[str, Any] = {"by": answer.by, "how": answer.how}
    if problem:
        out = error(call_id, "error", "INVALID_INPUT", problem)
        out["validated"] = False
    else:
        out = {"status": "ok", "value": value, "validated": call.validation is not None}
    if not call.password:
        recorded["answer"] = value
    envelope = gw.record_result(gated, {**out, **{"answered": recorded}})
    envelope.pop("answered", None)
    return envelope
