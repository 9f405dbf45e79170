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

from gateway.analysis import analyze

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
