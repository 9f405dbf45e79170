"""Browser sessions of the console.

A supervisor signs in with their secret (the login form); the server answers with a session
cookie that scripts cannot read (HttpOnly), that no other site's request carries
(SameSite=Strict), scoped to `/console`, and `Secure` when the server speaks TLS. The session
holds a key (`csrf`) that is not a cookie: the sign-in's redirect hands it to the page in its
fragment, the page keeps it in its tab's storage and sends it in `X-CSRF-Token` with every
request. A browser sends the cookie to every port of the host, so the cookie alone opens
nothing (app.py checks both). Sessions live in this server's memory only: a restart signs everybody out.

A session ends at logout, after `idle_s` without a request, `max_age_s` after sign-in, and as
soon as its supervisor's secret is revoked (checked on every request by the caller). At most
`max_sessions` exist; a new sign-in beyond that ends the least recently used one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

COOKIE = "agw_console"
IDLE_S = 30 * 60.0
MAX_AGE_S = 8 * 3600.0
MAX_SESSIONS = 64


@dataclass
class Session:
    supervisor: str
    """The supervisor's name (the `--supervisor NAME` of their secret): every answer is audited with it."""
    token_id: str
    """The id of the secret they signed in with; revoking it ends the session."""
    csrf: str
    created: float
    last: float
    secret: str = ""
    """The secret itself, kept (in memory) only for an inbox that checks it with each answer
    (the fleet's: the store checks it, not this server); empty otherwise."""


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    def __init__(self, idle_s: float = IDLE_S, max_age_s: float = MAX_AGE_S, max_sessions: int = MAX_SESSIONS) -> None:
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._by_key: dict[str, Session] = {}  # insertion order refreshed on use: least recent first

    def open(self, supervisor: str, token_id: str, secret: str = "") -> tuple[str, Session]:
        """A new session; returns (the cookie's value, the session). Only its digest is kept."""
        session_id = secrets.token_urlsafe(32)
        now = time.monotonic()
        session = Session(supervisor, token_id, secrets.token_urlsafe(32), now, now, secret)
        with self._lock:
            self._expire(now)
            while len(self._by_key) >= self.max_sessions:
                del self._by_key[next(iter(self._by_key))]
            self._by_key[_key(session_id)] = session
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        """The live session with this cookie value (its idle time starts again), or None."""
        now = time.monotonic()
        key = _key(session_id)
        with self._lock:
            self._expire(now)
            session = self._by_key.pop(key, None)
            if session is None:
                return None
            session.last = now
            self._by_key[key] = session
            return session

    def close(self, session_id: str) -> None:
        with self._lock:
            self._by_key.pop(_key(session_id), None)

    def end_for(self, token_id: str) -> None:
        """End every session signed in with this secret (it was revoked)."""
        with self._lock:
            for key in [k for k, s in self._by_key.items() if s.token_id == token_id]:
                del self._by_key[key]

    def _expire(self, now: float) -> None:
        gone = [k for k, s in self._by_key.items() if now - s.last > self.idle_s or now - s.created > self.max_age_s]
        for key in gone:
            del self._by_key[key]

    @staticmethod
    def csrf_ok(session: Session, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(session.csrf.encode(), presented.encode())
