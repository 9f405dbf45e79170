"""Decision tables for what the analysis reports beyond argv: which words are literal and why
not, redirects, contexts, assignments, flags, and the second opinion's verdict."""

from __future__ import annotations

import pytest

from gateway.analysis import (
    Context,
    Expansion,
    Flag,
    OpinionStatus,
    RedirectMode,
    analyze,
)

E = Expansion
C = Context
M = RedirectMode

# --- words: (text, command index, [(value, expansions)]) -----------------------------------------
WORDS = [
    ("echo plain", 0, [("echo", ()), ("plain", ())]),
    ("echo $HOME", 0, [("echo", ()), ("$HOME", (E.PARAMETER,))]),
    ('echo "$HOME/x"', 0, [("echo", ()), ("$HOME/x", (E.PARAMETER,))]),
    ("echo '$HOME'", 0, [("echo", ()), ("$HOME", ())]),
    ('echo "\\$HOME"', 0, [("echo", ()), ("$HOME", ())]),
    ("echo $(id)", 1, [("echo", ()), ("$(id)", (E.COMMAND_SUBSTITUTION,))]),
    ("echo $((1+2))", 0, [("echo", ()), ("$((1+2))", (E.ARITHMETIC,))]),
    ("cat <(ls)", 1, [("cat", ()), ("<(ls)", (E.PROCESS_SUBSTITUTION,))]),
    ("ls *.py", 0, [("ls", ()), ("*.py", (E.GLOB,))]),
    ("ls file?.txt", 0, [("ls", ()), ("file?.txt", (E.GLOB,))]),
    ("ls [ab].c", 0, [("ls", ()), ("[ab].c", (E.GLOB,))]),
    ("ls '*.py'", 0, [("ls", ()), ("*.py", ())]),
    ("ls \\*.py", 0, [("ls", ()), ("*.py", ())]),
    ("cd ~", 0, [("cd", ()), ("~", (E.TILDE,))]),
    ("cd ~/src", 0, [("cd", ()), ("~/src", (E.TILDE,))]),
    ("echo a~b '~'", 0, [("echo", ()), ("a~b", ()), ("~", ())]),
    # plain brace words are expanded by the analyser (braces.py); the rest stay brace words
    ("echo {a,b}", 0, [("echo", ()), ("a", ()), ("b", ())]),
    ("echo x{1..3}", 0, [("echo", ()), ("x1", ()), ("x2", ()), ("x3", ())]),
    ("echo {1..3}", 0, [("echo", ()), ("1", ()), ("2", ()), ("3", ())]),
    ('echo "x"{a,b} {a..Z}', 0, [("echo", ()), ("x{a,b}", (E.BRACE,)), ("{a..Z}", (E.BRACE,))]),
    ("echo {a} {} '{a,b}'", 0, [("echo", ()), ("{a}", ()), ("{}", ()), ("{a,b}", ())]),
    ('echo $"msg"', 0, [("echo", ()), ("msg", (E.TRANSLATION,))]),
    ("echo ${x:-default}", 0, [("echo", ()), ("${x:-default}", (E.PARAMETER,))]),
    ("echo pre$x'post'", 0, [("echo", ()), ("pre$xpost", (E.PARAMETER,))]),
    ("echo *$x", 0, [("echo", ()), ("*$x", (E.GLOB, E.PARAMETER))]),
    ("find . -exec rm {} \\;", 1, [("rm", ()), ("{}", (E.PLACEHOLDER,))]),
    ("xargs -I % mv % %.bak", 1, [("mv", ()), ("%", (E.PLACEHOLDER,)), ("%.bak", (E.PLACEHOLDER,))]),
]


@pytest.mark.parametrize(("text", "index", "expected"), WORDS, ids=[w[0] for w in WORDS])
def test_words(text: str, index: int, expected: list[tuple[str, tuple[Expansion, ...]]]) -> None:
    result = analyze(text)
    assert result.denial is None, result.denial
    words = result.commands[index].argv
    assert [(w.value, tuple(sorted(w.expansions))) for w in words] == [(v, tuple(sorted(k))) for v, k in expected]


