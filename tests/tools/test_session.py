"""Shell sessions through the whole gateway: real bash in the real sandbox, real PTYs, real
audit files. The gate must hold inside a session: every command decided, input never run."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.approval import CallbackApprover
from gateway.audit import AuditLog, records, verify
from gateway.calls import RunCall, SessionCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from gateway.sandbox.proctree import descendants
from tests.conftest import PATIENCE_S, eventually

POLICY: dict[str, Any] = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}, "other": {"roles": ["dev"]}, "limited": {"roles": ["small"]}},
    "roles": {
        "dev": {
            "level": 2,
            "read_roots": ["."],
            "write_roots": ["."],
            "protected": [".git/hooks"],
            "limits": {"timeout_ms": 20000, "output_bytes": 65536, "sessions": 3},
        },
        "small": {"level": 2, "read_roots": ["."], "limits": {"sessions": 1, "session_idle_seconds": 1}},
    },
    "tools": {"session": {"allow_from": 2}, "run": {"allow_from": 2}},
    "environment": {"allow": ["APP_*"]},
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [
        {
            "id": "basics",
            "decision": "allow",
            "justification": "harmless programs",
            "programs": [
                "echo",
                "printf",
                "cat",
                "sleep",
                "stty",
                "pwd",
                "cd",
                "read",
                "true",
                "false",
                "ls",
                "touch",
                "exit",
                "python3",
                "set",
            ],
            "accept_unknown": True,
            "examples": {"match": ["echo x"]},
        },
        {
            "id": "touch-writes",
            "decision": "allow",
            "justification": "touch writes files",
            "programs": ["touch"],
            "path_args": {"write": "all"},
            "examples": {"match": ["touch x"]},
        },
        {
            "id": "export-app",
            "decision": "allow",
            "justification": "APP_ variables may be exported",
            "programs": ["export"],
            "env": ["APP_*"],
            "examples": {"match": ["export APP_X=1"]},
        },
        {
            "id": "rm-asks",
            "decision": "ask",
            "justification": "deleting asks a supervisor",
            "programs": ["rm"],
            "path_args": {"write": "all"},
            "examples": {"match": ["rm x"]},
        },
    ],
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "sub").mkdir(parents=True)
    (w / "sub" / "note.txt").write_text("hello\n")
    hand_over(w)  # sandboxed commands run as the sandbox's account (docs/sandbox.md)
    return w


@pytest.fixture
def policy(ws: Path) -> CompiledPolicy:
    return compile_policy(Policy.model_validate(POLICY), ws.parent / "p.yaml", ws, sha256="test")


@pytest.fixture
def gw(policy: CompiledPolicy, tmp_path: Path) -> Iterator[Gateway]:
    g = Gateway(policy, AuditLog(tmp_path / "audit"), CallbackApprover(lambda r: "ok" in r.command))
    yield g
    g.close()
    assert verify(tmp_path / "audit").ok


def call(gw: Gateway, action: str, principal: str = "agent", **kw: Any) -> dict[str, Any]:
    return gw.handle(SessionCall(principal=principal, action=action, **kw))  # type: ignore[arg-type]


def start(gw: Gateway, **kw: Any) -> str:
    out = call(gw, "start", **kw)
    assert out["status"] == "ok", out
    sid: str = out["session_id"]
    return sid


def read_until(gw: Gateway, sid: str, needle: str, timeout: float = PATIENCE_S) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen += call(gw, "read", session_id=sid)["output"]
        if needle in seen:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in {seen!r}")


@pytest.mark.parametrize("pty", [False, True])
def test_env_and_cwd_persist_across_exec(gw: Gateway, ws: Path, pty: bool) -> None:
    sid = start(gw, pty=pty)
    assert call(gw, "exec", session_id=sid, command="cd sub")["exit_code"] == 0
    assert call(gw, "exec", session_id=sid, command="export APP_COLOR=blue")["exit_code"] == 0
    out = call(gw, "exec", session_id=sid, command='pwd; echo "$APP_COLOR"; cat note.txt')
    assert out["status"] == "ok" and out["exit_code"] == 0, out
    assert out["output"].split() == [str(ws / "sub"), "blue", "hello"]
    assert out["cwd"] == str(ws / "sub")  # read from /proc, not from the shell's output
    assert call(gw, "exec", session_id=sid, command="false")["exit_code"] == 1


@pytest.fixture
def busy_gateway_process() -> Iterator[None]:
    """This process holds over a thousand descriptors, as a server with many connections does (or
    a long test run that leaked them): the next pipe the gateway makes is numbered above 1,024,
    the sandbox's descriptor limit."""
    want = 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = len(os.listdir("/proc/self/fd")) + want + 64
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(want)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("pty", [False, True])
def test_a_session_outlives_its_first_command_when_the_gateway_holds_many_descriptors(
    busy_gateway_process: None, gw: Gateway, pty: bool
) -> None:
    """The control pipe reached the loop shell as fd 1,100-odd, above its limit: bash closed it
    around the first command and could not restore it ("Bad file descriptor" after the output), so
    the session ended after one command (the suite went red from its 90% on, once its own leaked
    descriptors pushed the number past 1,024)."""
    sid = start(gw, pty=pty, prompt="$ ")
    newline = "\r\n" if pty else "\n"
    for word in ("one", "two", "three"):
        out = call(gw, "exec", session_id=sid, command=f"echo {word}")
        assert out["status"] == "ok" and out["output"] == f"{word}{newline}$ " and out["alive"], out
    # input for a command (a wait for the pipe to take it: select() refused descriptors past 1,023)
    out = call(gw, "exec", session_id=sid, command="read -r ans; echo got=$ans", timeout_ms=500)
    assert out["running"] is True, out
    w = call(gw, "write", session_id=sid, input="yes\n")
    assert w["status"] == "ok", w
    assert "got=yes" in w["output"] or "got=yes" in read_until(gw, sid, "got=yes")
    # and a run beside it: both parsers' workers and the sandbox's start wait on pipes numbered so
    ran = gw.handle(RunCall(principal="agent", command="echo ran"))
    assert ran["status"] == "ok" and ran["stdout"] == "ran\n", ran


