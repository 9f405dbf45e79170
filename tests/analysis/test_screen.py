"""tree-sitter-bash must never crash the gateway on any character.

Its scanner calls <ctype.h> functions with code points, undefined above 255: glibc reads past
its table and the process segfaults depending on memory layout. The parser is therefore given an
ASCII image of the text (primary.ascii_image). These checks run in child processes: a crash
fails the test instead of killing pytest.
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
n = 0
for prefix in ("{", "a{", "$", "-", "[[ -", "cat <<"):
    for c in range(0x80, 0x110000, 331):  # a spread over all planes, screened or not
        if 0xD800 <= c < 0xE000:
            continue
        primary.parse_tree(prefix + chr(c) + "x}")
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


def test_no_character_crashes_the_parser() -> None:
    proc = run_child(CHILD_SWEEP)
    assert proc.returncode == 0, f"tree-sitter crashed: {proc.returncode}"
    assert int(proc.stdout) > 15_000


def test_the_parser_sees_only_ascii_but_values_keep_their_characters() -> None:
    from gateway.analysis import analyze, primary

    assert primary.ascii_image("é日x".encode()) == b"_____x"
    (cmd,) = analyze("echo héllo 'wörld' \"日本\" ✓").commands
    assert [w.value for w in cmd.argv] == ["echo", "héllo", "wörld", "日本", "✓"]
