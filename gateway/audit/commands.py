"""`gateway audit verify | repair | head`: the reviewer's checks and the one repair there is.

verify  checks the chain, every signature against the public key, and the log against its
        checkpoints. Exit 0 when intact, 1 when not (the first problem named), 2 on usage errors.
        A signed log needs a key and a checkpoint: without them it fails, unless --no-checkpoint
        says the reviewer knowingly checks less.
repair  moves what a crash left at the end aside (a torn line; complete records after the last
        signature) and records `audit_repaired`. It refuses a log with any other problem.
adopt   goes on with a log that has no checkpoint here (restored from a backup, moved, written
        before signing) once it verifies, and records `audit_adopted`.
replay  decides every recorded command call of a time range again under a draft policy (nothing
        runs) and prints the calls whose decision would change, grouped by rule (replay.py).
        Exit 0 when nothing would change, 1 when something would, 2 on errors.
head    prints the current head as a checkpoint line, to copy off the machine (cron, a remote
        sink); `verify --checkpoint FILE` checks the log against every line of such a file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gateway.audit import checkpoint as checkpoints
from gateway.audit.keys import PUB_FILE, AuditKeyError, VerifyKey
from gateway.audit.records import AuditUnavailable, records
from gateway.audit.verify import head, repair, verify
from gateway.audit.writer import AuditLog, open_signed

OK, BROKEN, USAGE = 0, 1, 2


def _fail(message: str) -> int:
    print(f"gateway audit: {message}", file=sys.stderr)
    return USAGE


def main(args: argparse.Namespace, directory: Path) -> int:
    if args.action == "repair":
        return _repair(args, directory)
    if args.action == "head":
        return _head(args, directory)
    if args.action == "adopt":
        return _adopt(args, directory)
    if args.action == "replay":
        return _replay(args, directory)
    return _verify(args, directory)


def _signed(directory: Path) -> bool:
    return any(isinstance(record, dict) and "sig" in record for _, _, record, _ in records(directory))


def _verify(args: argparse.Namespace, directory: Path) -> int:
    keys = Path(args.audit_keys)
    key_path = Path(args.key) if args.key else keys / PUB_FILE
    key = None
    if args.key or key_path.exists():
        try:
            key = VerifyKey.load(key_path)
        except AuditKeyError as exc:
            return _fail(str(exc))
    try:
        heads = [cp for p in args.checkpoint or [] for cp in checkpoints.read(Path(p))]
        if not args.checkpoint and not args.no_checkpoint:
            newest = checkpoints.latest(checkpoints.default_path(directory, keys))
            heads = [newest] if newest else []
    except checkpoints.CheckpointError as exc:
        return _fail(str(exc))
    for p in args.checkpoint or []:
        if not Path(p).exists():
            return _fail(f"no checkpoint file {p}")
    result = verify(directory, key, None if args.no_checkpoint else heads)
    problems: list[str] = []
    if result.ok and _signed(directory):
        if key is None:
            problems.append(f"the log is signed but there is no public key at {key_path}: pass --key FILE")
        if not heads and not args.no_checkpoint:
            problems.append(
                f"no checkpoint for this log (looked for {checkpoints.default_path(directory, keys)}): records "
                "removed from the end would not show. Pass --checkpoint FILE, or --no-checkpoint to check less"
            )
    ok = result.ok and not problems
    if getattr(args, "json", False):
        print(json.dumps({**result.to_json(), "ok": ok, "problems": problems}, ensure_ascii=False))
    else:
        print(result.describe())
        for p in problems:
            print(f"not verified: {p}")
    return OK if ok else BROKEN


def _public_key(args: argparse.Namespace) -> VerifyKey | None:
    pub = Path(args.key) if getattr(args, "key", None) else Path(args.audit_keys) / PUB_FILE
    return VerifyKey.load(pub) if pub.exists() or getattr(args, "key", None) else None


def _repair(args: argparse.Namespace, directory: Path) -> int:
    try:
        key = _public_key(args)
        if key is None and _signed(directory):
            return _fail(f"the log is signed but there is no public key at {Path(args.audit_keys) / PUB_FILE}")
        done = repair(directory, key)
    except (AuditUnavailable, AuditKeyError) as exc:
        print(f"gateway audit repair: {exc}", file=sys.stderr)
        return BROKEN
    if done is None:
        print("nothing to repair: the log ends in a complete, signed record")
        return OK
    data = {"file": done.file, "offset": done.offset, "bytes": done.bytes, "sha256": done.sha256}
    data.update(kept_as=done.kept_as, records=done.records)
    try:
        if key is not None:  # never a new key: a mistyped --audit-keys is an error
            open_signed(directory, Path(args.audit_keys), create=False).append("audit_repaired", data=data)
        else:
            AuditLog(directory).append("audit_repaired", data=data)
    except AuditUnavailable as exc:
        print(f"gateway audit repair: the end was moved aside but not recorded: {exc}", file=sys.stderr)
        return BROKEN
    what = f"{done.bytes} bytes ({done.records} whole unsigned records)" if done.records else f"{done.bytes} torn bytes"
    print(f"repaired: {what} at {done.file}:{done.offset} kept in {done.kept_as}; recorded")
    return OK


def _adopt(args: argparse.Namespace, directory: Path) -> int:
    """Go on with a log that has no checkpoint here (restored, moved, from before signing): only
    once it verifies, and on the record (`audit_adopted`)."""
    try:
        key = _public_key(args)
    except AuditKeyError as exc:
        return _fail(str(exc))
    if key is None:
        return _fail(f"no public key at {Path(args.audit_keys) / PUB_FILE}: adopt needs the gateway's key")
    if not _signed(directory):
        print(
            "gateway audit adopt: no record of this log carries a signature, so nothing vouches for it. A log "
            "from before signing is adopted when its key is first made; otherwise start a new audit directory",
            file=sys.stderr,
        )
        return BROKEN
    checked = verify(directory, key)
    if not checked.ok:
        print(f"gateway audit adopt: the log does not verify, not adopting it:\n{checked.describe()}", file=sys.stderr)
        return BROKEN
    try:
        log = open_signed(directory, Path(args.audit_keys), create=False, adopt=True)
        log.append("audit_adopted", data={"records": checked.records, "by": os.environ.get("USER", "")})
    except AuditUnavailable as exc:
        print(f"gateway audit adopt: {exc}", file=sys.stderr)
        return BROKEN
    print(f"adopted: {checked.records} records verified; the log goes on from here, signed and checkpointed")
    return OK


def _head(args: argparse.Namespace, directory: Path) -> int:
    try:
        last = head(directory)
        key = _public_key(args)
    except (AuditUnavailable, AuditKeyError) as exc:
        return _fail(str(exc))
    if last is None:
        return _fail(f"{directory}: the log is empty")
    if key is not None and not (isinstance(last.get("sig"), str) and key.verify(last["hash"], last["sig"])):
        # a head nobody with the key signed is not worth shipping: it would vouch for a forgery
        print(f"gateway audit head: the last record (seq {last.get('seq')}) is not signed by key {key.fingerprint}:"
              " see `gateway audit verify`", file=sys.stderr)  # fmt: skip
        return BROKEN
    fingerprint = key.fingerprint if key else ""
    sys.stdout.write(checkpoints.Checkpoint.of(Path(os.path.realpath(directory)), last, fingerprint).line())
    return OK


def _replay(args: argparse.Namespace, directory: Path) -> int:
    from gateway.audit.replay import ReplayError, describe, replay

    if not args.policy:
        return _fail("audit replay needs --policy DRAFT (the policy to decide the recorded calls under)")
    for name in ("max_rows", "max_calls"):
        if getattr(args, name) < 0:
            return _fail(f"audit replay --{name.replace('_', '-')} {getattr(args, name)}: expected 0 or more")
    try:
        report = replay(
            Path(args.policy), directory, args.since, args.until,
            workspace=Path(args.workspace) if args.workspace else None,
            max_rows=args.max_rows, max_calls=args.max_calls,
        )  # fmt: skip
    except ReplayError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
    else:
        print(describe(report))
    return BROKEN if report.changed else OK
