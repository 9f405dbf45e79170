"""`gateway audit verify | repair | head`: the reviewer's checks and the one repair there is.

verify  checks the chain, every signature against the public key, and the log against its
        checkpoints. Exit 0 when intact, 1 when not (the first problem named), 2 on usage errors.
        Without a key and a checkpoint it fails, unless --no-key / --no-checkpoint say the
        reviewer knowingly checks less; a key found beside the log rather than given (--key) is
        used with a warning. --key again for each key the log has had (adopted under a new key).
repair  moves what a crash left at the end aside (a torn line; complete records after the last
        signature) and records `audit_repaired`, both or neither. It refuses a log with any other
        problem, and anything a checkpoint covers.
adopt   goes on with a log that has no checkpoint here (restored from a backup, moved) once it
        verifies, and records `audit_adopted`. --new-key: the log's key is gone (or it was never
        signed): checks it as far as it can, makes a new key, and records the change.
replay  decides every recorded command call of a time range again under a draft policy (nothing
        runs) and prints the calls whose decision would change, grouped by rule (gateway/replay.py,
        above the gate: the CLI runs it). Exit 0 when nothing would change, 1 when something would,
        2 on errors.
head    prints the current head as a checkpoint line, to copy off the machine (cron, a remote
        sink); `verify --checkpoint FILE` checks the log against every line of such a file.
export  streams the records a selection keeps as JSON lines (`jsonl`, `ecs`, `ocsf`) on stdout,
        or the calls as OpenTelemetry spans to an OTLP/HTTP endpoint (`otlp`), once or following
        the log (`--follow`), resumable from `--cursor FILE` (export.py, follow.py). Exit 0 done,
        1 the sink did not take a batch (the cursor stays at the last one it took), 2 usage or a
        cursor that no longer fits the log, 3 lines that are not records were skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gateway.audit import checkpoint as checkpoints
from gateway.audit import export as exporting
from gateway.audit.follow import Cursor, CursorError
from gateway.audit.keys import KEY_FILE, PUB_FILE, AuditKeyError, SigningKey, VerifyKey
from gateway.audit.records import AuditUnavailable, records
from gateway.audit.selection import Selection
from gateway.audit.timespec import TimeSpecError
from gateway.audit.verify import head, verify
from gateway.audit.writer import AuditLog, has_records, open_signed

OK, BROKEN, USAGE, UNREADABLE, INTERRUPTED = 0, 1, 2, 3, 130


def _fail(message: str) -> int:
    print(f"gateway audit: {message}", file=sys.stderr)
    return USAGE


def main(args: argparse.Namespace, directory: Path, lines: Callable[[], exporting.LineSource] | None = None) -> int:
    """`lines`: where `export` reads (the fleet's store); None: the files in `directory`."""
    if args.action == "repair":
        return _repair(args, directory)
    if args.action == "head":
        return _head(args, directory)
    if args.action == "adopt":
        return _adopt(args, directory)
    if args.action == "export":
        return _export(args, directory, lines)
    return _verify(args, directory)


def _signed(directory: Path) -> bool:
    return any(isinstance(record, dict) and "sig" in record for _, _, record, _ in records(directory))


def _given_keys(args: argparse.Namespace) -> list[VerifyKey]:
    """The public keys the reviewer gave (`--key`, as many as the log has had)."""
    return [VerifyKey.load(Path(k)) for k in getattr(args, "key", None) or []]


def _verify(args: argparse.Namespace, directory: Path) -> int:
    keys_dir = Path(args.audit_keys)
    beside = keys_dir / PUB_FILE
    warnings: list[str] = []
    try:
        keys = _given_keys(args)
        if not keys and beside.exists():
            keys = [VerifyKey.load(beside)]
            warnings.append(
                f"the key was found beside the log ({beside}, {keys[0].fingerprint}), not given by you: whoever could "
                "rewrite the log may have replaced it too. Copy signing.pub off this machine once and pass --key"
            )
    except AuditKeyError as exc:
        return _fail(str(exc))
    try:
        heads = [cp for p in args.checkpoint or [] for cp in checkpoints.read(Path(p))]
        if not args.checkpoint and not args.no_checkpoint:
            newest = checkpoints.latest(checkpoints.default_path(directory, keys_dir))
            heads = [newest] if newest else []
    except checkpoints.CheckpointError as exc:
        return _fail(str(exc))
    for p in args.checkpoint or []:
        if not Path(p).exists():
            return _fail(f"no checkpoint file {p}")
    result = verify(directory, keys[0] if keys else None, None if args.no_checkpoint else heads, also=keys[1:])
    problems: list[str] = []
    if result.ok and not keys and not getattr(args, "no_key", False):
        what = "the log is signed" if _signed(directory) else "the log carries no signature"
        problems.append(
            f"{what} and there is no public key (none given, none at {beside}): a log rewritten without its "
            "signatures looks just like this. Pass --key FILE (a copy kept off this machine), or --no-key to "
            "check only that the log is consistent"
        )
    if result.ok and keys and not heads and not args.no_checkpoint:
        problems.append(
            f"no checkpoint for this log (looked for {checkpoints.default_path(directory, keys_dir)}): records "
            "removed from the end would not show. Pass --checkpoint FILE, or --no-checkpoint to check less"
        )
    ok = result.ok and not problems
    if getattr(args, "json", False):
        out = {**result.to_json(), "ok": ok, "problems": problems, "warnings": warnings}
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(result.describe())
        for w in warnings:
            print(f"warning: {w}")
        for p in problems:
            print(f"not verified: {p}")
    return OK if ok else BROKEN


def _public_key(args: argparse.Namespace) -> VerifyKey | None:
    given = _given_keys(args)
    if given:
        return given[-1]
    pub = Path(args.audit_keys) / PUB_FILE
    return VerifyKey.load(pub) if pub.exists() else None


def _repair(args: argparse.Namespace, directory: Path) -> int:
    """Move a crash's torn end aside and record it (`AuditLog.repair`: both or neither)."""
    keys_dir = Path(args.audit_keys)
    try:
        if (keys_dir / KEY_FILE).exists() or _signed(directory):
            # never a new key: a mistyped --audit-keys is an error
            if not (keys_dir / PUB_FILE).exists():
                return _fail(f"the log is signed but there is no public key at {keys_dir / PUB_FILE}")
            log = open_signed(directory, keys_dir, create=False, check=False)
        else:
            log = AuditLog(directory, check=False)
        done = log.repair()
    except (AuditUnavailable, AuditKeyError) as exc:
        print(f"gateway audit repair: {exc}", file=sys.stderr)
        return BROKEN
    if done is None:
        print("nothing to repair: the log ends in a complete, signed record")
        return OK
    what = f"{done.bytes} bytes ({done.records} whole unsigned records)" if done.records else f"{done.bytes} torn bytes"
    print(f"repaired: {what} at {done.file}:{done.offset} kept in {done.kept_as}; recorded")
    return OK


def _adopt(args: argparse.Namespace, directory: Path) -> int:
    """Go on with a log that has no checkpoint here (restored, moved): only once it verifies with
    the key, and on the record (`audit_adopted`). `--new-key`: its key is gone (see below)."""
    if getattr(args, "new_key", False):
        return _adopt_new_key(args, directory)
    try:
        key = _public_key(args)
    except AuditKeyError as exc:
        return _fail(str(exc))
    if key is None:
        return _fail(f"no public key at {Path(args.audit_keys) / PUB_FILE}: adopt needs the gateway's key")
    if not _signed(directory):
        print(
            "gateway audit adopt: no record of this log carries a signature, so nothing vouches for it. If you "
            "know where it comes from (a log from before signing), `gateway audit adopt --new-key` with its own "
            "key directory takes it on, on the record; otherwise start a new audit directory",
            file=sys.stderr,
        )
        return BROKEN
    checked = verify(directory, key)
    if not checked.ok:
        print(f"gateway audit adopt: the log does not verify, not adopting it:\n{checked.describe()}", file=sys.stderr)
        return BROKEN
    try:
        log = open_signed(directory, Path(args.audit_keys), create=False, adopt=True)
        log.append("audit_adopted", data={
            "records": checked.records, "by": _who(), "public": key.line().strip(), "fingerprint": key.fingerprint,
            "checked": f"signatures with key {key.fingerprint}",
        })  # fmt: skip
    except AuditUnavailable as exc:
        print(f"gateway audit adopt: {exc}", file=sys.stderr)
        return BROKEN
    print(f"adopted: {checked.records} records verified; the log goes on from here, signed and checkpointed")
    return OK


def _adopt_new_key(args: argparse.Namespace, directory: Path) -> int:
    """Go on under a new key with a log whose key is gone (or that was never signed): the log is
    checked as far as it can be (with the old public key if it is there or given with --key,
    against its checkpoint if there is one), a new key is made (the old public key and the
    checkpoint are kept aside, renamed), and `audit_adopted` names the new key, the old one and
    what was checked. A reviewer holding the old public key can still check everything before."""
    keys_dir = Path(args.audit_keys)
    if (keys_dir / KEY_FILE).exists():
        return _fail(
            f"there is a signing key in {keys_dir}: --new-key replaces only a key that is gone "
            "(`gateway audit adopt` without it goes on with this one)"
        )
    if not has_records(directory):
        return _fail(f"{directory} has no records: a gateway makes the key of a new log itself")
    try:
        old = _given_keys(args) or ([VerifyKey.load(keys_dir / PUB_FILE)] if (keys_dir / PUB_FILE).exists() else [])
        cp_path = checkpoints.default_path(directory, keys_dir)
        newest = checkpoints.latest(cp_path)
    except (AuditKeyError, checkpoints.CheckpointError) as exc:
        return _fail(str(exc))
    checked = verify(directory, old[0] if old else None, [newest] if newest else None, also=old[1:])
    if not checked.ok:
        print(
            f"gateway audit adopt: the log does not verify, not adopting it:\n{checked.describe()}\n"
            "(a torn end from a crash: `gateway audit repair` first)",
            file=sys.stderr,
        )
        return BROKEN
    how = f"signatures with key {checked.key}" if old else "consistency only: no public key of the old key was given"
    if newest is not None:
        how += f", against its checkpoint (seq {newest.seq})"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    try:
        key, old_pub = SigningKey.replace(keys_dir)
        kept_cp = ""
        if cp_path.exists():  # the old head, signed by the old key: kept, out of the writer's way
            kept_cp = f"{cp_path.name}.replaced-{stamp}"
            os.rename(cp_path, cp_path.with_name(kept_cp))
        with contextlib.suppress(FileNotFoundError):
            cp_path.with_name(cp_path.stem + ".verified").unlink()
        log = AuditLog(directory, key=key, checkpoint=cp_path, adopt=True)
        log.append("audit_adopted", data={
            "records": checked.records, "by": _who(), "public": key.public.line().strip(),
            "fingerprint": key.public.fingerprint, "renewed": True,
            "previous": old[0].fingerprint if old else None, "checked": how,
            "previous_public_kept_as": old_pub or None, "previous_checkpoint_kept_as": kept_cp or None,
        })  # fmt: skip
    except (AuditUnavailable, AuditKeyError, OSError) as exc:
        print(f"gateway audit adopt: {exc}", file=sys.stderr)
        return BROKEN
    print(
        f"adopted under a new key {key.public.fingerprint}: {checked.records} records ({how}); recorded. "
        f"Copy the new {keys_dir / PUB_FILE} off this machine: reviewers check with both keys (--key OLD --key NEW)"
    )
    return OK


def _who() -> str:
    return os.environ.get("SUDO_USER") or os.environ.get("USER", "")


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


def selection(args: argparse.Namespace, calls: list[str] | None = None) -> Selection:
    """The reading verbs' filters from the command line. Raises TimeSpecError."""
    return Selection.of(
        since=args.since, until=args.until, events=args.event or (), call_ids=[*(args.call or ()), *(calls or ())],
        principal=args.principal, tool=args.tool, decision=args.decision, rule=args.rule, host=args.host,
        text=args.text,
    )  # fmt: skip


def _export(args: argparse.Namespace, directory: Path, lines: Callable[[], exporting.LineSource] | None) -> int:
    fmt = "jsonl" if args.format == "text" else args.format
    if fmt == "csv":
        return _fail("audit export --format csv: export writes jsonl, ecs, ocsf or otlp (csv is `query --format csv`)")
    try:
        chosen = selection(args)
    except TimeSpecError as exc:
        return _fail(str(exc))
    sink: exporting.Sink | exporting.CallSink
    if fmt == "otlp":
        endpoint = args.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if not endpoint:
            return _fail("audit export --format otlp needs --endpoint URL (or OTEL_EXPORTER_OTLP_ENDPOINT): "
                         "nothing is sent anywhere unless you say where")  # fmt: skip
        try:
            # lazy: the optional `otel` extra (the OpenTelemetry SDK may not be installed)
            from gateway.audit import otlp
        except ImportError as exc:
            return _fail(f"audit export --format otlp needs the OpenTelemetry SDK: pip install 'agent-gateway[otel]' "
                         f"({exc})")  # fmt: skip
        sink = otlp.SpanSink(otlp.otlp_exporter(args.endpoint), host=os.uname().nodename, arguments=args.arguments)
    else:
        sink = exporting.LineSink(sys.stdout)
    stopping = threading.Event()  # SIGINT, SIGTERM: end after the batch in hand, its cursor saved
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        if lines is not None and args.cursor:
            raise CursorError("audit export --store: --cursor is for the files of one host (not built for the store)")
        cursor = Cursor.load(Path(args.cursor), fmt) if args.cursor else None
        report = exporting.export(
            directory, fmt, sink, chosen, cursor=cursor, follow=args.follow, redact_patterns=args.redact or (),
            stop=stopping.is_set, source=lines() if lines is not None else None,
        )  # fmt: skip
    except CursorError as exc:
        return _fail(str(exc))
    except exporting.ExportFailed as exc:
        print(f"gateway audit export: {exc}", file=sys.stderr)
        return BROKEN
    except AuditUnavailable as exc:
        return _fail(str(exc))
    finally:
        if fmt == "otlp":
            sink.close()  # type: ignore[union-attr]
    exporting.warn_unreadable(report)
    if stopping.is_set() and not args.follow:
        print("gateway audit export: interrupted (the cursor, if any, holds what was sent)", file=sys.stderr)
        return INTERRUPTED
    if fmt == "otlp":
        print(f"gateway audit export: {report.sent} span(s) sent from {report.records} record(s)", file=sys.stderr)
    return UNREADABLE if report.unreadable_count else OK