# --- redirects: (text, command index, [(mode, fd, target value, both)]) ---------------------------
REDIRECTS = [
    ("echo hi > out", 0, [(M.WRITE, None, "out", False)]),
    ("echo hi >> out", 0, [(M.APPEND, None, "out", False)]),
    ("cat < in", 0, [(M.READ, None, "in", False)]),
    ("ls 2> err", 0, [(M.WRITE, 2, "err", False)]),
    ("ls 2>> err", 0, [(M.APPEND, 2, "err", False)]),
    ("ls &> all", 0, [(M.WRITE, None, "all", True)]),
    ("ls &>> all", 0, [(M.APPEND, None, "all", True)]),
    ("ls >& all", 0, [(M.WRITE, None, "all", True)]),
    ("ls >| forced", 0, [(M.WRITE, None, "forced", False)]),
    ("ls 2>&1", 0, [(M.DUP, 2, "1", False)]),
    ("ls 1>&2", 0, [(M.DUP, 1, "2", False)]),
    ("cat <&3", 0, [(M.DUP, None, "3", False)]),
    ("exec 3>&-", 0, [(M.CLOSE, 3, None, False)]),
    ("ls 2>&$fd", 0, [(M.WRITE, 2, "$fd", False)]),
    ("cat <<< hi", 0, [(M.HERESTRING, None, "hi", False)]),
    ("cat <<'EOF'\nbody $x\nEOF", 0, [(M.HEREDOC, None, "body $x\n", False)]),
    ("cat > f <<'EOF'\nx\nEOF", 0, [(M.WRITE, None, "f", False), (M.HEREDOC, None, "x\n", False)]),
    ("make > log 2>&1", 0, [(M.WRITE, None, "log", False), (M.DUP, 2, "1", False)]),
    ("{ a; } > out", 0, [(M.WRITE, None, "out", False)]),
    ("(a; b) 2> err", 1, [(M.WRITE, 2, "err", False)]),
    ("> truncated", 0, [(M.WRITE, None, "truncated", False)]),
    ("ls > $(mktemp)", 1, [(M.WRITE, None, "$(mktemp)", False)]),
    ("while read l; do :; done < list", 0, [(M.READ, None, "list", False)]),
]


@pytest.mark.parametrize(("text", "index", "expected"), REDIRECTS, ids=[r[0] for r in REDIRECTS])
def test_redirects(text: str, index: int, expected: list[tuple[RedirectMode, int | None, str | None, bool]]) -> None:
    result = analyze(text)
    assert result.denial is None, result.denial
    got = [(r.mode, r.fd, r.target.value if r.target else None, r.both) for r in result.commands[index].redirects]
    assert got == expected


# --- contexts: (text, {program: context tuple}) ------------------------------------------------------
CONTEXTS = [
    ("a | b", {"a": (C.PIPELINE,), "b": (C.PIPELINE,)}),
    ("a && b", {"a": (C.AND,), "b": (C.AND,)}),
    ("a || b", {"a": (C.OR,), "b": (C.OR,)}),
    ("a; b", {"a": (C.SEQUENCE,), "b": (C.SEQUENCE,)}),
    ("a\nb", {"a": (C.SEQUENCE,), "b": (C.SEQUENCE,)}),
    ("a & b", {"a": (C.SEQUENCE, C.BACKGROUND), "b": (C.SEQUENCE,)}),
    ("a &", {"a": (C.BACKGROUND,)}),
    ("! a", {"a": (C.NEGATED,)}),
    ("(a)", {"a": (C.SUBSHELL,)}),
    ("{ a; }", {"a": (C.GROUP,)}),
    ("f() { a; }", {"a": (C.FUNCTION, C.GROUP)}),
    ("for x in 1; do a; done", {"a": (C.LOOP,)}),
    ("while a; do b; done", {"a": (C.LOOP,), "b": (C.LOOP,)}),
    ("if a; then b; fi", {"a": (C.IF,), "b": (C.IF,)}),
    ("case x in x) a;; esac", {"a": (C.CASE,)}),
    ("echo $(a)", {"a": (C.COMMAND_SUBSTITUTION,), "echo": ()}),
    ("cat <(a)", {"a": (C.PROCESS_SUBSTITUTION_IN,)}),
    ("tee >(a)", {"a": (C.PROCESS_SUBSTITUTION_OUT,)}),
    ("echo $(( $(a) ))", {"a": (C.ARITHMETIC, C.COMMAND_SUBSTITUTION)}),
    ("(( $(a) ))", {"a": (C.ARITHMETIC, C.COMMAND_SUBSTITUTION), "((": ()}),
    ("cat <<EOF\n$(a)\nEOF", {"a": (C.HEREDOC, C.COMMAND_SUBSTITUTION)}),
    ("env a", {"env": (), "a": (C.WRAPPER,)}),
    ("bash -c 'a | b'", {"a": (C.WRAPPER, C.PIPELINE), "b": (C.WRAPPER, C.PIPELINE)}),
    ("(a | b) && c &", {"a": (C.BACKGROUND, C.AND, C.SUBSHELL, C.PIPELINE), "c": (C.BACKGROUND, C.AND)}),
    ("x=$(a)", {"a": (C.COMMAND_SUBSTITUTION,)}),
    ("cat <<'EOF' | a\nx\nEOF", {"cat": (C.PIPELINE,), "a": (C.PIPELINE,)}),
]


@pytest.mark.parametrize(("text", "expected"), CONTEXTS, ids=[c[0] for c in CONTEXTS])
def test_contexts(text: str, expected: dict[str, tuple[Context, ...]]) -> None:
    result = analyze(text)
    assert result.denial is None, result.denial
    got = {c.program: c.context for c in result.commands if c.argv}
    assert {k: got[k] for k in expected} == expected


