"""Paths known only at run time from programs that only list under a starting point (issue 13,
class 9): the jail checks the starting points with the access the words need; anything that can
make other strings is not a producer."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.analysis import analyze
from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.selftest import load_checked
from gateway.programs.producers import starting_points


def last_word(text: str) -> list[str] | None:
    return starting_points(analyze(text).commands[-1].argv[-1])


@pytest.mark.parametrize(
    ("text", "starts"),
    [
        ("grep -c TODO $(find lib -name '*.rb')", ["lib"]),
        ("wc -l $(find src tests -type f -name '*.py' -not -path '*/node_modules/*')", ["src", "tests"]),
        ("cat $(find . -maxdepth 1 -name '*.md' | sort | head -3)", ["."]),
        ("cat $(git ls-files '*.py' | grep -v test)", ["."]),
        ("cat $(git diff --name-only HEAD~1)", ["."]),
        ("cat $(ls)", ["."]),
        ("cat $(find lib)", ["lib"]),
    ],
)
def test_producers(text: str, starts: list[str]) -> None:
    assert last_word(text) == starts


@pytest.mark.parametrize(
    "text",
    [
        "cat $(find lib -exec echo {} \\;)",  # an action
        "cat $(find -L lib -name x)",  # follows links out of the tree
        "cat $(find lib -fprint /tmp/x)",
        "cat $(find lib | cut -c4-)",  # makes other strings
        "cat $(find lib | sed s/lib/etc/)",
        "cat $(cat list)",
        "cat $(find $D -name x)",  # a start known only at run time
        "cat $(find lib)x",  # a suffix: lib + x is a sibling
        "cat $(grep -l x -r /etc)",
        "cat $(find lib | sort -o out)",
        "cat $(find lib | grep -f patterns)",
        "cat $(find lib | grep x other-file)",
        "cat $(git ls-files --with-tree=HEAD)",
        "cat $(echo /etc/passwd)",
        "cat $(find lib $(zork))",
    ],
)
def test_not_producers(text: str) -> None:
    assert last_word(text) is None


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompiledPolicy, Path]:
    ws = tmp_path_factory.mktemp("out") / "ws"
    (ws / "lib").mkdir(parents=True)
    (ws / "lib" / "a.rb").write_text("TODO\n")
    (ws / ".git").mkdir()
    return load_checked(Path("policies/default.yaml"), ws), ws


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("grep -c TODO $(find lib -name '*.rb')", Verdict.ALLOW),
        ("wc -l $(git ls-files | grep rb)", Verdict.ALLOW),
        # the starting points are jailed with the access the words need
        ("grep -c TODO $(find / -name '*.rb')", Verdict.DENY),
        ("grep x $(find .. -name '*.rb')", Verdict.DENY),
        ("rm $(find .git -name index)", Verdict.DENY),  # a write under .git
        # split at blanks, a listed name can be an option (a directory 'x --target-directory=y'):
        # a program without a model takes the listing only after --
        ("cp $(find lib -name '*.rb') lib", Verdict.DENY),
        ("cp -- $(find lib -name '*.rb') lib", Verdict.ALLOW),
        ("cat $(find lib | sed s/lib/etc/)", Verdict.DENY),
    ],
)
def test_through_the_shipped_policy(shipped: tuple[CompiledPolicy, Path], text: str, verdict: Verdict) -> None:
    policy, ws = shipped
    assert evaluate(policy, text, "agent", ws).decision.verdict is verdict
