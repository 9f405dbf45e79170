"""The model files: how they load, how they fail, and how argv is read through them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import programs
from gateway.analysis import analyze
from gateway.policy.compile import compile_policy
from gateway.policy.loader import PolicyError, parse_policy
from gateway.programs import ProgramModelError, load_models, model_for, read

GOOD = """\
program: demo
summary: "a demo"
sources: ["demo --help"]
operands: {first: pattern, rest: read}
options:
  - {names: ["-e", "--regexp"], value: pattern, replaces_first: true}
  - {names: ["-o", "--output"], value: write}
  - {names: ["-n"]}
examples:
  - {command: "demo -n x f", read: [f], patterns: [x]}
"""


def _load(tmp_path: Path, text: str, name: str = "demo.yaml") -> dict[str, programs.schema.ProgramModel]:
    (tmp_path / name).write_text(text)
    return load_models(tmp_path)


def test_a_good_model_loads(tmp_path: Path) -> None:
    assert _load(tmp_path, GOOD)["demo"].operands.first == "pattern"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("value: write", "value: wrote"), "demo.yaml:7:"),  # the line of the bad value
        (
            ("value: write}", "value: write, colour: red}"),
            "demo.yaml:7:55: options[1].colour: got 'red', this key is not part of",
        ),
        (('names: ["-n"]', 'names: ["n"]'), "is not an option spelling"),
        (("read: [f]", "read: [g]"), "demo.yaml:10: examples[0]: 'demo -n x f': got read ['f']"),
        (("program: demo", "program: other"), "must be the file's name"),
        (('summary: "a demo"\n', ""), "summary: this field is required"),
        (('names: ["-n"]', 'names: ["-e"]'), "option '-e' is listed twice"),
        (("operands: {first: pattern, rest: read}", "operands: {first: script, rest: read}"), "needs `language`"),
    ],
)
def test_errors_name_the_file_the_line_and_the_field(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    text = GOOD.replace(*change)
    assert text != GOOD
    with pytest.raises(ProgramModelError) as err:
        _load(tmp_path, text)
    assert message in str(err.value)
    assert "demo.yaml" in str(err.value)


def test_a_name_modelled_twice_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "demo.yaml").write_text(GOOD)
    with pytest.raises(ProgramModelError, match="already modelled"):
        _load(tmp_path, GOOD.replace("program: demo", "program: demo2\nnames: [demo]"), "demo2.yaml")


def test_a_broken_model_stops_the_policy_from_loading(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "grep.yaml").write_text("program: grep\nsummary: x\n")
    monkeypatch.setattr(programs, "DIRECTORY", tmp_path)
    programs.models.cache_clear()
    monkeypatch.setattr(programs.load_models, "__defaults__", (tmp_path,))
    try:
        policy = parse_policy(Path("policies/default.yaml"))
        with pytest.raises(PolicyError, match="the program models"):
            compile_policy(policy, Path("policies/default.yaml"), tmp_path)
    finally:
        programs.models.cache_clear()


def test_every_program_the_shipped_policy_leaves_to_a_model_has_one() -> None:
    policy = parse_policy(Path("policies/default.yaml"))
    relying = [(r.id, p) for r in policy.rules if r.uses_model and r.path_args is None for p in r.programs]
    path_rules = {"search", "read-files", "sort", "find", "awk", "sed"}
    for rule_id, program in relying:
        if rule_id in path_rules:
            assert model_for(program) is not None, (rule_id, program)


def _reading(text: str) -> programs.Reading:
    (cmd,) = analyze(text, second_opinion_enabled=False).commands
    model = model_for(cmd.program)
    assert model is not None
    return read(model, cmd)


# (command, options, reads, writes, patterns, refused)
READINGS = [
    ("grep -ne x f", ["-n", "-e"], ["f"], [], ["x"], False),  # -e's value is attached
    ("grep -en f", ["-e"], ["f"], [], ["n"], False),  # 'n' is -e's value, not -n
    ("grep --reg=x f", ["--regexp"], ["f"], [], ["x"], False),  # a unique prefix
    ("grep --regexp x -- -f", ["--regexp"], ["-f"], [], ["x"], False),  # after --: a file
    ("grep x f -r", ["-r"], ["f"], [], ["x"], False),  # GNU getopt permutes: -r is an option
    ("grep --color x f", ["--color"], ["f"], [], ["x"], False),  # optional: not the next word
    ("grep -12 x f", ["-12"], ["f"], [], ["x"], False),
    ("grep --no x f", [], [], [], [], True),  # ambiguous
    ("grep --color-x x f", [], [], [], [], True),
    ("grep --count=3 x f", [], [], [], [], True),  # takes no value
    ("grep -q$X x f", [], [], [], [], True),
    ("sed -n -i.bak p f", ["-n", "-i"], ["f"], ["f", "f.bak", "f.bak"], [], False),
    ("sed -i -- p -f", ["-i"], ["-f"], ["-f"], [], False),
    ("sort -ko f", ["-k"], ["f"], [], [], False),  # 'o' is the key
    ("sort -ro f", ["-r", "-o"], [], ["f"], [], False),
    ("head -n5 -- -n", ["-n"], ["-n"], [], [], False),
    ("find -L . -name x -newer y", ["-L", "-name", "-newer"], ["y", "."], [], ["x"], False),
    (
        "find . \\( -name a -o -name b \\) -print",
        ["(", "-name", "-o", "-name", ")", "-print"],
        ["."],
        [],
        ["a", "b"],
        False,
    ),
]


@pytest.mark.parametrize(
    ("text", "options", "reads", "writes", "patterns", "refused"), READINGS, ids=[r[0] for r in READINGS]
)
def test_argv_is_read_as_getopt_and_find_read_it(
    text: str, options: list[str], reads: list[str], writes: list[str], patterns: list[str], refused: bool
) -> None:
    got = _reading(text)
    assert bool(got.refused) is refused, got
    if refused:
        return
    taken = got.to_json()
    assert taken["options"] == options
    assert taken["read"] == reads
    assert taken["write"] == writes
    assert taken["patterns"] == patterns


SPLITS = [
    ("git log -n $V", True),  # unquoted: split at blanks
    ("git log -n x$V", True),
    ("git log -n $(cat f)", True),
    ("git log -n ${V:-1}", True),
    ('git log -n {"$V",2}', True),  # a brace expansion left unexpanded: one word per element
    ('git log -n "$V"', False),
    ('git log -n x"$V"y', False),
    ('git log -n "$(cat f)"', False),
    ("git log -n '$V'", False),
    ("git log -n $'a b'", False),
    ('git log -n "a\\"$V\\""', False),
    ("git log -n 5", False),
]


@pytest.mark.parametrize(("command", "splits"), SPLITS)
def test_a_word_the_shell_may_split_is_known(command: str, splits: bool) -> None:
    from gateway.programs.argv import may_split

    cmd = analyze(command, second_opinion_enabled=False).commands[-1]
    assert may_split(cmd.argv[3]) is splits, cmd.argv[3]
    reading = read(programs.models()["git"], cmd)
    assert bool(reading.refused) is splits, reading
