"""Git works through every tool that runs commands, under the shipped policy, while .git stays
read-only to everything else (tests/adversarial/test_sandbox_escapes.py plays the attacks)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog, records
from gateway.calls import ProcessCall, RunCall, SessionCall
from gateway.pipeline import Gateway
from gateway.policy.selftest import load_checked
from gateway.sandbox.identity import hand_over
from tests.conftest import eventually


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    (w / "app.py").write_text("print(1)\n")
    hand_over(w)
    return w


@pytest.fixture
def gw(ws: Path, tmp_path: Path) -> Iterator[Gateway]:
    g = Gateway(
        load_checked(Path("policies/default.yaml"), ws), AuditLog(tmp_path / "audit"), state_dir=tmp_path / "st"
    )
    yield g
    g.handle(ProcessCall(principal="agent", action="stop_all"))
    g.close()


def host_git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(ws), *args], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_git_through_run(gw: Gateway, ws: Path) -> None:
    for command in ("git init -q", "git add -A", "git commit -q -m first", "git checkout -q -b topic"):
        out = gw.handle(RunCall(principal="agent", command=command))
        assert out["status"] == "ok" and out["exit_code"] == 0, (command, out)
        assert out["sandbox"]["git_write"] is True
    assert host_git(ws, "log", "--format=%an|%s").strip() == "agent-gateway (agent)|first"
    assert host_git(ws, "branch", "--show-current").strip() == "topic"
    out = gw.handle(RunCall(principal="agent", command="touch x && git add x"))  # not git alone: .git read-only
    assert out["sandbox"]["git_write"] is False and out["exit_code"] != 0
    assert "Read-only file system" in out["stderr"]


def test_git_through_a_session(gw: Gateway, ws: Path) -> None:
    start = gw.handle(SessionCall(principal="agent", action="start"))
    assert start["status"] == "ok", start
    assert start["sandbox"]["landlock"].startswith("ABI") and start["sandbox"]["quotas"] != ""
    sid = start["session_id"]

    def exec_(command: str) -> dict[str, Any]:
        return gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command=command))

    assert exec_("mkdir -p sub && cd sub && echo x > f.txt")["status"] == "ok"
    for command in ("git init -q ..", "git add -A", "git commit -q -m in-session", "git checkout -q -b s-topic"):
        out = exec_(command)  # in the session's directory (sub), on the workspace's repository
        assert out["status"] == "ok" and out["exit_code"] == 0, (command, out)
    assert (ws / ".git").is_dir() and not (ws / "sub" / ".git").exists()
    assert host_git(ws, "log", "--format=%s").strip() == "in-session"
    assert host_git(ws, "ls-files").split() == ["app.py", "sub/f.txt"]
    assert exec_("pwd")["output"].strip() == str(ws / "sub")  # the session's shell is where it was


def test_a_nested_repository_is_quarantined_not_kept(gw: Gateway, ws: Path, tmp_path: Path) -> None:
    """git init in a subdirectory makes a nested repository, which the human's git would look
    into with its own configuration: the watcher moves it aside at once (sandbox/nested.py)."""
    out = gw.handle(RunCall(principal="agent", command="mkdir -p lib && cd lib && git init -q"))
    assert out["status"] == "ok", out
    assert eventually(lambda: not (ws / "lib" / ".git").exists())
    aside = [p.name for p in (ws / "lib").iterdir()]
    assert aside and all(name.startswith(".git.quarantined-") for name in aside), aside

    def events() -> list[str]:
        return [r["event"] for _, _, r, _ in records(tmp_path / "audit") if r]

    # the watcher's thread writes the record after the rename: wait for it, not for the rename
    assert eventually(lambda: "nested_repository_quarantined" in events()), events()


def test_git_through_a_durable_process(gw: Gateway, ws: Path) -> None:
    command = "git init -q && git add -A && git commit -q -m from-process && git checkout -q -b p-topic"
    out = gw.handle(ProcessCall(principal="agent", action="start", command=command))
    assert out["status"] == "ok", out
    assert out["sandbox"]["git_write"] is True
    pid = out["process"]["id"]

    def ended() -> dict[str, Any] | None:
        got: dict[str, Any] = gw.handle(ProcessCall(principal="agent", action="get", process_id=pid))
        return got if got["process"]["state"] != "running" else None

    got = eventually(ended)
    assert got is not None, "the process never ended"
    assert got["process"]["exit_code"] == 0, gw.handle(ProcessCall(principal="agent", action="output", process_id=pid))
    assert host_git(ws, "log", "--format=%s").strip() == "from-process"


def test_each_result_says_what_held_it(gw: Gateway, ws: Path, tmp_path: Path) -> None:
    gw.handle(RunCall(principal="agent", command="true"))
    result = [r for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] == "result"][-1]
    held = result["data"]["sandbox"]
    assert held["landlock"] == "ABI 7" or held["landlock"].startswith(("ABI", "unavailable"))
    assert held["uid"] != 0 and held["quotas"] in ("cgroup v1", "cgroup v2", "rlimits")


def test_a_signed_commit_runs_no_gpg_in_the_sandbox(gw: Gateway, ws: Path) -> None:
    """`git log --show-signature` (allowed as a git read) on a commit carrying a signature, as
    any fetched history may: git starts gpg.program, a program no rule decided, which reads its
    own configuration from the sandbox's HOME. The sandbox's git verifies with no program."""
    host_git(ws, "init", "-q")
    host_git(ws, "-c", "user.name=h", "-c", "user.email=h@x", "commit", "-q", "--allow-empty", "-m", "one")
    tree = host_git(ws, "rev-parse", "HEAD^{tree}").strip()
    body = (f"tree {tree}\nauthor h <h@x> 1700000000 +0000\ncommitter h <h@x> 1700000000 +0000\n"
            "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE=\n =abcd\n -----END PGP SIGNATURE-----\n"
            "\nsigned upstream\n")  # fmt: skip
    argv = ["git", "-c", "safe.directory=*", "-C", str(ws), "hash-object", "-t", "commit", "-w", "--stdin"]
    made = subprocess.run(argv, input=body, capture_output=True, text=True, check=True).stdout.strip()
    host_git(ws, "update-ref", "HEAD", made)
    hand_over(ws)
    for command in ("git log --show-signature -1", "git log -1 --format=%G?%n%s"):
        out = gw.handle(RunCall(principal="agent", command=command))
        assert out["status"] == "ok", out
        assert "signed upstream" in out["stdout"], out
        assert "gpg:" not in out["stdout"] + out["stderr"], out  # gpg ran and spoke
