"""The store's CLI verbs: `gateway store init|migrate|status` and `gateway audit verify --store`.
Thin: each parses nothing itself (gateway/cli.py did), calls the library, prints, returns the
exit code (0 done, 1 verification failed, 2 usage, configuration or an unreachable store)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.approval import ApprovalRequest, escaped, shortened
from gateway.audit.keys import AuditKeyError, SigningKey, VerifyKey
from gateway.audit.records import AuditUnavailable, canonical
from gateway.audit.sink import AuditSink
from gateway.store import approvals, commitwatch, db, ledger, sequencer, spool
from gateway.store import tokens as store_tokens
from gateway.store.policy import PolicySync, RolloutError, publish
from gateway.store.tokens import StoreTokens
from gateway.tokens import AGENT, METRICS, SUPERVISOR, TokenError, TokenStore

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _fatal(message: str) -> int:
    print(f"gateway: {message}", file=sys.stderr)
    return EXIT_USAGE


def dsn_of(args: argparse.Namespace) -> str | None:
    """`--store`, else AGW_STORE, else None (the files of one host)."""
    given = getattr(args, "store", None) or os.environ.get(db.ENV)
    return given or None


def spool_dirs(args: argparse.Namespace) -> tuple[Path, ...]:
    """`--store-spool DIR` (else AGW_STORE_SPOOL) as an absolute path, when given: a directory of
    the gateway's own, hidden from every sandbox."""
    given = getattr(args, "store_spool", None) or os.environ.get(spool.ENV)
    return (Path(given).absolute(),) if given else ()


def spool_of(args: argparse.Namespace) -> tuple[Path | None, int]:
    """Where a batch the store does not take waits (`--store-spool`; None: it is refused) and
    the spool's bound in bytes (`--store-spool-max`, else AGW_STORE_SPOOL_MAX). Raises
    AuditUnavailable on a bound that is not a positive whole number, or a spool without a store."""
    dirs = spool_dirs(args)
    bound = getattr(args, "store_spool_max", None)
    if bound is None:
        text = os.environ.get(spool.ENV_MAX, "").strip()
        if not text:
            bound = spool.DEFAULT_MAX
        elif not text.isdigit() or int(text) < 1:
            raise AuditUnavailable(f"{spool.ENV_MAX}={text!r}: the spool's bound is a positive number of bytes")
        else:
            bound = int(text)
    if dirs and not dsn_of(args):
        raise AuditUnavailable(
            f"--store-spool (or {spool.ENV}) is for a gateway with --store: it keeps the store's records while the "
            "store is away"
        )
    return (dirs[0] if dirs else None), bound


def commit_timeout_of(args: argparse.Namespace) -> float:
    """How long a commit may go unanswered (`--store-commit-timeout`, else
    AGW_STORE_COMMIT_TIMEOUT, else 30 s: commitwatch.py). Raises AuditUnavailable naming the
    setting when it is not a number of seconds above 0."""
    given = getattr(args, "store_commit_timeout", None)
    name = "--store-commit-timeout" if given is not None else commitwatch.ENV
    try:
        return commitwatch.bound_of(given if given is not None else os.environ.get(commitwatch.ENV))
    except ValueError as exc:
        raise AuditUnavailable(f"{name}: {exc}") from None


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


class StoreInbox:
    """`gateway approvals --store`: the requests of every gateway of the fleet, answered as the
    database identity the supervisor connects as (their own login: `by` is theirs, not a name
    they type), from this host."""

    def __init__(self, dsn: str) -> None:
        self.store = db.Store(dsn)

    def pending(self) -> list[dict[str, Any]]:
        return approvals.pending(self.store)

    def answer(self, call_id: str, approved: bool, reason: str, scope: str) -> dict[str, Any]:
        return approvals.answer(self.store, call_id, approved, reason, scope, where=socket.gethostname())

    def close(self) -> None:
        self.store.close()


def fleet_approver(audit: AuditSink, say: Callable[[str], None]) -> approvals.StoreApprover | None:
    """The approver of a gateway whose ledger is the store (its asks go to the fleet's inbox),
    None for a gateway on files. `say` tells the operator how to answer each ask."""
    if not isinstance(audit, ledger.StoreLedger):
        return None

    def tell(request: ApprovalRequest, timeout: float) -> None:
        command = shortened(escaped(request.command), 60, f"approvals show --store ... {request.call_id}")
        say(
            f"call {request.call_id} waits for approval ({escaped(request.principal)}, {request.tool}, "
            f"{int(timeout)} s): {command}\n  answer from any host: gateway approvals approve --store "
            f"{shlex.quote(audit.store.name)} {request.call_id}"
        )

    return approvals.StoreApprover(audit.store, audit.stream, audit.host, on_wait=tell)


