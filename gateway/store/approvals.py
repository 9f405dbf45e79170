"""Approvals across the fleet: a request is a row of `agw.approval` (and a NOTIFY); a
supervisor answers from any host, as their own database identity, through `agw.answer()`
(migrations/0003_approvals.sql); the waiting gateway is woken by LISTEN.

NOTIFY does not replay: a notification sent while the listener was disconnected is lost. So the
row is the truth and a notification only a hint: the listener wakes every waiting call after it
reconnects, and each waiting call also reads its row every `POLL_S` seconds. With the store
unreachable, the call waits until its timeout and is denied (the row expires with it: an answer
after `expires_at` is refused).

Exactly one answer wins: `agw.answer()` updates only a pending, unexpired row whose digest is
the one the supervisor was shown. A gateway that gives up (timeout, its caller went away) settles
its request as expired or withdrawn through `agw.settle()`, in the same race: whichever commits
first stands, and an answer that won is honoured.

A gateway's web console answers on a supervisor's behalf with their console secret
(`answer_with_secret`, `agw.answer_with_secret()` in migrations/0006): the database checks the
secret, and records its supervisor as who answered.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import psycopg

from gateway.approval import Approval, ApprovalRequest
from gateway.cancellation import cancelled
from gateway.store import db

POLL_S = 2.0
"""How often a waiting call reads its row without being woken (NOTIFY is only a hint)."""
ANSWERED = "agw_approval_answered"
REQUESTED = "agw_approval_requested"
_COLUMNS = ("call_id, host, principal, request, digest, created_at, expires_at, state, scope, answered_by, "
            "answered_from, answered_at, reason")  # fmt: skip


class ApprovalError(db.StoreError):
    """An answer the store refused (the message says why: answered, expired, digest, unknown)."""


class _Listener:
    """One LISTEN connection per process: wakes the call a notification names; wakes every
    waiting call after a reconnect (what was sent meanwhile is lost)."""

    def __init__(self, store: db.Store) -> None:
        self.store = store
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agw-approvals-listen", daemon=True)
        self._thread.start()

    def watch(self, call_id: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._events[call_id] = event
        return event

    def forget(self, call_id: str) -> None:
        with self._lock:
            self._events.pop(call_id, None)

    def _wake_all(self) -> None:
        with self._lock:
            for event in self._events.values():
                event.set()

    def _loop(self) -> None:
        while True:
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self.store.connect()
                conn.execute(f"LISTEN {ANSWERED}")
                self.connected.set()
                self._wake_all()  # re-read every waiting row: notifications sent while away are lost
                for note in conn.notifies():
                    with self._lock:
                        event = self._events.get(note.payload)
                    if event is not None:
                        event.set()
            except (db.StoreError, psycopg.Error):
                pass
            finally:
                self.connected.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            time.sleep(1.0)


class StoreApprover:
    """An Approver whose requests any supervisor of the fleet answers (`gateway approvals
    --store`). `stream` and `host` name the asking gateway (its ledger's stream)."""

    def __init__(
        self, store: db.Store, stream: str, host: str, on_wait: Callable[[ApprovalRequest, float], None] | None = None
    ) -> None:
        self.store = store
        self.stream = stream
        self.host = host
        self.on_wait = on_wait
        self.listener = _Listener(store)

    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
        deadline = time.monotonic() + timeout
        event = self.listener.watch(request.call_id)
        try:
            try:
                self._insert(request, timeout)
            except (db.StoreError, psycopg.Error):
                return None  # not asked: nobody can answer it, so it is denied
            if self.on_wait is not None:
                with contextlib.suppress(Exception):
                    self.on_wait(request, timeout)
            while not cancelled():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                event.wait(min(POLL_S, left))
                event.clear()
                row = self._read(request.call_id)
                if row is not None and row["state"] in ("approved", "denied"):
                    return _approval(row)
            return self._settle(request.call_id, "withdrawn" if cancelled() else "expired")
        finally:
            self.listener.forget(request.call_id)

    def _insert(self, request: ApprovalRequest, timeout: float) -> None:
        body = json.dumps(asdict(request), ensure_ascii=False, default=str)
        with self.store.connection() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO agw.approval (call_id, stream, host, principal, request, digest, expires_at) "
                "VALUES (%s, %s, %s, %s, %s::jsonb, %s, clock_timestamp() + make_interval(secs => %s))",
                (request.call_id, self.stream, self.host, request.principal, body, request.digest, timeout),
            )
            conn.execute("SELECT pg_notify(%s, %s)", (REQUESTED, request.call_id))

    def _read(self, call_id: str) -> dict[str, Any] | None:
        with contextlib.suppress(db.StoreError, psycopg.Error), self.store.connection() as conn:
            return _row(conn.execute(f"SELECT {_COLUMNS} FROM agw.approval WHERE call_id = %s", (call_id,)))
        return None

    def _settle(self, call_id: str, state: str) -> Approval | None:
        """Give up on the request, unless an answer committed first (then it stands)."""
        with contextlib.suppress(db.StoreError, psycopg.Error), self.store.connection() as conn:
            row = _row(conn.execute(f"SELECT {_COLUMNS} FROM agw.settle(%s, %s)", (call_id, state)))
            if row is not None and row["state"] in ("approved", "denied"):
                return _approval(row)
        return None


