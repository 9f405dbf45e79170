"""A bound on how long the ledger waits for a commit's answer.

With `synchronous_commit` on and a synchronous standby named, PostgreSQL answers a commit only
once the standby has it: a standby that stops answering holds every commit, and so every call,
for as long as it is away. Cancelling the statement is no way out: the server then reports the
commit as done (it is, locally) with only a warning, which would have the call run on a record
the standby never got. So the watch cuts the connection itself (shuts its socket down): the
driver reports the connection lost, the commit's outcome is unknown to the gateway, the call is
denied, and the next append reads the stream's end back and voids what landed (ledger.py), as
for any commit whose answer was lost.

One watch per ledger, one thread, started with the first commit; commits take turns in a
ledger, so at most one is watched at a time.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

COMMIT_TIMEOUT_S = 30.0
"""How long a commit may go unanswered before its connection is cut (`--store-commit-timeout`)."""
ENV = "AGW_STORE_COMMIT_TIMEOUT"


class CommitWatch:
    def __init__(self, bound_s: float = COMMIT_TIMEOUT_S) -> None:
        if not bound_s > 0:
            raise ValueError(f"a commit's bound must be above 0 seconds, not {bound_s}")
        self.bound_s = bound_s
        self._cond = threading.Condition()
        self._watched: tuple[object, psycopg.Connection[Any], float] | None = None
        self._cut: object | None = None
        self._idle = False
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def watching(self, conn: psycopg.Connection[Any]) -> Iterator[Cut]:
        """Watch `conn` while the block runs; the `Cut` it yields says, afterwards, whether the
        watch cut the connection (the block's error is then this bound's, not the server's)."""
        cut = Cut()
        with self._cond:
            self._watched = (cut, conn, time.monotonic() + self.bound_s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agw-commit-watch", daemon=True)
                self._thread.start()
            elif self._idle:
                self._cond.notify()
        try:
            yield cut
        finally:
            with self._cond:  # after this, the watch never touches `conn` again
                self._watched = None
                cut.done = True

    def progressed(self, cut: Cut) -> None:
        """The block watched with `cut` got an answer (one of its statements): the bound starts
        again for what follows. A block of many statements (a spool's forward) is bounded per
        answer, not as a whole: a large one on a slow store is never cut for its size alone."""
        with self._cond:
            if self._watched is not None and self._watched[0] is cut:
                self._watched = (cut, self._watched[1], time.monotonic() + self.bound_s)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._watched is None:
                    self._idle = True
                    self._cond.wait()
                    self._idle = False
                    continue
                cut, conn, deadline = self._watched
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                assert isinstance(cut, Cut)
                cut.cut = True
                self._watched = None
                _shut_down(conn)


class Cut:
    """Whether a watched block's connection was cut for taking too long."""

    def __init__(self) -> None:
        self.cut = False
        self.done = False


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down (both ways): a read blocked on it returns at once, and
    the driver reports the connection lost. Its descriptor stays the driver's to close."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # already closed
    with contextlib.suppress(OSError):
        dup = os.dup(fd)
        sock = socket.socket(fileno=dup)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


def bound_of(text: str | None) -> float:
    """`--store-commit-timeout` / $AGW_STORE_COMMIT_TIMEOUT as seconds (the default when
    empty). Raises ValueError naming what is wrong."""
    if text is None or not text.strip():
        return COMMIT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise ValueError(f"{text!r}: expected more than 0 and at most 3600 seconds")
    return value
