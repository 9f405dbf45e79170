"""Policies carry their own tests: every rule's inline examples, and an optional tests file.

`check_examples` runs when a policy loads: a policy whose examples fail does not load. An
example `match` must be matched by the rule for at least one command of its analysis, and the
rules together must decide it as the rule does: for a principal of the rule's own level (the
fewest rules: any higher level only adds rules, which can only make it stricter), the strictest
decision over its commands is the rule's, and the rule is among those deciding it (a `pip`
example that the inline-code rule denies fails). A `not_match` must be matched by no command.
Nothing here reads the filesystem: `gateway policy test` (gateway/decide.py, `example_decisions`)
runs each example through the whole decision, path jail included, for a principal of the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.analysis import analyze
from gateway.policy.compile import CompiledPolicy, load_policy
from gateway.policy.loader import PolicyError
from gateway.policy.schema import Rule, RuleDecision
from gateway.stages.permissions import match
from gateway.stages.upstream_rules import example_decides, example_matches

_ORDER = {RuleDecision.ALLOW: 0, RuleDecision.ASK: 1, RuleDecision.DENY: 2}


@dataclass(frozen=True)
class Case:
    name: str
    passed: bool
    detail: str = ""


def rule_matches(rule: Rule, text: str) -> bool | str:
    if rule.tool is not None:  # an upstream tool's rule: `UPSTREAM.TOOL {arguments}`
        return example_matches(rule, text)
    analysis = analyze(text, second_opinion_enabled=False)
    if analysis.denial is not None:
        return f"the analyser denies it ({analysis.denial.code}: {analysis.denial.message})"
    return any(match(rule, cmd)[0] is not None for cmd in analysis.commands)


def rules_decide(policy: CompiledPolicy, rule: Rule, text: str) -> str:
    """Why the rules of `policy` do not decide `text` as `rule` does, for a principal of the
    rule's level ("" when they do): the strictest decision over the text's commands must be the
    rule's, and the rule among the ones making it. A command no rule matches is denied."""
    if rule.tool is not None:  # an upstream tool's rule: the tool rules matching the example
        return example_decides(policy.tool_rules, rule, text)
    analysis = analyze(text, second_opinion_enabled=False)
    if analysis.denial is not None:
        return f"the analyser denies it ({analysis.denial.code}: {analysis.denial.message})"
    worst: RuleDecision | None = None
    deciders: set[str] = set()
    for cmd in analysis.commands:
        if not cmd.argv:
            continue
        found = [
            r
            for r in policy.by_program.get(cmd.program, ())
            if r.min_level <= rule.min_level and match(r, cmd)[0] is not None
        ]
        verdict = max((r.decision for r in found), key=_ORDER.__getitem__, default=RuleDecision.DENY)
        ids = {r.id for r in found if r.decision is verdict} or {f"no rule for {cmd.program}"}
        if worst is None or _ORDER[verdict] > _ORDER[worst]:
            worst, deciders = verdict, ids
        elif verdict is worst:
            deciders |= ids
    if worst is rule.decision and rule.id in deciders:
        return ""
    made = worst.value if worst is not None else "nothing"
    return f"the policy decides it {made} ({', '.join(sorted(deciders))}), not {rule.decision.value} by this rule"


def example_cases(policy: CompiledPolicy) -> list[Case]:
    cases: list[Case] = []
    for rule in policy.policy.rules:
        if rule.examples is None:  # a rule naming an upstream tool may go without examples
            continue
        for text in rule.examples.match:
            got = rule_matches(rule, text)
            if got is True:
                why = rules_decide(policy, rule, text)
                cases.append(Case(f"{rule.id}: decides {text!r}", not why, why))
                continue
            cases.append(Case(f"{rule.id}: matches {text!r}", False, str(got or "no match")))
        for text in rule.examples.not_match:
            got = rule_matches(rule, text)
            cases.append(
                Case(f"{rule.id}: does not match {text!r}", got is not True, "it matches" if got is True else "")
            )
    return cases


def check_examples(policy: CompiledPolicy) -> None:
    failed = [c for c in example_cases(policy) if not c.passed]
    if failed:
        lines = "\n".join(f"  rule {c.name}: {c.detail}" for c in failed[:20])
        raise PolicyError(f"{policy.source}: {len(failed)} inline example(s) fail:\n{lines}")


def load_checked(path: Path, workspace: Path | None = None) -> CompiledPolicy:
    """Load, compile and check a policy's examples: what the gateway and `check` use."""
    policy = load_policy(path, workspace)
    check_examples(policy)
    return policy
