"""The process tree, read from /proc: what sessions and processes signal and inspect."""

from __future__ import annotations

import contextlib
import os


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


def comm(pid: int) -> str:
    """The process's name, or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