def test_pipe_session_has_no_terminal_and_no_ansi(gw: Gateway) -> None:
    sid = start(gw)
    out = call(gw, "exec", session_id=sid, command="stty size")
    assert out["exit_code"] != 0 and "\x1b[" not in out["output"]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def idle(gw: Gateway, sid: str) -> bool:
    """Wait until the session's command has ended (what it does is another process's business)."""
    return eventually(lambda: not call(gw, "read", session_id=sid)["running"])


def test_pty_interactive_prompt_answered_with_write(gw: Gateway) -> None:
    sid = start(gw, pty=True)
    out = call(gw, "exec", session_id=sid, command="read -p 'Continue? ' ans; echo got=$ans", timeout_ms=500)
    assert out["running"] is True
    assert "Continue? " in out["output"] or "Continue? " in read_until(gw, sid, "Continue? ")  # a slow start
    w = call(gw, "write", session_id=sid, input="yes\n")
    assert w["status"] == "ok" and w["sent"][0]["as"] == "input"
    assert "got=yes" in w["output"] or "got=yes" in read_until(gw, sid, "got=yes")
    assert idle(gw, sid)  # its output is in before the shell has said it is done (else SESSION_BUSY)
    assert call(gw, "exec", session_id=sid, command="echo after")["output"].strip() == "after"


def test_resize_is_seen_by_stty(gw: Gateway) -> None:
    sid = start(gw, pty=True, rows=30, cols=100)
    assert call(gw, "exec", session_id=sid, command="stty size")["output"].strip() == "30 100"
    assert call(gw, "resize", session_id=sid, rows=50, cols=132)["status"] == "ok"
    assert call(gw, "exec", session_id=sid, command="stty size")["output"].strip() == "50 132"


def test_denied_command_typed_into_the_idle_shell(gw: Gateway, ws: Path) -> None:
    sid = start(gw, pty=True)
    out = call(gw, "write", session_id=sid, input="curl http://example.com\n")
    assert out["status"] == "denied" and out["error"]["code"] == "POLICY_DENIED"
    out = call(gw, "write", session_id=sid, input="echo one\ntouch ../outside\n")
    assert out["status"] == "denied" and out["error"]["code"] == "PATH_OUTSIDE_JAIL"
    assert [s["as"] for s in out["sent"]] == ["command", "command"]
    assert not (ws.parent / "outside").exists()
    assert "one" in out["output"]


