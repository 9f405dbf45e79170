"""Globs expanded by the gate: bash's matches, the directories read, and the budget.

Matching is checked against a real bash on a real tree (`printf '%s\\0' PATTERN`): equal for
`*`, `?` and literal parts; a superset for bracket expressions, which the gate takes as any
one character (the jail then checks at least every path bash would pass).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gateway.stages import globs

BASH = shutil.which("bash")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("globs")
    for d in ("src/pkg", "tests", "a b", ".hidden", "docs"):
        (t / d).mkdir(parents=True)
    for f in ("src/app.py", "src/pkg/mod.py", "tests/test_a.py", "a b/c.txt", ".hidden/x", ".env", "README.md",
              "-rf", "docs/-n", "bracket[1].txt", "q1", "q22"):  # fmt: skip
        (t / f).write_text("x")
    (t / "link").symlink_to(t / "src")
    (t / "dangling").symlink_to(t / "nowhere")
    return t


def bash_words(pattern: str, cwd: Path) -> list[str]:
    assert BASH is not None
    out = subprocess.run([BASH, "--noprofile", "--norc", "-c", f"printf '%s\\0' X {pattern}"], capture_output=True,
                         cwd=cwd, timeout=10).stdout  # fmt: skip
    return [w.decode() for w in out.split(b"\0")[1:-1]]


EQUAL = ["*", "*.py", "src/*", "*/*.py", "*/", ".*", "?1", "q?", "q??", "./*", "**", "src/**", "*/pkg/*", "nomatch*",
         "d*", "link/*", "*/c.txt", "../*", ".hidden/*", "src/../*.md"]  # fmt: skip
SUPERSET = ["[ab]*", "[!a]*", "[^a]*", "[[:alpha:]]*", "q[0-9]"]


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize("pattern", EQUAL)
def test_matches_are_bashs(tree: Path, pattern: str) -> None:
    assert globs.expand(pattern, str(tree), globs.Budget()).words == bash_words(pattern, tree)


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize("pattern", SUPERSET)
def test_bracket_matches_include_bashs(tree: Path, pattern: str) -> None:
    ours = globs.expand(pattern, str(tree), globs.Budget()).words
    assert set(bash_words(pattern, tree)) <= set(ours)


def test_the_directories_a_pattern_lists(tree: Path) -> None:
    listed = globs.expand("*/*.py", str(tree), globs.Budget()).listed
    assert listed[0] == str(tree)
    assert str(tree / "src") in listed and str(tree / "tests") in listed
    assert globs.expand("../*/x", str(tree / "src"), globs.Budget()).listed == [str(tree / "src" / "..")]


def test_the_work_is_bounded(tmp_path: Path) -> None:
    # the attack of the issue: a wide tree the agent made, and `ls */*` (or deeper) over it
    for a in range(30):
        d = tmp_path / f"d{a}"
        d.mkdir()
        for b in range(700):
            (d / f"f{b}").touch()
    started = time.monotonic()
    with pytest.raises(globs.TooCostly):
        globs.expand("*/*", str(tmp_path), globs.Budget())
    assert time.monotonic() - started < 60  # a guard against a hang, not a measure of speed
    budget = globs.Budget()
    globs.expand("d1/*", str(tmp_path), budget)
    assert budget.entries == globs.MAX_ENTRIES - 700
    assert budget.matches == globs.MAX_MATCHES - 700
