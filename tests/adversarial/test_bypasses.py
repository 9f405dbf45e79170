"""Ways to run a program past the analyser, found by red-teaming it against bash 5.2.

Each row is a text where bash runs a program (`zork`) that an earlier version of the analyser
did not report, or reported under a wrong literal name. Every one must now be denied.
"""

from __future__ import annotations

import pytest

from gateway.analysis import Expansion, analyze

DENIED = [
    # time / coproc before a compound command: tree-sitter reads the keyword as a command name
    ("time { zork; }", "reserved_word_as_command"),
    ("time -p { zork; }", "reserved_word_as_command"),
    ("time ! zork", "reserved_word_as_command"),
    ("time if zork; then :; fi", "reserved_word_as_command"),
    ("time for x in 1; do zork; done", "reserved_word_as_command"),
    ("time while zork; do break; done", "reserved_word_as_command"),
    ("coproc { zork; }", "reserved_word_as_command"),
    ("coproc X { zork; }", "reserved_word_as_command"),
    ("coproc while zork; do break; done", "reserved_word_as_command"),
    # builtins that run a string as a command
    ("mapfile -C zork -c 1 arr <<< x", "forbidden_builtin"),
    ("readarray -Czork -c 1 arr <<< x", "forbidden_builtin"),
    ("compgen -C zork x", "forbidden_builtin"),
    ("complete -F zork x", "forbidden_builtin"),
    ("bind -x '\"\\C-x\": zork'", "forbidden_builtin"),
    # a quoted compound assignment is parsed again by declare
    ("declare -a 'a=($(zork))'", "subscript_substitution"),
    ("typeset -a 'a=($(zork))'", "subscript_substitution"),
    ("declare -ga 'a=($(zork))'", "subscript_substitution"),
    # find actions hidden behind expansions
    ("x=-exec; find . $x zork \\;", "dynamic_find_expression"),
    ("find . ${x:--exec} zork \\;", "dynamic_find_expression"),
    ("find . -exe? zork \\;", "dynamic_find_expression"),
    ("x=';'; find . -exec zork \"$x\" -exec zork2 {} \\;", "dynamic_find_expression"),
    # PATH and friends through forms the first checks missed
    ("printf -vPATH /tmp/evil; ls", "protected_variable"),
    ("printf -v'PATH' /tmp/evil; ls", "protected_variable"),
    ("printf -vBASH_ENV /tmp/evil.sh; bash -c :", "protected_variable"),
    (
        "set -a; GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.fsmonitor GIT_CONFIG_VALUE_0=id; git status",
        "forbidden_builtin",
    ),
    ("set -o allexport; x=1", "forbidden_builtin"),
    ("HOME=/etc; cat ~/passwd", "protected_variable"),
    ("read -a PATH <<< x; ls", "protected_variable"),
    ("set -k; bash -c : BASH_ENV=/tmp/evil.sh", "forbidden_builtin"),
    ("set -o keyword; bash -c :", "forbidden_builtin"),
    # a lone `$` that bash reads as $0 / $- / $!
    ("zork]$0", "dynamic_command_name"),
    ("zork{$0", "dynamic_command_name"),
    ("zork}$1", "dynamic_command_name"),
    ("zork}$!b", "dynamic_command_name"),
    # tree-sitter swallows a newline (no ERROR node) and makes the next line's command arguments
    (
        'cargo build 2>&1 | grep -E "^(error|warning)" | sort | uniq -c\n'
        'echo "export NODE_ENV=development" >> .envrc\necho "*.log" >> .gitignore && git add .gitignore',
        "joined_lines",
    ),
    # round two: word lists and variables set by arithmetic, getopts --, xargs, wait
    ("compgen -W '$(zork)' x", "forbidden_builtin"),
    ("let PATH=5; zork5", "protected_variable"),
    ("((PATH=5)); zork5", "protected_variable"),
    (": $((PATH=5)); zork5", "protected_variable"),
    ("x=$((PATH++)); zork5", "protected_variable"),
    ("declare -i x=PATH=5; zork5", "protected_variable"),
    ("[[ PATH=5 -eq 5 ]]; zork5", "protected_variable"),
    ("for ((PATH=5;0;)); do :; done; zork5", "protected_variable"),
    ("set -a; ((BASH_ENV=7)); bash -c :", "protected_variable"),
    ("set -- -a; getopts -- a PATH; zork5", "protected_variable"),
    ("echo a | xargs --process-slot-var=BASH_ENV bash -c :", "protected_variable"),
    ("wait -n -p PATH", "protected_variable"),
    # round two: shells that run startup files
    ("bash --rcfile rc.sh -ic :", "shell_startup_files"),
    ("bash -i -c :", "shell_startup_files"),
    ("bash -l -c :", "shell_startup_files"),
    ("bash --login -c :", "shell_startup_files"),
    ("exec -l bash -c :", "shell_startup_files"),
    ("exec -a -bash bash -c :", "shell_startup_files"),
    # round two: non-ASCII names look like identifiers in the parser's ASCII image
    ("\u00e9=1 zork", "unsupported_construct"),
    ("a\u00e9=1 zork2", "unsupported_construct"),
    ("for \u00e9 in 1; do zork; done", "unsupported_construct"),
    # round two: code kept in a variable and evaluated later
    ("x=\\$\\(zork\\); echo ${x@P}", "prompt_expansion"),
    ("x='a[$(zork)]'; echo $((x))", "stashed_code"),
    ("read x <<< 'a[$(zork)]'; echo ${!x}", "stashed_code"),
    ("declare x='a[$(zork)]'; [[ x -eq 1 ]]", "subscript_substitution"),
    ("y='$(zork)'", "stashed_code"),
    ("x='a[$(zork)]'; case 1 in $((x))) ;; esac", "stashed_code"),
    # round three
    ("declare BASH_CMDS[ls]=/tmp/zork; ls", "protected_variable"),
    ("printf -v 'BASH_CMDS[ls]' %s /tmp/zork; ls", "protected_variable"),
    ("BASH_CMDS=([ls]=/tmp/zork); ls", "protected_variable"),
    ("shopt -s expand_aliases\nBASH_ALIASES+=([ls]='zork;zork3')\nls", "protected_variable"),
    ("set -a; : ${BASH_ENV:=/tmp/evil.sh}; bash -c true", "protected_variable"),
    (": ${EXECIGNORE=/tmp/zork}; zork", "protected_variable"),
    ("read c <<< a[\\$\\(zork\\)]; echo $((c))", "unparsed_text"),
    ("read -aPATH <<< /tmp/bin2; ls", "protected_variable"),
    ("read -raPATH <<< /tmp/bin2; ls", "protected_variable"),
    ("sleep 0 & wait -npPATH; ls", "protected_variable"),
    # $'...' escapes: \cX, raw bytes, locale-dependent \u
    ("./$'l\\c3' -la", "invalid_character"),
    ("$'\\xff'", "unsupported_escape"),
    ("echo $'\\777'", "unsupported_escape"),
    ("echo $'\\u00e9'", "unsupported_escape"),
]


