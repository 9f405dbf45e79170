"""The `run` executor: one shell command, in the sandbox, with bounded output and a timeout.

The text runs with a pinned shell (`bash --noprofile --norc -c`), stdin closed, the jailed cwd,
a scrubbed environment (an allowlist plus what the policy permitted), inside the sandbox
(gateway/sandbox: a plan, then a launch).

Output is read as it comes and never kept whole: each stream keeps its first and last
`output_bytes / 2` bytes, and a notice says how many bytes in between were dropped.

On timeout the sandbox's process group gets SIGTERM, then SIGKILL after a grace period. bwrap is
the parent of the command's PID namespace, so when it dies every process the command started
dies with it, `setsid` and double-forked ones included.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway import sandbox
from gateway.sandbox import identity, reaper
from gateway.sandbox.plan import READONLY as READONLY
from gateway.sandbox.plan import READONLY_PREFIX

SHELL = ["bash", "--noprofile", "--norc", "-c"]


def shell_argv(text: str, posix: bool = False) -> list[str]:
    """The argv that runs `text` as the gate decided it (bash, or bash in POSIX mode for `sh`),
    with READONLY protected first."""
    return [*SHELL[:-1], *(["--posix"] if posix else []), "-c", READONLY_PREFIX + text]


SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
GRACE_SECONDS = 2.0


@dataclass
class _Stream:
    """Head and tail of a stream, with the count of bytes dropped between them."""

    keep: int
    head: bytearray
    tail: bytearray
    dropped: int = 0

    def add(self, data: bytes) -> None:
        half = self.keep // 2
        room = half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - (self.keep - half)
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes dropped ...]\n".encode() if self.dropped else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", "replace")


def sandbox_pipe() -> tuple[int, int]:
    """A pipe for a sandboxed command's output, owned by the sandbox's account: a command may
    reopen its own output (`> /dev/stdout` is /proc/self/fd/1), which checks the pipe's owner."""
    r, w = os.pipe()
    try:
        identity.own(w)
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    return r, w


# A program that pages its output when it writes to a terminal (man, and others, in a session's
# terminal) runs PAGER: `cat`, never `less`, whose `!cmd` would run a command no one decided
# (less itself, if something still starts it, in its secure mode: no commands, no other files).
PAGERS = {"PAGER": "cat", "MANPAGER": "cat", "LESSSECURE": "1"}


