"""Differential check against bash: every text the analyser accepts, bash accepts too.

The analyser must never model a text bash would reject (it would be modelling something that
never runs); `bash -n` parses without executing.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gateway.analysis import analyze
from tests.analysis.test_commands_table import CASES

BASH = shutil.which("bash")
ACCEPTED = [text for text, expected in CASES if isinstance(expected, list)]


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize("text", ACCEPTED, ids=[repr(t)[:60] for t in ACCEPTED])
def test_bash_parses_what_the_analyser_accepts(text: str) -> None:
    assert analyze(text).denial is None
    assert BASH is not None
    proc = subprocess.run([BASH, "--noprofile", "--norc", "-n", "-c", text], capture_output=True, timeout=10)
    assert proc.returncode == 0, proc.stderr.decode()


def test_most_of_the_table_is_accepted_text() -> None:
    assert len(ACCEPTED) >= 150
