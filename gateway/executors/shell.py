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
import shutil
import signal
import subprocess
import threading
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


MAX_SNAPSHOT_BYTES = 4 << 20
DIR = b"\0dir"
ABSENT = b"\0absent"


LINKED = b"\0linked-ancestor"


def _linked_ancestor(path: Path) -> Path | None:
    """The first directory above `path` that is a symlink (never follow one: it may lead out)."""
    for parent in reversed(path.parents):
        if os.path.islink(parent):
            return parent
    return None


def snapshot(paths: tuple[Path, ...]) -> dict[str, bytes]:
    """What lies under each protected path: file contents, symlink targets, DIR or ABSENT; a
    path below a symlinked directory is LINKED and is not read through the link."""
    out: dict[str, bytes] = {}
    total = 0
    for root in paths:
        if _linked_ancestor(root) is not None:
            out[str(root)] = LINKED
            continue
        if not os.path.lexists(root):
            out[str(root)] = ABSENT
            continue
        if not os.path.isdir(root) or os.path.islink(root):
            out[str(root)] = os.readlink(root).encode() if os.path.islink(root) else Path(root).read_bytes()
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            out[dirpath] = DIR
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                full = os.path.join(dirpath, name)
                data = os.readlink(full).encode() if os.path.islink(full) else Path(full).read_bytes()
                total += len(data)
                if total > MAX_SNAPSHOT_BYTES:
                    raise OSError(f"protected paths hold more than {MAX_SNAPSHOT_BYTES} bytes")
                out[full] = data
    return out


def restore(paths: tuple[Path, ...], before: dict[str, bytes]) -> list[str]:
    """Put the protected paths back as they were; the names of what had changed. (Symlinks
    inside them come back as their recorded target text in a file: they should not be there.)"""
    after = snapshot(paths)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if not changed:
        return []
    for root in paths:
        link = _linked_ancestor(root)
        if link is not None:  # a directory swapped for a symlink: remove the link, not its target
            os.unlink(link)
    for root in paths:
        if os.path.islink(root) or os.path.isfile(root):
            os.unlink(root)
        elif os.path.isdir(root):
            shutil.rmtree(root)
    for name in sorted(before, key=len):
        data = before[name]
        if _linked_ancestor(Path(name)) is not None:
            continue
        if data == DIR:
            os.makedirs(name, exist_ok=True)
        elif data not in (ABSENT, LINKED):
            os.makedirs(os.path.dirname(name), exist_ok=True)
            Path(name).write_bytes(data)
    return changed


def writable_protected(read_only: tuple[Path, ...], write_roots: tuple[Path, ...]) -> tuple[Path, ...]:
    """The protected paths inside a write root: the ones a command could change."""
    return tuple(p for p in read_only if any(p == r or r in p.parents for r in write_roots))


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
    posix: bool = False,
    capture: bool = True,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Run `text`. Returns the result fields of the `run` tool (docs/tools.md). Raises
    sandbox.SandboxUnavailable when it cannot run sandboxed (the caller refuses). `posix` runs
    bash in POSIX mode (the `sh` shell); without `capture` the output goes to /dev/null. Setting
    `cancel` (the caller went away, the server shuts down) kills the command: CALL_CANCELLED."""
    if not cwd.is_dir():
        return {"status": "error", "error": {"code": "INVALID_INPUT", "message": f"cwd {cwd} is not a directory"}}
    argv = sandbox.wrap(
        [*SHELL[:-1], *(["--posix"] if posix else []), "-c", text],
        cwd,
        write_roots,
        limits or sandbox.Limits(),
        network,
        read_only,
        hidden,
        read_roots,
    )
    # the sandbox binds protected paths read-only, but a command can rename their parent away or
    # create a protected path that did not exist: compare after, and put them back
    protected = writable_protected(read_only, write_roots)
    before = snapshot(protected)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.PIPE if capture else subprocess.DEVNULL,
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
    for name in ("stdout", "stderr"):
        stream = getattr(proc, name)
        if stream is not None:
            sel.register(stream, selectors.EVENT_READ, name)
    deadline = started + timeout_ms / 1000
    timed_out = cancelled = False
    try:
        while sel.get_map() or (cancel is not None and proc.poll() is None):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if cancel is not None and cancel.is_set():
                cancelled = True
                break
            if not sel.get_map() and cancel is not None:  # output closed, still running: wait, watch cancel
                cancel.wait(min(left, 0.1))
                continue
            for key, _ in sel.select(min(left, 0.1 if cancel is not None else 0.5)):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    streams[key.data].add(chunk)
                else:
                    sel.unregister(key.fileobj)
        if timed_out or cancelled:
            _kill(proc)
        else:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill(proc)
    finally:
        sel.close()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
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
    changed = restore(protected, before)
    if changed:
        result["status"] = "error"
        result["error"] = {
            "code": "PROTECTED_PATH_CHANGED",
            "message": f"the command changed protected paths, which were restored: {', '.join(changed[:5])}",
        }
        return result
    if cancelled:
        result["status"] = "error"
        result["error"] = {
            "code": "CALL_CANCELLED",
            "message": "killed: the call was cancelled (client gone or shutdown)",
        }
    elif timed_out:
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