def scrubbed_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment a command starts with: an allowlist plus what the policy permitted (the
    sandbox's plan adds HOME and git's settings over it)."""
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", **PAGERS}
    env.update(extra)
    return env


def run(
    text: str,
    cwd: Path,
    profile: sandbox.Profile,
    *,
    env: dict[str, str] | None = None,
    timeout_ms: int = 120_000,
    output_bytes: int = 1 << 20,
    posix: bool = False,
    capture: bool = True,
    cancel: threading.Event | None = None,
    git_write: bool = False,
    release: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run `text`. Returns the result fields of the `run` tool (docs/tools.md). Raises
    sandbox.SandboxUnavailable when it cannot run sandboxed (the caller refuses). `posix` runs
    bash in POSIX mode (the `sh` shell); without `capture` the output goes to /dev/null. Setting
    `cancel` (the caller went away, the server shuts down) kills the command: CALL_CANCELLED.
    `git_write` (the call is git and nothing else: sandbox/git.py) leaves .git writable.

    `release`: the sandbox is built while `release()` runs (the caller writes the decision
    record there), and the command starts only once it returns; if it raises, the command never
    runs, the sandbox is taken down and the exception propagates. Never called when the
    executor returns or raises before the sandbox exists."""
    if not cwd.is_dir():
        return {"status": "error", "error": {"code": "INVALID_INPUT", "message": f"cwd {cwd} is not a directory"}}
    argv = shell_argv(text, posix)
    plan, launch = sandbox.start(
        profile, argv, cwd, scrubbed_env(env or {}), git_write=git_write, hold=release is not None
    )
    started = time.monotonic()
    pipes = [sandbox_pipe(), sandbox_pipe()] if capture else []
    try:
        proc = subprocess.Popen(
            launch.argv,
            stdin=subprocess.DEVNULL,
            stdout=pipes[0][1] if capture else subprocess.DEVNULL,
            stderr=pipes[1][1] if capture else subprocess.DEVNULL,
            env=plan.env,
            cwd="/",
            start_new_session=True,  # its own process group, for killpg
            close_fds=True,
            pass_fds=launch.pass_fds,
        )
    except OSError as exc:
        launch.abandon()
        for r, w in pipes:
            os.close(r)
            os.close(w)
        return {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": f"cannot start: {exc}"}}
    launch.started(proc.pid)
    readers = {}
    for name, (r, w) in zip(("stdout", "stderr"), pipes, strict=False):
        os.close(w)
        readers[name] = os.fdopen(r, "rb", buffering=0)
    if release is not None:
        try:
            release()
        except BaseException:  # not released: the held command never runs
            launch.withhold()
            _kill(proc)
            for reader in readers.values():
                reader.close()
            launch.finished()
            raise
        launch.go()
    streams = {
        "stdout": _Stream(output_bytes, bytearray(), bytearray()),
        "stderr": _Stream(output_bytes, bytearray(), bytearray()),
    }
    sel = selectors.DefaultSelector()
    for name in ("stdout", "stderr"):
        stream = readers.get(name)
        if stream is not None:
            sel.register(stream, selectors.EVENT_READ, name)
    # the process's exit wakes the loop at once (a pidfd is readable when it ends): output closed
    # before bwrap is reaped no longer costs a 100 ms poll interval
    exit_fd = _pidfd(proc.pid) if cancel is not None else None
    if exit_fd is not None:
        sel.register(exit_fd, selectors.EVENT_READ, "exit")
    deadline = started + timeout_ms / 1000
    timed_out = cancelled = ended_itself = False
    try:
        while _reading(sel) or (cancel is not None and proc.poll() is None):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if not _reading(sel) and exit_fd is None and cancel is not None:  # no pidfd: poll, watch cancel
                cancel.wait(min(left, 0.01))
                continue
            for key, _ in sel.select(min(left, 0.1 if cancel is not None else 0.5)):
                if key.data == "exit":
                    sel.unregister(key.fileobj)
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    streams[key.data].add(chunk)
                else:
                    sel.unregister(key.fileobj)
        if timed_out or cancelled:
            ended_itself = proc.poll() is not None  # before the deadline: a sandbox that failed
            _kill(proc)
        else:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                ended_itself = False
                _kill(proc)
    finally:
        sel.close()
        if exit_fd is not None:
            os.close(exit_fd)
        for stream in readers.values():
            stream.close()
        if proc.poll() is None:
            _kill(proc)
    duration = int((time.monotonic() - started) * 1000)
    truncated = any(s.dropped for s in streams.values())
    result: dict[str, Any] = {
        "status": "timeout" if timed_out else "ok",
        "exit_code": None if timed_out else proc.returncode,
        "stdout": streams["stdout"].text(),
        "stderr": streams["stderr"].text(),
        "timed_out": timed_out,
        "duration_ms": duration,
        "truncated": truncated,
        "dropped_bytes": {k: s.dropped for k, s in streams.items()},
    }
    never_ran = launch.never_ran()
    stopped = launch.finished()
    result["sandbox"] = launch.summary(plan)
    if launch.network_summary is not None:  # what the network policy let through and refused, and why
        result["network"] = launch.network_summary
    if launch.disk_stopped is not None:  # its principal's write roots passed their budget (sandbox/disk.py)
        result["status"] = "error"
        result["exit_code"] = None if stopped.get("disk_stopped") else result["exit_code"]
        how = "the command was stopped" if stopped.get("disk_stopped") else "the command ended"
        how = "the command was refused" if launch.refused else how  # (it never ran)
        result["error"] = {"code": "DISK_BUDGET", "message": f"{how}: {launch.disk_stopped}"}
        return result
    if never_ran and (timed_out or cancelled) and not ended_itself:  # killed while its sandbox was being set up
        result["exit_code"] = None
        if cancelled:
            result["status"] = "error"
            result["error"] = {"code": "CALL_CANCELLED", "message": "the call was cancelled before the command started"}
        else:
            why = f"killed after {timeout_ms} ms, before the command started (its sandbox was still being set up)"
            result["error"] = {"code": "COMMAND_TIMEOUT", "message": why}
        return result
    if never_ran or sandbox.is_setup_failure(proc.returncode, result["stderr"]):
        result["status"] = "error"
        lines = result["stderr"].strip().splitlines()
        why = lines[-1][:300] if lines else f"it ended with status {proc.returncode} before the command started"
        if launch.network_error:
            why = f"{launch.network_error} ({why})" if lines else launch.network_error
        result["error"] = {"code": "SANDBOX_UNAVAILABLE", "message": f"the sandbox refused to start: {why}"}
        return result
    if stopped.get("oom_killed"):
        result["status"] = "error"
        cap = plan.quotas.memory_bytes or 0
        result["error"] = {
            "code": "RESOURCE_LIMIT",
            "message": f"killed: the command used more than its memory limit ({cap >> 20} MiB)",
        }
        return result
    if stopped.get("pids_refused"):
        result["notice"] = f"the process limit ({plan.quotas.pids}) refused some forks"
    if cancelled:
        result["status"] = "error"
        result["error"] = {
            "code": "CALL_CANCELLED",
            "message": "killed: the call was cancelled (client gone or shutdown)",
        }
    elif timed_out:
        result["error"] = {"code": "COMMAND_TIMEOUT", "message": f"killed after {timeout_ms} ms"}
    elif proc.returncode == 127:  # the program was not found: an error status, as isError says
        result["status"] = "error"
        result["error"] = {"code": "COMMAND_NOT_FOUND", "message": streams["stderr"].text().strip()[-300:]}
    return result


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+; None where missing)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _reading(sel: selectors.BaseSelector) -> bool:
    """Whether an output pipe is still open (the exit descriptor does not count)."""
    return any(key.data != "exit" for key in sel.get_map().values())


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the sandbox's group, SIGKILL after the grace period; the PID namespace takes
    every descendant with bwrap."""
    for sig, wait in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    reaper.poke()  # bwrap's orphaned namespace init is the gateway's to reap