WAIT_FOR_GO = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n"
"""A program that runs until the test says so (never a sleep that ends on a loaded machine's
whim, before or after the test has done its part)."""


@pytest.mark.parametrize("pty", [False, True])
def test_input_typed_ahead_never_runs_as_a_command(gw: Gateway, ws: Path, pty: bool) -> None:
    """Text written while a program runs is its input; what it leaves unread stays data."""
    (ws / "wait.py").write_text(WAIT_FOR_GO)
    sid = start(gw, pty=pty)
    out = call(gw, "exec", session_id=sid, command="python3 wait.py", timeout_ms=100)  # it reads no input
    assert out["running"] is True
    assert call(gw, "write", session_id=sid, input="touch ../escaped; touch injected\n")["status"] == "ok"
    assert call(gw, "exec", session_id=sid, command="echo busy")["error"]["code"] == "SESSION_BUSY"
    (ws / "go").touch()
    assert idle(gw, sid)
    out = call(gw, "exec", session_id=sid, command="ls")
    assert out["exit_code"] == 0
    assert not (ws / "injected").exists() and not (ws.parent / "escaped").exists()


@pytest.mark.parametrize(
    "command",
    [
        "cd /",  # out of the jail
        "cd ..",
        "export PATH=/tmp",  # PATH changes
        "PATH=/tmp",
        "export LD_PRELOAD=/x.so",  # forbidden variables
        "export HOME=/",
        "exec 3</dev/null",  # the control pipe's number cannot be redirected to a file
        "exec bash",  # replace the loop with a shell reading the terminal
        "bash",
        "eval echo hi",
        "source /dev/stdin",
        "builtin cd /",
        # /proc/self resolved by the gateway is the gateway: the jail must not let a command
        # reopen a descriptor (such as the loop's saved control pipe) through it
        "echo 'touch pwned' > /proc/self/fd/10",
        "echo x > /dev/fd/10",
        "cat < /proc/self/environ",
    ],
)
def test_known_ways_around_the_session_gate_are_denied(gw: Gateway, ws: Path, command: str) -> None:
    sid = start(gw)
    out = call(gw, "exec", session_id=sid, command=command)
    assert out["status"] == "denied", out
    assert call(gw, "exec", session_id=sid, command="pwd")["output"].strip() == str(ws)


def test_ask_in_a_session_goes_to_the_supervisor(gw: Gateway, ws: Path) -> None:
    (ws / "a").write_text("")
    (ws / "ok").write_text("")
    sid = start(gw)
    denied = call(gw, "exec", session_id=sid, command="rm a")
    assert denied["error"]["code"] == "APPROVAL_DENIED" and (ws / "a").exists()
    assert call(gw, "exec", session_id=sid, command="rm ok")["exit_code"] == 0
    assert not (ws / "ok").exists()


def test_startup_commands_are_gated(gw: Gateway) -> None:
    out = call(gw, "start", startup_commands=["cd sub", "curl x"])
    assert out["status"] == "denied"
    assert out["startup"][0]["status"] == "ok" and out["startup"][1]["error"]["code"] == "POLICY_DENIED"


def test_interrupt_stops_the_program_not_the_session(gw: Gateway) -> None:
    sid = start(gw, pty=True)
    shell = gw.sessions.get("agent", sid).shell_pid
    assert call(gw, "exec", session_id=sid, command="sleep 600", timeout_ms=200)["running"] is True
    # the ^C goes to the program once it runs (sent while a loaded machine had not started it
    # yet, it was lost and the test waited for the sleep to end by itself)
    assert eventually(lambda: any(cmdline(p) == b"sleep\x00600\x00" for p in descendants(shell)))
    sent = call(gw, "write", session_id=sid, input="\x03")
    assert sent["status"] == "ok" and sent["interrupted"] >= 1, sent
    if not idle(gw, sid):  # well before the sleep's 600 s: interrupted (else say what was left)
        left = [(p, cmdline(p)) for p in descendants(shell)]
        now = call(gw, "read", session_id=sid)
        pytest.fail(f"the session still runs after ^C; below its shell: {left}; it reads {now}")
    alive = call(gw, "exec", session_id=sid, command="echo alive")
    assert alive.get("output", "").strip() == "alive", alive


