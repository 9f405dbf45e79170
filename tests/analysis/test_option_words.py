"""Words that are, or are not, options to bash's builtins (issue 26, class 7).

bash reads a builtin's options after expansion, up to its first operand or `--`: a word known
only at run time there may be any option (`printf "$x" /tmp` with x=-vPATH assigns PATH), and a
word after the format is never one (`printf '%s %s\\n' -v "$x"` prints `-v`). An unquoted
`$((...))` is one number, since IFS may hold no digit or `-`. Each hostile form is run in real
bash too, to show it does what the denial says.
"""

from __future__ import annotations

import subprocess

import pytest

from gateway.analysis import analyze


def bash(script: str) -> str:
    out = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], capture_output=True, text=True, timeout=60)
    return out.stdout


# (text, denial code): a run-time word where a builtin reads options that assign, bind or run
HOSTILE = [
    ('x=-vPATH; printf "$x" /tmp; ls', "dynamic_builtin_option"),
    ('printf -v y "$x" /tmp', "dynamic_builtin_option"),
    ('printf "${x}" /tmp', "dynamic_builtin_option"),
    ('wait "$x"', "dynamic_builtin_option"),  # x=-pPATH assigns a pid to PATH
    ('wait -n "$x"', "dynamic_builtin_option"),
    ('hash "$x" ls', "dynamic_builtin_option"),  # x=-p/tmp/evil binds ls
    ('set "$x"', "dynamic_builtin_option"),  # x=-a: allexport
    ('set -o "$x"', "forbidden_builtin"),  # x=allexport
    ("set -eo allexport", "forbidden_builtin"),  # o anywhere in a cluster takes the next word
    ("set -oe allexport", "forbidden_builtin"),
    ("set +e -a", "forbidden_builtin"),  # a +option does not end the options
    ("jobs -x id", "forbidden_builtin"),  # runs id, which no parser reported as a command
    ('jobs "$x" id', "dynamic_builtin_option"),
    # IFS splits an unquoted $((...)): it may hold no digit or '-'
    ("IFS=0; head -n $((x)) README.md", "protected_variable"),
    ('IFS="$old"', "protected_variable"),
    ("read IFS", "protected_variable"),
    ('declare IFS="$x"', "protected_variable"),
    ("for IFS in 0; do :; done", "protected_variable"),
    ("((IFS=1))", "protected_variable"),
    ("export IFS=-", "protected_variable"),
]


@pytest.mark.parametrize(("text", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_option_words_are_denied(text: str, code: str) -> None:
    denial = analyze(text).denial
    assert denial is not None and denial.code == code, denial


def test_the_hostile_forms_do_what_the_denials_say() -> None:
    assert bash('x=-vPATH; printf "$x" /nowhere; echo "$PATH"').strip() == "/nowhere"
    assert "allexport" in bash("set -eo allexport; shopt -po allexport")
    assert "allexport" in bash("set +e -a; shopt -po allexport")
    assert bash("jobs -x echo ran") == "ran\n"
    assert bash("IFS=0; n=-105; printf '[%s]' $((n))") == "[-1][5]"


HONEST = [
    "printf '%s %s\\n' -v \"$x\"",  # -v after the format is an argument
    "printf '%s\\n' \"$@\"",
    'printf -- "$fmt" a',
    "printf -v out '%05d' 42",
    "printf '%s\\n' -- -v",
    "wait $!",  # a number is no option
    'wait -- "$pid"',
    "set -euo pipefail",
    'set -- "$@"',
    'set -o pipefail -o "nounset"',
    "IFS=$'\\n'",
    'while IFS=, read -r a b; do echo "$a"; done < data.csv',
    'f() { local IFS=:; echo "$*"; }',
    "unset IFS",
    'echo "$x" -n $((n+1))',
    "seq 1 $((n-1))",
    "sleep $((2 * 3))",
]


@pytest.mark.parametrize("text", HONEST)
def test_honest_option_words_are_not_denied(text: str) -> None:
    assert analyze(text).denial is None, analyze(text).denial