def fleet_tokens(audit: AuditSink) -> TokenStore | None:
    """The tokens of a gateway whose ledger is the store (the fleet's, revocable everywhere),
    None for a gateway on files (its tokens file)."""
    if not isinstance(audit, ledger.StoreLedger):
        return None
    return StoreTokens(audit.store, audit.host)


def token_main(args: argparse.Namespace, dsn: str) -> int:
    """`gateway token create|list|revoke --store`: the fleet's tokens (the policy check of an
    agent's principal is the CLI's, as for the file)."""
    try:
        store = db.Store(dsn)
    except db.StoreError as exc:
        return _fatal(str(exc))
    try:
        if args.action == "create":
            kind, name = (SUPERVISOR, args.supervisor) if args.supervisor else (METRICS, args.metrics) if args.metrics \
                else (AGENT, args.principal)  # fmt: skip
            if not name or sum(bool(x) for x in (args.principal, args.supervisor, args.metrics)) != 1:
                return _fatal("token create takes one of --principal NAME, --supervisor NAME, --metrics NAME")
            token, entry = store_tokens.create(store, name, args.label or "", kind, args.host)
            where = f" on {', '.join(args.host)} only" if args.host else " on every gateway"
            print(f"created {kind} token {entry.id} for {entry.principal} in {store.name}{where} (shown once; only "
                  "its hash is kept):", file=sys.stderr)  # fmt: skip
            print(token)
        elif args.action == "list":
            for e, hosts, revoked in store_tokens.listing(store):
                state = f"revoked {revoked}" if revoked else "valid"
                print(f"{e.id}  {e.kind:10}  {escaped(e.principal):12}  {e.created}  {state:30}  "
                      f"{','.join(hosts) if hosts else 'all hosts'}  {escaped(e.label)}")  # fmt: skip
        else:
            if not args.token_id:
                return _fatal("token revoke needs a TOKEN_ID (see: gateway token list --store ...)")
            gone = store_tokens.revoke(store, args.token_id)
            print(f"revoked {gone.kind} {gone.id} ({escaped(gone.principal)}) on every gateway of {store.name}")
        return EXIT_OK
    except (db.StoreError, TokenError) as exc:
        return _fatal(str(exc))
    finally:
        store.close()


def policy_publish(args: argparse.Namespace, path: Path, dsn: str) -> int:
    """`gateway policy publish [FILE] --store ... --signing-key DIR`: check, sign and store the
    fleet's next policy revision."""
    try:
        key = SigningKey.load_or_create(Path(args.signing_key))
        with db.Store(dsn) as store:
            rev = publish(store, path, Path(args.workspace) if args.workspace else None, key)
    except (AuditKeyError, RolloutError, db.StoreError) as exc:
        return _fatal(str(exc))
    print(f"published {path} as revision {rev}, signed with {key.public.fingerprint}: pin "
          f"{Path(args.signing_key) / 'signing.pub'} on the gateways (serve --policy-key)")  # fmt: skip
    return EXIT_OK


def fleet_policy(args: argparse.Namespace, directory: Path, say: Callable[[str], None]) -> PolicySync | None:
    """With --store and --policy-key: the fleet's policy, its newest verified revision written
    into `directory` (or the last one written there, with the store away). None without them.
    Raises RolloutError when there is no policy to start from."""
    dsn = dsn_of(args)
    if not dsn or not getattr(args, "policy_key", None):
        return None
    try:
        keys = [VerifyKey.load(Path(k)) for k in args.policy_key]
    except AuditKeyError as exc:
        raise RolloutError(str(exc)) from None
    store = db.Store(dsn)
    host = socket.gethostname()

    def refused(rev: int, why: str) -> None:
        say(f"policy revision {rev} from the store refused: {why}")

    workspace = Path(args.workspace) if getattr(args, "workspace", None) else None
    sync = PolicySync(store, directory, keys, f"{host}:{os.getpid()}", host, on_reject=refused, workspace=workspace)
    try:
        sync.sync()
    except db.StoreError as exc:
        if sync.entry() is None:
            raise RolloutError(f"no policy: {exc}, and none taken before in {directory}") from None
        say(f"{exc}: serving the last policy taken from it ({sync.entry()})")
    if sync.entry() is None:
        raise RolloutError(f"the store {store.name} has no policy revision that verifies: `gateway policy publish`")
    return sync
