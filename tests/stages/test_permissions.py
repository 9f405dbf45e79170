"""Rule matching: option spellings, first arguments, env assignments, unknown values."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.analysis import analyze
from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Rule
from gateway.policy.selftest import load_checked
from gateway.stages.permissions import match


def rule(**fields: object) -> Rule:
    base: dict[str, object] = {
        "id": "r",
        "decision": "allow",
        "justification": "j",
        "programs": ["sed"],
        "path_args": {},  # written: these tables are about option spellings, not sed's model
        "examples": {"match": ["sed"]},
    }
    return Rule.model_validate(base | fields)


# (forbidden option, command, matches the rule?)
SPELLINGS = [
    ("-i", "sed -i s/a/b/ f", False),
    ("-i", "sed -i.bak s/a/b/ f", False),
    ("-i", "sed -ni p f", False),
    ("-i", "sed -n p f", True),
    ("-i", "sed -- -i", True),  # after --, an argument
    ("--in-place", "sed --in-place s/a/b/ f", False),
    ("--in-place", "sed --in-place=.bak s/a/b/ f", False),
    ("--in-place", "sed --in-pl s/a/b/ f", False),  # getopt accepts unique prefixes
    ("--in-place", "sed --inplace s/a/b/ f", True),
    ("-exec", "sed -exec x", False),
    ("-exec", "sed -execdir x", True),
]


@pytest.mark.parametrize(("spec", "command", "matches"), SPELLINGS, ids=[s[1] for s in SPELLINGS])
def test_forbidden_option_spellings(spec: str, command: str, matches: bool) -> None:
    (cmd,) = analyze(command).commands
    found, why = match(rule(forbidden_options=[spec]), cmd)
    assert (found is not None) is matches, why
    if not matches:
        assert "is not allowed" in why


def test_programs_match_by_exact_name_or_absolute_path() -> None:
    r = rule(programs=["git", "/usr/bin/make"])
    assert match(r, analyze("git status").commands[0])[0] is not None
    assert match(r, analyze("/usr/bin/make").commands[0])[0] is not None
    for other in ("./git status", "/tmp/git status", "/usr/local/bin/git", "make"):
        assert match(r, analyze(other).commands[0])[0] is None, other


def test_first_arg_args_env_and_unknown_values() -> None:
    r = rule(programs=["python"], subcommands=["-m"], first_arg=["pytest"], env=["CI", "PY*"])
    ok = analyze("CI=1 PYTHONHASHSEED=0 python -m pytest -x tests/").commands[0]
    assert match(r, ok)[0] is not None
    assert "first argument 'http.server'" in match(r, analyze("python -m http.server").commands[0])[1]
    assert "setting EDITOR is not allowed" in match(r, analyze("EDITOR=/x python -m pytest").commands[0])[1]
    assert "only known at run time" in match(r, analyze("python -m pytest $ARGS").commands[0])[1]
    assert match(rule(programs=["python"], accept_unknown=True), analyze("python $x").commands[0])[0] is not None
    anchored = rule(args=["s/[a-z]+/[a-z]+/"])
    assert match(anchored, analyze("sed s/a/b/ ").commands[0])[0] is not None
    assert match(anchored, analyze("sed 's/a/b/;e id'").commands[0])[0] is None  # fullmatch, not a prefix


def test_arguments_arriving_at_run_time_need_accept_unknown() -> None:
    inner = analyze("ls | xargs rm").commands[-1]
    assert "arrive at run time" in match(rule(programs=["rm"]), inner)[1]
    assert match(rule(programs=["rm"], accept_unknown=True), inner)[0] is not None


# --- a denial says what would make the command pass (issue 13, class 10) -------------------------


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> CompiledPolicy:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "data.txt").write_text("x\n")
    return load_checked(Path("policies/default.yaml"), ws)


DENIALS = [
    ("pyhton3 x.py", "did you mean python3?"),
    ("shred data.txt", "the policy names no rule for shred"),
    ("dd if=data.txt of=y", "the files tool reads, writes, lists and searches files"),
    ("git frobnicate", "no rule covers this use of git (its rules cover the subcommands"),
    ("cat $F", "write it literally"),
    ("sort --compress-program=sh data.txt", "it runs the program 'sh'"),  # the model (programs/sort.yaml)
    ("FOO=1 ls", "setting FOO is not allowed (the rule allows no variables)"),
]


@pytest.mark.parametrize(("command", "hint"), DENIALS, ids=[d[0] for d in DENIALS])
def test_a_denial_says_what_to_do(shipped: CompiledPolicy, command: str, hint: str) -> None:
    decision = evaluate(shipped, command, "agent").decision
    assert decision.verdict is Verdict.DENY
    assert hint in decision.reasons[0].message, decision.reasons[0].message


def test_no_subcommand_of_a_deny_rule_is_offered(shipped: CompiledPolicy) -> None:
    message = evaluate(shipped, "git frobnicate", "agent").decision.reasons[0].message
    assert "clone" not in message and "daemon" not in message  # denied by the policy: not a way out
