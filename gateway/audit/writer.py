"""The writer: appends records durably, signs them, keeps the head's checkpoint, never tears.

Appends are serialised across threads and processes (`flock` on `.lock` in the audit directory).
Threads of one process commit together: whoever finds the log idle writes every record queued
so far in one `write` and one `fdatasync` (group commit), and each caller returns once its own
record is on disk. Any failure raises `AuditUnavailable` to the callers whose records it
concerns, and they deny.

A failed write leaves the file as it was: the file is cut back to its length before the write
(a full disk, an I/O error), so the next append, once space returns, just works. A crash in the
middle of a write can still leave a partial last line (a power cut): the writer then refuses to
append until `gateway audit repair` (`AuditLog.repair`) has moved the torn bytes aside and
recorded that it did. The gateway's log (`open_signed`) keeps a reserve of disk space for a full
disk (reserve.py): records that let no call run (a refusal, a result) are then written from it,
so a call refused for a full disk still leaves its record.

At start the writer checks the file it continues from, line by line (canonical, hashed,
chained onto the file before it): a log broken anywhere in that file is refused, not appended
to. With a checkpoint, the part of the file found sound is remembered beside it (its size and
digest), so the next start walks only what was written since.

With a key (`keys.SigningKey`), each commit's last record is signed and the head is added to a
checkpoint kept apart (`checkpoint.py`). Before each commit the writer checks the end of the log
and extends it only if it is what a holder of the key left there: the record it wrote last, the
one the checkpoint names, or a record whose signature verifies. A log that ends before its
checkpoint, beside it, in records nobody signed, that has records but no checkpoint, whose
checkpoint or pin names another key, is never extended: signing on top would launder what
someone without the key put there, or move the head back over the evidence. A new signed log
starts with an `audit_key` record naming its key (the pin). The one way past any of this is
explicit and recorded: `gateway audit adopt` (`audit_adopted`).

Calls interrupted by a crash are marked at the next start. While a call that is being handled
(`written_call_ids`) is allowed (a `decision` or an `approval` with `decision: allow`) and has not
ended (a `result`, an `error`, ...: journal.ENDS), its id is in this writer's journal
(journal.py). A writer that starts takes the journals of writers that are gone, and writes an
`interrupted` record for each call in them that the log shows allowed and never ended.

Files are used by descriptor, never through a link (files.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit import checkpoint as checkpoints
from gateway.audit import journal
from gateway.audit.files import FILE_NAME, AuditDir, write_all
from gateway.audit.keys import KEY_FILE, PUB_FILE, AuditKeyError, SigningKey
from gateway.audit.records import (
    MAX_FILE_BYTES,
    RESERVED,
    SECRET_NAME,
    AuditUnavailable,
    bound,
    canonical,
    digest,
    last_record,
    parse,
    redact,
    stub,
)
from gateway.audit.reserve import FULL, RESERVE_BYTES, AuditDiskFull, Reserve
from gateway.audit.verify import Walk, pinned, record_at, verify

MAX_BATCH_BYTES = 8 * 1024 * 1024
MAX_RECORD_BYTES = 1024 * 1024

_WRITTEN: ContextVar[set[str] | None] = ContextVar("audit_written_call_ids", default=None)
"""The call ids this context's appends named (while `written_call_ids` watches)."""


@contextlib.contextmanager
def written_call_ids() -> Iterator[set[str]]:
    """The call ids every record appended in this context names, as they are written: the gateway
    checks that a call it answers left a record (no record, no call). A call allowed in this
    context is a call being handled: until its result (or error...) is written, it is in the
    writer's journal (an `interrupted` record marks it if the gateway dies first)."""
    seen: set[str] = set()
    token = _WRITTEN.set(seen)
    try:
        yield seen
    finally:
        _WRITTEN.reset(token)


def mark_written(call_id: str) -> None:
    """A record naming `call_id` is durable (for `written_call_ids`; another ledger's appends
    call it too: gateway/audit/sink.py)."""
    seen = _WRITTEN.get()
    if seen is not None:
        seen.add(call_id)


