"""`gateway audit tail|show|query` as a reviewer reads them: without --json, each record on one
line with its time, principal, tool, decision, rule and what it was about, escaped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.audit import AuditLog

# what an agent may send: the analyser refuses it, and the refusal is recorded with the text
FORGING = "ls\x1b[2K\r2026-01-01 fake record\nrm -rf /"


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "audit", *args, "--audit-dir", str(tmp_path / "audit")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )


def make_log(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    log.append("decision", call_id="c1", principal="agent", tool="run", decision="allow", rule="git-read",
               arguments={"command": "git status"})  # fmt: skip
    log.append("decision", call_id="c2", principal="agent", tool="run", decision="deny", rule=None,
               arguments={"command": FORGING},
               reasons=[{"stage": "parse", "code": "control", "message": "control characters"}])  # fmt: skip
    log.append("decision", call_id="c3", principal="bob", tool="files", decision="ask", rule="secrets",
               arguments={"action": "read", "path": ".env"})  # fmt: skip
    log.append("approval", call_id="c3", principal="bob", tool="files", decision="deny", rule="secrets",
               data={"answered": True, "by": "alice", "how": "queue", "reason": "not the .env"})  # fmt: skip
    log.append("result", call_id="c1", principal="agent", tool="run", data={"status": "ok", "exit_code": 0})


def test_tail_prints_who_what_and_the_decision_by_default(tmp_path: Path) -> None:
    make_log(tmp_path)
    out = cli(tmp_path, "tail").stdout
    lines = out.splitlines()
    assert len(lines) == 5  # one line a record: nothing the agent wrote breaks a line
    first = lines[0].split()
    assert first[0].startswith(("19", "20")) and first[1:8] == ["1", "decision", "agent", "run", "allow",
                                                                "git-read", "c1"]  # fmt: skip
    assert lines[0].endswith("git status")
    assert "\x1b" not in out and "\r" not in out
    assert "ls\\u{001b}[2K\\u{000d}2026-01-01 fake record\\nrm -rf /" in lines[1]
    assert "(why: control characters)" in lines[1]
    assert "by alice (queue): not the .env" in lines[3]
    assert lines[4].split()[-2:] == ["exit", "0"]


def test_tail_n_0_prints_nothing(tmp_path: Path) -> None:
    make_log(tmp_path)
    out = cli(tmp_path, "tail", "-n", "0")
    assert out.returncode == 0 and out.stdout == ""
    assert len(cli(tmp_path, "tail", "-n", "2").stdout.splitlines()) == 2


def test_show_and_query_print_the_command_by_default(tmp_path: Path) -> None:
    make_log(tmp_path)
    shown = cli(tmp_path, "show", "c1").stdout.splitlines()
    assert len(shown) == 2 and shown[0].endswith("git status") and "agent" in shown[0] and "run" in shown[0]
    asked = cli(tmp_path, "query", "--principal", "bob").stdout.splitlines()
    assert len(asked) == 2 and ".env" in asked[0] and "files" in asked[0] and "secrets" in asked[0]
    assert len(cli(tmp_path, "query", "--tool", "files").stdout.splitlines()) == 2
