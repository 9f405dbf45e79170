"""The writer: appends records durably, signs them, keeps the head's checkpoint, never tears.

Appends are serialised across threads and processes (`flock` on `.lock` in the audit directory).
Threads of one process commit together: whoever finds the log idle writes every record queued
so far in one `write` and one `fdatasync` (group commit), and each caller returns once its own
record is on disk. Any failure raises `AuditUnavailable` to the callers whose records it
concerns, and they deny.

A failed write leaves the file as it was: the file is cut back to its length before the write
(a full disk, an I/O error), so the next append, once space returns, just works. A crash in the
middle of a write can still leave a partial last line (a power cut): the writer then refuses to
append until `gateway audit repair` has moved the torn bytes aside and recorded that it did.

With a key (`keys.SigningKey`), each commit's last record is signed and the head is added to a
checkpoint kept apart (`checkpoint.py`). Before each commit the writer checks the end of the log
and extends it only if it is what a holder of the key left there: the record it wrote last, the
one the checkpoint names, or a record whose signature verifies. A log that ends before its
checkpoint, beside it, in records nobody signed, or that has records but no checkpoint, is never
extended: signing on top would launder what someone without the key put there, or move the head
back over the evidence. The one exception is explicit: a log from before signing, adopted when
its key is made or by `gateway audit adopt`.

Files are used by descriptor, never through a link (files.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit import checkpoint as checkpoints
from gateway.audit.files import FILE_NAME, AuditDir
from gateway.audit.keys import SigningKey
from gateway.audit.records import (
    MAX_FILE_BYTES,
    RESERVED,
    SECRET_NAME,
    AuditUnavailable,
    bound,
    canonical,
    digest,
    last_record,
    redact,
    stub,
)

MAX_BATCH_BYTES = 8 * 1024 * 1024
MAX_RECORD_BYTES = 1024 * 1024

_WRITTEN: ContextVar[set[str] | None] = ContextVar("audit_written_call_ids", default=None)
"""The call ids this context's appends named (while `written_call_ids` watches)."""


@contextlib.contextmanager
def written_call_ids() -> Iterator[set[str]]:
    """The call ids every record appended in this context names, as they are written: the gateway
    checks that a call it answers left a record (no record, no call)."""
    seen: set[str] = set()
    token = _WRITTEN.set(seen)
    try:
        yield seen
    finally:
        _WRITTEN.reset(token)


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


