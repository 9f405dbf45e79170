"""The store's fixtures: one PostgreSQL for the session (tests/store/pg.py), a fresh database
for each test that wants one, and the schema migrated into it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import psycopg
import pytest

from gateway.store import db
from tests.store.pg import Postgres, bindir

_NAMES = itertools.count(1)


@pytest.fixture(scope="session")
def pg() -> Iterator[Postgres]:
    found = bindir()
    if found is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl, postgres): apt-get install postgresql")
    server = Postgres(found)
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture
def empty_dsn(pg: Postgres) -> str:
    """A new, empty database (no schema yet)."""
    name = f"t{next(_NAMES)}"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg.dsn(name)


@pytest.fixture
def dsn(empty_dsn: str) -> str:
    """A new database with the store's schema (as `gateway store init` makes it)."""
    store = db.Store(empty_dsn)
    try:
        db.migrate(store, init=True)
    finally:
        store.close()
    return empty_dsn