def test_kill_ends_the_whole_tree_and_list_shows_it(gw: Gateway) -> None:
    sid = start(gw)
    call(gw, "exec", session_id=sid, command="sleep 60 & sleep 61", timeout_ms=200)
    listed = call(gw, "list")["sessions"]
    assert [s["session_id"] for s in listed] == [sid] and listed[0]["alive"] and listed[0]["running"]
    session = gw.sessions.get("agent", sid)
    pids = [session.shell_pid]
    assert call(gw, "kill", session_id=sid)["status"] == "ok"
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
    assert call(gw, "list")["sessions"] == []
    assert call(gw, "exec", session_id=sid, command="true")["error"]["code"] == "SESSION_NOT_FOUND"


def test_sessions_belong_to_their_principal(gw: Gateway) -> None:
    sid = start(gw)
    for action in ("exec", "read", "kill", "write"):
        out = call(gw, action, principal="other", session_id=sid, command="echo x", input="x\n")
        assert out["error"]["code"] == "SESSION_NOT_FOUND"
    assert call(gw, "list", principal="other")["sessions"] == []


def test_limit_and_idle_expiry(gw: Gateway, tmp_path: Path) -> None:
    sid = start(gw, principal="limited")
    assert call(gw, "start", principal="limited")["error"]["code"] == "SESSION_LIMIT"
    time.sleep(1.2)
    assert sid in gw.sessions.reap()
    assert call(gw, "read", principal="limited", session_id=sid)["error"]["code"] == "SESSION_NOT_FOUND"
    assert "session_expired" in [r["event"] for _, _, r, _ in records(tmp_path / "audit") if r]
    start(gw, principal="limited")  # the slot is free again


def test_output_buffer_is_bounded(gw: Gateway) -> None:
    sid = start(gw)
    out = call(gw, "exec", session_id=sid, command="printf '%0200000d' 0")
    assert len(out["output"]) <= 65536 and out["dropped_bytes"] >= 200000 - 65536


def test_start_refuses_forbidden_env_and_cwd(gw: Gateway, ws: Path) -> None:
    out = call(gw, "start", env={"LD_PRELOAD": "/x.so"})
    assert out["status"] == "denied" and "protected" in out["error"]["message"]
    out = call(gw, "start", env={"OTHER": "1"})
    assert out["status"] == "denied" and "environment.allow" in out["error"]["message"]
    out = call(gw, "start", cwd="/")
    assert out["error"]["code"] == "PATH_OUTSIDE_JAIL"
    out = call(gw, "start", shell_type="sh")
    assert out["status"] == "denied" and "shells" in out["error"]["message"]


def test_every_session_command_is_audited(gw: Gateway, tmp_path: Path) -> None:
    sid = start(gw)
    call(gw, "exec", session_id=sid, command="echo audited")
    recs = [r for _, _, r, _ in records(tmp_path / "audit") if r]
    decided = [r for r in recs if r["event"] == "decision" and r["tool"] == "session"]
    assert any(r["arguments"].get("command") == "echo audited" for r in decided)


def test_a_symlink_into_proc_is_refused(gw: Gateway, ws: Path) -> None:
    (ws / "lnk").symlink_to("/proc/self/fd/10")
    sid = start(gw)
    out = call(gw, "exec", session_id=sid, command="echo 'touch pwned' > lnk")
    assert out["status"] == "denied" and "/proc" in out["error"]["message"], out
    assert call(gw, "exec", session_id=sid, command="echo ok > /dev/null; echo shown > /dev/stdout")["exit_code"] == 0