class AuditLog:
    """The writer. One per process and directory is enough; it is safe across threads and
    processes. `key` signs every record; `checkpoint` (a file outside `directory`) keeps the head."""

    def __init__(
        self,
        directory: Path,
        max_file_bytes: int = MAX_FILE_BYTES,
        redact: list[str] | None = None,
        *,
        key: SigningKey | None = None,
        checkpoint: Path | None = None,
        adopt: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.secret_names = re.compile("|".join([SECRET_NAME.pattern, *(redact or [])]), re.IGNORECASE)
        self.key = key
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        # a log with records but no checkpoint is extended only when adopting it is said
        # outright (`gateway audit adopt`) or its key was made just now (a log from before signing)
        self._adopt = adopt or bool(key is not None and key.created)
        self._mutex = threading.Lock()  # the queue and whether a commit is in flight
        self._queue: list[_Pending] = []
        self._committing = False
        self._trusted = ""  # the hash of the last record this writer wrote or checked
        self._high = 0  # the highest seq this writer has seen on disk: the log must never go below it
        # told when appends start failing (the error) and when they work again (None): `gateway
        # serve` prints a line for each change, so the operator hears of it at once
        self.on_health: Callable[[str | None], None] | None = None
        self._failing = False
        self._dir = AuditDir(self.directory, create=True)
        self._lock_fd = self._dir.lock()
        if self.checkpoint is not None:
            if key is None:
                raise AuditUnavailable("a checkpoint needs a signing key")
            try:
                checkpoints.prepare(self.checkpoint, self.directory)
            except checkpoints.CheckpointError as exc:
                raise AuditUnavailable(str(exc)) from exc
        with self._locked():
            self._check_end(self._tail(), deep=True)

    # --- appending -------------------------------------------------------------------------------
    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one record durably and return it. Raises AuditUnavailable."""
        reserved = RESERVED.intersection(fields)
        if reserved:
            raise AuditUnavailable(f"audit fields {sorted(reserved)} are the writer's own")
        try:
            given = redact(
                bound({k: v for k, v in fields.items() if v is not None}, max_chars=1 << 30), self.secret_names
            )
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
        pending = _Pending(event, body, size, wake=threading.Condition(self._mutex))
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
        if pending.error is not None:
            raise pending.error
        assert pending.record is not None
        seen = _WRITTEN.get()  # only a record on disk counts as the call's record
        if seen is not None and isinstance(fields.get("call_id"), str):
            seen.add(fields["call_id"])
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
                self._commit_locked(batch)
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
        self._write(name, data)
        head = made[-1][1]
        self._high = head["seq"]
        self._trusted = head["hash"]
        if self.checkpoint is not None and self.key is not None:
            try:
                checkpoints.write(
                    self.checkpoint, checkpoints.Checkpoint.of(self._dir.real(), head, self.key.public.fingerprint)
                )
            except checkpoints.CheckpointError as exc:
                # the records are on disk (harmless: nothing has run yet) but the head is not kept
                # apart: fail closed, the callers deny
                raise AuditUnavailable(f"records written but the head was not: {exc}") from exc
        self._adopt = False
        for p, record in made:
            p.record = record

    def _write(self, name: str, data: bytes) -> None:
        """Append `data` and make it durable, or leave the file exactly as it was."""
        try:
            fd = self._dir.open_append(name)
        except OSError as exc:
            raise AuditUnavailable(
                f"cannot write the audit log {self.directory / name}: {exc.strerror or exc}"
            ) from exc
        try:
            before = os.fstat(fd).st_size
            try:
                view, done = memoryview(data), 0
                while done < len(data):  # a short write is retried: the next one says why (ENOSPC)
                    n = os.write(fd, view[done:])
                    if n <= 0:
                        raise OSError(errno.EIO, f"write returned {n} after {done} of {len(data)} bytes")
                    done += n
                os.fdatasync(fd)
            except OSError as exc:
                self._cut_back(fd, before)
                raise AuditUnavailable(
                    f"cannot write the audit log {self.directory / name}: {exc.strerror or exc}"
                ) from exc
        finally:
            os.close(fd)

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

    def _check_end(self, tail: _Tail, *, deep: bool) -> None:
        """Refuse to extend a log whose end is not what a holder of the key left there (see the
        module's docstring). `deep` (at start) also checks the checkpoint's own record when the
        log has gone on past it (a crash between a commit and its checkpoint)."""
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
        if cp is None:
            if last is not None and not self._adopt:
                raise AuditUnavailable(
                    f"the audit log {self.directory} has {seq} records but no checkpoint at {self.checkpoint}: "
                    "it was removed, or this log was not written with this key (moved, restored, replaced). "
                    "Check it (`gateway audit verify --no-checkpoint --key ...`), then `gateway audit adopt` "
                    "to go on with it, or start a new audit directory"
                )
        else:
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
                from gateway.audit.verify import record_at

                found = record_at(self.directory, cp.seq)
                if found is None or found.get("hash") != cp.hash:
                    raise AuditUnavailable(
                        f"the audit log's record seq {cp.seq} is not the one its checkpoint {self.checkpoint} "
                        "names: the log was rewritten. See `gateway audit verify`"
                    )
        if last is not None and digest(last) != last["hash"]:
            raise AuditUnavailable(
                f"the audit log's last record (seq {seq}) does not match its hash: it was edited. "
                "See `gateway audit verify`"
            )
        vouched = last is None or last["hash"] == self._trusted or (cp is not None and cp.seq == seq)
        legacy = self._adopt and cp is None and last is not None and "sig" not in last
        if not vouched and not legacy and not self._signed_here(last):
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


def open_signed(
    directory: Path, key_dir: Path, redact: list[str] | None = None, *, create: bool = True, adopt: bool = False
) -> AuditLog:
    """The gateway's log: signed with the key in `key_dir` (made on first use unless `create` is
    false), its head kept in `key_dir/checkpoints/`. Raises AuditUnavailable with the reason."""
    from gateway.audit.keys import AuditKeyError

    try:
        key = SigningKey.load_or_create(key_dir) if create else SigningKey.load(key_dir)
    except AuditKeyError as exc:
        raise AuditUnavailable(str(exc)) from exc
    return AuditLog(
        directory, redact=redact, key=key, checkpoint=checkpoints.default_path(directory, key_dir), adopt=adopt
    )
