"""The HTTP front: what stands between the listening socket and the MCP SDK.

Anyone who can reach the port (any local process, any web page in a local browser) can open
connections before it holds a token. The front keeps them from starving the clients that do:

- **Connections** (`GuardedH11`, a uvicorn h11 protocol with one `ConnectionGuard` per server).
  A connection must deliver complete request headers within `header_timeout_s` of connecting
  (or of starting its next request) and its body within `body_timeout_s` of its headers, or it
  is closed. An answer the client does not take is a deadline too: a connection whose unsent
  answer waits in the server while the client takes less than `WRITE_PROGRESS_BYTES` of it in
  `write_timeout_s` is dropped (a client with a valid token that pipelines large answers and
  never reads would otherwise hold it forever: uvicorn's send waits for the client with no
  deadline). At most `max_connections` are open, at most `max_connections_per_peer` from one
  address. At a cap, a new connection takes the place of the oldest one stalled in its headers,
  silent for a second since it connected, or with an answer the client has not taken for a
  second, else of the oldest one idle between requests; if every one is in a request (or too
  new to judge), the new one is closed at once. Stalled, silent and unread connections are what
  a flood holds, and a real client sends its whole request as soon as it connects and reads its
  answer, so it finds a place.
- **Sizes** (`BodyCap`). A request whose declared body is over `max_body_bytes` gets 413 before
  anything else reads it, authentication included. Bodies without a length are counted by the
  SDK's own cap, set to the same value, before it parses them.
- **Refusals** (`RefusalLog`). 401 and 403 answers are audited as `auth_refused`: the first of a
  kind (peer address, status, token presented or not) in full, then at most one record per
  `window_s` carrying the count. The records are written by one thread, off the answer's path.
- **Resource errors** (`quiet_resource_errors`, `ThrottledLog`). Out of descriptors, the event
  loop would log a traceback on every accept; uvicorn logs each bad request. Both are logged at
  most once per interval, with the count of what was left out.

uvicorn (0.54, h11) has none of this by itself: no deadline before the first request's headers
(its keep-alive timer starts only after a response), and `limit_concurrency` counts idle
connections too and answers 503 to anyone once a flood holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.audit import AuditUnavailable
from gateway.audit.sink import AuditSink
from gateway.log import log
from gateway.server.limits import FrontLimits

ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]

SILENT_GRACE_S = 1.0
"""A connection that has sent nothing for this long may give its place to a new one."""
WRITE_PROGRESS_BYTES = 64 << 10
"""What a client must take of an answer waiting for it, per write deadline, to keep its connection."""
_TCP_INFO_BYTES_ACKED = 120  # offset of tcpi_bytes_acked (u64) in Linux's struct tcp_info (since 4.1)
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


# --- logging that cannot flood -------------------------------------------------------------------
class ThrottledLog:
    """Logs one line per key per `interval_s`; the next line says how many were left out."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        """None: stay quiet. Else log now; the int is how many were suppressed since the last line."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._skipped[key] = self._skipped.get(key, 0) + 1
                return None
            if len(self._last) > 1000:  # keys come from a fixed set of messages; never grow unbounded
                self._last.clear()
            self._last[key] = now
            return self._skipped.pop(key, 0)

    def warning(self, key: str, event: str, **fields: Any) -> None:
        skipped = self.allow(key)
        if skipped is not None:
            log.warning(event, **fields, **({"suppressed": skipped} if skipped else {}))


