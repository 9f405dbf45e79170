"""Launch long-lived sandboxes from one long-lived thread.

bwrap's `--die-with-parent` is PR_SET_PDEATHSIG, and Linux sends that signal when the *thread*
that forked the child exits, not the process. A session started from a short-lived worker
thread (the MCP server handles each call on its own thread) would be killed the moment that
call returned. Sessions are therefore forked from this one thread, which lives as long as the
gateway: they still die with the gateway, and only with it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class Spawner:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the spawner thread and return its result (or raise its exception)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="gateway-spawner", daemon=True)
                self._thread.start()
        done: Future[T] = Future()
        self._jobs.put((fn, done))
        return done.result()

    def _loop(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller
                done.set_exception(exc)


SPAWNER = Spawner()