# --- assignments and flags ------------------------------------------------------------------------------
def test_prefix_assignments_are_reported_with_their_values() -> None:
    result = analyze('FOO=1 BAR="$x y" make')
    (cmd,) = result.commands
    assert [(a.name, a.value.value, a.value.literal) for a in cmd.assignments] == [
        ("FOO", "1", True),
        ("BAR", "$x y", False),
    ]


def test_bare_assignment_runs_no_program_but_is_reported() -> None:
    (cmd,) = analyze("X+=more").commands
    assert cmd.argv == ()
    assert [(a.name, a.value.value, a.append) for a in cmd.assignments] == [("X", "more", True)]


def test_env_assignments_reach_the_inner_command() -> None:
    env, inner = analyze("A=1 env B=2 make").commands
    assert [a.name for a in env.assignments] == ["A"]
    assert [a.name for a in inner.assignments] == ["A", "B"]
    assert inner.wrapper == "env"


def test_sudo_is_flagged_on_the_inner_command() -> None:
    _sudo, inner = analyze("sudo -u bob make install").commands
    assert Flag.PRIVILEGE in inner.flags
    assert inner.program == "make"
    assert inner.wrapper == "sudo"


def test_dynamic_args_and_builtin_flags() -> None:
    cmds = analyze("find . -exec grep x {} + ; [ -f y ]").commands
    assert Flag.DYNAMIC_ARGS in cmds[1].flags
    assert Flag.BUILTIN in cmds[2].flags
    assert Flag.DYNAMIC_ARGS in analyze("xargs rm").commands[1].flags


def test_bash_c_is_flagged_and_its_commands_follow() -> None:
    shell, inner = analyze("bash -c 'make'").commands
    assert Flag.SHELL_SCRIPT in shell.flags
    assert inner.wrapper == "bash"


# --- the second opinion's verdict ---------------------------------------------------------------------
# bashlex first; where it cannot confirm (blind, unparsed, timed out), mvdan/sh (shfmt) must read
# exactly the same commands and words. The blind spots bashlex reported stay on the record.
CONFIRMED = OpinionStatus.CONFIRMED_BY_SHFMT
OPINIONS = [
    ("ls | grep x", OpinionStatus.AGREED, (), ""),
    ("echo ${x:-$(id)}", CONFIRMED, ("command substitution inside ${...}",), "agreed"),
    ("cat <<EOF\n$(id)\nEOF", CONFIRMED, ("substitution in a here-document",), "agreed"),
    ("$'\\x6c\\x73' -l", CONFIRMED, ("ANSI-C quoting $'...'",), "agreed"),
    ("echo \"a\"'b'", CONFIRMED, ("bashlex quote removal after a quoted part (\"a\"'b')",), "agreed"),
    ('grep "a\\(" f', CONFIRMED, ('bashlex drops backslashes inside double quotes ("\\(" is \\( in bash)',), "agreed"),
    ("(( x++ ))", CONFIRMED, ("arithmetic command (( )), which bashlex reads as nested subshells",), "agreed"),
    ("case a in a) ls;; esac", CONFIRMED, (), "agreed"),
    ("[[ -f x ]]", CONFIRMED, (), "agreed"),
    ("echo $((1+2))", CONFIRMED, (), "agreed"),
    ("cat <<'EOF'\nx\nEOF", CONFIRMED, (), "agreed"),
    ("a=(1 2)", CONFIRMED, (), "agreed"),
    ("echo 'pre${'post", CONFIRMED, (), "agreed"),  # bashlex loops on it until its CPU limit
    ("time ls | wc -l", OpinionStatus.UNPARSED, (), "uncomparable"),  # `time` over a pipeline
    ("eval x", OpinionStatus.SKIPPED, (), ""),
]


@pytest.mark.parametrize(("text", "status", "blind", "shfmt"), OPINIONS, ids=[o[0] for o in OPINIONS])
def test_second_opinion(text: str, status: OpinionStatus, blind: tuple[str, ...], shfmt: str) -> None:
    result = analyze(text, use_cache=False)
    assert result.second_opinion.status is status, result.second_opinion
    assert result.second_opinion.blind_spots == blind
    assert result.second_opinion.shfmt == shfmt
    assert result.second_opinion.confirmed is (status in (OpinionStatus.AGREED, CONFIRMED))


def test_disagreement_is_a_denial_with_both_views() -> None:
    result = analyze("a[$(id)]=1", use_cache=False)
    assert result.denial is not None
    assert result.denial.code == "parser_disagreement"
    assert result.second_opinion.status is OpinionStatus.DISAGREED
    assert result.denial.details["tree_sitter"] == [["id"], []]
    assert result.denial.details["bashlex"] == [["a[$(id)]=1"], ["id"]]
    assert result.commands == ()


def test_without_second_opinion_the_result_says_so() -> None:
    result = analyze("ls", second_opinion_enabled=False)
    assert result.second_opinion.status is OpinionStatus.SKIPPED
    assert not result.second_opinion.confirmed
