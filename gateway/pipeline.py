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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.analysis import Analysis, analyze
from gateway.decision import Decision, Reason, Verdict
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


def evaluate(policy: CompiledPolicy, command: str, principal: str, cwd: Path | None = None) -> CheckResult:
    """The decision for running `command` as `principal` in `cwd` (default: the workspace)."""
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
        for cmd in analysis.commands:
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
