"""Policies carry their own tests: every rule's inline examples, and an optional tests file.

`check_examples` runs when a policy loads: a policy whose examples fail does not load. An
example `match` must be matched by the rule for at least one command of its analysis; a
`not_match` by none. (Matching is the rule's own checks, whoever the principal.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gateway.analysis import analyze
from gateway.policy.compile import CompiledPolicy, load_policy
from gateway.policy.loader import PolicyError
from gateway.policy.schema import Rule
from gateway.stages.permissions import match
from gateway.upstream.rules import example_matches


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


def example_cases(policy: CompiledPolicy) -> list[Case]:
    cases: list[Case] = []
    for rule in policy.policy.rules:
        if rule.examples is None:  # a rule naming an upstream tool may go without examples
            continue
        for text in rule.examples.match:
            got = rule_matches(rule, text)
            cases.append(
                Case(f"{rule.id}: matches {text!r}", got is True, "" if got is True else str(got or "no match"))
            )
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


def test_cases(policy: CompiledPolicy, principal: str) -> list[Case]:
    """The policy's `tests:` file: one {"command", "principal"?, "cwd"?, "decision", "rule"?}
    per line, each evaluated through the decision pipeline."""
    from gateway.decide import evaluate

    if policy.tests is None:
        return []
    cases: list[Case] = []
    for n, line in enumerate(policy.tests.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            spec = json.loads(line)
            cwd = policy.workspace / spec["cwd"] if "cwd" in spec else None
            got = evaluate(policy, spec["command"], spec.get("principal", principal), cwd).decision
        except (ValueError, KeyError) as exc:
            cases.append(Case(f"{policy.tests.name}:{n}", False, f"bad test line: {exc}"))
            continue
        ok = got.verdict.label == spec["decision"] and ("rule" not in spec or got.rule == spec["rule"])
        detail = "" if ok else f"expected {spec['decision']} ({spec.get('rule')}), got {got.verdict.label} ({got.rule})"
        cases.append(Case(f"{policy.tests.name}:{n} {spec['command']!r}", ok, detail))
    return cases
