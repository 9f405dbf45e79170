"""`gateway store init|migrate|status` against a real PostgreSQL, through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from gateway.store import db
from tests.store.pg import Postgres


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip


def test_init_then_status_then_migrate(empty_dsn: str) -> None:
    before = gateway("store", "status", "--store", empty_dsn, "--json")
    assert before.returncode == 1, before.stderr
    assert {v["state"] for v in json.loads(before.stdout)} == {"pending"}
    done = gateway("store", "init", "--store", empty_dsn)
    assert done.returncode == 0, done.stderr
    assert "applied 0001_ledger" in done.stdout
    after = gateway("store", "status", "--store", empty_dsn, "--json")
    assert after.returncode == 0, after.stderr
    assert {v["state"] for v in json.loads(after.stdout)} == {"applied"}
    again = gateway("store", "init", "--store", empty_dsn)
    assert again.returncode == 2 and "already initialised" in again.stderr
    up = gateway("store", "migrate", "--store", empty_dsn)
    assert up.returncode == 0 and "up to date" in up.stdout


def test_the_store_comes_from_the_environment(empty_dsn: str) -> None:
    done = gateway("store", "init", env={**os.environ, db.ENV: empty_dsn})
    assert done.returncode == 0, done.stderr
    none = gateway("store", "status", env={k: v for k, v in os.environ.items() if k != db.ENV})
    assert none.returncode == 2 and "needs --store" in none.stderr


def test_a_changed_migration_is_reported_never_applied_again(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE agw.migration SET sha256 = 'x' WHERE version = 1")
    out = gateway("store", "migrate", "--store", dsn)
    assert out.returncode == 2
    assert "0001_ledger was applied from another text" in out.stderr
    store = db.Store(dsn)
    try:
        assert next(v.state for v in db.status(store)) == "changed"
    finally:
        store.close()


def test_an_unreachable_store_is_named_without_its_password(pg: Postgres) -> None:
    dsn = f"postgresql://gw:s3cret@/nosuchdb?host={pg.root}&port={pg.port}"
    out = gateway("store", "status", "--store", dsn)
    assert out.returncode == 2
    assert f"the store postgresql://gw@{pg.root}:{pg.port}/nosuchdb is unavailable" in out.stderr
    assert "s3cret" not in out.stderr
