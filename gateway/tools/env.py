"""The `env` tool: get, set, unset and list the principal's session environment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway import envstore as store
from gateway.audit import SECRET_NAME
from gateway.calls import EnvCall
from gateway.decision import Decision, Reason, Verdict
from gateway.pipeline import Gated, error, tool_decision
from gateway.policy.schema import Tool

if TYPE_CHECKING:
    from gateway.pipeline import Gateway


def arguments(call: EnvCall) -> dict[str, Any]:
    """The call's arguments as the audit log keeps them (a secret-looking name's value redacted
    here; the writer redacts the policy's names too)."""
    out: dict[str, Any] = {"action": call.action, "name": call.name}
    if call.value is not None:
        out["value"] = store.REDACTED if call.name and SECRET_NAME.search(call.name) else call.value
    return out


def handle(gw: Gateway, call: EnvCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    secret = bool(call.name and gw.audit.secret_names.search(call.name))
    recorded = {"action": call.action, "name": call.name}
    if call.value is not None:
        recorded["value"] = store.REDACTED if secret else call.value
    decision = tool_decision(policy, call.principal, Tool.ENV)
    if call.action == "set" and decision.verdict is not Verdict.DENY:
        assert call.name is not None and call.value is not None
        why = store.refusal(policy, call.name, call.value)
        if why:
            decision = Decision(Verdict.DENY, None, (Reason("env", "env_refused", why),))
    subject = f"env {call.action} {call.name or ''}".strip()
    gated = gw.authorize(call_id, call.principal, "env", subject, policy.workspace, {}, decision, recorded, policy)
    if not isinstance(gated, Gated):
        return gated
    out: dict[str, Any]
    if call.action == "set":
        assert call.name is not None and call.value is not None
        try:
            gw.env.set(call.principal, call.name, call.value)
        except ValueError as exc:
            return gw.record_result(gated, error(call_id, "error", "INVALID_INPUT", str(exc)))
        out = {"status": "ok", "name": call.name}
    elif call.action == "unset":
        assert call.name is not None
        out = {"status": "ok", "name": call.name, "was_set": gw.env.unset(call.principal, call.name)}
    elif call.action == "get":
        assert call.name is not None
        value = gw.env.get(call.principal, call.name)
        if value is None:
            out = error(call_id, "error", "ENV_NOT_SET", f"{call.name} is not set (env list shows what is)")
        else:
            out = {"status": "ok", "name": call.name, "value": value}
    else:
        shown = {
            k: (store.REDACTED if gw.audit.secret_names.search(k) else v)
            for k, v in sorted(gw.env.items(call.principal).items())
        }
        out = {"status": "ok", "variables": shown}
    return gw.record_result(gated, out)
