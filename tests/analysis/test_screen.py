"""The screen keeps from tree-sitter every character that could crash it.

tree-sitter-bash runs in the gateway's process, so a segfault in it would take the gateway
down. These checks run in child processes: a crash fails the test instead of killing pytest.
"""

from __future__ import annotations

import subprocess
import sys

CHILD_ANALYZE = """
import sys
from gateway.analysis import analyze
a = analyze(sys.stdin.read(), second_opinion_enabled=False, use_cache=False)
print(a.denial.code if a.denial else "allowed")
"""

CHILD_SWEEP = """
import unicodedata
from gateway.analysis import primary
from gateway.analysis.screen import screen
n = 0
for c in range(0x80, 0x40010):  # the screen refuses everything above 0x3FFFF
    if 0xD800 <= c < 0xE000:
        continue
    text = "{" + chr(c) + "x}"
    if screen(text) is None:  # everything the screen lets through reaches the parser
        primary.parse_tree(text)
        n += 1
print(n)
"""


def run_child(code: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, timeout=300)


def test_the_crashing_input_is_refused_before_parsing() -> None:
    proc = run_child(CHILD_ANALYZE, "{\U000e1e71")
    assert proc.returncode == 0, f"the analyser crashed: {proc.returncode} {proc.stderr}"
    assert proc.stdout.strip() == "invalid_character"


def test_private_use_and_high_planes_are_refused() -> None:
    for text in ("echo \ue000", "echo \U000f32ad", "echo \U00050000", "echo \U00040000"):
        proc = run_child(CHILD_ANALYZE, text)
        assert proc.stdout.strip() == "invalid_character", text


def test_every_allowed_character_parses_without_a_crash() -> None:
    proc = run_child(CHILD_SWEEP)
    assert proc.returncode == 0, f"tree-sitter crashed on an allowed character: {proc.returncode}"
    assert int(proc.stdout) > 100_000
