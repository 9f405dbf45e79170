"""Reaping the sandboxes' namespace inits that outlive their bwrap.

When a run times out or a session is killed, the sandbox's process group gets SIGKILL: bwrap and
the init of its PID namespace die together, and that init, orphaned, is handed to the nearest
subreaper or to PID 1. On a host, PID 1 reaps it. In a container where the gateway *is* PID 1,
nobody did: every timeout left a zombie `bwrap`, and a container's PID limit ran out.

So the gateway becomes a subreaper (`PR_SET_CHILD_SUBREAPER`; as PID 1 it is one already) and a
thread reaps those orphans: children of the gateway in a deeper PID namespace than its own
(their `NSpid` line in /proc lists more ids than ours). The gateway's own children (bwrap, the
helpers it runs) live in its namespace and are never waited for here: their `subprocess.Popen`
owns their exit status, so nothing here ever calls `waitpid(-1)`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

from gateway.sandbox.proctree import nspid_depth

PR_SET_CHILD_SUBREAPER = 36
INTERVAL_S = 2.0
"""How often to look for orphans between pokes (a poke follows each killed sandbox)."""

_lock = threading.Lock()
_wake = threading.Event()
_thread: threading.Thread | None = None
_reaped = 0


def start() -> bool:
    """Become a subreaper (once per process) and start the reaping thread. Returns whether this
    process now receives its sandboxes' orphans (False: the kernel refused; then PID 1 or the
    host's subreaper gets them, as before)."""
    global _thread
    with _lock:
        if _thread is not None:
            return True
        ok = os.getpid() == 1 or _set_subreaper()
        _thread = threading.Thread(target=_loop, name="sandbox-reaper", daemon=True)
        _thread.start()
        return ok


def poke() -> None:
    """A sandbox was just killed: look for its orphaned init soon."""
    _wake.set()


def reaped() -> int:
    """How many orphans this process has reaped (for tests and `doctor`)."""
    return _reaped


def reap_now() -> int:
    """Reap every orphaned sandbox init that has exited; returns how many."""
    global _reaped
    mine = nspid_depth(os.getpid())
    if mine is None:
        return 0
    count = 0
    for pid in _children():
        depth = nspid_depth(pid)
        if depth is None or depth <= mine:
            continue  # one of our own children (or gone): its Popen waits for it
        with contextlib.suppress(ChildProcessError, OSError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                count += 1
    _reaped += count
    return count


def _loop() -> None:
    while True:
        poked = _wake.wait(INTERVAL_S)
        _wake.clear()
        with contextlib.suppress(Exception):  # never let the thread die
            reap_now()
            if poked:  # the init dies an instant after its bwrap: look again shortly
                for _ in range(5):
                    if _wake.wait(0.1):
                        break
                    reap_now()


def _set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """Our children's pids, from /proc (each task's `children` list where the kernel has it,
    else every process's parent field)."""
    me = os.getpid()
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{me}/task")
        lists = [f"/proc/{me}/task/{t}/children" for t in tasks]
        if lists and os.path.exists(lists[0]):
            for path in lists:
                with contextlib.suppress(OSError), open(path) as f:
                    found.update(int(p) for p in f.read().split())
            return sorted(found)
    except OSError:
        pass
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{entry}/stat", "rb") as f:
            raw = f.read()
            if int(raw[raw.rindex(b")") + 2 :].split()[1]) == me:
                found.add(int(entry))
    return sorted(found)
