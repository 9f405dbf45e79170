"""Cancelling a call in flight: the MCP server sets a call's event when its client goes away or
the server shuts down; whatever handles the call (the approver waiting for a supervisor, the
executor running the command) looks at `current_cancel()` and stops.

The event belongs to the thread handling the call (`Gateway.handle` installs it), so the
executors need no extra parameter threaded through every tool family.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_current = threading.local()


def current_cancel() -> threading.Event | None:
    """The cancel event of the call this thread handles (None: not cancellable)."""
    event: threading.Event | None = getattr(_current, "cancel", None)
    return event


def cancelled() -> bool:
    event = current_cancel()
    return event is not None and event.is_set()


class Cancel(threading.Event):
    """A cancel event that can say why (`cancel(why)`): the server withdrawing a call that waits
    for approval records the reason."""

    why: str = ""

    def cancel(self, why: str) -> None:
        if not self.is_set():
            self.why = why
        self.set()


def reason() -> str:
    """Why this thread's call was cancelled ("" when nobody said)."""
    return str(getattr(current_cancel(), "why", "") or "")


@contextmanager
def handling(cancel: threading.Event | None) -> Iterator[None]:
    """Install `cancel` as this thread's call's event for the duration of the block."""
    before = getattr(_current, "cancel", None)
    _current.cancel = cancel
    try:
        yield
    finally:
        _current.cancel = before
