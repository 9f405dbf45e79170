"""Differential check against bash: the argv the analyser reports is the argv bash passes.

Each text runs in a real bash, in an empty temporary directory, with every program it names
replaced by a shell function that prints its arguments; the analyser's literal argv must be
exactly that. (Functions run nothing: the texts are only ever echoed.)
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.analysis import analyze, braces

BASH = shutil.which("bash")

TEXTS = [
    # words after a redirect target are arguments
    "sort < notes.txt -u",
    "sort -r < notes.txt -u x",
    "cat < a b > c d",
    "echo x 2>&1 y",
    "sort < f -u 2> e -r",
    "x=1 sort < f -u",
    "sort -k2 <f -t, -n 2>/dev/null -r",
    # brace expansion, done by the analyser
    "mkdir -p out/{arm64,x86_64}",
    "cp conf{,.bak}",
    "touch f{1..3}.txt g{a..c} h{10..1..3}",
    "echo {a,b}{1,2} x{,y,}z {a,{b,c}d}e",
    "echo pre-{1..-2}-post {-3..3..2} {,}",
    "mv -- src/{old,new}.py",
]


def bash_argv(text: str, programs: list[str], where: Path) -> list[list[str]]:
    """What bash passes each program: each shim appends its argv to a log the text's own
    redirects cannot reach (NUL between words, \1 after each command)."""
    log = where.parent / f"{where.name}.argv"
    to_log = f">> {shlex.quote(str(log))}"
    shims = "".join(
        f"{p}() {{ printf '%s\\0' {shlex.quote(p)} \"$@\" {to_log}; printf '\\1' {to_log}; }}; " for p in programs
    )
    assert BASH is not None
    subprocess.run([BASH, "--noprofile", "--norc", "-c", shims + text], capture_output=True, cwd=where, timeout=10)
    data = log.read_bytes() if log.exists() else b""
    return [[w.decode() for w in chunk.split(b"\0")[:-1]] for chunk in data.split(b"\1")[:-1]]


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize("text", TEXTS)
def test_the_argv_is_what_bash_passes(text: str, tmp_path: Path) -> None:
    for name in ("notes.txt", "a", "f"):
        (tmp_path / name).write_text("x\n")
    analysis = analyze(text)
    assert analysis.denial is None, analysis.denial
    ours = [[w.value for w in c.argv] for c in analysis.commands if c.argv]
    assert ours == bash_argv(text, sorted({c[0] for c in ours}), tmp_path)


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(["a", "b", "1", "2", "0", "-", ",", "{", "}", "..", ".", "x", "Z", "_", "/"]), max_size=12
        ).map("".join),
        min_size=1,
        max_size=40,
    )
)
def test_brace_expansion_is_bashs(words: list[str]) -> None:
    # every word the analyser expands, it expands exactly as bash does; the rest it leaves
    # known only at run time (never a guess)
    expanded: dict[str, list[str]] = {}
    for w in words:
        try:
            expanded[w] = braces.expand(w)
        except (braces.NotPlain, braces.TooLarge):
            continue
    if not expanded:
        return
    script = "".join(f"printf '%s\\0' X {w}; printf '\\1'; " for w in expanded)
    assert BASH is not None
    out = subprocess.run([BASH, "--noprofile", "--norc", "-c", script], capture_output=True, timeout=30).stdout
    theirs = [[x.decode() for x in chunk.split(b"\0")[1:-1]] for chunk in out.split(b"\1")[:-1]]
    assert list(expanded.values()) == theirs


def test_a_brace_expansion_too_large_is_refused_not_expanded() -> None:
    denial = analyze("echo {1..100000}").denial
    assert denial is not None and denial.code == "brace_too_large"
    denial = analyze("echo " + " ".join(["{1..200}"] * 30)).denial
    assert denial is not None and denial.code == "brace_too_large"
    assert analyze("echo {a..z}{a..z}").denial is not None  # 676 words from one
