"""The `run` executor: one shell command, in the sandbox, with bounded output and a timeout.

The text runs with a pinned shell (`bash --noprofile --norc -c`), stdin closed, the jailed cwd,
a scrubbed environment (an allowlist plus what the policy permitted), inside `sandbox.wrap`.

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway import sandbox

SHELL = ["bash", "--noprofile", "--norc", "-c"]
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


def scrubbed_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {"PATH": SAFE_PATH, "HOME": str(home), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb"}
    env.update(extra)
    return env


def run(
    text: str,
    cwd: Path,
    write_roots: tuple[Path, ...],
    *,
    env: dict[str, str] | None = None,
    home: Path | None = None,
    timeout_ms: int = 120_000,
    output_bytes: int = 1 << 20,
    limits: sandbox.Limits | None = None,
    network: bool = False,
    read_only: tuple[Path, ...] = (),
    hidden: tuple[Path, ...] = (),
    read_roots: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """Run `text`. Returns the result fields of the `run` tool (docs/tools.md). Raises
    sandbox.SandboxUnavailable when it cannot run sandboxed (the caller refuses)."""
    argv = sandbox.wrap(
        [*SHELL, text], cwd, write_roots, limits or sandbox.Limits(), network, read_only, hidden, read_roots
    )
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=scrubbed_env(home or cwd, env or {}),
            start_new_session=True,  # its own process group, for killpg
            close_fds=True,
        )
    except OSError as exc:
        return {"status": "error", "error": {"code": "COMMAND_NOT_FOUND", "message": str(exc)}}
    streams = {
        "stdout": _Stream(output_bytes, bytearray(), bytearray()),
        "stderr": _Stream(output_bytes, bytearray(), bytearray()),
    }
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    deadline = started + timeout_ms / 1000
    timed_out = False
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(left, 0.5)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    streams[key.data].add(chunk)
                else:
                    sel.unregister(key.fileobj)
        if timed_out:
            _kill(proc)
        else:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill(proc)
    finally:
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
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
    if timed_out:
        result["error"] = {"code": "COMMAND_TIMEOUT", "message": f"killed after {timeout_ms} ms"}
    elif proc.returncode == 127:
        result["error"] = {"code": "COMMAND_NOT_FOUND", "message": streams["stderr"].text().strip()[-300:]}
    return result


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
