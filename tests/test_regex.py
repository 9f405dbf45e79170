"""Policy patterns: linear time where RE2 reads them as Python does, bounded input otherwise."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.selftest import load_checked
from gateway.regex import MAX_BACKTRACKING_INPUT, PolicyPattern

SHIPPED = Path("policies/default.yaml")
SAME = [r"[a-z]+\.py", r"^-[a-z]$", r"a|b(c)*", r"\.\.?/x", r"x$", r"(?:a|b)+?", r"[^/]*", r"[0-9]{1,3}"]
DIFFERENT = [r"(?!.*x)[^\n]*", r"\d+", r"\w+", r"(?i)abc", r"[[:alpha:]]+", r"a$b", r"(a)\1", r"\bx"]


@pytest.mark.parametrize("pattern", SAME)
def test_patterns_re2_reads_as_python_does_run_in_linear_time(pattern: str) -> None:
    assert PolicyPattern(pattern).linear


@pytest.mark.parametrize("pattern", DIFFERENT)
def test_patterns_re2_would_read_otherwise_keep_pythons_meaning(pattern: str) -> None:
    # \d, \w, \b are Unicode in Python and ASCII in RE2; (?i) folds differently; [[:alpha:]] is a
    # POSIX class only to RE2: a deny rule must never match less than its author meant
    assert not PolicyPattern(pattern).linear


def shipped_patterns() -> list[str]:
    raw = yaml.safe_load(SHIPPED.read_text())
    return [p for r in raw["rules"] for p in (r.get("args") or []) + (r.get("first_arg") or [])]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([*SAME, *shipped_patterns()]), st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=30))
def test_the_linear_matcher_agrees_with_python(pattern: str, text: str) -> None:
    p = PolicyPattern(pattern)
    if p.linear:
        assert p.fullmatch(text) == (re.fullmatch(pattern, text) is not None)


def test_an_agent_chosen_argument_never_chooses_how_long_a_check_takes(tmp_path: Path) -> None:
    # the shipped awk rule's lookahead was quadratic: a 64 KiB program took seconds per check.
    # The rule now reads the program with awk's model (gateway/programs/awk.py), in linear time.
    (tmp_path / "data.txt").write_text("x\n")
    policy = load_checked(SHIPPED, tmp_path)
    program = "{print $1} " + "print " * 10000  # just under the 64 KiB cap on a command
    started = time.monotonic()
    decision = evaluate(policy, f"awk '{program}' data.txt", "agent", tmp_path).decision
    assert time.monotonic() - started < 30  # a guard against the old cost, not a benchmark
    assert decision.rule == "awk", decision  # read by the model, not refused as too long to check
    slow = "{print $1} " + "system " * 9000
    decision = evaluate(policy, f"awk '{slow}' data.txt", "agent", tmp_path).decision
    assert decision.verdict is Verdict.DENY and "system() runs a command" in decision.reasons[0].message
    assert evaluate(policy, "awk '{print $1}' data.txt", "agent", tmp_path).decision.verdict is Verdict.ALLOW


def test_a_deny_rule_that_cannot_decide_applies() -> None:
    pattern = PolicyPattern(r"(?!.*safe).*")
    assert pattern.fullmatch("x" * (MAX_BACKTRACKING_INPUT + 1)) is None
    from gateway.stages.permissions import _any_match

    assert _any_match((pattern,), "x" * (MAX_BACKTRACKING_INPUT + 1), strict=False) is True
    assert isinstance(_any_match((pattern,), "x" * (MAX_BACKTRACKING_INPUT + 1), strict=True), str)
