"""The approvals inbox, watched for the console's live inbox.

The inbox is this host's approvals queue (`QueueInbox`: a directory of files that the gateway
and `gateway approvals` both write), or with `--store` the fleet's (fleet.py: rows every
gateway writes). One thread per server looks at it every `interval_s` (looking is the one way
to see every change, whoever made it) and tells each subscriber what changed:

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway import approval_queue
from gateway.log import log

MAX_BACKLOG = 256
END = {"kind": "end"}
"""Put on a subscriber's queue when it is dropped or the server stops: its stream ends."""


class Inbox(Protocol):
    """Where the console's asks wait and are answered."""

    interval_s: float
    """How often the feed looks at it."""

    def pending(self) -> list[dict[str, Any]]:
        """The requests waiting, as `gateway approvals show` prints them (`call_id`, `digest`,
        `expires`, the call's fields)."""
        ...

    def answered(self, call_ids: list[str]) -> set[str]:
        """Which of these requests, pending no more, were answered (the others were withdrawn)."""
        ...

    def answer(
        self, supervisor: str, secret: str, call_id: str, approved: bool, reason: str, scope: str,
        digest: str | None, record: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:  # fmt: skip
        """Answer as the supervisor `secret` belongs to (`supervisor`: their name); `digest`: the
        request they were shown, if known. `record(request)` audits the answer that won before
        it is given (if it raises, nothing is answered). Returns `{approved, by}`; raises
        AnswerRefused when the answer did not take (another won, it went, it expired)."""
        ...

    needs_secret: bool
    """The inbox checks the supervisor's secret itself (the sessions must then keep it)."""


class AnswerRefused(Exception):
    """An answer that did not take; the message says why."""


class QueueInbox:
    """This host's approvals queue (gateway/approval_queue.py)."""

    interval_s = 0.25
    needs_secret = False

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def pending(self) -> list[dict[str, Any]]:
        return approval_queue.pending(self.state_dir)

    def answered(self, call_ids: list[str]) -> set[str]:
        return {c for c in call_ids
                if any((self.state_dir / f"{c}{s}").exists() for s in (".answer.json", ".answer.used"))}  # fmt: skip

    def answer(
        self, supervisor: str, secret: str, call_id: str, approved: bool, reason: str, scope: str,
        digest: str | None, record: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:  # fmt: skip
        try:
            return approval_queue.answer(self.state_dir, call_id, approved, supervisor, reason, scope, record=record)
        except approval_queue.QueueError as exc:
            raise AnswerRefused(str(exc)) from None


@dataclass
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[dict[str, Any]]


class Feed:
    def __init__(self, inbox: Inbox | None) -> None:
        self.inbox = inbox
        self.interval_s = inbox.interval_s if inbox is not None else 1.0
        self._lock = threading.Lock()
        self._subscribers: list[_Subscriber] = []
        self._known: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.inbox is None or self._thread is not None:
            return
        with contextlib.suppress(Exception):  # not readable now: the watch says so, and tries again
            self._known = {r["call_id"]: r for r in self.inbox.pending()}
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
        assert self.inbox is not None
        while not self._stop.wait(self.interval_s):
            try:
                self._look(self.inbox)
            except Exception as exc:  # looked at again next time
                log.warning("console_feed_failed", error=f"{type(exc).__name__}: {exc}")

    def _look(self, inbox: Inbox) -> None:
        now = {r["call_id"]: r for r in inbox.pending()}
        for call_id in now.keys() - self._known.keys():
            self.publish({"kind": "added", "call_id": call_id})
        gone = sorted(self._known.keys() - now.keys())
        answered = inbox.answered(gone) if gone else set()
        for call_id in gone:
            if call_id in answered:
                self.publish({"kind": "answered", "call_id": call_id})
            else:
                expired = float(self._known[call_id].get("expires", 0)) <= time.time()
                why = "it expired unanswered" if expired else "its call can no longer complete"
                self.publish({"kind": "withdrawn", "call_id": call_id, "why": why})
        self._known = now
