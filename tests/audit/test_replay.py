"""What-if replay (gateway/replay.py): a log written by the real pipeline under the shipped
policy, decided again under drafts. Nothing in the replay runs, asks or writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.approval import CallbackApprover
from gateway.audit import AuditLog, records
from gateway.calls import FilesCall, RunCall, SessionCall
from gateway.pipeline import Gateway
from gateway.policy.selftest import load_checked
from gateway.replay import ReplayError, replay
from gateway.sandbox.identity import hand_over

SHIPPED = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
RM_ASKS = "  - id: rm\n    decision: ask\n"

# what the agent did: allowed, asked (rm in three spellings), denied by a rule and by the jail
CALLS = [
    "ls -la",
    "git status",
    "rm -rf build",
    "cat /etc/passwd",
    "curl https://example.com",
    "echo hi > notes.txt",
    "rm notes.txt && ls",
    "grep -n hi notes.txt",
    "rmdir build",
    "ls | wc -l",
]


def draft_text(old: str = RM_ASKS, new: str = "  - id: rm\n    decision: deny\n") -> str:
    text = SHIPPED.read_text()
    assert old in text
    return text.replace(old, new)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """A workspace and the audit log of CALLS (and a session, a files call, a redacted variable)
    run through the real gateway under the shipped policy; every ask is denied. Returns the
    workspace, the audit dir and each call id's command."""
    root = tmp_path_factory.mktemp("replay")
    os.chmod(root, 0o755)
    ws = root / "ws"
    (ws / "build").mkdir(parents=True)
    (ws / "sub").mkdir()
    (ws / "inside.txt").write_text("in\n")
    hand_over(ws)
    policy = load_checked(SHIPPED, ws)
    gw = Gateway(policy, AuditLog(root / "audit"), CallbackApprover(lambda r: False))
    ids: dict[str, str] = {}
    for command in CALLS:
        out = gw.handle(RunCall(principal="agent", command=command))
        ids[str(out["call_id"])] = command
    # a session whose shell moved into sub/: `cat ../inside.txt` is inside the workspace only from there
    started = gw.handle(SessionCall(principal="agent", action="start"))
    sid = started["session_id"]
    for command in ("cd sub", "cat ../inside.txt"):
        out = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command=command))
        assert out["status"] == "ok", out
        ids[str(out["call_id"])] = command
    gw.handle(SessionCall(principal="agent", action="kill", session_id=sid))
    gw.handle(FilesCall(principal="agent", action="read", path="inside.txt"))
    gw.handle(RunCall(principal="agent", command="echo $APP_TOKEN", env={"APP_TOKEN": "s3cret"}))
    gw.close()
    yield ws, root / "audit", ids


def test_the_shipped_policy_against_itself_changes_nothing(recorded: tuple[Path, Path, dict[str, str]]) -> None:
    _, audit, ids = recorded
    before = (audit / "audit-000001.jsonl").read_bytes()
    report = replay(SHIPPED, audit)
    assert report.changed == 0 and report.groups == {}
    # every command call was decided again, the session's two with the shell's recorded cwd
    assert report.replayed == len(ids) == report.unchanged
    assert (audit / "audit-000001.jsonl").read_bytes() == before  # nothing written


def test_a_draft_that_denies_rm_reports_exactly_the_rm_calls(recorded: tuple[Path, Path, dict[str, str]]) -> None:
    _, audit, ids = recorded
    report = replay(draft_text(), audit)  # the draft as YAML text, as the console posts it
    rm_calls = {cid for cid, command in ids.items() if command.startswith(("rm ", "rmdir "))}
    assert len(rm_calls) == 3
    assert report.changed == 3
    [group] = report.groups.values()
    assert (group.old_decision, group.old_rule, group.new_decision, group.new_rule) == ("ask", "rm", "deny", "rm")
    assert {c.call_id for c in group.calls} == rm_calls
    assert report.to_json()["groups"][0]["count"] == 3


def test_a_rule_renamed_is_a_change_of_rule(recorded: tuple[Path, Path, dict[str, str]]) -> None:
    _, audit, _ = recorded
    report = replay(draft_text("  - id: rm\n", "  - id: deleting\n"), audit)
    [group] = report.groups.values()
    assert (group.old_rule, group.new_rule, group.count) == ("rm", "deleting", 3)


def test_what_cannot_be_replayed_is_counted_and_named(recorded: tuple[Path, Path, dict[str, str]]) -> None:
    _, audit, _ = recorded
    report = replay(SHIPPED, audit)
    skipped = {code: s.count for code, s in report.not_replayed.items()}
    # the session's start and kill and the files read are tool decisions, not command decisions;
    # the command whose variable the log keeps redacted cannot be decided again
    assert skipped == {"tool:session": 2, "tool:files": 1, "redacted": 1}
    assert report.decisions == report.replayed + report.skipped
    other = draft_text("principals:\n  agent:\n", "principals:\n  someone:\n")
    report = replay(other, audit)
    assert report.not_replayed["principal"].count == report.decisions - 4
    assert "agent" in report.not_replayed["principal"].why


def test_the_range_and_the_row_cap(recorded: tuple[Path, Path, dict[str, str]]) -> None:
    _, audit, ids = recorded
    stamps = {r["call_id"]: r["ts"] for _, _, r, _ in records(audit) if r and r["event"] == "decision"}
    order = list(ids)
    second_rm = order[CALLS.index("rm notes.txt && ls")]
    report = replay(draft_text(), audit, since=stamps[second_rm])
    assert report.changed == 2  # rm notes.txt and rmdir build
    report = replay(draft_text(), audit, until=stamps[second_rm])
    assert report.changed == 1
    report = replay(draft_text(), audit, max_rows=1)
    assert report.changed == 3 and report.shown == 1
    assert report.to_json()["groups"][0]["shown"] == 1
    with pytest.raises(ReplayError, match="--since 'soon'"):
        replay(SHIPPED, audit, since="soon")
    assert replay(draft_text(), audit, since="yesterday").changed == 3  # the reading verbs' relative times too
    assert replay(draft_text(), audit, until="1h").changed == 0


def test_a_draft_that_does_not_load_is_an_error_with_file_and_line(
    recorded: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    _, audit, _ = recorded
    bad = tmp_path / "draft.yaml"
    bad.write_text(draft_text().replace("    decision: deny\n", "    decision: [deny\n", 1))
    with pytest.raises(ReplayError, match=rf"{bad}:\d+:\d+"):
        replay(bad, audit)
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "audit", "replay", "--audit-dir", str(audit), "--policy", str(bad)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and f"{bad}:" in out.stderr and "does not load" in out.stderr


def test_the_cli(recorded: tuple[Path, Path, dict[str, str]], tmp_path: Path) -> None:
    _, audit, _ = recorded
    draft = tmp_path / "draft.yaml"
    draft.write_text(draft_text())
    base = [sys.executable, "-m", "gateway", "audit", "replay", "--audit-dir", str(audit)]
    same = subprocess.run([*base, "--policy", str(SHIPPED)], capture_output=True, text=True, check=False)
    assert same.returncode == 0 and "0 would change" in same.stdout, same.stderr
    changed = subprocess.run([*base, "--policy", str(draft)], capture_output=True, text=True, check=False)
    assert changed.returncode == 1, changed.stderr
    assert "ask (rm) -> deny (rm): 3" in changed.stdout and "rm -rf build" in changed.stdout
    assert "not replayed [tool:files]: 1" in changed.stdout
    js = subprocess.run([*base, "--policy", str(draft), "--json"], capture_output=True, text=True, check=False)
    assert json.loads(js.stdout)["changed"] == 3