def test_a_fake_marker_and_a_stolen_record_run_nothing_undecided(gw: Gateway, ws: Path) -> None:
    """The red team's desync: learn the nonce, print a fake end marker so the gateway sends the
    next command early, and swallow part of the control stream from the loop's saved descriptor
    so the loop's fields shift. Text the gateway wrote as a cwd must never run as a command."""
    (ws / "x;mkdir pwned;#").mkdir()
    (ws / "ls").mkdir()
    sid = start(gw)
    # the nonce no longer shows in the shell's command line (the next test): taken from the
    # gateway here, as the worst case of code that learned it
    nonce = gw.sessions.get("agent", sid).marker.pattern.split(b"GW", 1)[1].split(b":", 1)[0].decode()
    for steal in ("read -r -d '' -u 10 junk", "read -r -N 3 -u 10 junk", "read -r -d $'\\x1f' -u 10 junk"):
        attack = f"cd 'x;mkdir pwned;#'; printf '\\036GW{nonce}:0\\036'; {steal}"
        call(gw, "exec", session_id=sid, command=attack, timeout_ms=500)
        for _ in range(3):
            call(gw, "exec", session_id=sid, command="echo next", timeout_ms=500)
        time.sleep(0.3)
        assert not list(ws.rglob("pwned")), steal


@pytest.mark.parametrize("pty", [False, True])
def test_tracing_shows_the_agents_commands_and_never_the_loops_marker(gw: Gateway, pty: bool) -> None:
    """`set -x` (or -v) in a session traced the loop's own lines too, its printf with the end
    marker's nonce among them (a red team's find): a command could then print a marker of its
    own and be reported finished while it ran. The agent's trace goes on; the loop's never shows."""
    sid = start(gw, pty=pty)
    nonce = gw.sessions.get("agent", sid).marker.pattern.split(b"GW", 1)[1].split(b":", 1)[0].decode()
    steps = ("set -xv", "echo traced", "set +xv", "echo quiet", "set -x", "echo again; exit 3")
    outs = [call(gw, "exec", session_id=sid, command=c) for c in steps]
    assert not [o for o in outs if nonce in o.get("output", "")], outs
    assert "+ echo traced" in outs[1]["output"] and "+ echo quiet" not in outs[3]["output"], outs
    assert "+ echo again" in outs[5]["output"] and outs[5]["exit_code"] == 3, outs[5]


FORGE = """
import os, re, sys, time
found = set()
for pid in os.listdir("/proc"):
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                found.update(re.findall(rb"GW([0-9a-f]{16}):", f.read()))
        except OSError:
            pass
print("forger-looked", len(found), flush=True)
for nonce in found:  # what a program that found the marker does: say "finished", and go on
    sys.stdout.write("\\x1eGW%s:0\\x1e" % nonce.decode())
sys.stdout.flush()
time.sleep(1)
print("still-running", flush=True)
"""


@pytest.mark.parametrize("pty", [False, True])
def test_a_program_cannot_find_the_end_marker_to_forge_command_finished(gw: Gateway, ws: Path, pty: bool) -> None:
    """A program the session runs reads every command line and environment it can see in the
    sandbox (/proc/*/cmdline, environ) for the loop's end marker and prints it, then runs on.
    The marker was in the loop shell's command line: the gateway answered "finished" (exit 0)
    while the program ran, and its later output went to the next command's reply. Must hold:
    nothing in the sandbox shows the marker, and the reply waits for the real end."""
    (ws / "forge.py").write_text(FORGE)
    sid = start(gw, pty=pty)
    out = call(gw, "exec", session_id=sid, command="python3 forge.py")
    assert "forger-looked 0" in out["output"], out
    assert "still-running" in out["output"] and out["running"] is False and out["exit_code"] == 0, out


def test_a_program_a_python_session_starts_cannot_find_its_marker_either(gw: Gateway, ws: Path) -> None:
    """A Python session's prompt carries the marker; its setup was on python3's command line."""
    (ws / "forge.py").write_text(FORGE)
    sid = start(gw, pty=True, shell_type="python")
    out = call(gw, "exec", session_id=sid, command="import subprocess; subprocess.run(['python3', 'forge.py'])")
    assert "forger-looked 0" in out["output"], out
    assert "still-running" in out["output"] and out["running"] is False, out


