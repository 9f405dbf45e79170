"""The sed script parser, against tables and against GNU sed itself.

GNU sed's `--sandbox` refuses, when it compiles a script, every `e`, `r`, `R`, `w`, `W` and the
`e` and `w` flags of `s`. So sed is the oracle: whenever it says a script uses one of them, the
parser must have found it (or refused the script). The other way round the parser may be
stricter than sed (it refuses `!` without an address), never laxer.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.programs import sed

SED = shutil.which("sed")

# (script, runs code, reads, writes, refused)
TABLE = [
    ("p", False, [], [], False),
    ("/^class /,/^$/p", False, [], [], False),
    ("1,20p", False, [], [], False),
    ("s/foo/bar/g", False, [], [], False),
    ("s|a|b|2p", False, [], [], False),
    ("s/x/e/", False, [], [], False),  # e in the replacement
    ("s/e/x/", False, [], [], False),
    ("s/a\\/e/b/", False, [], [], False),  # an escaped delimiter
    ("y/abc/xyz/", False, [], [], False),
    (":a;N;$!ba;s/\\n/ /g", False, [], [], False),
    ("1a foo; 2e uname", False, [], [], False),  # appended text runs to the end of the line
    ("1i\\\nline one\\\n2e id", False, [], [], False),  # a continued text block
    ("$!{N;D}", False, [], [], False),
    ("0,/re/d", False, [], [], False),
    ("1~2p;2,+3d;/x/I,~4p", False, [], [], False),
    ("# a comment with e and w\np", False, [], [], False),
    ("2e uname", True, [], [], False),
    ("e", True, [], [], False),
    ("1!G;h;$!d;e", True, [], [], False),
    ("s/x/id/e", True, [], [], False),
    ("s/x/id/ge", True, [], [], False),
    ("/x/{\ne id\n}", True, [], [], False),
    ("w out.txt", False, [], ["out.txt"], False),
    ("w out; e id", False, [], ["out; e id"], False),  # the file name runs to the end of the line
    ("/TODO/w todo.txt", False, [], ["todo.txt"], False),
    ("s/a/b/w out.txt", False, [], ["out.txt"], False),
    ("s/a/b/gpw /etc/x", False, [], ["/etc/x"], False),
    ("W x\np", False, [], ["x"], False),
    ("1r /etc/passwd", False, ["/etc/passwd"], [], False),
    ("R in.txt", False, ["in.txt"], [], False),
    ("k", False, [], [], True),
    ("s/a/b", False, [], [], True),
    ("p x", False, [], [], True),
    ("{p", False, [], [], True),
    ("}", False, [], [], True),
    ("w", False, [], [], True),
    ("s/a/b/q", False, [], [], True),
]


@pytest.mark.parametrize(("script", "runs", "reads", "writes", "refused"), TABLE, ids=[t[0][:40] for t in TABLE])
def test_table(script: str, runs: bool, reads: list[str], writes: list[str], refused: bool) -> None:
    facts = sed.analyse(script)
    assert bool(facts.error) is refused, facts
    if not refused:
        assert bool(facts.runs) is runs, facts
        assert [w.value for w in facts.reads] == reads
        assert [w.value for w in facts.writes] == writes


def _gnu(fragments: list[str], cwd: Path) -> str:
    """How GNU sed's compiler takes the script given as these -e fragments: "ok", "sandbox" (it
    uses e, r or w) or "error"."""
    assert SED is not None
    args = [a for f in fragments for a in ("-e", f)]
    out = subprocess.run(
        [SED, "--sandbox", "-n", *args, "/dev/null"], cwd=cwd, capture_output=True, text=True, check=False
    )
    if out.returncode == 0:
        return "ok"
    return "sandbox" if "disabled in sandbox mode" in out.stderr else "error"


@pytest.mark.skipif(SED is None, reason="needs GNU sed")
@pytest.mark.parametrize(("script", "runs", "reads", "writes", "refused"), TABLE, ids=[t[0][:40] for t in TABLE])
def test_table_agrees_with_gnu_sed(
    tmp_path: Path, script: str, runs: bool, reads: list[str], writes: list[str], refused: bool
) -> None:
    got = _gnu([script], tmp_path)
    if refused:  # sed refuses it too (where it uses e/r/w first, it says so first)
        assert got in ("error", "sandbox")
    else:
        assert got == ("sandbox" if runs or reads or writes else "ok")


_PIECES = [
    "p", "e", "e id", "w f", "r f", "W f", "R f", "s/a/b/", "s/a/b/e", "s/a/b/w f", "s,e,w,", "y/a/b/", "a x",
    "a\\", "i\\\n", "c t", "1", "$", "/x/", "\\,x,", ",", "!", "{", "}", ";", "\n", " ", "#", ":l", "b l", "t",
    "q", "l 5", "=", "\\", "/", "e;", "w;", "0,", "~2", "+1", "I", "M", "g", "s", "a", "x",
]  # fmt: skip


@pytest.mark.skipif(SED is None, reason="needs GNU sed")
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=8).map("".join), min_size=1, max_size=2))
def test_never_laxer_than_gnu_sed(tmp_path: Path, fragments: list[str]) -> None:
    facts = sed.analyse("\n".join(fragments))  # as argv.py joins -e fragments, and sed does
    clean = not facts.error and not facts.runs and not facts.reads and not facts.writes
    if clean:  # where sed compiles it, sed finds no e, r or w either (a script sed refuses never runs)
        assert _gnu(fragments, tmp_path) in ("ok", "error"), (fragments, facts)
