"""The gate's jobs, each alone (gateway/pipeline.py composes them): recording (recording.py),
waiting for approval (approving.py) and launching (launching.py), with a real audit log and a
real compiled policy, no Gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.approval import Approval, CallbackApprover
from gateway.approving import Approvals
from gateway.audit import AuditLog, records
from gateway.decision import Decision, Reason, Verdict
from gateway.launching import Launcher, limits, unsafe_setup
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.recording import CURRENT, Call, Recorder, raw_arguments
from tests.test_gateway import PERMISSIVE

ASKED = Decision(Verdict.ASK, "maybe", (Reason("permissions", "ask", "a rule asks", "maybe"),))


@pytest.fixture
def policy(tmp_path: Path) -> CompiledPolicy:
    ws = tmp_path / "ws"
    ws.mkdir()
    return compile_policy(Policy.model_validate(PERMISSIVE), tmp_path / "p.yaml", ws, sha256="one")


def logged(tmp_path: Path) -> list[dict[str, Any]]:
    return [r for _, _, r, _ in records(tmp_path / "audit") if r]


def base(call_id: str = "c1") -> dict[str, Any]:
    return {"call_id": call_id, "principal": "agent", "tool": "run", "policy_sha256": "one"}


# --- recording ----------------------------------------------------------------------------------


def test_a_refusal_is_recorded_with_its_secrets_as_digests(tmp_path: Path) -> None:
    rec = Recorder(AuditLog(tmp_path / "audit"))
    given = raw_arguments({"command": "x", "content": "s3cret"})
    out = rec.refuse("c1", "agent", "files", given, {"status": "denied", "error": {"code": "BUSY", "message": "m"}})
    assert out["error"]["code"] == "BUSY" and "warning" not in out
    (record,) = logged(tmp_path)
    assert record["event"] == "rejected" and record["decision"] == "deny"
    assert record["arguments"]["content"]["bytes"] == 6 and "s3cret" not in str(record)


def test_a_decision_marks_the_call_recorded_and_a_result_keeps_sizes_not_output(tmp_path: Path) -> None:
    rec = Recorder(AuditLog(tmp_path / "audit"))
    current = Call("c1")
    token = CURRENT.set(current)
    try:
        rec.decision(base(), {"command": "echo hi"}, Decision(Verdict.ALLOW, "anything"), {"context": {}})
        assert current.recorded and current.decided is not None
        envelope = rec.result(base(), {"status": "ok", "stdout": "hi\n", "exit_code": 0})
    finally:
        CURRENT.reset(token)
    assert envelope == {"call_id": "c1", "status": "ok", "stdout": "hi\n", "exit_code": 0}
    decision, result = logged(tmp_path)
    assert decision["event"] == "decision" and decision["decision"] == "allow"
    assert result["event"] == "result" and result["data"]["stdout_bytes"] == 3 and "stdout" not in result["data"]


# --- waiting for approval -----------------------------------------------------------------------


def approvals(tmp_path: Path, policy: CompiledPolicy, answer: bool | None) -> Approvals:
    return Approvals(CallbackApprover(lambda r: answer, "alice"), 5.0, AuditLog(tmp_path / "audit"), lambda: policy)


def ask(gate: Approvals, policy: CompiledPolicy, inherited: dict[str, str] | None = None,
        now: dict[str, str] | None = None) -> dict[str, Any] | None:  # fmt: skip
    return gate.ask(base(), "make", policy.workspace, {}, ASKED, policy, False, inherited, (), lambda: now or {})


def test_an_approval_grants_and_is_recorded_with_its_digest(tmp_path: Path, policy: CompiledPolicy) -> None:
    assert ask(approvals(tmp_path, policy, True), policy) is None
    (record,) = logged(tmp_path)
    assert record["event"] == "approval" and record["decision"] == "allow"
    assert record["data"]["by"] == "alice" and record["data"]["bound"] is True and len(record["data"]["digest"]) == 64


@pytest.mark.parametrize(("answer", "code"), [(False, "APPROVAL_DENIED"), (None, "APPROVAL_TIMEOUT")])
def test_a_denial_or_no_answer_ends_the_call(
    tmp_path: Path, policy: CompiledPolicy, answer: bool | None, code: str
) -> None:
    out = ask(approvals(tmp_path, policy, answer), policy)
    assert out is not None and out["error"]["code"] == code
    assert logged(tmp_path)[0]["decision"] == "deny"


def test_an_approval_under_another_policy_is_void(tmp_path: Path, policy: CompiledPolicy) -> None:
    newer = compile_policy(Policy.model_validate(PERMISSIVE), tmp_path / "p.yaml", policy.workspace, sha256="two")
    gate = Approvals(CallbackApprover(lambda r: True, "alice"), 5.0, AuditLog(tmp_path / "audit"), lambda: newer)
    out = ask(gate, policy)
    assert out is not None and out["error"]["message"] == "the policy changed after the approval"
    assert logged(tmp_path)[0]["data"]["policy_unchanged"] is False


def test_stored_variables_changed_while_it_waited_void_the_approval(tmp_path: Path, policy: CompiledPolicy) -> None:
    out = ask(approvals(tmp_path, policy, True), policy, inherited={"A": "1"}, now={"A": "2"})
    assert (
        out is not None and out["error"]["code"] == "APPROVAL_DENIED" and "stored variables" in out["error"]["message"]
    )


def test_an_approval_for_the_session_is_kept_for_that_session_only(tmp_path: Path, policy: CompiledPolicy) -> None:
    gate = approvals(tmp_path, policy, None)
    assert gate.keep_session_grant("agent", "s1", Approval(True, "alice", "d" * 64, "console-session"))
    assert not gate.keep_session_grant("agent", None, Approval(True, "alice", "e" * 64, "console-session"))
    assert gate.session_grant("agent", "s1", "d" * 64) == "alice"
    assert gate.session_grant("agent", "s2", "d" * 64) is None and gate.session_grant("other", "s1", "d" * 64) is None
    gate.end_client_session("s1")
    assert gate.session_grant("agent", "s1", "d" * 64) is None
    assert logged(tmp_path)[0]["event"] == "session_approvals_ended"


# --- launching ----------------------------------------------------------------------------------


def test_a_setup_with_its_records_inside_a_write_root_may_not_launch(tmp_path: Path, policy: CompiledPolicy) -> None:
    assert unsafe_setup(policy, "agent", tmp_path / "audit", ()) == ""
    inside = policy.workspace / "audit"
    assert "the audit log" in unsafe_setup(policy, "agent", inside, ())
    assert "the approvals queue" in unsafe_setup(policy, "agent", tmp_path / "audit", (policy.workspace / "q",))


def test_the_sandbox_profile_takes_the_roots_and_limits_and_hides_the_gateways_records(
    tmp_path: Path, policy: CompiledPolicy
) -> None:
    launcher = Launcher(AuditLog(tmp_path / "audit"), (tmp_path / "state",), lambda: policy)
    try:
        profile = launcher.profile(policy, "agent", None)
        assert profile.write_roots == policy.grant("agent").write_roots
        assert (tmp_path / "audit").resolve() in profile.private and (tmp_path / "state").resolve() in profile.private
        assert limits(policy, "agent") == {"timeout_ms": 20000, "output_bytes": 4096}
    finally:
        launcher.close()
