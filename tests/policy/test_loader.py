"""Policy files: strict YAML, errors with file:line:column, layering, examples at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.compile import load_policy
from gateway.policy.loader import PolicyError, parse_policy
from gateway.policy.selftest import load_checked

RULE = """  - id: {id}
    decision: {decision}
    justification: "j"
    programs: [{program}]
    examples: {{match: ["{program}"]}}
"""


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


# (yaml text, expected fragments of the error)
ERRORS = [
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="alow", program="ls"),
        ["p.yaml:4:15", "rules[0].decision", "got 'alow'", "expected 'allow', 'ask' or 'deny'"],
    ),
    ("version: 1\nroles:\n  r: {level: 1}\n  r: {level: 2}\n", ["p.yaml:4:3", "duplicate key 'r'", "first at line 3"]),
    ("version: 1\nroles:\n  r: {level: 0755}\n", ["p.yaml:3:14", "roles.r.level", "got '0755'", "whole number"]),
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="ls") + "    accept_unknown: no\n",
        ["p.yaml:8:21", "rules[0].accept_unknown", "got 'no'", "true or false"],
    ),
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="ls") + "    typo: 1\n",
        ["p.yaml:8:11", "rules[0].typo", "not part of the format"],
    ),
    (
        "version: 1\nrules:\n  - id: a\n    decision: allow\n",
        ["rules[0].justification", "required", "rules[0].programs", "rules[0].examples"],
    ),
    ("version: 2\n", ["version", "got 2", "expected 1"]),
    ("version: 1\nrules:\n" + RULE.format(id="Bad Id", decision="allow", program="ls"), ["rules[0].id"]),
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="bin/ls"),
        ["rules[0].programs", "absolute path"],
    ),
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="ls") + "    args: ['(']\n",
        ["rules[0].args", "invalid regular expression"],
    ),
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="ls") * 2,
        ["'a' is used by an earlier rule"],
    ),
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="ls") + "    approval: client\n",
        ["rules[0]", "approval: 'client' only applies to rules that ask"],
    ),
    (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="ask", program="ls") + "    approval: agent\n",
        ["rules[0].approval", "got 'agent'"],
    ),
    ("version: 1\nrules: [\n", ["p.yaml:"]),
    ("", ["empty"]),
]


@pytest.mark.parametrize(("text", "fragments"), ERRORS, ids=[f[1][0] if f[1] else "?" for f in ERRORS])
def test_errors_name_the_place_and_the_fix(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, "p.yaml", text)
    with pytest.raises(PolicyError) as exc:
        parse_policy(path)
    for fragment in fragments:
        assert fragment in str(exc.value), str(exc.value)


def test_yes_and_octal_stay_strings_where_strings_are_wanted(tmp_path: Path) -> None:
    text = (
        "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="ls") + "    subcommands: [no, 0755]\n"
    )
    policy = parse_policy(write(tmp_path, "p.yaml", text))
    assert policy.rules[0].subcommands == ["no", "0755"]


def test_examples_that_fail_stop_the_load(tmp_path: Path) -> None:
    text = "version: 1\nrules:\n" + RULE.format(id="a", decision="allow", program="ls").replace(
        'match: ["ls"]', 'match: ["cat x"], not_match: ["ls -l"]'
    )
    with pytest.raises(PolicyError) as exc:
        load_checked(write(tmp_path, "p.yaml", text), tmp_path)
    assert "2 inline example(s) fail" in str(exc.value)
    assert "rule a: matches 'cat x'" in str(exc.value)


def test_layers_override_by_key_and_final_rules_hold(tmp_path: Path) -> None:
    write(
        tmp_path,
        "base.yaml",
        "version: 1\nroles:\n  r: {level: 3}\nrules:\n"
        + RULE.format(id="a", decision="deny", program="rm")
        + "    final: true\n"
        + RULE.format(id="b", decision="allow", program="ls"),
    )
    upper = write(
        tmp_path,
        "top.yaml",
        "version: 1\ninclude: [base.yaml]\nroles:\n  r: {level: 1}\nrules:\n"
        + RULE.format(id="b", decision="ask", program="ls"),
    )
    policy = load_policy(upper, tmp_path)
    assert policy.policy.roles["r"].level == 1  # lowered: an upper layer may tighten a role (test_layers.py)
    assert policy.rules["b"].decision.value == "ask"
    assert policy.rules["a"].decision.value == "deny"
    relax = write(
        tmp_path,
        "relax.yaml",
        "version: 1\ninclude: [base.yaml]\nrules:\n" + RULE.format(id="a", decision="allow", program="rm"),
    )
    with pytest.raises(PolicyError) as exc:
        load_policy(relax, tmp_path)
    assert "rule 'a' is final" in str(exc.value)


def test_include_cycles_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "version: 1\ninclude: [b.yaml]\n")
    write(tmp_path, "b.yaml", "version: 1\ninclude: [a.yaml]\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(tmp_path / "a.yaml", tmp_path)
    assert "include cycle" in str(exc.value)


def test_unknown_roles_and_inheritance_cycles_are_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "p.yaml", "version: 1\nprincipals:\n  x: {roles: [ghost]}\n")
    with pytest.raises(PolicyError, match="unknown role 'ghost'"):
        load_policy(p, tmp_path)
    p = write(tmp_path, "q.yaml", "version: 1\nroles:\n  a: {inherits: [b]}\n  b: {inherits: [a]}\n")
    with pytest.raises(PolicyError, match="inheritance deeper"):
        load_policy(p, tmp_path)


@pytest.mark.parametrize("path", sorted(Path("policies").glob("**/*.yaml")), ids=str)
def test_every_shipped_policy_loads_with_its_examples(path: Path, tmp_path: Path) -> None:
    policy = load_checked(path, tmp_path)
    assert policy.rules