class ThrottledFilter(logging.Filter):
    """A logging filter (for uvicorn's logger) passing each message template once per interval,
    without its traceback when it repeats."""

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.throttle = ThrottledLog(interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        skipped = self.throttle.allow(f"{record.name}:{record.msg}")
        if skipped is None:
            return False
        if skipped:
            record.msg = f"{record.msg} ({skipped} more like this left out)"
        return True


def quiet_resource_errors(loop: asyncio.AbstractEventLoop, throttle: ThrottledLog) -> None:
    """Out of descriptors (or memory for sockets), asyncio logs a traceback on every failed
    accept; log one line per interval instead. Everything else goes to the usual handler."""
    previous = loop.get_exception_handler()

    def handler(the_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS:
            throttle.warning(
                f"resource:{exc.errno}", "http_out_of_resources", error=errno.errorcode.get(exc.errno or 0, "?"),
                message=str(context.get("message", "")),
            )  # fmt: skip
            return
        if previous is not None:
            previous(the_loop, context)
        else:
            the_loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


# --- connections ---------------------------------------------------------------------------------
class ConnectionGuard:
    """The open connections of one server, by peer, oldest first. Used on the event loop only."""

    def __init__(self, limits: FrontLimits, throttle: ThrottledLog) -> None:
        self.limits = limits
        self.throttle = throttle
        self.open: dict[GuardedH11, None] = {}  # insertion order: oldest first
        self.by_peer: dict[str, dict[GuardedH11, None]] = {}
        self.counts = {"refused": 0, "evicted": 0, "header_timeouts": 0, "body_timeouts": 0, "write_timeouts": 0}

    def admit(self, conn: GuardedH11) -> bool:
        """Make room for `conn` (evicting a connection not in a request if a cap is reached) and
        register it; False if there is no room."""
        mine = self.by_peer.get(conn.peer, {})
        if len(mine) >= self.limits.max_connections_per_peer and not self._evict_from(mine):
            return self._refuse(conn, "per_peer")
        if len(self.open) >= self.limits.max_connections and not self._evict_from(self.open):
            return self._refuse(conn, "total")
        self.open[conn] = None
        self.by_peer.setdefault(conn.peer, {})[conn] = None
        return True

    def forget(self, conn: GuardedH11) -> None:
        self.open.pop(conn, None)
        mine = self.by_peer.get(conn.peer)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_peer[conn.peer]

    def _evict_from(self, conns: dict[GuardedH11, None]) -> bool:
        """Close the oldest connection that is stalled, silent or unread, else the oldest idle one,
        else the oldest that has sent nothing yet however young (a flood of fresh connections must not
        fill the caps: a real client's request follows its connect within milliseconds)."""
        now = time.monotonic()
        victim = None
        best = 3
        for candidate in conns:
            rank = candidate.eviction_rank(now)
            if rank == 0:
                victim = candidate
                break
            if rank is not None and rank < best:
                victim, best = candidate, rank
        if victim is None:
            return False
        self.counts["evicted"] += 1
        self.forget(victim)
        victim.drop()
        return True

    def _refuse(self, conn: GuardedH11, cap: str) -> bool:
        self.counts["refused"] += 1
        self.throttle.warning(
            f"cap:{cap}", "http_connection_refused", cap=cap, peer=conn.peer, open=len(self.open),
            limit=self.limits.max_connections if cap == "total" else self.limits.max_connections_per_peer,
            **self.counts,
        )  # fmt: skip
        return False


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with deadlines for headers, body and the client taking its answer,
    admitted by a ConnectionGuard.
    `bind` makes the subclass uvicorn instantiates for one server."""

    guard: ConnectionGuard

    @classmethod
    def bind(cls, guard: ConnectionGuard) -> type[GuardedH11]:
        return type("GuardedH11ForServer", (cls,), {"guard": guard})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer = "?"
        self.opened = 0.0
        self.heard = False  # some bytes of the current request arrived
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: str | None = None  # "headers" or "body"
        self._dropped = False
        self._write_check: asyncio.TimerHandle | None = None  # set while an answer waits for the client
        self._taken = 0  # bytes the client had taken when `_unread_since` began
        self._unread_since = 0.0  # since when the client has taken less than WRITE_PROGRESS_BYTES

    # -- life of the connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else "?"
        self.opened = time.monotonic()
        if not self.guard.admit(self):
            self._dropped = True
            self.connections.discard(self)
            transport.abort()
            return
        self._arm("headers", self.guard.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unwatch_writes()
        if not self._dropped:
            self.guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._dropped:
            return
        self.heard = True
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.heard = bool(self.conn.trailing_data[0])  # the next request, if it has begun
        self._follow()
        if self._unsent():  # the answer's tail has yet to go: a close waits for it, and so would we
            self._watch_writes()

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark: uvicorn's send now waits for the
        client, with no deadline of its own."""
        super().pause_writing()
        self._watch_writes()

    # -- what the guard asks
    def eviction_rank(self, now: float) -> int | None:
        """0: stalled in its headers, silent for a second since it connected, or with an answer
        the client has not taken for a second; 1: idle between requests (a client's kept-alive
        connection); 2: connected moments ago and silent so far; None: in a request."""
        if self._dropped:
            return None
        if self._write_check is not None and not self._taking(now) and now - self._unread_since >= SILENT_GRACE_S:
            return 0
        if self.conn.their_state is not h11.IDLE:
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            return None
        if self.heard or (self.cycle is None and now - self.opened >= SILENT_GRACE_S):
            return 0
        return 1 if self.cycle is not None else 2

    def drop(self) -> None:
        self._dropped = True
        self._disarm()
        self._unwatch_writes()
        self.connections.discard(self)
        if self.transport is not None:
            # a reset, even if closing: a close waits for unsent data, and even after an abort the
            # kernel keeps what it holds (and the FIN behind it) for a window that may never open
            sock = self.transport.get_extra_info("socket")
            with contextlib.suppress(AttributeError, OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()

    # -- answers the client does not take
    def _unsent(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def _taken_by_client(self) -> int:
        """Bytes of this connection the client's kernel has acknowledged (Linux's TCP_INFO). Its
        receive buffer fills in moments, so beyond that this grows only as the client reads. 0 if
        it cannot be known: the client then never counts as taking its answer (fail closed)."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES_ACKED + 8)
        except (AttributeError, OSError):
            return 0
        if len(info) < _TCP_INFO_BYTES_ACKED + 8:
            return 0
        acked: int = struct.unpack_from("=Q", info, _TCP_INFO_BYTES_ACKED)[0]
        return acked

    def _taking(self, now: float) -> bool:
        """Whether the client took WRITE_PROGRESS_BYTES since `_unread_since`; if so that starts again now."""
        taken = self._taken_by_client()
        if taken - self._taken < WRITE_PROGRESS_BYTES:
            return False
        self._taken, self._unread_since = taken, now
        return True

    def _watch_writes(self) -> None:
        if self._write_check is None and not self._dropped:
            self._taken, self._unread_since = self._taken_by_client(), time.monotonic()
            self._write_check = self.loop.call_later(self.guard.limits.write_timeout_s, self._check_writes)

    def _unwatch_writes(self) -> None:
        if self._write_check is not None:
            self._write_check.cancel()
            self._write_check = None

    def _check_writes(self) -> None:
        """Drop the connection if a whole write deadline passed with its answer waiting and the
        client taking less than WRITE_PROGRESS_BYTES of it; else look again."""
        self._write_check = None
        if self._dropped or self.transport is None or not self._unsent():
            return  # gone, or all handed to the kernel: nothing waits in the server
        now = time.monotonic()
        self._taking(now)
        left = self.guard.limits.write_timeout_s - (now - self._unread_since)
        if left > 0:
            self._write_check = self.loop.call_later(left, self._check_writes)
            return
        self.guard.counts["write_timeouts"] += 1
        self.guard.throttle.warning("timeout:write", "http_answer_not_read", peer=self.peer, unsent=self._unsent(),
                                    **self.guard.counts)  # fmt: skip
        self.guard.forget(self)
        self.drop()

    # -- deadlines
    def _follow(self) -> None:
        """Arm or clear the deadline for where the current request stands."""
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.heard:
                if self._deadline_for != "headers":
                    self._arm("headers", self.guard.limits.header_timeout_s)
            elif self.cycle is not None:
                self._disarm()  # between requests: uvicorn's keep-alive timer closes it
        elif state is h11.SEND_BODY:
            if self._deadline_for != "body":
                self._arm("body", self.guard.limits.body_timeout_s)
        else:
            self._disarm()

    def _arm(self, what: str, seconds: float) -> None:
        self._disarm()
        self._deadline_for = what
        self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._deadline_for = None, None

    def _expired(self, what: str) -> None:
        self._deadline, self._deadline_for = None, None
        still = self.conn.their_state is (h11.IDLE if what == "headers" else h11.SEND_BODY)
        if not still or self.transport is None or self.transport.is_closing():
            return
        key = "header_timeouts" if what == "headers" else "body_timeouts"
        self.guard.counts[key] += 1
        self.guard.throttle.warning(f"timeout:{what}", "http_request_too_slow", part=what, peer=self.peer,
                                    **self.guard.counts)  # fmt: skip
        self.transport.close()


# --- sizes ---------------------------------------------------------------------------------------
class BodyCap:
    """413 for a request whose declared body is over the limit, before anything reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            declared = _header(scope, b"content-length")
            if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
                size = int(declared)
                text = (
                    f"request body too large: {size} bytes, over this gateway's limit of {self.max_bytes} "
                    f"bytes ({self.max_bytes / (1 << 20):.1f} MiB; gateway serve --max-body). A files write "
                    "of up to 10 MiB fits in the default limit.\n"
                )
                await send({"type": "http.response.start", "status": 413, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]})  # fmt: skip
                await send({"type": "http.response.body", "body": text.encode()})
                return
        await self.app(scope, receive, send)


def _header(scope: MutableMapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


# --- refusals ------------------------------------------------------------------------------------
@dataclass
class _Window:
    opened: float
    since: str
    count: int = 0
    last: str = ""
    paths: dict[str, int] = field(default_factory=dict)
    peers: set[str] = field(default_factory=set)


class RefusalLog:
    """Audits refused requests without letting them fill the log or queue fsyncs.

    A kind is (peer address, status, whether a token was presented). Its first refusal is
    recorded in full; later ones within `window_s` are counted and recorded together when the
    window ends (`count`, `since`, `until`, `paths`). More than `max_kinds` kinds at once (many
    addresses) share one overflow kind, peer `*`. One thread writes; `close` writes what is
    left (at shutdown)."""

    def __init__(self, audit: AuditSink, window_s: float = 10.0, max_kinds: int = 16) -> None:
        self.audit = audit
        self.window_s = window_s
        self.max_kinds = max_kinds
        self.throttle = ThrottledLog()
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._queue: list[dict[str, Any]] = []
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._writer, name="auth-refusals", daemon=True)
        self._thread.start()

    def refused(self, status: int, path: str, peer: tuple[str, int] | None, presented: str) -> None:
        host, port = (peer[0], peer[1]) if peer else ("?", "?")
        now, wall = time.monotonic(), _now()
        with self._lock:
            key = (host, status, presented)
            if key not in self._windows and len(self._windows) >= self.max_kinds:
                key = ("*", status, presented)
            window = self._windows.get(key)
            if window is None:
                self._windows[key] = _Window(now, wall, peers={host})
                self._queue.append({"status": status, "path": path, "peer": f"{host}:{port}", "presented": presented})
            else:
                window.count += 1
                window.last = wall
                if len(window.paths) < 8 or path in window.paths:
                    window.paths[path] = window.paths.get(path, 0) + 1
                if len(window.peers) < 1000:
                    window.peers.add(host)
                return
        self._wake.set()

    def close(self) -> None:
        """Stop the writer and record every count still open."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)
        self._write(self._take(everything=True))

    def _take(self, everything: bool = False) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            out, self._queue = self._queue, []
            for key, w in list(self._windows.items()):
                if everything or now - w.opened >= self.window_s:
                    del self._windows[key]
                    if w.count:
                        host, status, presented = key
                        data: dict[str, Any] = {"status": status, "peer": host, "presented": presented,
                                                "count": w.count, "since": w.since, "until": w.last,
                                                "paths": w.paths}  # fmt: skip
                        if host == "*":
                            data["peers"] = len(w.peers)
                        out.append(data)
        return out

    def _writer(self) -> None:
        while not self._stopping:
            self._wake.wait(timeout=max(0.05, self.window_s / 4))
            self._wake.clear()
            if not self._stopping:
                self._write(self._take())

    def _write(self, items: list[dict[str, Any]]) -> None:
        for data in items:
            try:
                self.audit.append("auth_refused", data=data)
            except (AuditUnavailable, OSError) as exc:  # nothing runs for a refused request: log it
                self.throttle.warning("audit", "auth_refused_unrecorded", error=str(exc))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


CLOSE_AFTER = frozenset({400, 401, 403, 404, 405, 406, 413, 415, 421})
"""Refusals after which the server closes the connection (`Connection: close`)."""


def refusal_recorder(app: ASGIApp, refusals: RefusalLog) -> ASGIApp:
    """`app`, with its 401 and 403 answers reported to `refusals`."""

    async def recorded(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message.get("type") == "http.response.start" and message.get("status") in (401, 403):
                auth = (_header(scope, b"authorization") or "").lower()
                presented = "unknown bearer" if auth.startswith("bearer ") else "none"
                refusals.refused(int(message["status"]), str(scope.get("path")), scope.get("client"), presented)
            if message.get("type") == "http.response.start" and message.get("status") in CLOSE_AFTER:
                # a refused request ends its connection: a client that announced a large body and
                # sends it a byte at a time no longer holds a slot until the body deadline
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await app(scope, receive, watch)

    return recorded


# --- a client that leaves ------------------------------------------------------------------------
PEEK_BYTES = 1 << 20
"""Bodies up to this size are kept while their call runs, to name the call if the client leaves."""


def cancel_on_leave(app: ASGIApp) -> ASGIApp:
    """`app`, telling the SDK to cancel a legacy-era tool call whose client disconnected.

    On the 2026-07-28 wire the SDK cancels a call when its client disconnects. On the legacy
    (`initialize`) wire it does not: the call would run to its timeout with nobody to answer. Its
    answer is an SSE stream, whose reader does notice the disconnect (`http.disconnect`); then
    this sends the session the `notifications/cancelled` a polite client would have sent, with
    the same session and token, and the SDK cancels the call, which kills its command
    (CALL_CANCELLED). Calls already answered (`pending` included) are left alone."""
    spawned: set[asyncio.Task[None]] = set()

    async def watched(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or _header(scope, b"mcp-session-id") is None:
            await app(scope, receive, send)
            return
        body: list[bytes] = []
        kept = 0
        answered = False

        async def seen(message: MutableMapping[str, Any]) -> None:
            nonlocal answered
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        async def heard() -> MutableMapping[str, Any]:
            nonlocal kept
            message: MutableMapping[str, Any] = await receive()
            if message.get("type") == "http.request" and kept <= PEEK_BYTES:
                chunk = bytes(message.get("body", b""))
                kept += len(chunk)
                body.append(chunk)
            elif message.get("type") == "http.disconnect" and not answered and kept <= PEEK_BYTES:
                call_id = _tool_call_id(b"".join(body))
                if call_id is not None:
                    task = asyncio.get_running_loop().create_task(_cancel(app, scope, call_id))
                    spawned.add(task)
                    task.add_done_callback(spawned.discard)
            return message

        await app(scope, heard, seen)

    return watched


def _tool_call_id(body: bytes) -> str | int | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("method") == "tools/call":
        rid = message.get("id")
        if isinstance(rid, str | int) and not isinstance(rid, bool):
            return rid
    return None


async def _cancel(app: ASGIApp, scope: MutableMapping[str, Any], call_id: str | int) -> None:
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": call_id, "reason": "the HTTP client disconnected"}}  # fmt: skip
    raw = json.dumps(note).encode()
    keep = (b"authorization", b"mcp-session-id", b"mcp-protocol-version", b"host", b"origin")
    headers = [(k, v) for k, v in scope.get("headers") or () if k.lower() in keep]
    headers += [(b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
                (b"content-length", str(len(raw)).encode())]  # fmt: skip
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(60)  # the SDK answers a notification without listening for more
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message.get("type") == "http.response.start" and message.get("status") != 202:
            log.warning("http_cancel_not_accepted", status=message.get("status"), request_id=call_id)

    try:
        await app({**scope, "headers": headers}, receive, send)
    except Exception as exc:  # the call then runs to its timeout, as without this
        log.warning("http_cancel_failed", request_id=call_id, error=f"{type(exc).__name__}: {exc}")
