"""Upstream decisions decided again under a draft policy (`gateway audit replay`, the console's
what-if): the recorded tool and arguments through the draft's rules (rules.decide). The
upstream's state at the time (the tool not offered, not pinned, changed, unreachable) is a fact
of that moment, not of the policy: a call it denied stays denied, with the same reasons.

Registered with the replay (gateway/replay.py `DECIDERS`) when this module is imported:
the `upstream` tool family and the CLI import it."""

from __future__ import annotations

from typing import Any

from gateway.audit import REDACTED
from gateway.decision import Decision, Reason, Verdict
from gateway.policy.compile import CompiledPolicy
from gateway.replay import DECIDERS
from gateway.stages import upstream_rules as rules


def _holds(value: Any, text: str) -> bool:
    if isinstance(value, str):
        return text in value
    if isinstance(value, dict):
        return any(_holds(k, text) or _holds(v, text) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds(v, text) for v in value)
    return False


def decide_again(
    draft: CompiledPolicy, principal: str, arguments: dict[str, Any], record: dict[str, Any]
) -> tuple[Decision, str] | str:
    upstream, name, given = arguments.get("upstream"), arguments.get("name"), arguments.get("arguments")
    if not isinstance(upstream, str) or not isinstance(name, str) or not isinstance(given, dict):
        return "the record does not name the upstream tool and its arguments"
    if _holds(given, REDACTED) or _holds(given, "too long to record"):
        return "the log keeps some of the arguments redacted or summarised: they cannot be decided again"
    decision = rules.decide(draft, principal, upstream, name, given).decision
    found = record.get("reasons")
    reasons: list[Any] = found if isinstance(found, list) else []
    state = [
        Reason(str(r.get("stage")), str(r.get("code")), str(r.get("message")))
        for r in reasons
        if isinstance(r, dict) and r.get("stage") == rules.STATE_STAGE
    ]
    if state and decision.verdict is not Verdict.DENY:
        decision = Decision(Verdict.DENY, None, tuple(state))
    return decision, f"{rules.qualified(upstream, name)} {given}"


DECIDERS["upstream"] = decide_again
