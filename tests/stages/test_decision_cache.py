"""Remembered decisions are served only while everything they resolved is as it was: real trees,
real symlinks swapped between a decision and its repeat."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy

RULES = [
    {"id": "read", "decision": "allow", "justification": "read", "programs": ["cat", "ls"],
     "path_args": {"read": "all"}, "examples": {"match": ["cat x"]}},
    {"id": "write", "decision": "allow", "justification": "write", "programs": ["touch"],
     "path_args": {"write": "all"}, "examples": {"match": ["touch x"]}},
]  # fmt: skip


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws" / "d").mkdir(parents=True)
    (tmp_path / "ws" / "d" / "f").write_text("inside\n")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "f").write_text("secret\n")
    return tmp_path / "ws"


@pytest.fixture
def policy(ws: Path) -> CompiledPolicy:
    raw = {
        "version": 1,
        "principals": {"agent": {"roles": ["dev"]}},
        "roles": {"dev": {"level": 1, "write_roots": ["."]}},
        "tools": {"run": {"allow_from": 0}},
        "second_opinion": {"unconfirmed": "allow"},
        "rules": RULES,
    }
    return compile_policy(Policy.model_validate(raw), ws / "p.yaml", ws, sha256="t")


def verdict(policy: CompiledPolicy, command: str) -> Verdict:
    return evaluate(policy, command, "agent").decision.verdict


def test_a_repeated_decision_is_served_from_the_cache(policy: CompiledPolicy) -> None:
    first = evaluate(policy, "cat d/f", "agent")
    assert first.decision.verdict is Verdict.ALLOW
    hits = policy.decisions.hits
    assert evaluate(policy, "cat d/f", "agent") is first
    assert policy.decisions.hits == hits + 1
    assert evaluate(policy, "cat d/f", "agent", env={"X": "1"}) is not first  # other inputs: decided anew


def test_a_link_swapped_to_point_outside_is_never_served_the_old_allow(policy: CompiledPolicy, ws: Path) -> None:
    (ws / "link").symlink_to(ws / "d")
    assert verdict(policy, "cat link/f") is Verdict.ALLOW
    os.unlink(ws / "link")
    (ws / "link").symlink_to(ws.parent / "secret")  # same name, maybe the same inode: a new target
    assert verdict(policy, "cat link/f") is Verdict.DENY


def test_a_directory_replaced_by_a_link_is_seen(policy: CompiledPolicy, ws: Path) -> None:
    assert verdict(policy, "touch d/f") is Verdict.ALLOW
    os.rename(ws / "d", ws / "d.old")
    (ws / "d").symlink_to(ws.parent / "secret")
    assert verdict(policy, "touch d/f") is Verdict.DENY


def test_a_missing_name_created_later_as_a_link_is_seen(policy: CompiledPolicy, ws: Path) -> None:
    assert verdict(policy, "cat later/f") is Verdict.ALLOW  # missing: taken literally, inside
    (ws / "later").symlink_to(ws.parent / "secret")
    assert verdict(policy, "cat later/f") is Verdict.DENY


def test_a_glob_decision_is_not_kept(policy: CompiledPolicy, ws: Path) -> None:
    assert verdict(policy, "cat g*/f") is Verdict.ALLOW  # matches nothing: the literal, inside
    (ws / "gone").symlink_to(ws.parent / "secret")
    assert verdict(policy, "cat g*/f") is Verdict.DENY  # the listing changed


def test_a_reloaded_policy_starts_with_an_empty_cache(policy: CompiledPolicy, ws: Path) -> None:
    evaluate(policy, "cat d/f", "agent")
    again = compile_policy(policy.policy, ws / "p.yaml", ws, sha256="t")
    assert again.decisions is not policy.decisions and again.decisions.hits == 0


def test_a_racing_swap_never_gets_a_stale_allow_for_the_outside(policy: CompiledPolicy, ws: Path) -> None:
    """A link flipped between inside and outside while the same command is decided again and
    again: every allow must have been right for a state the link was in, and the outside state
    must be denied as often as it is seen."""
    (ws / "flip").symlink_to(ws / "d")
    stop = threading.Event()

    def flipper() -> None:
        inside, outside = ws / "flip.in", ws / "flip.out"
        inside.symlink_to(ws / "d")
        outside.symlink_to(ws.parent / "secret")
        while not stop.is_set():
            os.link(outside, ws / "flip.tmp", follow_symlinks=False)
            os.replace(ws / "flip.tmp", ws / "flip")
            os.link(inside, ws / "flip.tmp", follow_symlinks=False)
            os.replace(ws / "flip.tmp", ws / "flip")

    t = threading.Thread(target=flipper)
    t.start()
    denied = 0
    try:
        for _ in range(3000):
            if evaluate(policy, "cat flip/f", "agent").decision.verdict is Verdict.DENY:
                denied += 1
    finally:
        stop.set()
        t.join()
    assert denied > 0  # the outside state was seen and denied, not served a remembered allow
    os.unlink(ws / "flip")
    (ws / "flip").symlink_to(ws.parent / "secret")
    assert verdict(policy, "cat flip/f") is Verdict.DENY  # at rest, outside: denied, whatever was kept
