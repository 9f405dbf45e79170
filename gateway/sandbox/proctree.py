"""The process tree, read from /proc: what the sandbox's quotas, sessions and processes signal and
inspect. Below the executors (in the sandbox package) because the sandbox's quota kill uses it too."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable


def children(pid: int) -> list[int]:
    """The direct children of `pid` (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def namespace_inits(pid: int) -> list[int]:
    """The children of `pid` that are the first process of a PID namespace below its own (a
    sandbox's init, when `pid` is its bwrap): their NSpid lists more ids than that of `pid`."""
    mine = nspid_depth(pid)
    if mine is None:
        return []
    return [c for c in children(pid) if (depth := nspid_depth(c)) is not None and depth > mine]


def nspid_depth(pid: int) -> int | None:
    """How many PID namespaces (from /proc's down to the process's) give `pid` an id; None: gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) - 1
    except OSError:
        return None
    return None


def comm(pid: int) -> str:
    """The process's name, or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def signal_descendants(pid: int, sig: int, spare: frozenset[int] = frozenset()) -> int:
    """Send `sig` to every process below `pid` but those in `spare`; returns how many were sent.
    Each is signalled only if it is still below `pid` once pinned (`signal_pinned`)."""
    return signal_pinned([p for p in descendants(pid) if p not in spare], lambda: descendants(pid), sig)


def signal_pinned(listed: Iterable[int], still: Callable[[], Iterable[int]], sig: int) -> int:
    """Send `sig` to each listed pid that `still()`, asked once every one is pinned, lists again;
    returns how many were sent.

    A pid read from /proc or cgroup.procs may pass to an unrelated process (the listed one exited)
    before the gateway, as root, signals it. Each is pinned first with a pidfd, which refers to
    that process and never to a later one given its pid; a pinned process still listed afterwards
    is the listed one, and a dead one gives ESRCH. Where pidfds are missing (before Linux 5.3),
    the pid is signalled after the same second look, and keeps that race."""
    pinned: dict[int, int | None] = {}
    try:
        for p in listed:
            try:
                pinned[p] = os.pidfd_open(p)
            except ProcessLookupError:
                continue
            except OSError:
                pinned[p] = None
        again = set(still())
        sent = 0
        for p, fd in pinned.items():
            if p not in again:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if fd is not None:
                    signal.pidfd_send_signal(fd, sig)
                else:
                    os.kill(p, sig)
                sent += 1
        return sent
    finally:
        for fd in pinned.values():
            if fd is not None:
                os.close(fd)