@pytest.mark.parametrize(("text", "code"), DENIED, ids=[d[0] for d in DENIED])
def test_denied(text: str, code: str) -> None:
    result = analyze(text)
    assert result.denial is not None, [c.argv for c in result.commands]
    assert result.denial.code == code, result.denial.message


def test_ansi_c_control_escape_decodes_as_bash_does() -> None:
    # bash: TOCTRL(c) = toupper(c) & 0x1f, and '?' is DEL
    (cmd,) = analyze("printf %s $'\\cA' $'\\c3' $'\\c?'").commands
    assert [w.value for w in cmd.argv[2:]] == ["\x01", "\x13", "\x7f"]


def test_time_keyword_takes_only_one_p() -> None:
    # `time -p -p zork` runs the program `-p`
    cmds = analyze("time -p -p zork").commands
    assert [c.program for c in cmds] == ["time", "-p"]


def test_time_keyword_takes_a_double_dash() -> None:
    assert [c.program for c in analyze("time -- zork").commands] == ["time", "zork"]
    assert [c.program for c in analyze("time -p -- -p zork").commands] == ["time", "-p"]


def test_the_time_program_is_not_the_keyword() -> None:
    # \time, 'time' and a wrapped time are /usr/bin/time, whose options take arguments
    assert [c.program for c in analyze("\\time -f %e zork").commands] == ["time", "zork"]
    assert [c.program for c in analyze("'time' -f %e zork").commands] == ["time", "zork"]
    assert [c.program for c in analyze("env time -v zork").commands] == ["env", "time", "zork"]
    assert [c.program for c in analyze("command time -a zork").commands] == ["command", "time", "zork"]


def test_env_dash_is_env_i() -> None:
    # `env - PATH=/x zork` runs zork with PATH=/x: the dash is an option, not the program
    denied = analyze("env - PATH=/tmp/bin zork x").denial
    assert denied is not None and denied.code == "protected_variable"
    assert [c.program for c in analyze("env - zork x").commands] == ["env", "zork"]


def test_sudo_edit_runs_no_command() -> None:
    assert [c.program for c in analyze("sudo -e /etc/hosts").commands] == ["sudo"]


# Arithmetic evaluates variables as expressions, so x='a[$(zork)]' runs zork from data no
# parser can see. Every arithmetic context is therefore reported as a non-literal word, which
# a policy can only match with a rule that accepts unknown values; the sandbox is the backstop.
ARITHMETIC = [
    "echo $((x))",
    "(( x ))",
    "for ((;x;)); do break; done",
    "echo ${a[@]:x}",
]


@pytest.mark.parametrize("text", ARITHMETIC)
def test_arithmetic_contexts_are_never_literal(text: str) -> None:
    result = analyze(text)
    assert result.denial is None
    assert any(not w.literal for c in result.commands for w in c.argv)


def test_test_comparisons_mark_their_operands_arithmetic() -> None:
    (cmd,) = analyze("[[ x -eq 1 ]]").commands
    assert Expansion.ARITHMETIC in cmd.argv[1].expansions
    (cmd,) = analyze("[ -v x ]").commands
    assert Expansion.ARITHMETIC in cmd.argv[2].expansions
