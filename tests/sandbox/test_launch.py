"""Applying a plan: what refuses a launch (nothing runs), with real descriptors and real runs."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway import sandbox
from gateway.executors import shell
from gateway.sandbox import disk, landlock
from gateway.sandbox.identity import hand_over
from gateway.sandbox.launch import Launch
from gateway.sandbox.quotas import Quotas
from tests import clonestop

Q = Quotas(memory_bytes=1 << 30, pids=256, cpu_seconds=60, file_bytes=1 << 30, open_files=256, tmpfs_bytes=64 << 20)


def profile(ws: Path, **kw: object) -> sandbox.Profile:
    base: dict[str, object] = {"principal": "agent", "read_roots": (ws,), "write_roots": (ws,),
                               "protected": (ws / "conf" / "secret",), "private": (), "quotas": Q}  # fmt: skip
    return sandbox.Profile(**(base | kw))  # type: ignore[arg-type]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "conf").mkdir(parents=True)
    (w / "conf" / "secret").write_text("keep\n")
    hand_over(w)
    return w


def test_a_symlink_on_the_way_to_a_protected_path_refuses_the_launch(ws: Path, tmp_path: Path) -> None:
    """conf/ swapped for a link to a directory of the user's: never followed, nothing runs."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(ws / "conf", ws / "conf.real")
    (ws / "conf").symlink_to(elsewhere)
    with pytest.raises(sandbox.SandboxUnavailable, match="symlink"):
        shell.run("touch ran", ws, profile(ws))
    assert not (ws / "ran").exists()


def test_a_protected_path_is_read_only_and_a_missing_one_cannot_be_made(ws: Path) -> None:
    out = shell.run("echo x > conf/secret; mkdir -p new/deeper; echo x > new/deeper/key", ws,
                    profile(ws, protected=(ws / "conf" / "secret", ws / "new" / "deeper" / "key")))  # fmt: skip
    assert "Read-only file system" in out["stderr"], out
    assert (ws / "conf" / "secret").read_text() == "keep\n"
    assert not (ws / "new" / "deeper").exists()  # the first missing component is a read-only placeholder


def test_a_policy_that_requires_landlock_refuses_where_there_is_none(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This kernel has Landlock; the kernel's answer is replaced to stand for one that has not
    (the helper's own refusal on a Landlock-less kernel is shown with seccomp in test_helper)."""
    monkeypatch.setattr(landlock, "abi", lambda: 0)
    with pytest.raises(sandbox.SandboxUnavailable, match="requires Landlock"):
        shell.run("touch ran", ws, profile(ws, landlock="required"))
    assert not (ws / "ran").exists()
    out = shell.run("touch ran", ws, profile(ws))  # optional: runs, and says Landlock was not there
    assert out["exit_code"] == 0 and out["sandbox"]["landlock"].startswith("unavailable")


def test_a_write_root_its_account_cannot_write_is_refused_with_what_to_do(tmp_path: Path) -> None:
    ws = tmp_path / "root-owned"
    ws.mkdir()
    if os.geteuid() != 0:
        pytest.skip("only root makes a tree the sandbox's account does not own")
    with pytest.raises(sandbox.SandboxUnavailable, match="chown -R"):
        shell.run("true", ws, profile(ws, protected=()))


SELF_CHECK = """
import sys
sys.stdin.readline()
from gateway.sandbox import launch
try:
    launch.check()
    print("started")
except launch.SandboxUnavailable as exc:
    print(f"refused: {exc}")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="traces the self-check's bwrap (root)")
def test_a_self_check_given_up_on_leaves_no_bwrap_waiting() -> None:
    """The self-check's bwrap held (traced) right after it cloned its first process, until the
    check gives up on it (its time limit): killing the monitor alone left that process, forked
    and not yet let go, waiting for its go for ever, as root, in the gateway's own process group.
    The check kills the probe's whole process group, of its own, which that process shares."""
    out, ended = clonestop.held_until_given_up(SELF_CHECK, "/usr/bin/true")
    assert out.startswith("refused: bubblewrap does not start"), out
    assert ended, "bwrap's first process waits on"


def _same_pid_leader(pid: int, attempts: int = 200) -> subprocess.Popen[bytes] | None:
    """A new session leader (its own process group) with exactly `pid`, by setting the kernel's
    last pid just below it (root); other processes forking meanwhile may take it: tried again."""
    last = Path("/proc/sys/kernel/ns_last_pid")
    for _ in range(attempts):
        last.write_text(str(pid - 1))
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="sets the kernel's next pid (root)")
def test_a_stop_that_comes_after_the_sandbox_ended_signals_nothing(tmp_path: Path) -> None:
    """Without a cgroup a sandbox over its disk budget is stopped through its process group, by
    pid. A stop that came after the sandbox's process was reaped and its pid taken by another
    process group sent SIGKILL (as root) to that group. The stop now signals only the process
    it started (through a pidfd), and nothing once the sandbox has ended."""
    root = tmp_path / "ws"
    root.mkdir()
    launch = Launch(argv=[], pass_fds=(), cgroup=None, fallback="rlimits")
    launch._disk = disk.watch().start((str(root),), 1 << 30, "test", launch.stop_for_disk)
    first = subprocess.Popen(["sleep", "300"], start_new_session=True)
    launch.started(first.pid)
    first.kill()
    first.wait()  # reaped: its pid is free
    launch.finished()
    other = _same_pid_leader(first.pid)
    if other is None:
        pytest.skip("the machine's other processes kept taking the pid")
    try:
        launch._stop()  # as the disk watch's late stop would
        time.sleep(0.5)  # a settle, not a measure: a SIGKILL lands at once
        assert other.poll() is None, "the stop killed another process group that took the sandbox's pid"
    finally:
        other.kill()
        other.wait()


RT_SIGACTION = {"x86_64": 13, "aarch64": 134}.get(os.uname().machine)
"""The system call's number: the C library will not set signal 32, which it keeps for itself."""

INHERITED = """
import json, signal, sys
from pathlib import Path
from gateway.executors import shell
from tests.sandbox.test_launch import profile
ws = Path(sys.argv[1])
print(json.dumps(shell.run("grep -E '^Sig(Ign|Blk):' /proc/self/status", ws, profile(ws))))
"""


def test_a_gateway_started_ignoring_signals_gives_its_commands_the_default_ones(ws: Path) -> None:
    """A gateway started from a script's `gateway serve &` or under nohup ignores SIGINT and
    SIGQUIT (SIGHUP), and one started from a thread that blocks signals blocks them: an ignored
    signal stays ignored across fork and exec, a blocked one blocked. Every command in every
    sandbox inherited both, so a session's ^C never stopped its program (it ran on, for ever,
    while the reply said it was interrupted). Commands start with every signal at its default
    and none blocked, however the gateway was started."""

    def as_nohup_in_the_background() -> None:
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGINT})
        if RT_SIGACTION is not None:  # and 32, the C library's own (a CI run's test process had it ignored)
            ignore = (ctypes.c_ulong * 8)(1)  # SIG_IGN, no flags, an empty mask
            assert ctypes.CDLL(None, use_errno=True).syscall(RT_SIGACTION, 32, ignore, None, 8) == 0

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", INHERITED, str(ws)], capture_output=True, text=True, timeout=120,
                          cwd=root, preexec_fn=as_nohup_in_the_background)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["exit_code"] == 0, out
    got = dict(line.split(":\t") for line in out["stdout"].splitlines())
    assert got == {"SigIgn": "0000000000000000", "SigBlk": "0000000000000000"}, got