def prepare(fields: dict[str, Any], secret_names: re.Pattern[str]) -> tuple[dict[str, Any], int]:
    """A record's body from an append's fields: secrets redacted, bounded to MAX_RECORD_BYTES,
    and its size. Raises AuditUnavailable for the writer's own fields or what is not JSON."""
    reserved = RESERVED.intersection(fields)
    if reserved:
        raise AuditUnavailable(f"audit fields {sorted(reserved)} are the writer's own")
    try:
        given = redact(bound({k: v for k, v in fields.items() if v is not None}, max_chars=1 << 30), secret_names)
        body = bound(given)
        size = len(canonical(body).encode("utf-8", "surrogatepass"))
        if size > MAX_RECORD_BYTES:  # many long fields: keep each as its size and digest
            body = bound(given, max_chars=1024, max_items=50)
            data = canonical(body).encode("utf-8", "surrogatepass")
            size = len(data)
            if size > MAX_RECORD_BYTES:
                body = stub(given, data)
                size = len(canonical(body).encode("utf-8", "surrogatepass"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise AuditUnavailable(f"audit record is not serialisable: {exc}") from exc
    return body, size


def _opens(event: Any, decision: Any) -> bool:
    """A record that lets its call go on: an allowed decision or an approval that granted it."""
    return event in ("decision", "approval") and decision == "allow"


@dataclass
class _Pending:
    event: str
    body: dict[str, Any]
    size_hint: int = 0
    record: dict[str, Any] | None = None
    error: AuditUnavailable | None = None
    wake: threading.Condition | None = None
    """Its appender's own condition (on the writer's lock): woken when this record is settled or
    when it heads the queue, never for other threads' commits."""
    spare: bool = True
    """It may be written from the reserve on a full disk (reserve.py): it lets no call run."""

    @property
    def settled(self) -> bool:
        return self.record is not None or self.error is not None


@dataclass
class _Tail:
    """The end of the log: the file to append to and its last record."""

    name: str
    last: dict[str, Any] | None
    size: int = 0
    """The file's size when its last record was read (under the lock, as the commit is)."""


@dataclass
class _Batch:
    items: list[_Pending] = field(default_factory=list)
    bytes: int = 0


@dataclass
class _Sound:
    """The part of the file the log goes on in that this writer knows is sound: walked at start,
    then extended by what it appends itself while nobody else appends (`_memo` keeps it)."""

    file: str
    size: int
    sha: Any  # hashlib's running SHA-256 of the file's first `size` bytes
    prev: str  # the hash of the last record in them
    seq: int
    lines: int
    named: tuple[str, int] | None  # the last key the log named, and where
    saved: int = 0  # `size` when the memo was last written

    def memo(self) -> dict[str, Any]:
        return {"file": self.file, "size": self.size, "sha256": self.sha.hexdigest(), "prev": self.prev,
                "seq": self.seq, "lines": self.lines, "named": list(self.named) if self.named else None}  # fmt: skip


MEMO_EVERY = 1 << 20
"""Bytes a writer appends between two updates of the memo (so a restart walks at most these)."""


@dataclass(frozen=True)
class Repair:
    """What `AuditLog.repair` moved aside (and recorded as `audit_repaired`)."""

    file: str
    offset: int
    bytes: int
    sha256: str
    kept_as: str
    records: int  # complete but unsigned records moved aside (a commit a crash cut short)
    first_seq: int  # the seq the first line moved aside had, or would have had


class AuditLog:
    """The writer. One per process and directory is enough; it is safe across threads and
    processes. `key` signs every record; `checkpoint` (a file outside `directory`) keeps the head.
    `adopt`: go on with a log nothing here vouches for (`gateway audit adopt`, which checked it
    first). `check=False` skips the checks at start (and the marking of interrupted calls): only
    for `repair`, which checks the whole log itself."""

    def __init__(
        self,
        directory: Path,
        max_file_bytes: int = MAX_FILE_BYTES,
        redact: list[str] | None = None,
        *,
        key: SigningKey | None = None,
        checkpoint: Path | None = None,
        adopt: bool = False,
        check: bool = True,
        reserve_bytes: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.secret_names = re.compile("|".join([SECRET_NAME.pattern, *(redact or [])]), re.IGNORECASE)
        self.key = key
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        # a log nothing here vouches for (no checkpoint, another key) is extended only when
        # adopting it is said outright: `gateway audit adopt`, which verified it first
        self._adopt = adopt
        self._mutex = threading.Lock()  # the queue and whether a commit is in flight
        self._queue: list[_Pending] = []
        self._committing = False
        self._trusted = ""  # the hash of the last record this writer wrote or checked
        self._high = 0  # the highest seq this writer has seen on disk: the log must never go below it
        # told when appends start failing (the error) and when they work again (None): `gateway
        # serve` prints a line for each change, so the operator hears of it at once
        self.on_health: Callable[[str | None], None] | None = None
        self._failing = False
        self._sound: _Sound | None = None
        self._closed = True  # until its descriptors are all open
        self._dir = AuditDir(self.directory, create=True)
        self._lock_fd = self._dir.lock()
        self.reserve = Reserve(self._dir, reserve_bytes)
        """Space kept for the records that let no call run, when the disk is full (reserve.py)."""
        # this writer's calls that are allowed and not ended (journal.py)
        self._journal = journal.Journal(self._dir, lambda: self._high)
        self._closed = False
        if self.checkpoint is not None:
            if key is None:
                raise AuditUnavailable("a checkpoint needs a signing key")
            try:
                checkpoints.prepare(self.checkpoint, self.directory)
            except checkpoints.CheckpointError as exc:
                raise AuditUnavailable(str(exc)) from exc
        if check:
            with self._locked():
                self.reserve.refill(now=True)
                self._start()

    def close(self) -> None:
        """Let the log's descriptors go (its directory, lock and journal); appending afterwards
        raises AuditUnavailable. A writer dropped without close() closes them when collected: a
        process that makes many (a test run, a server re-made per request) must not keep them."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
        self._journal.close()
        os.close(self._lock_fd)
        self._dir.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not self.__dict__.get("_closed", True):
                self.close()

    # --- appending -------------------------------------------------------------------------------
    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one record durably and return it. Raises AuditUnavailable."""
        if self._closed:
            raise AuditUnavailable(f"the audit log {self.directory} is closed")
        body, size = prepare(fields, self.secret_names)
        call_id = fields.get("call_id")
        call_id = call_id if isinstance(call_id, str) else None
        opens = call_id is not None and _WRITTEN.get() is not None and _opens(event, fields.get("decision"))
        if opens and call_id is not None:
            try:  # before the record: a crash after it leaves the call journaled
                self._journal.opened(call_id)
            except OSError as exc:
                raise AuditUnavailable(
                    f"cannot write the journal of running calls in {self.directory}: {exc.strerror or exc}"
                ) from exc
        spare = not _opens(event, fields.get("decision"))
        pending = _Pending(event, body, size, wake=threading.Condition(self._mutex), spare=spare)
        wake = pending.wake
        assert wake is not None
        with self._mutex:
            self._queue.append(pending)
            while not pending.settled:
                if self._committing:
                    wake.wait()
                    continue
                self._committing = True
                batch = self._take()
                self._mutex.release()
                try:
                    self._commit(batch)
                finally:
                    self._mutex.acquire()
                    self._committing = False
                    # wake whose records this commit settled, and the queue's head (it commits
                    # next): a commit does not wake every waiting thread to look and sleep again
                    for p in batch:
                        if p is not pending and p.wake is not None:
                            p.wake.notify()
                    if self._queue and self._queue[0].wake is not None:
                        self._queue[0].wake.notify()
        self._health(pending.error)
        if call_id is not None and (pending.error is not None if opens else event in journal.ENDS):
            self._journal.ended(call_id)  # its result, error, ... (or its allowing record failed)
        if pending.error is not None:
            raise pending.error
        assert pending.record is not None
        seen = _WRITTEN.get()  # only a record on disk counts as the call's record
        if seen is not None and call_id is not None:
            seen.add(call_id)
        return pending.record

    def _health(self, error: AuditUnavailable | None) -> None:
        """Tell `on_health` when the log turns unwritable or writable again (changes only)."""
        with self._mutex:
            changed = (error is not None) != self._failing
            self._failing = error is not None
        if changed and self.on_health is not None:
            with contextlib.suppress(Exception):  # a notice that fails changes nothing about the record
                self.on_health(None if error is None else str(error))

    def _take(self) -> list[_Pending]:
        """The queued records to commit now: all of them, up to MAX_BATCH_BYTES (at least one)."""
        batch = _Batch()
        while self._queue and (not batch.items or batch.bytes < MAX_BATCH_BYTES):
            item = self._queue.pop(0)
            batch.items.append(item)
            batch.bytes += item.size_hint or 1024
        return batch.items

    def _commit(self, batch: list[_Pending]) -> None:
        try:
            with self._locked():
                if self.reserve.in_use():  # the disk is full: no call may run, its refusal is recorded
                    full = AuditDiskFull(
                        f"cannot write the audit log {self.directory}: the disk is full (the space kept for the "
                        "log is in use; calls run again once the disk has room)"
                    )
                    self._commit_spare(batch, full, release=False)
                else:
                    try:
                        self._commit_locked(batch)
                    except AuditDiskFull as full:
                        self._commit_spare(batch, full)
                self.reserve.refill()
        except AuditUnavailable as exc:
            for p in batch:
                if not p.settled:
                    p.error = exc
        except BaseException as exc:  # a bug: every caller still gets an answer, and denies
            for p in batch:
                if not p.settled:
                    p.error = AuditUnavailable(f"internal error in the audit writer: {exc!r}")
            if not isinstance(exc, Exception):
                raise

    def _commit_spare(self, batch: list[_Pending], full: AuditDiskFull, release: bool = True) -> None:
        """The disk is full: write the records that let no call run from the reserve (a piece
        given back at a time, when what was given before is used up: someone else may take
        some of it first), and fail the others."""
        for p in batch:
            if not p.settled and not p.spare:
                p.error = full
        spare = [p for p in batch if not p.settled]
        need = sum(p.size_hint or 1024 for p in spare) + 1024  # the records, and a checkpoint line
        while spare:
            if release and not self.reserve.release(need):
                raise full
            release = True
            try:
                self._commit_locked(spare)
                return
            except AuditDiskFull as again:
                full = again

    def _commit_now(self, batch: list[_Pending]) -> None:
        """Commit the writer's own records while the lock is held (start-up, repair); raises."""
        self._commit_locked(batch)
        for p in batch:
            if p.error is not None:
                raise p.error

    def _commit_locked(self, batch: list[_Pending]) -> None:
        tail = self._tail()
        self._check_end(tail, deep=False)
        last = tail.last
        seq = last["seq"] if last else 0
        prev = last["hash"] if last else ""
        made: list[tuple[_Pending, dict[str, Any]]] = []
        for p in batch:
            record: dict[str, Any] = {
                "seq": seq + 1,
                "ts": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
                "event": p.event,
                **p.body,
                "prev": prev,
            }
            try:
                record["hash"] = digest(record)
            except (TypeError, ValueError, RecursionError) as exc:
                p.error = AuditUnavailable(f"audit record is not serialisable: {exc}")
                continue
            seq, prev = record["seq"], record["hash"]
            made.append((p, record))
        if not made:
            return
        if self.key is not None:
            # the commit's last record is signed: through the chain its signature covers every
            # record before it (one signature per fdatasync, however many threads committed)
            made[-1][1]["sig"] = self.key.sign(made[-1][1]["hash"])
        chunks = [(canonical(record) + "\n").encode("utf-8") for _, record in made]
        data = b"".join(chunks)
        name = tail.name
        if tail.last is not None and tail.size + len(data) > self.max_file_bytes:
            name = self._next_file(name)
        before = self._write(name, data)
        head = made[-1][1]
        self._extend_sound(name, before, data, [record for _, record in made])
        self._high = head["seq"]
        self._trusted = head["hash"]
        if self.checkpoint is not None and self.key is not None:
            checkpoint = checkpoints.Checkpoint.of(self._dir.real(), head, self.key.public.fingerprint)
            try:
                try:
                    checkpoints.write(self.checkpoint, checkpoint)
                except checkpoints.CheckpointError as exc:
                    if exc.errno not in FULL or not self.reserve.release(1024):
                        raise
                    checkpoints.write(self.checkpoint, checkpoint)  # the records are written: so must the head be
            except checkpoints.CheckpointError as exc:
                # the records are on disk (harmless: nothing has run yet) but the head is not kept
                # apart: fail closed, the callers deny
                raise AuditUnavailable(f"records written but the head was not: {exc}") from exc
        self._adopt = False
        for p, record in made:
            p.record = record

    def _write(self, name: str, data: bytes) -> int:
        """Append `data` and make it durable, or leave the file exactly as it was. Returns the
        file's size before."""
        try:
            fd = self._dir.open_append(name)
        except OSError as exc:
            kind = AuditDiskFull if exc.errno in FULL else AuditUnavailable
            raise kind(f"cannot write the audit log {self.directory / name}: {exc.strerror or exc}") from exc
        try:
            before = os.fstat(fd).st_size
            try:
                write_all(fd, data)
                os.fdatasync(fd)
            except OSError as exc:
                self._cut_back(fd, before)
                kind = AuditDiskFull if exc.errno in FULL else AuditUnavailable
                raise kind(f"cannot write the audit log {self.directory / name}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        return before

    def _cut_back(self, fd: int, size: int) -> None:
        """Undo a failed append: shrinking a file needs no space, so this works on a full disk."""
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
                os.fdatasync(fd)
        except OSError:
            pass  # the disk is gone: the next append's check of the end reports it

    # --- the end of the log ----------------------------------------------------------------------
    def _locked(self) -> _Flock:
        return _Flock(self._lock_fd)

    @staticmethod
    def _next_file(name: str) -> str:
        m = FILE_NAME.match(name)
        return f"audit-{int(m.group(1)) + 1 if m else 1:06d}.jsonl"

    def _last_of(self, name: str) -> dict[str, Any] | None:
        try:
            fd = self._dir.open_read(name)
        except OSError as exc:
            raise AuditUnavailable(f"cannot use the audit log {self.directory / name}: {exc.strerror or exc}") from exc
        try:
            return last_record(fd, name)
        finally:
            os.close(fd)

    def _tail(self) -> _Tail:
        """The file to append to and the last record of the chain, read from disk every time
        (another process, or someone else, may have changed it since)."""
        names = self._dir.names()
        for name in reversed(names):
            try:
                fd = self._dir.open_read(name)
            except OSError as exc:
                raise AuditUnavailable(
                    f"cannot use the audit log {self.directory / name}: {exc.strerror or exc}"
                ) from exc
            try:
                size = os.fstat(fd).st_size
                last = last_record(fd, name)
            except OSError as exc:
                where = self.directory / name
                raise AuditUnavailable(f"cannot use the audit log {where}: {exc.strerror or exc}") from exc
            finally:
                os.close(fd)
            if last is not None:
                return _Tail(name, last, size)
        return _Tail(names[-1] if names else "audit-000001.jsonl", None)

    def _check_end(self, tail: _Tail, *, deep: bool, seen: dict[int, str] | None = None) -> None:
        """Refuse to extend a log whose end is not what a holder of the key left there (see the
        module's docstring). `deep` (at start) also checks the checkpoint's own record when the
        log has gone on past it (a crash between a commit and its checkpoint): from `seen` (what
        the walk of the last file met), else read from the file that holds it."""
        last = tail.last
        seq = last["seq"] if last else 0
        if seq < self._high:
            raise AuditUnavailable(
                f"the audit log went backwards: it ends at seq {seq}, this gateway wrote up to {self._high}: "
                "it was truncated or replaced; see `gateway audit verify`"
            )
        if self.key is None or self.checkpoint is None:
            self._high = seq
            return
        try:
            cp = checkpoints.latest(self.checkpoint)
        except checkpoints.CheckpointError as exc:
            raise AuditUnavailable(str(exc)) from exc
        mine = self.key.public.fingerprint
        if cp is None:
            if last is not None and not self._adopt:
                raise AuditUnavailable(
                    f"the audit log {self.directory} has {seq} records but no checkpoint at {self.checkpoint}: "
                    "it was removed, or this log was not written with this key (moved, restored, replaced). "
                    "Check it (`gateway audit verify --no-checkpoint --key ...`), then `gateway audit adopt` "
                    "to go on with it, or start a new audit directory"
                )
        else:
            if cp.key and cp.key != mine and not self._adopt:
                raise AuditUnavailable(
                    f"the checkpoint {self.checkpoint} says the audit log was last signed with key {cp.key}, but "
                    f"this gateway's key is {mine}: the signing key was replaced. Restore the key the log was "
                    "signed with; if it is lost, `gateway audit adopt --new-key` goes on under a new one, on the record"
                )
            if seq < cp.seq:
                raise AuditUnavailable(
                    f"the audit log ends at seq {seq} but its checkpoint {self.checkpoint} says it reached seq "
                    f"{cp.seq} ({cp.ts}): records were removed. See `gateway audit verify`; if the log was "
                    "archived on purpose, move the checkpoint away with it"
                )
            if seq == cp.seq and last is not None and last["hash"] != cp.hash:
                raise AuditUnavailable(
                    f"the audit log's record seq {seq} is not the one its checkpoint {self.checkpoint} names: "
                    "the log was rewritten. See `gateway audit verify`"
                )
            if deep and seq > cp.seq:
                found = (seen or {}).get(cp.seq) or (record_at(self.directory, cp.seq) or {}).get("hash")
                if found != cp.hash:
                    raise AuditUnavailable(
                        f"the audit log's record seq {cp.seq} is not the one its checkpoint {self.checkpoint} "
                        "names: the log was rewritten. See `gateway audit verify`"
                    )
        if last is not None and digest(last) != last["hash"]:
            raise AuditUnavailable(
                f"the audit log's last record (seq {seq}) does not match its hash: it was edited. "
                "See `gateway audit verify`"
            )
        adopting = self._adopt and cp is None  # `gateway audit adopt` checked the log before
        if deep and last is not None and "sig" in last and not adopting and not self._signed_here(last):
            # the key this log was last signed with is not the one here: a checkpoint (copied
            # into a replaced key directory, say) does not make up for it
            raise AuditUnavailable(
                f"the audit log's last record (seq {seq}) is not signed by this gateway's key "
                f"{self.key.public.fingerprint}: the log was signed with another key, or rewritten. Restore the "
                "key the log was signed with; if it is lost, `gateway audit adopt --new-key` goes on under a new "
                "one, on the record. See `gateway audit verify`"
            )
        vouched = last is None or last["hash"] == self._trusted or (cp is not None and cp.seq == seq)
        if not vouched and not adopting and not self._signed_here(last):
            # an end neither this writer nor the checkpoint vouches for, and no signature of ours
            raise AuditUnavailable(
                f"the audit log ends in a record (seq {seq}) no holder of this gateway's key signed: records "
                "were added or rewritten without the key, or a crash cut a commit short. "
                "See `gateway audit verify`; `gateway audit repair` handles a crash"
            )
        self._trusted = last["hash"] if last else ""
        self._high = seq

    def _signed_here(self, record: dict[str, Any] | None) -> bool:
        if record is None or self.key is None:
            return False
        sig = record.get("sig")
        try:
            return (
                isinstance(sig, str)
                and digest(record) == record["hash"]
                and self.key.public.verify(record["hash"], sig)
            )
        except (TypeError, ValueError):
            return False

    # --- at start --------------------------------------------------------------------------------
    def _start(self) -> None:
        """What a writer checks and writes before its first append (the lock held): the file it
        continues from, the end, the calls dead writers left open; a new signed log's pin."""
        tail = self._tail()
        try:
            cp = checkpoints.latest(self.checkpoint) if self.checkpoint is not None else None
        except checkpoints.CheckpointError as exc:
            raise AuditUnavailable(str(exc)) from exc
        seen = self._check_file(tail, cp.seq if cp is not None else None)
        self._check_end(tail, deep=True, seen=seen)
        self._recover()
        if self.key is not None and tail.last is None and not self._adopt:
            public = self.key.public
            pin = {"public": public.line().strip(), "fingerprint": public.fingerprint}
            self._commit_now([_Pending("audit_key", {"data": pin})])

    def _check_file(self, tail: _Tail, wanted: int | None) -> dict[int, str]:
        """Walk the file the log goes on in, from the previous file's last record: a log broken
        anywhere in it (an edited, removed or inserted record, a line not as written) is refused.
        The part found sound is remembered beside the checkpoint (`_memo`): unchanged since, it
        is not walked again. Returns the hash of record `wanted` if the walk met it."""
        if tail.last is None:
            return {}
        names = self._dir.names()
        prev, seq = "", 1
        for before in reversed(names[: names.index(tail.name)]):
            found = self._last_of(before)
            if found is not None:
                prev, seq = str(found.get("hash")), int(found.get("seq") or 0) + 1
                break
        try:
            data = self._dir.read_all(tail.name)
        except OSError as exc:
            raise AuditUnavailable(f"cannot read the audit log {self.directory / tail.name}: {exc.strerror}") from exc
        start, first_line, named = 0, 1, None
        memo = self._memo()
        size = memo.get("size")
        if (
            memo.get("file") == tail.name
            and isinstance(size, int)
            and 0 < size <= len(data)
            and data[size - 1 : size] == b"\n"
            and hashlib.sha256(data[:size]).hexdigest() == memo.get("sha256")
        ):
            start, first_line = size, int(memo.get("lines") or 0) + 1
            prev, seq = str(memo.get("prev")), int(memo.get("seq") or 0) + 1
            remembered = memo.get("named")
            if isinstance(remembered, list) and len(remembered) == 2:
                named = (str(remembered[0]), int(remembered[1]))
        walk = Walk((), prev, seq, wanted=frozenset(() if wanted is None else (wanted,)))
        lines = data[start:].splitlines(keepends=True)
        path = self.directory / tail.name
        for i, raw in enumerate(lines):
            problem = walk.step(path, first_line + i, parse(raw), raw, final=i == len(lines) - 1)
            if problem is not None:
                raise AuditUnavailable(
                    f"the audit log is broken at {self.directory / problem.file}:{problem.line} (seq {problem.seq}): "
                    f"{problem.problem}. The gateway does not append to a log that does not verify: see "
                    "`gateway audit verify`"
                )
        named = walk.named or named
        if self.key is not None and not self._adopt and named is not None and named[0] != self.key.public.fingerprint:
            raise AuditUnavailable(
                f"the audit log {self.directory} names key {named[0]} (record seq {named[1]}) as the key it is signed "
                f"with, but this gateway's key is {self.key.public.fingerprint}: the key directory was replaced or "
                "points elsewhere. Restore the key the log was signed with; if it is lost, `gateway audit adopt "
                "--new-key` goes on under a new one, on the record"
            )
        if self._memo_path() is not None:
            sound = _Sound(tail.name, len(data), hashlib.sha256(data), walk.prev, walk.seq - 1,
                           first_line - 1 + len(lines), named, len(data))  # fmt: skip
            self._sound = sound
            self._remember(sound.memo())
        return walk.hashes

    def _extend_sound(self, name: str, before: int, data: bytes, made: list[dict[str, Any]]) -> None:
        """Add what this writer just appended to the part it knows is sound, and write the memo
        every MEMO_EVERY bytes. Once another writer appended in between, it knows no more (until
        the next start walks the file)."""
        if self._memo_path() is None:
            return
        sound = self._sound
        if before == 0:  # a new file: the walk starts from the previous file's last record
            named = sound.named if sound is not None else None
            sound = _Sound(name, 0, hashlib.sha256(), "", 0, 0, named)
        elif sound is None or sound.file != name or sound.size != before:
            self._sound = None
            return
        sound.sha.update(data)
        sound.size += len(data)
        sound.prev, sound.seq, sound.lines = made[-1]["hash"], made[-1]["seq"], sound.lines + len(made)
        for record in made:
            key = pinned(record)
            if key is not None:
                sound.named = (key.fingerprint, record["seq"])
        self._sound = sound
        if sound.size - sound.saved >= MEMO_EVERY or sound.saved == 0:
            self._remember(sound.memo())
            sound.saved = sound.size

    def _memo_path(self) -> Path | None:
        if self.checkpoint is None:
            return None
        return self.checkpoint.with_name(self.checkpoint.stem + ".verified")

    def _memo(self) -> dict[str, Any]:
        """What the last start found sound (a cache kept beside the checkpoint, out of the
        audit directory: whoever could rewrite the log cannot rewrite this)."""
        path = self._memo_path()
        if path is None:
            return {}
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                value = json.loads(f.read(64 * 1024))
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def _remember(self, memo: dict[str, Any]) -> None:
        path = self._memo_path()
        if path is None:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                write_all(fd, json.dumps(memo, sort_keys=True).encode())
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:  # a cache: the next start walks the whole file again
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    # --- calls interrupted by a crash --------------------------------------------------------------
    def _recover(self) -> None:
        """Mark the calls of every writer that died (journal.py), then let its journal go."""
        for header, calls in journal.dead(self._dir, self._journal.name):
            if calls:
                self._mark_interrupted(header, calls)

    def _mark_interrupted(self, header: dict[str, Any], calls: set[str]) -> None:
        """An `interrupted` record for each of `calls` the log shows allowed and not ended."""
        seq = header.get("seq")
        since = seq if isinstance(seq, int) else 0
        allowed: dict[str, dict[str, Any]] = {}
        ended: set[str] = set()
        needles = [(c, f'"call_id":"{c}"'.encode()) for c in calls]
        for raw in self._lines_since(since):
            if not any(needle in raw for _, needle in needles):
                continue
            record = parse(raw)
            call_id = record.get("call_id") if record else None
            if record is None or call_id not in calls:
                continue
            if _opens(record.get("event"), record.get("decision")):
                allowed[call_id] = record
                ended.discard(call_id)
            elif call_id in allowed and record.get("event") in journal.ENDS:
                ended.add(call_id)
        pid = header.get("pid")
        why = (
            f"the gateway that allowed it (pid {pid}) ended before it recorded how the call ended: it was "
            "killed or it crashed. What the call did is unknown; its sandbox did not outlive that gateway"
        )
        batch = []
        for call_id, record in sorted(allowed.items(), key=lambda kv: int(kv[1].get("seq") or 0)):
            if call_id in ended:
                continue
            fields: dict[str, Any] = {"call_id": call_id}
            for name in ("principal", "tool", "parent", "policy_sha256"):
                if isinstance(record.get(name), str):
                    fields[name] = record[name]
            data = {"why": why, "pid": pid, "allowed_seq": record.get("seq"), "since": header.get("started")}
            batch.append(_Pending("interrupted", {**fields, "data": data}))
        if batch:
            self._commit_now(batch)

    def _lines_since(self, since: int) -> Iterable[bytes]:
        """The log's lines from the file holding record `since` on (read by descriptor)."""
        names = self._dir.names()
        first = 0
        for i in range(len(names) - 1, -1, -1):
            try:
                fd = self._dir.open_read(names[i])
            except OSError:
                continue
            try:
                head = parse(os.pread(fd, 64 * 1024, 0).split(b"\n", 1)[0])
            finally:
                os.close(fd)
            start = head.get("seq") if head else None
            if isinstance(start, int) and start <= max(since, 1):
                first = i
                break
        for name in names[first:]:
            try:
                data = self._dir.read_all(name)
            except OSError:
                continue
            yield from data.splitlines(keepends=True)

    # --- repair ----------------------------------------------------------------------------------
    def repair(self) -> Repair | None:
        """Move what a crash left at the end aside and record it (`audit_repaired`), in one go
        under the log's lock: a torn last line, and with a key the complete records after the
        last signature (a commit the crash cut short: never acknowledged, so nothing ran on
        them). Never a record a checkpoint covers (then it was not a crash: records were cut),
        never anything when the log has another problem (repair never hides tampering). If the
        repair cannot be recorded, the bytes are put back and it raises. None when there is
        nothing to repair."""
        with self._locked():
            try:
                cp = checkpoints.latest(self.checkpoint) if self.checkpoint is not None else None
            except checkpoints.CheckpointError as exc:
                raise AuditUnavailable(str(exc)) from exc
            result = verify(self.directory, self.key.public if self.key else None, [cp] if cp else None)
            if result.ok:
                return None
            names = self._dir.names()
            if not result.torn or result.file != (names or [""])[-1]:
                raise AuditUnavailable(f"not repairable: {result.describe()}")
            if self.key is not None and cp is None and not self._adopt:
                raise AuditUnavailable(
                    f"not repairable here: the log has no checkpoint at {self.checkpoint}, so nothing tells which "
                    "records it reached. See `gateway audit verify --no-checkpoint`"
                )
            name = result.file
            lines = self._dir.read_all(name).splitlines(keepends=True)
            cut = (result.tail_line or result.line) - 1
            kept = b"".join(lines[:cut])
            before = parse(lines[cut - 1]) if cut else None
            if not cut:
                earlier = [n for n in names if n != name]
                before = self._last_of(earlier[-1]) if earlier else None
            kept_seq = int(before.get("seq") or 0) if before else 0
            if cp is not None and cp.seq > kept_seq:
                raise AuditUnavailable(
                    f"not repairable: from {name}:{cut + 1} on the log would hold seq {kept_seq + 1} and later, which "
                    f"the checkpoint of {cp.ts} covers (the log reached seq {cp.seq}): acknowledged records are not "
                    "torn by a crash, they were cut. See `gateway audit verify`"
                )
            torn = b"".join(lines[cut:])
            aside = f"{name}.torn-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}"
            try:
                fd = self._dir.create_new(aside)
                try:
                    write_all(fd, torn)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._truncate(name, len(kept))
            except OSError as exc:
                raise AuditUnavailable(f"cannot move the torn end aside: {exc.strerror or exc}") from exc
            whole = sum(1 for line in lines[cut:] if line.endswith(b"\n"))
            done = Repair(name, len(kept), len(torn), hashlib.sha256(torn).hexdigest(), aside, whole, kept_seq + 1)
            data = {"file": done.file, "offset": done.offset, "bytes": done.bytes, "sha256": done.sha256,
                    "kept_as": done.kept_as, "records": done.records, "first_seq": done.first_seq}  # fmt: skip
            try:
                self._commit_now([_Pending("audit_repaired", {"data": data})])
            except AuditUnavailable as exc:
                try:  # the repair is not on the record: it did not happen
                    fd = self._dir.open_append(name)
                    try:
                        write_all(fd, torn)
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    os.unlink(aside, dir_fd=self._dir.fd)
                except OSError as undo:
                    raise AuditUnavailable(
                        f"the repair could not be recorded ({exc}), nor undone ({undo.strerror}): the torn end is "
                        f"kept whole in {self.directory / aside}"
                    ) from exc
                raise AuditUnavailable(
                    f"the repair could not be recorded ({exc}): the log was put back as it was"
                ) from exc
            return done

    def _truncate(self, name: str, size: int) -> None:
        fd = self._dir.open_write(name)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)


class _Flock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise AuditUnavailable(f"cannot lock the audit log: {exc.strerror}") from exc

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def has_records(directory: Path) -> bool:
    """Whether the audit directory holds a log file with anything in it."""
    try:
        with AuditDir(directory) as d:
            for name in d.names():
                with contextlib.suppress(OSError):
                    fd = d.open_read(name)
                    try:
                        if os.fstat(fd).st_size > 0:
                            return True
                    finally:
                        os.close(fd)
    except AuditUnavailable:
        return False
    return False


def _first_pin(directory: Path) -> str:
    """The key the log's first record names (an `audit_key` pin), as text for a message."""
    with contextlib.suppress(AuditUnavailable, OSError), AuditDir(directory) as d:
        names = d.names()
        if names:
            fd = d.open_read(names[0])
            try:
                first = parse(os.pread(fd, 64 * 1024, 0).split(b"\n", 1)[0])
            finally:
                os.close(fd)
            key = pinned(first) if first else None
            if key is not None:
                return f" (its first record names key {key.fingerprint})"
    return ""


def open_signed(
    directory: Path,
    key_dir: Path,
    redact: list[str] | None = None,
    *,
    create: bool = True,
    adopt: bool = False,
    check: bool = True,
    reserve_bytes: int = RESERVE_BYTES,
) -> AuditLog:
    """The gateway's log: signed with the key in `key_dir`, its head kept in
    `key_dir/checkpoints/`, with a reserve of `reserve_bytes` for a full disk (reserve.py). A
    key is made only for a log with no records (and only if `create`): a log with records and
    no key is refused, never signed on top by a new key. Raises AuditUnavailable with the
    reason and the remedy."""
    directory, key_dir = Path(directory), Path(key_dir)
    found = has_records(directory)
    try:
        key = SigningKey.load_or_create(key_dir, may_create=not found) if create else SigningKey.load(key_dir)
    except AuditKeyError as exc:
        lost = not os.path.lexists(key_dir / KEY_FILE) and not os.path.lexists(key_dir / PUB_FILE)
        if found and lost:
            raise AuditUnavailable(
                f"the audit log {directory} has records, but there is no signing key in {key_dir}"
                f"{_first_pin(directory)}: the key the log was signed with is gone (deleted, or --audit-keys names "
                "another directory), and a new key would sign over whatever the log now holds. Restore the key "
                "directory from a backup, or go on with this log under a new key: `gateway audit adopt --new-key "
                f"--audit-dir {directory} --audit-keys {key_dir}` (it checks the log as far as it can and records "
                "the adoption in it)"
            ) from None
        raise AuditUnavailable(str(exc)) from exc
    return AuditLog(
        directory, redact=redact, key=key, checkpoint=checkpoints.default_path(directory, key_dir), adopt=adopt,
        check=check, reserve_bytes=reserve_bytes,
    )  # fmt: skip
