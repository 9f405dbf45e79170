"""Bearer tokens kept in the store, so that a token made or revoked on one host holds on every
gateway of the fleet within seconds (`gateway token create|list|revoke --store`).

`StoreTokens` is the server's `TokenStore` (gateway/tokens.py) with its entries read from
`agw.token` instead of the file: the valid tokens of this host (not revoked; no host list, or
one naming this host), re-read when older than `REFRESH_S`. With the store unreachable, the
entries last read are honoured for `MAX_AGE_S`, then none is (fail closed) until it answers.
"""

from __future__ import annotations

import secrets
import socket
import time
from datetime import UTC
from pathlib import Path

import psycopg

from gateway.store import db
from gateway.tokens import LISTS, PREFIXES, TokenEntry, TokenError, TokenStore, digest

REFRESH_S = 1.0
MAX_AGE_S = 60.0
MISS_REFRESH_S = 0.05
"""A token not among the entries read is looked for again in the store once the last read is
this old: one made a moment ago on another host is honoured at once, and a flood of wrong
tokens reads the store at most 20 times a second."""


class StoreTokens(TokenStore):
    """The fleet's tokens for one gateway host."""

    def __init__(
        self, store: db.Store, host: str | None = None, refresh_s: float = REFRESH_S, max_age_s: float = MAX_AGE_S,
        miss_refresh_s: float = MISS_REFRESH_S,
    ) -> None:  # fmt: skip
        self.store = store
        self.host = host or socket.gethostname()
        self.refresh_s = refresh_s
        self.max_age_s = max_age_s
        self.miss_refresh_s = miss_refresh_s
        self._read_at: float | None = None
        self._ok_at: float | None = None
        super().__init__(Path(f"{store.name}#agw.token"))

    def _find(self, token: str, kind: str) -> TokenEntry | None:
        found = super()._find(token, kind)
        if found is None:  # made since the last read? (a token is often used the moment it is made)
            with self._lock:
                # only after a read that reached the store: while it is away a flood of wrong tokens
                # must not hold the lock through a connection timeout for every other lookup
                answered = self._read_at is not None and self._ok_at == self._read_at
                stale = answered and time.monotonic() - self._read_at >= self.miss_refresh_s  # type: ignore[operator]
                if stale:
                    self._read_at = None
            if stale:
                found = super()._find(token, kind)
        return found

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._read_at is not None and now - self._read_at < self.refresh_s:
            return
        self._read_at = now
        try:
            with self.store.connection() as conn:
                rows = conn.execute(
                    "SELECT id, principal, sha256, created_at, label, kind FROM agw.token "
                    "WHERE revoked_at IS NULL AND (hosts IS NULL OR %s = ANY(hosts))",
                    (self.host,),
                ).fetchall()
        except (db.StoreError, psycopg.Error) as exc:
            if self._ok_at is None or now - self._ok_at > self.max_age_s:
                self._entries = []
                self.error = f"no token is honoured: {exc}"
            return
        self._entries = [
            TokenEntry(str(i), str(p), str(s), c.astimezone(UTC).isoformat(timespec="seconds"), str(lb), str(k))
            for i, p, s, c, lb, k in rows
        ]
        self.error = None
        self._ok_at = now


def create(
    store: db.Store, principal: str, label: str = "", kind: str = "agent", hosts: list[str] | None = None
) -> tuple[str, TokenEntry]:
    """Make a token in the store (shown once: only its digest is kept). Raises TokenError."""
    if kind not in LISTS:
        raise TokenError(f"kind {kind!r}: expected one of {sorted(LISTS)}")
    if not principal or any(not ch.isprintable() for ch in principal) or len(principal) > 64:
        raise TokenError(f"name {principal!r}: expected 1 to 64 printable characters")
    token = PREFIXES[kind][0] + secrets.token_urlsafe(32)
    token_id = PREFIXES[kind][1] + secrets.token_hex(4)
    with store.connection() as conn:
        row = conn.execute(
            "INSERT INTO agw.token (id, kind, principal, sha256, label, hosts) VALUES (%s, %s, %s, %s, %s, %s) "
            "RETURNING created_at",
            (token_id, kind, principal, digest(token), label, hosts or None),
        ).fetchone()
    assert row is not None
    return token, TokenEntry(
        token_id, principal, digest(token), row[0].astimezone(UTC).isoformat(timespec="seconds"), label, kind
    )


def listing(store: db.Store) -> list[tuple[TokenEntry, list[str] | None, str | None]]:
    """Every token of the fleet: (entry, hosts it is limited to, when it was revoked)."""
    with store.connection() as conn:
        rows = conn.execute(
            "SELECT id, principal, sha256, created_at, label, kind, hosts, revoked_at FROM agw.token "
            "ORDER BY created_at"
        ).fetchall()
    return [
        (TokenEntry(str(i), str(p), str(s), c.astimezone(UTC).isoformat(timespec="seconds"), str(lb), str(k)), h,
         r.astimezone(UTC).isoformat(timespec="seconds") if r else None)
        for i, p, s, c, lb, k, h, r in rows
    ]  # fmt: skip


def revoke(store: db.Store, token_id: str) -> TokenEntry:
    """Revoke a token fleet-wide (as the login `store` connects as). Raises TokenError."""
    with store.connection() as conn:
        row = conn.execute(
            "UPDATE agw.token SET revoked_at = clock_timestamp(), revoked_by = session_user "
            "WHERE id = %s AND revoked_at IS NULL RETURNING id, principal, sha256, created_at, label, kind",
            (token_id,),
        ).fetchone()
    if row is None:
        raise TokenError(f"{store.name}: no token {token_id!r} that is not revoked (see: gateway token list --store)")
    i, p, s, c, lb, k = row
    return TokenEntry(str(i), str(p), str(s), c.astimezone(UTC).isoformat(timespec="seconds"), str(lb), str(k))