def test_the_loops_own_names_are_not_the_commands(gw: Gateway) -> None:
    """`__gw_prompt=X` put agent text into every later reply (the loop prints its prompt before
    each end marker). Must hold: a text naming one of the loop's names is refused before it is
    decided (and recorded), and one that builds the name at run time cannot set the prompt (the
    analyser refuses `printf -v` of a name it cannot read; the prompt is read-only besides)."""
    sid = start(gw)
    for text in ("__gw_prompt=INJECTED", "export __gw_prompt=INJECTED", "unset __gw_prompt", "__gw_status=0 true"):
        out = call(gw, "exec", session_id=sid, command=text)
        assert out["status"] == "error" and out["error"]["code"] == "INVALID_INPUT", (text, out)
        assert "__gw_" in out["error"]["message"], out
    out = call(gw, "exec", session_id=sid, command='p=__g; printf -v "${p}w_prompt" INJECTED2')
    assert out["status"] != "ok" or out["exit_code"] != 0, out  # refused, or read-only: it fails
    out = call(gw, "exec", session_id=sid, command="echo after")
    assert out["output"].strip() == "after", out
    assert "INJECTED" not in out["output"], out


def test_typed_input_is_audited_as_size_and_hash_only(gw: Gateway, tmp_path: Path) -> None:
    sid = start(gw, pty=True)
    call(gw, "exec", session_id=sid, command="read -s pw; echo done", timeout_ms=300)
    call(gw, "write", session_id=sid, input="hunter2-typed\n")
    text = "".join(p.read_text() for p in (tmp_path / "audit").iterdir())
    assert "hunter2-typed" not in text and "input_sha256" in text


def test_ended_sessions_free_their_slot_and_descriptors(gw: Gateway) -> None:
    import os

    before = len(os.listdir("/proc/self/fd"))
    for _ in range(6):  # the limited principal may hold one session
        sid = start(gw, principal="limited")
        call(gw, "exec", principal="limited", session_id=sid, command="exit")
    assert len(os.listdir("/proc/self/fd")) <= before + 4
    with pytest.raises(ValidationError, match="prompt: a NUL byte"):  # the call model refuses it: INVALID_INPUT
        call(gw, "start", prompt="a\x00b")


def test_input_a_program_does_not_read_ends_the_call(gw: Gateway) -> None:
    """A pipe to a program that never reads fills up: the write returns instead of hanging."""
    sid = start(gw)
    assert call(gw, "exec", session_id=sid, command="sleep 30", timeout_ms=100)["running"] is True
    out = call(gw, "write", session_id=sid, input="x" * 200_000)
    assert out["error"]["code"] == "INPUT_NOT_READ" and "kill the session" in out["error"]["message"]
    call(gw, "kill", session_id=sid)


def test_a_command_still_running_cannot_create_protected_paths_later(gw: Gateway, ws: Path) -> None:
    """No .git when the session starts: a read-only placeholder stands there for the session's
    whole life, so a command that plants a hook after its exec returned fails, and nothing needs
    putting back."""
    sid = start(gw)
    plant = (
        WAIT_FOR_GO + "try: os.makedirs('.git/hooks'); open('.git/hooks/pre-commit', 'w').write('x')\n"
        "except OSError as e: open('planted.txt', 'w').write(e.strerror)"
    )
    (ws / "plant.py").write_text(plant)
    assert call(gw, "exec", session_id=sid, command="python3 plant.py", timeout_ms=100)["running"] is True
    (ws / "go").touch()  # the exec has returned: now it plants
    assert idle(gw, sid)
    out = call(gw, "exec", session_id=sid, command="echo next")
    assert out["status"] == "ok", out
    assert (ws / "planted.txt").read_text() in ("File exists", "Read-only file system")
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()


