"""The store's CLI verbs: `gateway store init|migrate|status` and `gateway audit verify --store`.
Thin: each parses nothing itself (gateway/cli.py did), calls the library, prints, returns the
exit code (0 done, 1 verification failed, 2 usage, configuration or an unreachable store)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gateway.audit.keys import AuditKeyError, VerifyKey
from gateway.audit.records import canonical
from gateway.store import db, ledger, sequencer

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _fatal(message: str) -> int:
    print(f"gateway: {message}", file=sys.stderr)
    return EXIT_USAGE


def dsn_of(args: argparse.Namespace) -> str | None:
    """`--store`, else AGW_STORE, else None (the files of one host)."""
    given = getattr(args, "store", None) or os.environ.get(db.ENV)
    return given or None


def store_main(args: argparse.Namespace) -> int:
    """`gateway store init|migrate|status`."""
    dsn = dsn_of(args)
    if not dsn:
        return _fatal(f"store {args.action} needs --store postgresql://... (or {db.ENV})")
    try:
        store = db.Store(dsn)
    except db.StoreError as exc:
        return _fatal(str(exc))
    try:
        if args.action in ("init", "migrate"):
            applied = db.migrate(store, init=args.action == "init")
            for v in applied:
                print(f"applied {v.version:04d}_{v.name}")
            if not applied:
                print(f"{store.name}: the schema is up to date")
            return EXIT_OK
        if args.action == "checkpoint":  # the newest, for a reviewer to keep (`audit verify --store --checkpoint`)
            with store.connection() as conn:
                newest = sequencer.latest(conn)
            if newest is None:
                print(f"gateway: the store {store.name} has no checkpoint yet", file=sys.stderr)
                return EXIT_FAILED
            print(canonical(newest))
            return EXIT_OK
        versions = db.status(store)
        if args.json:
            print(json.dumps([{"version": v.version, "name": v.name, "state": v.state,
                               "applied_at": v.applied_at.isoformat() if v.applied_at else None}
                              for v in versions]))  # fmt: skip
        else:
            print(f"store {store.name}")
            for v in versions:
                when = f"  {v.applied_at:%Y-%m-%d %H:%M:%S %Z}" if v.applied_at else ""
                print(f"  {v.version:04d}_{v.name:<24} {v.state}{when}")
        return EXIT_OK if all(v.state == "applied" for v in versions) else EXIT_FAILED
    except db.StoreError as exc:
        return _fatal(str(exc))
    finally:
        store.close()


def verify_main(args: argparse.Namespace, dsn: str) -> int:
    """`gateway audit verify --store`: every stream of the fleet's ledger."""
    keys: list[VerifyKey] = []
    kept: list[dict[str, Any]] = []
    try:
        keys = [VerifyKey.load(Path(k)) for k in args.key or ()]
        for name in args.checkpoint or ():
            found = json.loads(Path(name).read_text(encoding="utf-8"))
            if not isinstance(found, dict):
                return _fatal(f"--checkpoint {name}: not a checkpoint (`gateway store checkpoint` prints one)")
            kept.append(found)
    except AuditKeyError as exc:
        return _fatal(str(exc))
    except (OSError, ValueError) as exc:
        return _fatal(f"--checkpoint: {exc}")
    try:
        store = db.Store(dsn)
    except db.StoreError as exc:
        return _fatal(str(exc))
    try:
        result = ledger.verify_store(store, keys, kept)
    except db.StoreError as exc:
        return _fatal(str(exc))
    finally:
        store.close()
    for line in result.lines():
        print(line)
    if not keys and result.ok:
        print("gateway: warning: no --key given: signatures were not checked against a key you hold", file=sys.stderr)
    return EXIT_OK if result.ok else EXIT_FAILED
