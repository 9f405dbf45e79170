"""The public honest corpus under the shipped policy and the strict read-mostly example: the
rate of wrong decisions may only go down (a ratchet, not the 1% goal of issue 13).

A wrong decision is any verdict other than the one the line is labelled with: an honest line
refused or sent to a supervisor, and equally a line allowed where the policy's prose means ask or
deny. The misses are printed grouped by expected/got and reason code (`pytest -s` or on failure):
that list is what the next change to the analyser or the jail should work through. When a change
lowers a count, lower its bound here in the same commit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.adversarial.honest_corpus import POLICIES, Line, load, make_workspace, measure

# Wrong decisions measured on main (2026-11-27); bench/corpus.py prints the same numbers.
# 12 and 3 before a `run` call's variables that nothing sets were read as empty (issue 26, point
# 14: `--features $TOKIO_STABLE_FEATURES`, `grep -qF "${V}"`...); one of the 3 left is a line
# labelled deny because its path was unknown (`tar czf "$ARCHIVE.tar.gz" "$ARCHIVE"`).
# 13 and 6 before issue 26's precision classes (read-mostly's writes, its project runs' paths
# and the script arguments of the shipped python-script rule); 17 and 8 before git's model and
# run-time words that could be options (issue 13, class 2); 33 and 20 before mvdan/sh confirmed
# what bashlex cannot (issue 13, class 7); 22 and 11 before the program models (classes 5 and 6).
MAX_WRONG = {"default": 3, "strict": 2}
SOURCE = re.compile(r"(github:[\w.-]+/[\w.-]+/\S+|https://\S+)")


@pytest.fixture(scope="module")
def corpus() -> list[Line]:
    return load()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, corpus: list[Line]) -> Path:
    ws = tmp_path_factory.mktemp("honest-ws")
    make_workspace(ws, corpus)
    return ws


def test_the_corpus_is_public_distinct_and_large(corpus: list[Line]) -> None:
    assert len({line.command for line in corpus}) == len(corpus) >= 1000
    assert all(SOURCE.fullmatch(line.source) for line in corpus), [
        line.source for line in corpus if not SOURCE.fullmatch(line.source)
    ]
    unclear = [line for line in corpus if "unclear" in line.expect.values()]
    assert all(line.note for line in unclear), "every unclear label says why"


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_wrong_decisions_do_not_grow(policy: str, corpus: list[Line], workspace: Path) -> None:
    outcome = measure(policy, workspace, corpus)
    print("\n" + outcome.report())
    assert outcome.counted >= 1000
    assert len(outcome.wrong) <= MAX_WRONG[policy], outcome.report(limit=20)
