"""A variable nothing sets is empty in a `run` call (gateway/analysis/unset.py), through the whole
gateway: the real sandbox's bash runs the text and finds it empty; a variable the env tool, the
text or an earlier command could set stays unknown, and a word that could be a forbidden option
is refused. And a wrapper's option value the shell splits is refused (it moves where the
command the wrapper runs starts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.approval import CallbackApprover
from gateway.audit import AuditLog, verify
from gateway.calls import EnvCall, ProcessCall, RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over

POLICY: dict[str, Any] = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}},
    "roles": {"dev": {"level": 2, "read_roots": ["."], "write_roots": ["."], "limits": {"processes": 2}}},
    "tools": {"run": {"allow_from": 1}, "processes": {"allow_from": 2}, "env": {"allow_from": 2}},
    "environment": {"allow": ["APP_*"]},
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [
        {
            "id": "search",
            "decision": "allow",
            "justification": "Searching; no -R (it follows every symlink).",
            "programs": ["grep"],
            "forbidden_options": ["-R", "--dereference-recursive"],
            "accept_unknown": True,
            "examples": {"match": ["grep x f"]},
        },
        {
            "id": "basics",
            "decision": "allow",
            "justification": "harmless programs, the builtin read, and nice, which runs a command decided on its own",
            "programs": ["echo", "read", "nice"],
            "accept_unknown": True,
            "examples": {"match": ["echo x"]},
        },
    ],
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return tmp_path / "ws"


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("a\nb\n")
    (ws / "link").mkdir()
    hand_over(ws)
    policy = compile_policy(Policy.model_validate(POLICY), tmp_path / "p.yaml", ws, sha256="test")
    g = Gateway(policy, AuditLog(tmp_path / "audit"), CallbackApprover(lambda r: False), state_dir=tmp_path / "state")
    yield g
    g.handle(ProcessCall(principal="agent", action="stop_all"))
    g.close()
    assert verify(tmp_path / "audit").ok


def run(gw: Gateway, command: str, **kw: Any) -> dict[str, Any]:
    return gw.handle(RunCall(principal="agent", command=command, **kw))


def test_a_variable_nothing_sets_is_empty_where_it_runs(gw: Gateway) -> None:
    out = run(gw, 'grep -c "${V}" notes.txt; echo "[$V]"')  # old: denied, "${V}" could be -R
    assert out["status"] == "ok" and out["stdout"] == "2\n[]\n", out
    out = run(gw, "grep -c x $V notes.txt")  # unquoted: no word at all
    assert out["status"] == "ok" and out["stdout"] == "0\n", out


def test_a_variable_something_could_set_stays_unknown(gw: Gateway) -> None:
    assert gw.handle(EnvCall(principal="agent", action="set", name="APP_V", value="-R"))["status"] == "ok"
    for text, env in [
        ('grep -c "$APP_V" notes.txt', {}),  # the env tool stored it
        ('grep -c "$V" notes.txt', {"V": "-R"}),  # the call sets it
        ('V=-R; grep -c "$V" notes.txt', {}),  # the text does
        ('read V <<< "-R"; grep -c "$V" notes.txt', {}),  # a builtin does
    ]:
        out = run(gw, text, env=env)
        assert out["status"] == "denied" and out["error"]["code"] == "POLICY_DENIED", (text, out)
    # a process starts in a shell too, but may be restarted later with what it inherited: unknown
    out = gw.handle(ProcessCall(principal="agent", action="start", command='grep -c "$V" notes.txt'))
    assert out["status"] == "denied", out


def test_a_wrapper_option_value_the_shell_splits_is_refused(gw: Gateway, ws: Path) -> None:
    """`nice -n $V echo hi` with V='1 touch pwned' runs `touch pwned`, which no rule allows: on
    the old gateway it ran and made the file."""
    out = run(gw, "V='1 touch pwned'; nice -n $V echo hi")
    assert out["status"] == "denied" and out["error"]["code"] == "POLICY_DENIED", out
    assert not (ws / "pwned").exists()
    out = run(gw, 'nice -n "$N" echo hi')  # quoted: one word (empty here: nice refuses it)
    assert out["status"] == "ok", out
