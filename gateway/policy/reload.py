"""Pick up policy changes on disk without a restart, atomically.

`PolicyHolder.current()` returns the policy in force. When any file of the policy (the file and
its includes) has changed since it was loaded, the new version is loaded and validated in full
(examples included) and only then swapped in, in one reference assignment. A new version that
fails to load leaves the old one in force; the failure is kept in `last_error` and handed to
`on_event`, which the gateway turns into an audit record (`policy_loaded` / `policy_rejected`).
A new version takes effect only once its `policy_loaded` record is written: while the log cannot
be written, the old policy stays in force and the change is tried again at the next check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.policy.compile import CompiledPolicy
from gateway.policy.layers import layer_files
from gateway.policy.loader import PolicyError
from gateway.policy.selftest import load_checked

Event = Callable[[str, dict[str, Any]], None]


def _stamp(files: tuple[Path, ...]) -> tuple[tuple[str, int, int, int, int, int], ...]:
    """What says a file changed, without reading it: its identity, size and times (an editor's
    save-by-rename gives a new inode; an in-place write moves mtime and ctime)."""
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((str(f), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            out.append((str(f), -1, -1, -1, -1, -1))
    return tuple(out)


class PolicyTooOld(Exception):
    """The policy in force may no longer be used (a fleet's gateway cut off from its store past
    the policy's `fleet.max_policy_age_seconds`): every call is refused, with this message."""


class PolicyHolder:
    def __init__(
        self, path: Path, workspace: Path | None = None, on_event: Event | None = None, interval: float = 1.0
    ) -> None:
        self.path = path
        self.workspace = workspace
        self.on_event = on_event or (lambda kind, data: None)
        self.interval = interval
        self.last_error: str | None = None
        self._lock = threading.Lock()
        # stamped before it is read: a change made while it loads is seen by the next check
        self._watched = self._files()
        self._stamp = _stamp(self._watched)
        self._policy = load_checked(path, workspace)  # a first load that fails is fatal: raise
        self._checked = time.monotonic()
        self.on_event("policy_loaded", {"path": str(path), "sha256": self._policy.sha256})

    def _files(self) -> tuple[Path, ...]:
        return layer_files(self.path)

    def current(self) -> CompiledPolicy:
        now = time.monotonic()
        if now - self._checked >= self.interval:
            self.reload_if_changed()
        return self._policy

    def reload_if_changed(self) -> bool:
        """Load the policy again if a file changed. True when a new policy is in force. A check
        with nothing changed stats the files it watches and reads none of them; the list of
        files (the includes) is read again only when one of them changed."""
        with self._lock:
            self._checked = time.monotonic()
            if _stamp(self._watched) == self._stamp:
                return False
            self._watched = self._files()  # an include may have been added or dropped
            stamp = _stamp(self._watched)
            try:
                fresh = load_checked(self.path, self.workspace)
            except PolicyError as exc:
                self.last_error = str(exc)
                if self._tell(
                    "policy_rejected", {"path": str(self.path), "error": str(exc), "kept": self._policy.sha256}
                ):
                    self._stamp = stamp
                return False
            # the record first: a policy the audit log does not name never decides anything
            if not self._tell("policy_loaded", {"path": str(self.path), "sha256": fresh.sha256}):
                return False
            self._stamp = stamp
            self._policy = fresh  # one assignment: callers see the old or the new, never a mix
            self.last_error = None
            return True

    def _tell(self, kind: str, data: dict[str, Any]) -> bool:
        """Hand an event to `on_event` (the audit log). False when it could not be recorded: the
        change is then not taken, the old policy stays in force, and the next check tries again."""
        try:
            self.on_event(kind, data)
        except Exception as exc:  # AuditUnavailable, or whatever the sink raises: never the caller's problem
            self.last_error = f"{kind} could not be recorded ({exc}): the policy in force is unchanged"
            return False
        return True
