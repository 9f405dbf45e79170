"""The store's connection and schema: a pool of PostgreSQL connections (psycopg 3), errors that
name the store (never its password), and the schema's versions.

The schema lives in `migrations/NNNN_name.sql`, applied in order, each once, in one transaction
under an advisory lock (two gateways migrating at once wait for each other), and remembered in
`agw.migration` with its SHA-256: a migration edited after it was applied is reported, never
applied again. A gateway refuses to start on a schema that is not the one it was built for
(`require_current`), with the command that fixes it.

    StoreError            a store that cannot be used as given (its address, its schema)
    └── StoreUnavailable  the store cannot be reached or stopped answering: the caller denies
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg
from psycopg import conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

ENV = "AGW_STORE"
"""The environment variable `--store` defaults to."""
SCHEMA = "agw"
MIGRATE_LOCK = 0x61677701
"""The advisory lock `migrate` holds (transaction-scoped): one migration at a time."""
TIMEOUT_S = 5.0
"""How long a caller waits for a connection before the store counts as unreachable."""
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class StoreError(Exception):
    """The store cannot be used as given: its address, or its schema's version."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, or a statement failed on the way: the caller denies."""


def describe(dsn: str) -> str:
    """The store as the operator named it, without a password: `postgresql://USER@HOST:PORT/DB`
    (HOST may be a socket directory). Raises StoreError for what is not a connection string."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise StoreError(f"--store: not a PostgreSQL connection string ({exc})") from None
    user = params.get("user")
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port")
    where = f"{host}:{port}" if port else str(host)
    return f"postgresql://{f'{user}@' if user else ''}{where}/{params.get('dbname') or ''}"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def migrations() -> list[Migration]:
    """The schema's migrations shipped with this gateway, in order."""
    found: list[Migration] = []
    for entry in resources.files("gateway.store").joinpath("migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise StoreError(f"the store's migrations are not numbered 1..n: {[m.version for m in found]}")
    return found


@dataclass(frozen=True)
class Version:
    """One migration as the store has it (`gateway store status`)."""

    version: int
    name: str
    state: str
    """applied | pending | changed (applied, but the file differs now) | unknown (newer than this gateway)"""
    applied_at: datetime | None = None


class Store:
    """A pool of connections to one PostgreSQL database. Connections are autocommit; a caller
    that needs a transaction opens one (`with conn.transaction()`). A connection the server
    dropped (a restart) is found out when taken from the pool and replaced, so callers resume
    once the server is back without restarting anything."""

    def __init__(self, dsn: str, *, max_size: int = 8, timeout: float = TIMEOUT_S) -> None:
        self.name = describe(dsn)
        self.dsn = dsn
        self.timeout = timeout
        self.application_name = f"agent-gateway {os.getpid()}"
        """Which gateway a backend serves (pg_stat_activity)."""
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(2, int(timeout)),
            "application_name": self.application_name,
        }
        self._pool = ConnectionPool(
            dsn, min_size=1, max_size=max_size, open=False, timeout=timeout, kwargs=self._kwargs,
            check=ConnectionPool.check_connection, name="agw-store", reconnect_timeout=0,
        )  # fmt: skip
        self._pool.open(wait=False)

    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        """`exc` (a psycopg or pool error) as the error callers deny with, naming the store."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreUnavailable(f"the store {self.name} is unavailable: {text}")

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection from the pool. Raises StoreUnavailable when none can be had within the
        timeout, or when the connection fails while in use (the server stopped, say)."""
        try:
            with self._pool.connection(timeout=self.timeout) as conn:
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise self.unavailable(exc) from exc

    def connect(self) -> psycopg.Connection[Any]:
        """A connection of its own, outside the pool (a `LISTEN` that must stay open)."""
        try:
            return psycopg.connect(self.dsn, **self._kwargs)
        except psycopg.OperationalError as exc:
            raise self.unavailable(exc) from exc

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _applied(conn: psycopg.Connection[Any]) -> dict[int, tuple[str, str, datetime]]:
    row = conn.execute("SELECT to_regclass('agw.migration') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return {}
    rows = conn.execute("SELECT version, name, sha256, applied_at FROM agw.migration ORDER BY version").fetchall()
    return {int(v): (str(n), str(s), a) for v, n, s, a in rows}


def _versions(done: dict[int, tuple[str, str, datetime]], shipped: list[Migration]) -> list[Version]:
    out = []
    for m in shipped:
        if m.version not in done:
            out.append(Version(m.version, m.name, "pending"))
        else:
            _, sha, at = done[m.version]
            out.append(Version(m.version, m.name, "applied" if sha == m.sha256 else "changed", at))
    newest = shipped[-1].version if shipped else 0
    out += [Version(v, name, "unknown", at) for v, (name, _, at) in sorted(done.items()) if v > newest]
    return out


def status(store: Store) -> list[Version]:
    """Every migration: applied, pending, changed or unknown to this gateway."""
    shipped = migrations()
    with store.connection() as conn:
        return _versions(_applied(conn), shipped)


def migrate(store: Store, *, init: bool = False) -> list[Version]:
    """Apply the pending migrations (all in one transaction) and return what was applied.
    `init`: the database must not hold the schema yet. Raises StoreError when a migration
    applied before has changed, or the store is newer than this gateway."""
    shipped = migrations()
    with store.connection() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        done = _applied(conn)
        if init and done:
            raise StoreError(
                f"the store {store.name} is already initialised (schema version {max(done)}): "
                "`gateway store migrate` brings it up to date"
            )
        versions = _versions(done, shipped)
        bad = [v for v in versions if v.state in ("changed", "unknown")]
        if bad:
            raise StoreError(_mismatch(store, bad))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS agw.migration (version integer PRIMARY KEY, name text NOT NULL, "
            "sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        applied = []
        for m in shipped:
            if m.version in done:
                continue
            try:
                conn.execute(m.sql.encode("utf-8"))
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError):
                    raise
                raise StoreError(f"migration {m.version:04d}_{m.name} failed on {store.name}: {exc}") from exc
            conn.execute(
                "INSERT INTO agw.migration (version, name, sha256) VALUES (%s, %s, %s)", (m.version, m.name, m.sha256)
            )
            applied.append(Version(m.version, m.name, "applied"))
        return applied


def _mismatch(store: Store, bad: list[Version]) -> str:
    parts = []
    for v in bad:
        if v.state == "changed":
            parts.append(f"migration {v.version:04d}_{v.name} was applied from another text than this gateway ships")
        else:
            parts.append(f"migration {v.version:04d}_{v.name} is newer than this gateway (upgrade the gateway)")
    return f"the store {store.name}: " + "; ".join(parts)


def require_current(store: Store) -> None:
    """Raise StoreError unless the store's schema is exactly the one this gateway ships."""
    versions = status(store)
    bad = [v for v in versions if v.state in ("changed", "unknown")]
    if bad:
        raise StoreError(_mismatch(store, bad))
    pending = [v for v in versions if v.state == "pending"]
    if pending:
        have = max((v.version for v in versions if v.state == "applied"), default=0)
        raise StoreError(
            f"the store {store.name} has schema version {have}, this gateway needs {versions[-1].version}: "
            f"run `gateway store {'init' if have == 0 else 'migrate'} --store ...`"
        )
