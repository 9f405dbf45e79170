"""The `upstream` tool family: a call to a tool of an upstream MCP server (docs/upstream.md).

    decide (the rules naming the tool, their argument conditions, the path jail: stages/upstream_rules.py)
    -> the tool offered now with its pinned definition (upstream/hub.py, pins.py; else denied)
    -> audit(decision) -> [approval if ask] -> audit(approval)
    -> the definition still the one decided -> forward (the checked arguments)
    -> the result within its size, credentials and secrets redacted, flagged -> audit(result)

The gate is the same as every family's (`Gateway.authorize`, `record_result`): an upstream call
is decided, asked about and recorded like a command, and replayed like one
(gateway/upstream/replay.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gateway import cancellation
from gateway.calls import UpstreamCall
from gateway.decision import Decision, Reason, Verdict
from gateway.pipeline import Gated, error
from gateway.policy.compile import CompiledPolicy
from gateway.stages import upstream_rules as rules
from gateway.upstream import replay as _replay  # noqa: F401  (registers the replay of upstream decisions)
from gateway.upstream import results
from gateway.upstream.hub import Hub, UpstreamFailure, hub_for

if TYPE_CHECKING:
    from gateway.pipeline import Gateway

STATE_STAGE = rules.STATE_STAGE
MAX_ERROR_CHARS = 2000


def hub(gw: Gateway) -> Hub:
    """The gateway's upstream connections."""
    return hub_for(gw)


def arguments(call: UpstreamCall) -> dict[str, Any]:
    return {"upstream": call.upstream, "name": call.name, "arguments": call.arguments}


def subject(upstream: str, tool: str, forwarded: dict[str, Any]) -> str:
    """What a supervisor is asked about, and what an approval binds: the tool and the exact
    arguments it would get."""
    return f"{rules.qualified(upstream, tool)} {json.dumps(forwarded, ensure_ascii=False, sort_keys=True)}"


def context(policy: CompiledPolicy, principal: str) -> dict[str, Any]:
    """What the decision used besides the rules (recorded, for `gateway audit replay`)."""
    grant = policy.grant(principal)
    return {
        "workspace": str(policy.workspace),
        "level": grant.level,
        "read_roots": [str(p) for p in grant.read_roots],
        "write_roots": [str(p) for p in grant.write_roots],
    }


def handle(gw: Gateway, call: UpstreamCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    connections = hub(gw)
    decided = rules.decide(policy, call.principal, call.upstream, call.name, call.arguments, gw.private_dirs())
    decision = decided.decision
    offered = None
    if decision.verdict is not Verdict.DENY:  # a denied call never starts or reaches the upstream
        offered = connections.offer(policy, call.upstream, call.name, cancellation.current_cancel())
        if not offered.ok:
            refusal = Reason(STATE_STAGE, offered.code, offered.message, None, {"seen_sha256": offered.sha256})
            decision = Decision(Verdict.DENY, None, (refusal, *decision.reasons))
    recorded = arguments(call)
    if decided.arguments != call.arguments:
        recorded["forwarded"] = decided.arguments
    data: dict[str, Any] = {"context": context(policy, call.principal)}
    if offered is not None and offered.sha256:
        data["definition_sha256"] = offered.sha256
    asked = subject(call.upstream, call.name, decided.arguments)
    gated = gw.authorize(
        call_id, call.principal, "upstream", asked, policy.workspace, {}, decision, recorded, policy, data
    )
    if not isinstance(gated, Gated):
        return gated
    assert offered is not None
    if decision.verdict is Verdict.ASK:  # it may have changed while a supervisor was asked
        now = connections.offer(policy, call.upstream, call.name, cancellation.current_cancel())
        if now.sha256 != offered.sha256 or not now.ok:
            name = rules.qualified(call.upstream, call.name)
            why = f"{name} changed after it was decided: {now.message or 'refused'}"
            return gw.record_result(gated, error(call_id, "denied", "DEFINITION_CHANGED", why))
    upstream = policy.policy.upstreams[call.upstream]
    meta = {"agent-gateway/principal": call.principal, "agent-gateway/call_id": call_id}
    try:
        raw = connections.call(
            policy, call.upstream, call.name, decided.arguments, cancellation.current_cancel(),
            meta if upstream.forward_identity else None,
        )  # fmt: skip
    except UpstreamFailure as exc:
        return gw.record_result(gated, error(call_id, exc.status, exc.code, exc.message))
    settings = connections.connection(policy, call.upstream)
    secrets = settings.settings.secrets if settings is not None else ()
    try:
        shown = results.clean(raw, limit=upstream.result_bytes, secrets=secrets, names=gw.audit.secret_names)
    except results.ResultRefused as exc:
        return gw.record_result(gated, error(call_id, "error", exc.code, exc.message))
    outcome: dict[str, Any] = {"status": "ok", "tool": rules.qualified(call.upstream, call.name)}
    if shown.get("isError"):
        text = " ".join(b.get("text", "") for b in shown.get("content", []) if isinstance(b, dict))
        outcome["status"] = "error"
        outcome["error"] = {"code": "UPSTREAM_TOOL_ERROR", "message": text[:MAX_ERROR_CHARS] or "the tool failed"}
    flags = results.injection(shown) if upstream.injection_flag else []
    if flags:
        outcome["flags"] = {"injection_heuristic": flags, "note": "a heuristic, not a security check"}
    out = gw.record_result(gated, {**outcome, "result": results.summary(shown)})
    out.pop("result", None)
    out["upstream_result"] = shown
    if flags:
        notice = results.NOTICE.format(matched=", ".join(flags), tool=rules.qualified(call.upstream, call.name))
        out["notice"] = notice
    return out