def _row(cur: psycopg.Cursor[Any]) -> dict[str, Any] | None:
    found = cur.fetchone()
    if found is None or found[0] is None:
        return None
    names = [c.strip() for c in _COLUMNS.split(",")]
    return dict(zip(names, found, strict=True))


def _approval(row: dict[str, Any]) -> Approval:
    approved = row["state"] == "approved"
    how = "store-session" if approved and row["scope"] == "session" else "store"
    where = f" (from {row['answered_from']})" if row.get("answered_from") else ""
    note = f"{row.get('reason') or ''}{where}".strip()
    return Approval(approved, str(row["answered_by"]), str(row["request"]["digest"]), how, note)


# --- the supervisor's side ----------------------------------------------------------------------
def pending(store: db.Store) -> list[dict[str, Any]]:
    """Requests of every gateway still waiting, oldest first, as `approvals list|show` print
    them (the request's fields, `expires` as a Unix time, `host`)."""
    with store.connection() as conn:
        cur = conn.execute(
            f"SELECT {_COLUMNS} FROM agw.approval WHERE state = 'pending' AND expires_at > clock_timestamp() "
            "ORDER BY created_at"
        )
        rows = [dict(zip([c.strip() for c in _COLUMNS.split(",")], r, strict=True)) for r in cur.fetchall()]
    return [{**r["request"], "host": r["host"], "expires": r["expires_at"].timestamp(),
             "created": r["created_at"].timestamp()} for r in rows]  # fmt: skip


def answer(
    store: db.Store,
    call_id: str,
    approved: bool,
    reason: str = "",
    scope: str = "once",
    where: str = "",
    digest: str | None = None,
) -> dict[str, Any]:
    """Answer a pending request as the database identity `store` connects as; `digest`: the one
    the supervisor was shown (default: the request's own). Raises ApprovalError with the
    store's reason when the answer does not take."""
    with store.connection() as conn:
        row = conn.execute("SELECT digest FROM agw.approval WHERE call_id = %s", (call_id,)).fetchone()
        if row is None:
            raise ApprovalError(f"no pending request {call_id}")
        row = (digest or row[0],)
        try:
            done = _row(
                conn.execute(
                    f"SELECT {_COLUMNS} FROM agw.answer(%s, %s, %s, %s, %s, %s)",
                    (call_id, approved, row[0], reason, scope, where),
                )
            )
        except psycopg.errors.RaiseException as exc:
            raise ApprovalError(str(exc.diag.message_primary or exc)) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ApprovalError(
                f"{store.name}: this identity may not answer approvals ({exc.diag.message_primary})"
            ) from None
    assert done is not None
    return {"call_id": call_id, "approved": done["state"] == "approved", "by": done["answered_by"],
            "reason": done["reason"] or "", "from": done["answered_from"]}  # fmt: skip


def answer_with_secret(
    store: db.Store,
    secret: str,
    host: str,
    call_id: str,
    approved: bool,
    reason: str = "",
    scope: str = "once",
    where: str = "",
    digest: str | None = None,
    record: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Answer a pending request on behalf of the supervisor whose console `secret` this is
    (migrations/0007: the database checks the secret, not this process; `host`: where the
    secret is used, for a secret limited to hosts). `store` may connect as a gateway's login.

    `record(row)` is called with the answer that won, inside its transaction and before it
    commits (the console audits it there): if it raises, the answer is rolled back and nobody
    sees it. Raises ApprovalError with the store's reason when the answer does not take, and
    StoreUnavailable when the store fails (the answer is then not known to stand)."""
    with store.connection() as conn:
        if digest is None:
            row = conn.execute("SELECT digest FROM agw.approval WHERE call_id = %s", (call_id,)).fetchone()
            if row is None:
                raise ApprovalError(f"no pending request {call_id}")
            digest = str(row[0])
        try:
            with conn.transaction():
                done = _row(
                    conn.execute(
                        f"SELECT {_COLUMNS} FROM agw.answer_with_secret(%s, %s, %s, %s, %s, %s, %s, %s)",
                        (secret, host, call_id, approved, digest, reason, scope, where),
                    )
                )
                assert done is not None
                if record is not None:
                    record(done)
        except psycopg.errors.RaiseException as exc:
            raise ApprovalError(str(exc.diag.message_primary or exc)) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ApprovalError(
                f"{store.name}: this identity may not pass on a supervisor's answer ({exc.diag.message_primary})"
            ) from None
    return {"call_id": call_id, "approved": done["state"] == "approved", "by": done["answered_by"],
            "reason": done["reason"] or "", "from": done["answered_from"], "digest": done["digest"]}  # fmt: skip


def states(store: db.Store, call_ids: list[str]) -> dict[str, str]:
    """The state of each of these requests (pending, approved, denied, expired, withdrawn)."""
    with store.connection() as conn:
        rows = conn.execute("SELECT call_id, state FROM agw.approval WHERE call_id = ANY(%s)", (call_ids,)).fetchall()
    return {str(c): str(s) for c, s in rows}
