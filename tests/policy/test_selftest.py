"""A policy's own tests check what the gateway decides, not only which rule matches (issue 23,
point 8): the shipped `pip` rule's example was denied by the inline-code rule while
`gateway policy test` passed, because it checked only that the pip rule matched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.decide import evaluate, example_decisions
from gateway.policy.loader import PolicyError
from gateway.policy.selftest import load_checked

SHIPPED = sorted(Path("policies").glob("**/*.yaml"))

# an ask rule whose example another rule denies: the example is never asked about
OVERRIDDEN = """version: 1
principals: {agent: {roles: [dev]}}
roles: {dev: {level: 1, read_roots: ["."], write_roots: ["."]}}
tools: {run: {allow_from: 1}}
rules:
  - id: pip
    decision: ask
    justification: "installing asks"
    programs: ["python3"]
    subcommands: ["-m"]
    first_arg: ["pip"]
    accept_unknown: true
    examples: {match: ["python3 -m pip install -r requirements.txt"]}
  - id: inline
    decision: deny
    justification: "no inline code"
    programs: ["python3"]
    when_options: ["-c", "-r"]
    examples: {match: ["python3 -c x"]}
"""

# an allow rule whose example the path jail denies: only the whole decision sees it
JAILED = """version: 1
principals: {agent: {roles: [dev]}}
roles: {dev: {level: 1, read_roots: ["."], write_roots: ["out"]}}
tools: {run: {allow_from: 1}}
rules:
  - id: touch
    decision: allow
    justification: "touch files"
    programs: ["touch"]
    path_args: {write: "all"}
    examples: {match: ["touch ../elsewhere"]}
"""


def gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=120)


def test_an_example_another_rule_decides_fails_validate_and_test(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(OVERRIDDEN)
    tested = gateway("policy", "test", "--workspace", str(tmp_path), str(policy))
    assert tested.returncode == 1, tested.stdout
    assert "FAIL pip: decides 'python3 -m pip install -r requirements.txt'" in tested.stdout
    assert "the policy decides it deny (inline), not ask by this rule" in tested.stdout
    validated = gateway("policy", "validate", "--workspace", str(tmp_path), str(policy))
    assert validated.returncode == 2 and "rule pip: decides" in validated.stderr
    with pytest.raises(PolicyError, match="inline example"):
        load_checked(policy, tmp_path)


def test_options_end_lets_the_module_have_its_own_options(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        OVERRIDDEN.replace('when_options: ["-c", "-r"]', 'when_options: ["-c", "-r"]\n    options_end: ["-m"]')
    )
    tested = gateway("policy", "test", "--workspace", str(tmp_path), str(policy))
    assert tested.returncode == 0, tested.stdout
    assert "PASS pip: 'python3 -m pip install -r requirements.txt' is ask for agent" in tested.stdout


def test_an_example_the_jail_denies_fails_the_policy_test(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    policy = tmp_path / "p.yaml"
    policy.write_text(JAILED)
    ws = str(tmp_path / "ws")
    assert gateway("policy", "validate", "--workspace", ws, str(policy)).returncode == 0  # reads no files
    tested = gateway("policy", "test", "--workspace", ws, str(policy))
    assert tested.returncode == 1
    assert "FAIL touch: 'touch ../elsewhere' is allow: for agent: deny" in tested.stdout
    assert "outside the write roots" in tested.stdout


# (command, decision, rule) under the shipped policy: what follows `-m MODULE` is the module's
PYTHON_M = [
    ("python -m pip install -r requirements.txt", "ask", "pip"),
    ("python -m pip install -e .", "ask", "pip"),
    ("python3 -m pip install -c constraints.txt -r requirements.txt", "ask", "pip"),
    ("python3 -m pytest -c pytest.ini tests", "allow", "python-modules"),
    ("python3 -c 'import os' -m pip", "deny", "interpreters-inline"),
    ("python3 -B -c 'import os'", "deny", "interpreters-inline"),
    ("python3 -Im pip install -r requirements.txt", "deny", "interpreters-inline"),  # a cluster: every word an option
    ("node -r ./x.js app.js", "deny", "interpreters-inline"),
]


@pytest.mark.parametrize(("command", "decision", "rule"), PYTHON_M, ids=[c for c, _, _ in PYTHON_M])
def test_the_shipped_policy_decides_python_m_by_the_module(
    command: str, decision: str, rule: str, tmp_path: Path
) -> None:
    policy = load_checked(Path("policies/default.yaml"), tmp_path)
    got = evaluate(policy, command, "agent").decision
    assert (got.verdict.label, got.rule) == (decision, rule)


@pytest.mark.parametrize("path", SHIPPED, ids=str)
def test_every_shipped_example_is_decided_as_its_rule_says(path: Path, tmp_path: Path) -> None:
    policy = load_checked(path, tmp_path)
    for principal in sorted(policy.grants) or ["nobody"]:
        failed = [f"{c.name}: {c.detail}" for c in example_decisions(policy, principal) if not c.passed]
        assert not failed, "\n".join(failed)
