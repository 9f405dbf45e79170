"""Globs as an attacker uses them, under the shipped policy (issue 13, classes 1-3).

- a glob is a read whatever the program: `echo /etc/ssl/private/*` lists a directory outside
  the roots;
- file names are agent data: `sort *` over a file named `--compress-program=bash` runs bash;
  `touch ./--target-directory=x && cp * y` makes the option in the same line, after the check;
- the work a glob costs is the agent's to choose: it is bounded, and the record keeps counts.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.selftest import load_checked


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    w = tmp_path_factory.mktemp("outside") / "ws"
    (w / "src").mkdir(parents=True)
    (w / "src" / "app.py").write_text("print(1)\n")
    (w / "notes.txt").write_text("b\na\n")
    (w / "--compress-program=bash").write_text("")  # planted by an earlier call
    (w.parent / "other").mkdir()
    (w.parent / "other" / ".env").write_text("SECRET=1\n")
    return w


@pytest.fixture(scope="module")
def policy(ws: Path) -> CompiledPolicy:
    return load_checked(Path("policies/default.yaml"), ws)


def decide(policy: CompiledPolicy, ws: Path, text: str) -> tuple[Verdict, list[str]]:
    d = evaluate(policy, text, "agent", ws).decision
    return d.verdict, [r.code for r in d.reasons]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        # class 1: a glob lists directories, in any word
        ("echo /etc/ssl/private/*", "outside_read_roots"),
        ("printf '%s\\n' ../*/.env", "outside_read_roots"),
        ("echo src/../../*", "outside_read_roots"),
        ("echo ~/../*", "outside_read_roots"),
        ("for f in /etc/ssl/private/*; do echo $f; done", "outside_read_roots"),
        ("for f in ../*/.env; do :; done", "outside_read_roots"),
        # class 2: a match that would be an option, now or made in the same line
        ("sort *", "glob_matches_option"),
        ("wc -l *", "glob_matches_option"),
        ("touch ./--target-directory=x && cp * src", "glob_after_write"),
        ("echo x > ./-rf && ls *", "glob_after_write"),
        ("for f in *; do sort $f; done", "glob_matches_option"),
    ],
)
def test_the_attack_is_denied(policy: CompiledPolicy, ws: Path, text: str, code: str) -> None:
    verdict, codes = decide(policy, ws, text)
    assert verdict is Verdict.DENY and code in codes, codes


@pytest.mark.parametrize(
    "text",
    [
        "sort -- *",
        "sort ./*",
        "wc -l src/*.py",
        "ls src/*",
        "cat ./*.txt",
        "touch ./x && cp ./*.txt src",
        "echo *.py",
        'for f in src/*.py; do echo "$f"; done',
    ],
)
def test_the_safe_forms_are_allowed(policy: CompiledPolicy, ws: Path, text: str) -> None:
    assert decide(policy, ws, text)[0] is Verdict.ALLOW


def test_a_glob_over_a_huge_tree_is_refused_quickly_and_recorded_small(policy: CompiledPolicy, ws: Path) -> None:
    big = ws / "big"
    for a in range(30):
        (big / f"d{a}").mkdir(parents=True)
        for b in range(700):
            (big / f"d{a}" / f"f{b}").touch()
    started = time.monotonic()
    verdict, codes = decide(policy, ws, "ls big/*/* big/*/* big/*/*")
    assert (verdict, codes) == (Verdict.DENY, ["glob_too_costly"])
    assert time.monotonic() - started < 60  # a guard against the 11 s of the issue, not a benchmark
    d = evaluate(policy, "ls big/d1/*", "agent", ws).decision
    assert d.verdict is Verdict.ALLOW
    jail = next(r for r in d.reasons if r.code == "paths_checked")
    assert jail.details["counts"] == {"read": 701, "write": 0}  # the listing and 700 matches
    assert len(jail.details["read"]) == 100  # the record lists the first hundred, not every path
