"""Pick up policy changes on disk without a restart, atomically.

`PolicyHolder.current()` returns the policy in force. When any file of the policy (the file and
its includes) has changed since it was loaded, the new version is loaded and validated in full
(examples included) and only then swapped in, in one reference assignment. A new version that
fails to load leaves the old one in force; the failure is kept in `last_error` and handed to
`on_event`, which the gateway turns into an audit record (`policy_loaded` / `policy_rejected`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.policy.compile import CompiledPolicy
from gateway.policy.loader import PolicyError
from gateway.policy.selftest import load_checked

Event = Callable[[str, dict[str, Any]], None]


def _stamp(files: tuple[Path, ...]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((str(f), -1, -1))
    return tuple(out)


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
        self._policy = load_checked(path, workspace)  # a first load that fails is fatal: raise
        self._stamp = _stamp(self._files())
        self._checked = time.monotonic()
        self.on_event("policy_loaded", {"path": str(path), "sha256": self._policy.sha256})

    def _files(self) -> tuple[Path, ...]:
        from gateway.policy.layers import layer_files

        return layer_files(self.path)

    def current(self) -> CompiledPolicy:
        now = time.monotonic()
        if now - self._checked >= self.interval:
            self.reload_if_changed()
        return self._policy

    def reload_if_changed(self) -> bool:
        """Load the policy again if a file changed. True when a new policy is in force."""
        with self._lock:
            self._checked = time.monotonic()
            stamp = _stamp(self._files())
            if stamp == self._stamp:
                return False
            self._stamp = stamp
            try:
                fresh = load_checked(self.path, self.workspace)
            except PolicyError as exc:
                self.last_error = str(exc)
                self.on_event(
                    "policy_rejected", {"path": str(self.path), "error": str(exc), "kept": self._policy.sha256}
                )
                return False
            self._policy = fresh  # one assignment: callers see the old or the new, never a mix
            self.last_error = None
            self.on_event("policy_loaded", {"path": str(self.path), "sha256": fresh.sha256})
            return True
