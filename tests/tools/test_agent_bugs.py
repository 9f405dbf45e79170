"""The bugs an agent met (issue 14), each through `Gateway.handle` with the real sandbox, real
processes and real audit files. Every test here failed on the code before its fix."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.approval import CallbackApprover
from gateway.audit import AuditLog, records, verify
from gateway.audit.records import REDACTED, redact
from gateway.calls import FilesCall, FormatOutputCall, ProcessCall, RunCall, SessionCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over

POLICY: dict[str, Any] = {
    "version": 1,
    "home": ".",
    "principals": {"agent": {"roles": ["dev"]}},
    "roles": {
        "dev": {
            "level": 2,
            "read_roots": ["."],
            "write_roots": ["."],
            "limits": {"timeout_ms": 20000, "processes": 2},
        },
    },
    "tools": {
        "run": {"allow_from": 1},
        "session": {"allow_from": 1},
        "files": {"allow_from": 1},
        "processes": {"allow_from": 1},
    },
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [
        {
            "id": "basics",
            "decision": "allow",
            "justification": "harmless programs",
            "programs": ["echo", "printf", "cat", "sleep", "true", "false", "exit", "pwd", "nosuchprogram"],
            "accept_unknown": True,
            "examples": {"match": ["echo x"]},
        },
        {
            "id": "rm-asks",
            "decision": "ask",
            "justification": "deleting needs a supervisor",
            "programs": ["rm"],
            "path_args": {"write": "all"},
            "examples": {"match": ["rm x"]},
        },
    ],
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    hand_over(w)
    return w


def compiled(ws: Path, **changes: Any) -> CompiledPolicy:
    return compile_policy(Policy.model_validate({**POLICY, **changes}), ws.parent / "p.yaml", ws, sha256="t")


ASKED: list[str] = []


def refuse(request: Any) -> bool:
    ASKED.append(request.command)
    return False


@pytest.fixture
def gw(ws: Path, tmp_path: Path) -> Iterator[Gateway]:
    ASKED.clear()
    g = Gateway(compiled(ws), AuditLog(tmp_path / "audit"), CallbackApprover(refuse), state_dir=tmp_path / "state")
    yield g
    g.handle(ProcessCall(principal="agent", action="stop_all"))
    g.close()
    assert verify(tmp_path / "audit").ok


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    return [r for _, _, r, _ in records(tmp_path / "audit") if r]


# --- sessions: exit status and prompt -----------------------------------------------------------
def test_exit_in_a_session_reports_its_own_status(gw: Gateway) -> None:
    started = gw.handle(SessionCall(principal="agent", action="start"))
    sid = started["session_id"]
    assert gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="true"))["exit_code"] == 0
    out = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="exit 3"))
    assert out["status"] == "ok" and out["exit_code"] == 3 and out["alive"] is False, out  # was 0: the previous one's


@pytest.mark.parametrize("pty", [True, False])
def test_a_session_prompt_comes_with_the_reply_it_ends(gw: Gateway, pty: bool) -> None:
    started = gw.handle(SessionCall(principal="agent", action="start", pty=pty, prompt="$ "))
    assert started["output"] == "$ ", started  # the initial prompt, at start
    sid = started["session_id"]
    first = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="echo one"))
    second = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="echo two"))
    newline = "\r\n" if pty else "\n"
    assert first["output"] == f"one{newline}$ ", first  # was "one": its prompt came with the next reply
    assert second["output"] == f"two{newline}$ ", second


# --- format_output json with a message ------------------------------------------------------------
def test_format_output_json_of_a_message(gw: Gateway) -> None:
    doc = gw.handle(FormatOutputCall(principal="agent", kind="json", message='{"b": 1, "a": [true]}'))
    assert doc["status"] == "ok" and doc["text"] == '{\n  "a": [\n    true\n  ],\n  "b": 1\n}', doc
    plain = gw.handle(FormatOutputCall(principal="agent", kind="json", message="just words"))
    assert plain["status"] == "ok" and plain["text"] == '"just words"'  # was "null"
    empty = gw.handle(FormatOutputCall(principal="agent", kind="json"))
    assert empty["status"] == "error" and empty["error"]["code"] == "INVALID_INPUT"


# --- a missing program is an error ------------------------------------------------------------
def test_command_not_found_is_an_error_status(gw: Gateway) -> None:
    out = gw.handle(RunCall(principal="agent", command="nosuchprogram --x"))
    assert out["status"] == "error" and out["error"]["code"] == "COMMAND_NOT_FOUND" and out["exit_code"] == 127


# --- process stop on a stopped process -------------------------------------------------------------
def test_stopping_a_stopped_process_says_it_is_not_running(gw: Gateway) -> None:
    started = gw.handle(ProcessCall(principal="agent", action="start", command="sleep 30"))
    pid = started["process"]["id"]
    assert gw.handle(ProcessCall(principal="agent", action="stop", process_id=pid))["status"] == "ok"
    again = gw.handle(ProcessCall(principal="agent", action="stop", process_id=pid))
    assert again["status"] == "error" and again["error"]["code"] == "DAEMON_NOT_RUNNING", again
    done = gw.handle(ProcessCall(principal="agent", action="start", command="true"))["process"]["id"]
    deadline = time.monotonic() + 20
    while gw.handle(ProcessCall(principal="agent", action="get", process_id=done))["process"]["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    exited = gw.handle(ProcessCall(principal="agent", action="stop", process_id=done))
    assert exited["error"]["code"] == "DAEMON_NOT_RUNNING"


# --- ~ in a cwd ---------------------------------------------------------------------------------
def test_a_tilde_cwd_is_the_policys_home(gw: Gateway, ws: Path, tmp_path: Path) -> None:
    (ws / "project").mkdir()
    hand_over(ws / "project")
    out = gw.handle(RunCall(principal="agent", command="pwd", cwd="~/project"))
    assert out["status"] == "ok" and out["stdout"] == f"{ws}/project\n", out
    started = gw.handle(SessionCall(principal="agent", action="start", cwd="~"))
    assert started["cwd"] == str(ws)
    outside = gw.handle(RunCall(principal="agent", command="pwd", cwd="~/../.."))
    assert outside["status"] == "denied" and outside["error"]["code"] == "PATH_OUTSIDE_JAIL"
    homeless = Gateway(compiled(ws, home=None), AuditLog(tmp_path / "audit2"))
    refused = homeless.handle(RunCall(principal="agent", command="pwd", cwd="~/project"))
    homeless.close()
    assert refused["status"] == "denied" and "sets no home" in refused["error"]["message"], refused
    assert not (ws / "~").exists()


def test_tilde_is_one_place_for_commands_sessions_and_the_files_tool(gw: Gateway, ws: Path) -> None:
    """The jail and the files tool took `~` for the policy's home while the sandbox's shell took
    it for a private, empty HOME: what a command wrote to `~/x` the files tool never found, and
    what the jail checked was not what the command touched (issue 23)."""
    ran = gw.handle(RunCall(principal="agent", command="echo from-run > ~/from-run.txt; echo $HOME"))
    assert ran["status"] == "ok" and ran["stdout"] == f"{ws}\n", ran
    read = gw.handle(FilesCall(principal="agent", action="read", path="~/from-run.txt"))
    assert read.get("content") == "from-run\n", read
    wrote = gw.handle(FilesCall(principal="agent", action="write", path="~/from-files.txt", content="from-files"))
    assert wrote["status"] == "ok", wrote
    assert gw.handle(RunCall(principal="agent", command="cat ~/from-files.txt"))["stdout"] == "from-files"
    sid = gw.handle(SessionCall(principal="agent", action="start"))["session_id"]
    out = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="cat ~/from-run.txt"))
    assert out.get("output", out.get("stdout", "")).strip() == "from-run", out
    gw.handle(SessionCall(principal="agent", action="kill", session_id=sid))


# --- files delete honours the rule that decides rm -------------------------------------------------
def test_files_delete_asks_where_rm_asks(gw: Gateway, ws: Path) -> None:
    (ws / "tree" / "sub").mkdir(parents=True)
    (ws / "tree" / "sub" / "f").write_text("x")
    (ws / "one").write_text("x")
    out = gw.handle(FilesCall(principal="agent", action="delete", path="tree", recursive=True))
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_DENIED", out
    assert (ws / "tree" / "sub" / "f").exists() and [f"files delete {ws}/tree"] == ASKED, ASKED
    out = gw.handle(FilesCall(principal="agent", action="delete", path="one"))
    assert out["status"] == "denied" and (ws / "one").exists()


def test_files_delete_is_denied_where_rm_is(ws: Path, tmp_path: Path) -> None:
    rules = [*POLICY["rules"][:1], {"id": "no-rm", "decision": "deny", "justification": "never delete",
                                     "programs": ["rm"], "examples": {"match": ["rm x"]}}]  # fmt: skip
    g = Gateway(compiled(ws, rules=rules), AuditLog(tmp_path / "audit"))
    (ws / "f").write_text("x")
    out = g.handle(FilesCall(principal="agent", action="delete", path="f"))
    g.close()
    assert out["status"] == "denied" and out["rule"] == "no-rm" and (ws / "f").exists()


# --- the audit keeps booleans and numbers under secret-looking names -------------------------------
def test_redaction_keeps_booleans_and_numbers() -> None:
    got = redact({"password": False, "token_count": 3, "secret": None, "api_key": "abc", "passwd": ["x"]})
    assert got == {"password": False, "token_count": 3, "secret": None, "api_key": REDACTED, "passwd": REDACTED}


# --- grep and find honour ignore rules; a bare glob matches at any depth -----------------------------
@pytest.fixture
def tree(ws: Path) -> Path:
    for rel in ("src/a.py", "src/deep/b.py", "node_modules/pkg/c.py", "build/d.py", "src/gen/e.py", "keep.py",
                "src/gen/keep_me.py", "logs/x.log"):  # fmt: skip
        p = ws / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("needle\n")
    (ws / ".gitignore").write_text("build/\n*.log\n")
    (ws / "src" / ".gitignore").write_text("gen/*\n!gen/keep_me.py\n")
    return ws


def _paths(out: dict[str, Any]) -> set[str]:
    assert out["status"] == "ok", out
    return {m["path"] for m in out["matches"]}


def test_find_honours_ignore_rules_and_bare_globs(gw: Gateway, tree: Path) -> None:
    found = _paths(gw.handle(FilesCall(principal="agent", action="find", pattern="*.py")))
    assert found == {"keep.py", "src/a.py", "src/deep/b.py", "src/gen/keep_me.py"}  # was: nothing
    anchored = _paths(gw.handle(FilesCall(principal="agent", action="find", pattern="src/*.py")))
    assert anchored == {"src/a.py"}
    everything = gw.handle(FilesCall(principal="agent", action="find", pattern="**/*.py", ignored=True))
    assert {"node_modules/pkg/c.py", "build/d.py", "src/gen/e.py"} <= _paths(everything)


def test_grep_honours_ignore_rules(gw: Gateway, tree: Path) -> None:
    found = _paths(gw.handle(FilesCall(principal="agent", action="grep", pattern="needle")))
    assert found == {"keep.py", "src/a.py", "src/deep/b.py", "src/gen/keep_me.py"}, found
    inside = _paths(gw.handle(FilesCall(principal="agent", action="grep", pattern="needle", path="src")))
    assert inside == {"src/a.py", "src/deep/b.py", "src/gen/keep_me.py"}  # the rules above the root hold too
    everything = _paths(gw.handle(FilesCall(principal="agent", action="grep", pattern="needle", ignored=True)))
    assert {"node_modules/pkg/c.py", "build/d.py", "logs/x.log"} <= everything


# --- tools the policy allows, found on PATH ---------------------------------------------------------
def test_a_policy_adds_read_only_tool_directories_to_path(ws: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "tools" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "mytool").write_text("#!/bin/sh\necho mytool ran\n")
    (bin_dir / "mytool").chmod(0o755)
    for d in (tmp_path / "tools", bin_dir):
        d.chmod(0o755)
    dev = {**POLICY["roles"]["dev"], "read_roots": [".", "../tools"], "path": ["../tools/bin"]}
    rules = [{**POLICY["rules"][0], "programs": [*POLICY["rules"][0]["programs"], "mytool"]}]
    g = Gateway(compiled(ws, roles={"dev": dev}, rules=rules), AuditLog(tmp_path / "audit"))
    out = g.handle(RunCall(principal="agent", command="mytool"))
    g.close()
    assert out["status"] == "ok" and out["stdout"] == "mytool ran\n", out  # was COMMAND_NOT_FOUND


@pytest.mark.parametrize(
    ("entry", "says"),
    [("bin", "inside the write root"), ("/opt/elsewhere", "neither in the system runtime"),
     ("../tools", "neither in the system runtime")],
)  # fmt: skip
def test_a_tool_directory_must_be_read_only_and_inside_the_jail(ws: Path, entry: str, says: str) -> None:
    from gateway.policy.loader import PolicyError

    dev = {**POLICY["roles"]["dev"], "path": [entry]}
    with pytest.raises(PolicyError, match=r"roles\.dev\.path: .*" + says):
        compiled(ws, roles={"dev": dev})
    assert compiled(ws, roles={"dev": {**dev, "path": ["/usr/local/bin"]}}).grant("agent").path == (
        Path("/usr/local/bin").resolve(),
    )
