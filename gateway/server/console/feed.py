"""The approvals queue, watched for the console's live inbox.

One thread per server looks at the queue directory every `interval_s` (the queue is a
directory of files that the gateway and `gateway approvals` both write, so looking is the one
way to see every change, whoever made it) and tells each subscriber what changed:

- `added`: a call started waiting;
- `answered`: a supervisor answered it (here or from a terminal);
- `withdrawn`: it can no longer be answered (its call ended or was cancelled, it expired, its
  gateway is gone).

Events carry the call id and the kind only; a page asks `GET /console/api/approvals` for the
rest, through the same authentication as any request. A subscriber is an asyncio queue of at
most `MAX_BACKLOG` events; one that falls that far behind is dropped (its stream ends and the
page reconnects), so a stalled reader costs the server nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway import approval_queue
from gateway.log import log

MAX_BACKLOG = 256
END = {"kind": "end"}
"""Put on a subscriber's queue when it is dropped or the server stops: its stream ends."""


@dataclass
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[dict[str, Any]]


class Feed:
    def __init__(self, state_dir: Path | None, interval_s: float = 0.25) -> None:
        self.state_dir = state_dir
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._subscribers: list[_Subscriber] = []
        self._known: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.state_dir is None or self._thread is not None:
            return
        self._known = {r["call_id"]: r for r in approval_queue.pending(self.state_dir)}
        self._thread = threading.Thread(target=self._watch, name="console-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            subscribers, self._subscribers = self._subscribers, []
        for sub in subscribers:
            self._put(sub, END)

    @property
    def streams(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def subscribe(self, limit: int) -> asyncio.Queue[dict[str, Any]] | None:
        """A queue of events for the calling event loop, or None when `limit` streams are open."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_BACKLOG)
        with self._lock:
            if len(self._subscribers) >= limit or self._stop.is_set():
                return None
            self._subscribers.append(_Subscriber(asyncio.get_running_loop(), queue))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        with self._lock:
            self._subscribers = [s for s in self._subscribers if s.queue is not queue]

    def publish(self, event: dict[str, Any]) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for sub in subscribers:
            self._put(sub, event)

    def _put(self, sub: _Subscriber, event: dict[str, Any]) -> None:
        def deliver() -> None:
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:  # too far behind: end its stream; the page reconnects and reloads
                self.unsubscribe(sub.queue)
                with contextlib.suppress(asyncio.QueueEmpty):
                    sub.queue.get_nowait()
                sub.queue.put_nowait(END)

        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody reads it any more
            sub.loop.call_soon_threadsafe(deliver)

    def _watch(self) -> None:
        assert self.state_dir is not None
        while not self._stop.wait(self.interval_s):
            try:
                self._look(self.state_dir)
            except Exception as exc:  # looked at again next time
                log.warning("console_feed_failed", error=f"{type(exc).__name__}: {exc}")

    def _look(self, state_dir: Path) -> None:
        now = {r["call_id"]: r for r in approval_queue.pending(state_dir)}
        for call_id in now.keys() - self._known.keys():
            self.publish({"kind": "added", "call_id": call_id})
        for call_id in self._known.keys() - now.keys():
            answered = any((state_dir / f"{call_id}{s}").exists() for s in (".answer.json", ".answer.used"))
            if answered:
                self.publish({"kind": "answered", "call_id": call_id})
            else:
                expired = float(self._known[call_id].get("expires", 0)) <= time.time()
                why = "it expired unanswered" if expired else "its call can no longer complete"
                self.publish({"kind": "withdrawn", "call_id": call_id, "why": why})
        self._known = now
