"""A variable nothing sets, in a `run` call's new bash, is empty (gateway/analysis/unset.py), and
its hostile twins: a variable the text, a builtin, arithmetic, the env tool or an earlier
command could set stays a value known only at run time.

The policy here allows the builtins that assign (read, printf, declare...) and `[[`, so each
hostile form is refused for the variable alone, not because its other commands are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.analysis import analyze, unset
from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Tool
from gateway.policy.selftest import load_checked

ALLOW, DENY = Verdict.ALLOW, Verdict.DENY

POLICY = """
version: 1
principals: {agent: {roles: [dev]}}
roles: {dev: {level: 1, read_roots: ["."], write_roots: ["."]}}
tools: {run: {allow_from: 1}, session: {allow_from: 1}}
environment: {allow: ["APP_*"]}
second_opinion: {unconfirmed: allow}
rules:
  - id: search
    decision: allow
    justification: "Searching; no -R (it follows every symlink)."
    programs: ["grep"]
    forbidden_options: ["-R", "--dereference-recursive"]
    accept_unknown: true
    examples: {match: ["grep x f"]}
  - id: builtins
    decision: allow
    justification: "Shell builtins, which assign variables."
    programs: ["read", "printf", "declare", "export", "local", "let", "mapfile", "getopts", "echo", "true",
               "test", "[", "[[", "eval", "source", "set"]
    accept_unknown: true
    examples: {match: ["echo x"]}
  - id: git
    decision: allow
    justification: "Recording work."
    programs: ["git"]
    subcommands: ["reset", "status"]
    accept_unknown: true
    examples: {match: ["git status"]}
"""


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    root = tmp_path_factory.mktemp("unset")
    ws = root / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("a\nb\n")
    (root / "p.yaml").write_text(POLICY)
    return load_checked(root / "p.yaml", ws)


def run(policy: CompiledPolicy, text: str, env: dict[str, str] | None = None) -> Verdict:
    return evaluate(policy, text, "agent", env=env, sandboxed=True, fresh_shell=True).decision.verdict


HONEST = [
    'grep -qF "${V}" notes.txt',  # old: deny, "${V}" could be -R
    "grep -c $V notes.txt",  # unquoted and empty: no word at all
    'git reset --hard "${TAG_NAME}"',  # old: deny, it could be --pathspec-from-file=F
    "set -eu\ngrep -c x$V notes.txt",
]
# (text, env of the call): each names V (or APP_V) where something could have set it
HOSTILE = [
    ('V=-R; grep -c "$V" notes.txt', None),  # assigned in the text
    ('grep -c "$V" notes.txt; V=-R; grep -c "$V" notes.txt', None),
    ('for V in -R; do grep -c "$V" notes.txt; done', None),
    ('read V <<< "-R"; grep -c "$V" notes.txt', None),
    ('read <<< "-R"; grep -c "$REPLY" notes.txt', None),  # bash sets REPLY
    ('r""ead V <<< "-R"; grep -c "$V" notes.txt', None),  # quotes joined: still read
    ('printf -v V -- -R; grep -c "$V" notes.txt', None),
    ('n=X; declare "${n}Y=-R"; grep -c "$XY" notes.txt', None),  # a name built at run time
    ('n=X; export "${n}Y=-R"; grep -c "$XY" notes.txt', None),
    ('a="X""Y=-5"; [[ $a -eq 0 ]]; grep -c "$XY" notes.txt', None),  # arithmetic assigns XY=-5
    ('a="X""Y=-5"; let "$a"; grep -c "$XY" notes.txt', None),
    ('a="X""Y=-5"; echo $(( a )); grep -c "$XY" notes.txt', None),
    ('eval "X""Y=-R"; grep -c "$XY" notes.txt', None),
    ('source ./env.sh; grep -c "$V" notes.txt', None),
    ('grep -c "${V:=-R}" notes.txt', None),  # a default that assigns
    ('grep -c "${!W}" notes.txt', None),  # indirection
    ('grep -c "$_" notes.txt', None),  # bash sets $_ to the last word of the command before
    ('grep -c "$APP_V" notes.txt', None),  # the env tool may have stored APP_V
    ('grep -c "$V" notes.txt', {"V": "-R"}),  # the call's env
    ('grep -c "$HOME" notes.txt', None),  # set by the sandbox, not empty
]


@pytest.mark.parametrize("text", HONEST)
def test_an_unset_variable_is_empty_in_a_run_call(policy: CompiledPolicy, text: str) -> None:
    assert run(policy, text) is ALLOW
    # ... and unknown where the shell may have inherited it (a session, a hook)
    assert evaluate(policy, text, "agent", tool=Tool.SESSION, sandboxed=True).decision.verdict is DENY


@pytest.mark.parametrize(("text", "env"), HOSTILE, ids=[h[0][:60] for h in HOSTILE])
def test_a_variable_something_could_set_stays_unknown(
    policy: CompiledPolicy, text: str, env: dict[str, str] | None
) -> None:
    assert run(policy, text, env) is DENY


def test_what_an_unset_variable_becomes() -> None:
    def words(text: str) -> list[list[str]]:
        a = analyze(text, second_opinion_enabled=False)
        cmds = unset.resolve(text, a.commands, lambda name: name == "SET")
        return [[w.value if w.literal else f"?{w.raw}" for w in c.argv] for c in cmds]

    assert words('grep -c "$V" f') == [["grep", "-c", "", "f"]]
    assert words("grep -c $V f") == [["grep", "-c", "f"]]
    assert words("cargo check --features $F,tracing") == [["cargo", "check", "--features", ",tracing"]]
    assert words("echo 'x$V' \"a${V}b\" \\$V") == [["echo", "x$V", "ab", "$V"]]
    assert words('echo "$SET" "$V"') == [["echo", '?"$SET"', ""]]
    assert words("echo $V* ~$V {$V,-R} $'$V' $$V $1") == [["echo", "?$V*", "?~$V", "?{$V,-R}", "$V", "?$$V", "?$1"]]
    assert words('V=x; echo "$V"') == [[], ["echo", '?"$V"']]
    assert words("make DESTDIR=~$V") == [["make", "?DESTDIR=~$V"]]  # bash expands that ~ to HOME


def test_the_network_policy_s_variables_are_set(tmp_path: Path) -> None:
    """A sandbox whose network is a policy is told the proxy (HTTP_PROXY...): those are set."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("a\n")
    text = POLICY.replace("second_opinion:", 'sandbox: {network: {allow: ["example.com:443"]}}\nsecond_opinion:')
    (tmp_path / "p.yaml").write_text(text)
    policy = load_checked(tmp_path / "p.yaml", ws)
    assert run(policy, 'grep -c "$HTTPS_PROXY" notes.txt') is DENY
    assert run(policy, 'grep -c "$NO_PROXY" notes.txt') is DENY
    assert run(policy, 'grep -c "$V" notes.txt') is ALLOW
