"""Remembered decisions, never served stale.

A decision depends on the policy, the principal, the cwd, the environment, the tool family, the
command text, what `~` means where it runs, and the filesystem the path jail resolved: each
component it looked at (missing, not a link, or a link to a given target). All but the last are
the key (the cache lives on the
compiled policy object, so a reloaded policy starts empty); the filesystem part is recorded while
the decision is made (`observing`) and checked again, with the same `lstat` and `readlink` calls
the jail made, before a remembered decision is served. A decision whose jail expanded a glob (a
directory's listing), met a racing rename, or whose second opinion did not finish, is not kept.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

MAX_ENTRIES = 4096
MISSING, PLAIN = "missing", "plain"
"""A component's state, as the jail's resolver saw it; a link's state is "link:" + its target."""


class Observation:
    """What one decision read of the filesystem."""

    __slots__ = ("cacheable", "seen")

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.cacheable = True

    def component(self, path: str, state: str) -> None:
        if len(self.seen) < 256:
            self.seen.append((path, state))
        else:  # a decision that looked at this much is cheaper to redo than to check
            self.cacheable = False

    def unknowable(self) -> None:
        self.cacheable = False


_current: ContextVar[Observation | None] = ContextVar("decision_observation", default=None)


def current() -> Observation | None:
    """The observation of the decision being made on this thread, if any."""
    return _current.get()


@contextlib.contextmanager
def observing() -> Iterator[Observation]:
    obs = Observation()
    token = _current.set(obs)
    try:
        yield obs
    finally:
        _current.reset(token)


def state_of(path: str) -> str:
    """A component's state now (the resolver's own view: lstat, and readlink for a link)."""
    try:
        st = os.lstat(path)
    except OSError:
        return MISSING
    if not stat.S_ISLNK(st.st_mode):
        return PLAIN
    try:
        return "link:" + os.readlink(path)
    except OSError:
        return MISSING  # gone since the lstat: not what any recorded state says


def still_holds(seen: list[tuple[str, str]]) -> bool:
    return all(state_of(path) == state for path, state in seen)


class DecisionCache:
    """An LRU of (key -> result, what it read). Thread-safe; one per compiled policy."""

    def __init__(self, size: int = MAX_ENTRIES) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], tuple[Any, list[tuple[str, str]]]] = OrderedDict()
        self.hits = self.misses = self.stale = 0

    def get(self, key: tuple[Any, ...]) -> Any | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
        if found is None:
            self.misses += 1
            return None
        result, seen = found
        if not still_holds(seen):  # a component changed: decide again
            with self._lock:
                self._entries.pop(key, None)
            self.stale += 1
            return None
        self.hits += 1
        return result

    def put(self, key: tuple[Any, ...], result: Any, obs: Observation) -> None:
        if not obs.cacheable:
            return
        with self._lock:
            self._entries[key] = (result, list(obs.seen))
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
