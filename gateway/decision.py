"""Verdicts, reasons and decisions: the values every stage produces.

Verdicts are ordered, ALLOW < ASK < DENY, and combine with max: the strictest wins. A decision is
a value (verdict, the rule that decided, structured reasons), never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Verdict(IntEnum):
    ALLOW = 0
    ASK = 1
    DENY = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Verdict:
        return cls[text.upper()]


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a stage escalated (or allowed). `code` is stable; `details` is for machines."""

    stage: str
    code: str
    message: str
    rule: str | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stage": self.stage, "code": self.code, "message": self.message}
        if self.rule:
            out["rule"] = self.rule
        if self.details:
            out["details"] = self.details
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    rule: str | None = None  # the rule that decided (the strictest one), if a rule did
    reasons: tuple[Reason, ...] = ()

    @staticmethod
    def merge(decisions: list[Decision]) -> Decision:
        """The strictest decision; its rule decides; every reason is kept."""
        if not decisions:
            return Decision(Verdict.DENY, None, (Reason("policy", "no_rule", "nothing allowed this call"),))
        top = max(decisions, key=lambda d: d.verdict)
        reasons = tuple(r for d in decisions for r in d.reasons)
        return Decision(top.verdict, top.rule, reasons)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.verdict.label,
            "rule": self.rule,
            "reasons": [r.to_json() for r in self.reasons],
        }
