"""`gateway audit verify | repair | head`: the reviewer's checks and the one repair there is.

verify  checks the chain, every signature against the public key, and the log against its
        checkpoints. Exit 0 when intact, 1 when not (the first problem named), 2 on usage errors.
        A signed log needs a key and a checkpoint: without them it fails, unless --no-checkpoint
        says the reviewer knowingly checks less.
repair  moves a torn last record aside (kept beside the log) and records `audit_repaired`.
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
from gateway.audit.writer import open_signed

OK, BROKEN, USAGE = 0, 1, 2


def _fail(message: str) -> int:
    print(f"gateway audit: {message}", file=sys.stderr)
    return USAGE


def main(args: argparse.Namespace, directory: Path) -> int:
    if args.action == "repair":
        return _repair(args, directory)
    if args.action == "head":
        return _head(args, directory)
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


def _repair(args: argparse.Namespace, directory: Path) -> int:
    try:
        done = repair(directory)
    except AuditUnavailable as exc:
        print(f"gateway audit repair: {exc}", file=sys.stderr)
        return BROKEN
    if done is None:
        print("nothing to repair: the log ends in a complete record")
        return OK
    data = {"file": done.file, "offset": done.offset, "bytes": done.bytes, "sha256": done.sha256}
    data["kept_as"] = done.kept_as
    try:
        log = open_signed(directory, Path(args.audit_keys))
        log.append("audit_repaired", data=data)
    except AuditUnavailable as exc:
        print(f"gateway audit repair: the torn record was moved aside but not recorded: {exc}", file=sys.stderr)
        return BROKEN
    print(f"repaired: {done.bytes} torn bytes at {done.file}:{done.offset} kept in {done.kept_as}; recorded")
    return OK


def _head(args: argparse.Namespace, directory: Path) -> int:
    try:
        last = head(directory)
    except AuditUnavailable as exc:
        return _fail(str(exc))
    if last is None:
        return _fail(f"{directory}: the log is empty")
    key = ""
    pub = Path(args.audit_keys) / PUB_FILE
    if pub.exists():
        try:
            key = VerifyKey.load(pub).fingerprint
        except AuditKeyError:
            key = ""
    sys.stdout.write(checkpoints.Checkpoint.of(Path(os.path.realpath(directory)), last, key).line())
    return OK