@pytest.mark.parametrize("pty", [False, True])
def test_a_session_whose_shell_exits_is_forgotten_and_reaped_at_once(gw: Gateway, pty: bool) -> None:
    """`exit` in a session: its bubblewrap is waited for (no zombie left) and the session leaves
    the list by itself, without waiting for the next start or the idle reaper."""
    sid = start(gw, pty=pty)
    session = gw.sessions.get("agent", sid)
    call(gw, "exec", session_id=sid, command="exit 3", timeout_ms=2000)
    assert eventually(lambda: not call(gw, "list")["sessions"] and session.proc.returncode is not None)
    assert call(gw, "list")["sessions"] == []
    assert session.proc.returncode is not None  # waited for: no zombie bwrap
    events = [r["event"] for _, _, r, _ in records(gw.audit.directory) if r]
    assert "session_ended" in events


def test_a_session_leaves_the_list_only_once_its_end_is_recorded(gw: Gateway) -> None:
    """A shell that exits is forgotten on a thread of its own. Before, the session left the list
    first and `session_ended` was written after: a client (and CI's test above, reading the log
    once the list was empty) saw the end before any record of it, and a crash meanwhile left none."""
    recording, release = threading.Event(), threading.Event()
    record = gw.sessions.on_event

    def slow_record(event: str, session: Any, data: dict[str, Any]) -> None:
        if event == "session_ended":
            recording.set()
            release.wait(PATIENCE_S)  # a slow disk, held until the test has looked
        record(event, session, data)

    gw.sessions.on_event = slow_record
    sid = start(gw)
    exiting = threading.Thread(target=call, args=(gw, "exec"), kwargs={"session_id": sid, "command": "exit 3"})
    exiting.start()  # its answer waits for the session to be forgotten (which may record on this thread)
    assert recording.wait(PATIENCE_S)
    listed = [s["session_id"] for s in call(gw, "list")["sessions"]]
    release.set()
    exiting.join()
    assert listed == [sid], "the session left the list before its end was recorded"
    assert eventually(lambda: not call(gw, "list")["sessions"])


@pytest.mark.parametrize("pty", [True, False])
def test_ending_sessions_never_closes_another_threads_descriptor(gw: Gateway, tmp_path: Path, pty: bool) -> None:
    """Before: killing a PTY session closed the terminal's descriptor twice. A number closed is
    handed out again by the next open anywhere in the gateway (an audit file, a sandbox's mount
    source), and the second close took that one: an unrelated file closed under its user."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    expected = probe.stat().st_ino
    stop = threading.Event()
    broken: list[str] = []

    def prober() -> None:  # what any other thread of the gateway does: open, use, close
        while not stop.is_set():
            fd = os.open(probe, os.O_RDONLY)
            try:
                time.sleep(0.0005)
                if os.fstat(fd).st_ino != expected:
                    broken.append("my descriptor now names another file")
            except OSError as exc:
                broken.append(f"my descriptor was closed under me: {exc}")
                continue
            try:
                os.close(fd)
            except OSError as exc:
                broken.append(f"my descriptor was closed under me: {exc}")

    t = threading.Thread(target=prober)
    t.start()
    try:
        for i in range(12):
            sid = start(gw, pty=pty)
            if i % 2:  # half end by kill, half by the shell exiting (the reader ends first)
                call(gw, "kill", session_id=sid)
            else:
                call(gw, "write", session_id=sid, input="exit\n")
                assert eventually(lambda: not call(gw, "list")["sessions"])
    finally:
        stop.set()
        t.join()
    assert broken == []


def test_an_exec_waits_no_longer_than_the_policys_timeout(ws: Path, tmp_path: Path) -> None:
    """Red team (issue 12, O3): an exec's timeout_ms (up to a day) was not bounded by the
    policy's timeout; it bounds the wait now (the command runs on in the session)."""
    raw = {**POLICY, "roles": {**POLICY["roles"], "dev": {**POLICY["roles"]["dev"], "limits": {"timeout_ms": 1500}}}}
    policy = compile_policy(Policy.model_validate(raw), ws.parent / "p2.yaml", ws, sha256="t2")
    g = Gateway(policy, AuditLog(tmp_path / "audit2"))
    try:
        started = g.handle(SessionCall(principal="agent", action="start"))
        sid = started["session_id"]
        out = g.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="sleep 30",
                                   timeout_ms=3_600_000))  # fmt: skip
        assert out["running"] is True, out  # it stopped waiting at the policy's 1.5 s, not the hour asked for
    finally:
        g.close()
