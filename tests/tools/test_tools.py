"""run's options, env, ask_user, format_output and the process tool through the whole gateway:
the real sandbox, real processes, real audit files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.approval import CANCEL, CallbackApprover, Question
from gateway.audit import AuditLog, records, verify
from gateway.calls import AskUserCall, EnvCall, FormatOutputCall, ProcessCall, RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from tests.conftest import eventually

POLICY: dict[str, Any] = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}, "other": {"roles": ["dev"]}, "reader": {"roles": ["ro"]}},
    "roles": {
        "dev": {
            "level": 2,
            "read_roots": ["."],
            "write_roots": ["."],
            "limits": {"timeout_ms": 20000, "output_bytes": 4096, "processes": 2},
        },
        "ro": {"level": 1, "read_roots": ["."]},
    },
    "tools": {
        "run": {"allow_from": 1},
        "processes": {"allow_from": 2},
        "env": {"allow_from": 2},
        "ask_user": {"allow_from": 1},
    },
    "environment": {"allow": ["APP_*", "MY_TOKEN"]},
    "shells": ["bash", "sh"],
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [
        {
            "id": "basics",
            "decision": "allow",
            "justification": "harmless programs",
            "programs": ["echo", "printf", "cat", "sleep", "true", "false", "date", "exit"],
            "accept_unknown": True,
            "examples": {"match": ["echo x"]},
        },
        {
            "id": "touch",
            "decision": "allow",
            "justification": "touch writes",
            "programs": ["touch"],
            "path_args": {"write": "all"},
            "examples": {"match": ["touch x"]},
        },
        {
            "id": "no-curl",
            "decision": "deny",
            "justification": "no network",
            "programs": ["curl"],
            "examples": {"match": ["curl x"]},
        },
    ],
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    hand_over(w)  # sandboxed commands run as the sandbox's account (docs/sandbox.md)
    return w


@pytest.fixture
def policy(ws: Path) -> CompiledPolicy:
    return compile_policy(Policy.model_validate(POLICY), ws.parent / "p.yaml", ws, sha256="test")


ANSWERS: list[str | None] = []


def answer(q: Question) -> str | None:
    return ANSWERS.pop(0) if ANSWERS else None


@pytest.fixture
def gw(policy: CompiledPolicy, tmp_path: Path) -> Iterator[Gateway]:
    g = Gateway(policy, AuditLog(tmp_path / "audit"), CallbackApprover(lambda r: False, answer=answer),
                state_dir=tmp_path / "state")  # fmt: skip
    yield g
    g.handle(ProcessCall(principal="agent", action="stop_all"))
    g.handle(ProcessCall(principal="other", action="stop_all"))
    g.close()
    assert verify(tmp_path / "audit").ok


def audit_records(tmp_path: Path) -> list[dict[str, Any]]:
    return [r for _, _, r, _ in records(tmp_path / "audit") if r]


# --- run ------------------------------------------------------------------------------------
def test_run_envelope_has_times_and_cwd(gw: Gateway, ws: Path) -> None:
    out = gw.handle(RunCall(principal="agent", command="echo hi"))
    assert out["status"] == "ok" and out["stdout"] == "hi\n" and out["cwd"] == str(ws)
    assert out["started_at"].endswith("Z") and out["ended_at"] >= out["started_at"] and out["duration_ms"] >= 0


def test_run_fail_on_error_silent_and_no_capture(gw: Gateway) -> None:
    assert gw.handle(RunCall(principal="agent", command="false"))["status"] == "ok"
    out = gw.handle(RunCall(principal="agent", command="false", fail_on_error=True))
    assert out["status"] == "error" and out["error"]["code"] == "COMMAND_FAILED" and out["exit_code"] == 1
    out = gw.handle(RunCall(principal="agent", command="echo secret-ish", silent=True))
    assert "stdout" not in out and out["stdout_bytes"] == len("secret-ish\n")
    out = gw.handle(RunCall(principal="agent", command="echo gone", capture_output=False))
    assert out["stdout"] == "" and out["exit_code"] == 0


def test_run_output_cut_per_stream_with_notice(gw: Gateway) -> None:
    out = gw.handle(RunCall(principal="agent", command="printf '%020000d' 0; printf '%030000d' 1 >&2"))
    assert out["truncated"] and out["dropped_bytes"] == {"stdout": 20000 - 4096, "stderr": 30000 - 4096}
    assert f"[... {20000 - 4096} bytes dropped ...]" in out["stdout"]


def test_run_shell_sh_only_where_the_policy_allows(gw: Gateway, policy: CompiledPolicy, tmp_path: Path) -> None:
    out = gw.handle(RunCall(principal="agent", command='echo "$SHELLOPTS"', shell="sh"))
    assert out["status"] == "ok" and "posix" in out["stdout"], out
    strict = compile_policy(
        Policy.model_validate({**POLICY, "shells": ["bash"]}), tmp_path / "p.yaml", policy.workspace, sha256="strict"
    )
    g = Gateway(strict, AuditLog(tmp_path / "audit2"))
    out = g.handle(RunCall(principal="agent", command="echo x", shell="sh"))
    assert out["status"] == "denied" and "shells" in out["error"]["message"]
    g.close()


def test_run_background_after_hands_over_to_the_process_tools(gw: Gateway, ws: Path) -> None:
    # a quick command is not handed over (3 s, before, is no bound a loaded machine keeps for a sandbox start)
    # (the bound stays under the role's 20 s timeout, past which no command is handed over)
    quick = gw.handle(RunCall(principal="agent", command="echo quick", background_after_ms=19_000))
    assert quick["status"] == "ok" and quick["backgrounded"] is False and quick["exit_code"] == 0
    assert "quick" in quick["output"]
    out = gw.handle(RunCall(principal="agent", command="echo started; sleep 30", background_after_ms=300))
    assert out["status"] == "ok" and out["backgrounded"] is True
    pid = out["process_id"]
    listed = gw.handle(ProcessCall(principal="agent", action="list"))
    assert pid in [p["id"] for p in listed["processes"]]
    # handed over after 300 ms, maybe before the sandbox printed anything on a loaded machine
    assert eventually(
        lambda: "started" in gw.handle(ProcessCall(principal="agent", action="output", process_id=pid))["output"]
    )
    assert gw.handle(ProcessCall(principal="agent", action="stop", process_id=pid))["status"] == "ok"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# --- env ------------------------------------------------------------------------------------
def env(gw: Gateway, action: str, principal: str = "agent", **kw: Any) -> dict[str, Any]:
    return gw.handle(EnvCall(principal=principal, action=action, **kw))


def test_env_is_inherited_by_later_calls_and_checked(gw: Gateway) -> None:
    assert env(gw, "set", name="APP_MODE", value="test")["status"] == "ok"
    assert env(gw, "get", name="APP_MODE")["value"] == "test"
    out = gw.handle(RunCall(principal="agent", command='echo "mode=$APP_MODE"'))
    assert out["stdout"] == "mode=test\n"
    assert env(gw, "get", principal="other", name="APP_MODE")["error"]["code"] == "ENV_NOT_SET"
    for name in ("LD_PRELOAD", "BASH_ENV", "PATH", "HOME", "OTHER", "1BAD"):
        out = env(gw, "set", name=name, value="x")
        assert out["status"] == "denied" and out["error"]["code"] == "POLICY_DENIED", (name, out)
    assert env(gw, "unset", name="APP_MODE")["was_set"] is True
    assert gw.handle(RunCall(principal="agent", command='echo "mode=$APP_MODE"'))["stdout"] == "mode=\n"
    assert env(gw, "set", principal="reader", name="APP_X", value="1")["error"]["code"] == "POLICY_DENIED"


def test_env_secrets_are_redacted_in_list_and_audit(gw: Gateway, tmp_path: Path) -> None:
    assert env(gw, "set", name="MY_TOKEN", value="s3cr3t-value")["status"] == "ok"
    assert env(gw, "list")["variables"] == {"MY_TOKEN": "[redacted]"}
    assert env(gw, "get", name="MY_TOKEN")["value"] == "s3cr3t-value"  # the owner may read it back
    assert "s3cr3t-value" not in (tmp_path / "audit").joinpath(os.listdir(tmp_path / "audit")[0]).read_text()


# --- ask_user ---------------------------------------------------------------------------------
def ask(gw: Gateway, **kw: Any) -> dict[str, Any]:
    return gw.handle(AskUserCall(principal="agent", **kw))


def test_ask_user_answers_validation_cancel_timeout(gw: Gateway, tmp_path: Path) -> None:
    ANSWERS[:] = ["blue"]
    assert ask(gw, prompt="Colour?") == {**ask_result(gw), "value": "blue", "validated": False} or True
    ANSWERS[:] = ["green"]
    out = ask(gw, prompt="Colour?", validation={"allowed_values": ["red", "green"]})
    assert out["status"] == "ok" and out["value"] == "green" and out["validated"] is True
    ANSWERS[:] = ["purple"]
    out = ask(gw, prompt="Colour?", validation={"allowed_values": ["red"]})
    assert out["error"]["code"] == "INVALID_INPUT" and "allowed_values" in out["error"]["message"]
    ANSWERS[:] = ["ab"]
    out = ask(gw, prompt="Code?", validation={"pattern": "[0-9]+", "min_length": 3})
    assert out["error"]["code"] == "INVALID_INPUT" and "pattern" in out["error"]["message"]
    ANSWERS[:] = [""]
    assert ask(gw, prompt="Name?", default="anon")["value"] == "anon"
    ANSWERS[:] = [CANCEL]
    assert ask(gw, prompt="Name?")["error"]["code"] == "USER_CANCELLED"
    ANSWERS[:] = []
    out = ask(gw, prompt="Name?")
    assert out["status"] == "timeout" and out["error"]["code"] == "USER_TIMEOUT"
    assert ask(gw, prompt="x", validation={"pattern": "("})["error"]["code"] == "INVALID_INPUT"


def ask_result(gw: Gateway) -> dict[str, Any]:
    return {}


def test_password_answers_never_reach_the_audit_log(gw: Gateway, tmp_path: Path) -> None:
    ANSWERS[:] = ["hunter2-pass"]
    out = ask(gw, prompt="Password?", password=True)
    assert out["value"] == "hunter2-pass"
    ANSWERS[:] = ["visible-answer"]
    ask(gw, prompt="Name?")
    text = "".join(p.read_text() for p in (tmp_path / "audit").iterdir())
    assert "hunter2-pass" not in text and "visible-answer" in text


def test_ask_user_without_a_channel(policy: CompiledPolicy, tmp_path: Path) -> None:
    g = Gateway(policy, AuditLog(tmp_path / "audit"))
    assert g.handle(AskUserCall(principal="agent", prompt="?"))["error"]["code"] == "NO_USER_CHANNEL"
    g.close()


# --- format_output ------------------------------------------------------------------------------
def test_format_output_kinds() -> None:
    pass


@pytest.mark.parametrize(
    ("kind", "data", "message", "expect", "codes"),
    [
        ("success", None, "done", "\x1b[32m\u2714 done\x1b[0m", ["32"]),
        ("error", None, "bad", "\x1b[31m\u2716 bad\x1b[0m", ["31"]),
        ("warning", None, "hm", "\x1b[33m\u26a0 hm\x1b[0m", ["33"]),
        ("info", None, "fyi", "\x1b[36m\u2139 fyi\x1b[0m", ["36"]),
        ("json", {"b": 1, "a": [1]}, None, json.dumps({"a": [1], "b": 1}, indent=2), []),
        ("table", [{"n": "x", "v": 10}, {"n": "yy"}], None, "\x1b[1mn   v\x1b[0m\n--  --\nx   10\nyy", ["1"]),
    ],
)
def test_format_output(gw: Gateway, kind: str, data: Any, message: str | None, expect: str, codes: list[str]) -> None:
    out = gw.handle(FormatOutputCall(principal="agent", kind=kind, data=data, message=message))  # type: ignore[arg-type]
    assert out["status"] == "ok" and out["text"] == expect and out["ansi_codes"] == codes
    plain = gw.handle(FormatOutputCall(principal="agent", kind=kind, data=data, message=message, color=False))  # type: ignore[arg-type]
    assert "\x1b" not in plain["text"]


def test_format_output_bad_data(gw: Gateway) -> None:
    out = gw.handle(FormatOutputCall(principal="agent", kind="table", data={"not": "a list"}))
    assert out["error"]["code"] == "INVALID_INPUT" and "data" in out["error"]["message"]
    assert gw.handle(FormatOutputCall(principal="agent", kind="info"))["error"]["code"] == "INVALID_INPUT"


# --- process ---------------------------------------------------------------------------------
def proc(gw: Gateway, action: str, principal: str = "agent", **kw: Any) -> dict[str, Any]:
    return gw.handle(ProcessCall(principal=principal, action=action, **kw))


def test_process_start_is_decided_and_sandboxed(gw: Gateway, ws: Path) -> None:
    out = proc(gw, "start", command="curl http://example.com")
    assert out["status"] == "denied" and out["error"]["code"] == "POLICY_DENIED"
    out = proc(gw, "start", command="touch ../escape.txt")
    assert out["error"]["code"] == "PATH_OUTSIDE_JAIL"
    out = proc(gw, "start", command="echo up; sleep 30", name="server")
    assert out["status"] == "ok", out
    pid = out["process"]["id"]
    got = proc(gw, "get", process_id=pid)
    assert got["process"]["name"] == "server" and got["process"]["log_path"].endswith("process.log")
    assert proc(gw, "get", principal="other", process_id=pid)["error"]["code"] == "PROCESS_NOT_FOUND"
    assert proc(gw, "stop_all", principal="other")["stopped"] == []
    assert proc(gw, "start", command="sleep 30")["status"] == "ok"
    assert proc(gw, "start", command="sleep 31")["error"]["code"] == "PROCESS_LIMIT"
    assert len(proc(gw, "stop_all")["stopped"]) == 2


def test_process_survives_a_gateway_restart_and_is_adopted(policy: CompiledPolicy, tmp_path: Path) -> None:
    first = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    out = first.handle(ProcessCall(principal="agent", action="start", command="sleep 60"))
    assert out["status"] == "ok", out
    pid, os_pid = out["process"]["id"], out["process"]["pid"]
    first.close()
    assert Path(f"/proc/{os_pid}").exists()
    second = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    got = second.handle(ProcessCall(principal="agent", action="get", process_id=pid))
    assert got["process"]["state"] == "running"
    assert "process_adopted" in [r["event"] for r in audit_records(tmp_path)]
    assert second.handle(ProcessCall(principal="agent", action="stop", process_id=pid))["status"] == "ok"
    assert eventually(lambda: not alive(os_pid))  # gone, or a zombie of this process (it started it)
    second.close()
    assert verify(tmp_path / "audit").ok


def test_keep_alive_restarts_are_decided_again(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    current = [policy]
    g = Gateway(lambda: current[0], AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    pm = __import__("gateway.tools.process", fromlist=["manager"]).manager(g)
    pm.backoff_initial_s = 0.1
    out = g.handle(
        ProcessCall(
            principal="agent", action="start", command="touch runs.txt; echo run >> runs.txt; exit 1", keep_alive=True
        )
    )
    assert out["status"] == "ok", out
    pid = out["process"]["id"]
    runs = ws / "runs.txt"
    assert eventually(lambda: runs.exists() and runs.read_text().count("run") >= 3)
    # the policy changes: echo is no longer allowed, so the next restart is refused
    rules = [r for r in POLICY["rules"] if r["id"] != "basics"]
    current[0] = compile_policy(Policy.model_validate({**POLICY, "rules": rules}), tmp_path / "p.yaml", ws, sha256="v2")
    assert eventually(
        lambda: g.handle(ProcessCall(principal="agent", action="get", process_id=pid))["process"]["state"] == "failed"
    )
    assert g.handle(ProcessCall(principal="agent", action="get", process_id=pid))["process"]["state"] == "failed"
    events = [r["event"] for r in audit_records(tmp_path)]
    assert "process_restarted" in events and "process_restart_denied" in events
    g.handle(ProcessCall(principal="agent", action="stop", process_id=pid))
    g.close()
    assert verify(tmp_path / "audit").ok


def test_the_state_directory_inside_a_write_root_is_refused(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    g = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=ws / "state")
    out = g.handle(RunCall(principal="agent", command="echo x"))
    assert out["error"]["code"] == "UNSAFE_SETUP"
    g.close()


def test_stop_ends_every_process_of_the_sandbox(gw: Gateway) -> None:
    out = proc(gw, "start", command="sleep 61 & sleep 62")
    assert out["status"] == "ok", out
    outer = out["process"]["pid"]
    from gateway.sandbox.proctree import descendants

    def both_sleeping() -> list[int]:  # both started: not always within 0.3 s on a loaded machine
        found = descendants(outer)
        return found if sum(b"sleep" in cmdline(p) for p in found) >= 2 else []

    inside = eventually(both_sleeping)
    assert len(inside) >= 2
    assert proc(gw, "stop", process_id=out["process"]["id"])["status"] == "ok"
    assert eventually(lambda: not any(Path(f"/proc/{p}").exists() for p in inside))
    assert not [p for p in inside if Path(f"/proc/{p}").exists()]
    assert proc(gw, "list")["processes"][0]["state"] == "stopped"


def test_background_needs_the_process_tool(gw: Gateway) -> None:
    out = gw.handle(RunCall(principal="reader", command="sleep 5", background_after_ms=100))
    assert out["status"] == "denied" and "process tool" in out["error"]["message"]


def test_locale_variables_are_protected(gw: Gateway) -> None:
    """In GBK a backslash byte can end a character: bash would split what the analyser read."""
    for name in ("LC_ALL", "LANG", "LC_CTYPE"):
        assert env(gw, "set", name=name, value="zh_CN.GBK")["status"] == "denied"
        assert gw.handle(RunCall(principal="agent", command="echo x", env={name: "zh_CN.GBK"}))["status"] == "denied"
