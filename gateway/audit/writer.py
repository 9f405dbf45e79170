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

With a key (`keys.SigningKey`), every record is signed and, after each commit, the head is
written to a checkpoint kept apart (`checkpoint.py`). Before each commit the writer compares the
log with that checkpoint and refuses to append to a log that ends before it or disagrees with it:
a truncated or rewritten log is never extended (which would move the checkpoint back over the
evidence).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit import checkpoint as checkpoints
from gateway.audit.keys import SigningKey
from gateway.audit.records import (
    FILE_NAME,
    MAX_FILE_BYTES,
    SECRET_NAME,
    AuditUnavailable,
    bound,
    canonical,
    digest,
    last_record,
    redact,
)

MAX_BATCH_BYTES = 8 * 1024 * 1024
MAX_RECORD_BYTES = 1024 * 1024


@dataclass
class _Pending:
    event: str
    body: dict[str, Any]
    size_hint: int = 0
    record: dict[str, Any] | None = None
    error: AuditUnavailable | None = None

    @property
    def settled(self) -> bool:
        return self.record is not None or self.error is not None


@dataclass
class _Tail:
    """What the writer last saw at the end of the log (valid while nothing else touched it)."""

    path: Path
    ino: int
    size: int
    last: dict[str, Any] | None


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
    ) -> None:
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.secret_names = re.compile("|".join([SECRET_NAME.pattern, *(redact or [])]), re.IGNORECASE)
        self.key = key
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self._cond = threading.Condition()
        self._queue: list[_Pending] = []
        self._committing = False
        self._tail_seen: _Tail | None = None
        self._high = 0  # the highest seq this writer has seen on disk: the log must never go below it
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AuditUnavailable(f"cannot open the audit directory {self.directory}: {exc.strerror}") from exc
        if self.checkpoint is not None:
            try:
                checkpoints.prepare(self.checkpoint, self.directory)
            except checkpoints.CheckpointError as exc:
                raise AuditUnavailable(str(exc)) from exc
            with self._locked():
                self._check_head(self._tail(), deep=True)

    # --- appending -------------------------------------------------------------------------------
    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one record durably and return it. Raises AuditUnavailable."""
        given = redact({k: v for k, v in fields.items() if v is not None}, self.secret_names)
        body = bound(given)
        try:
            size = len(canonical(body))
            if size > MAX_RECORD_BYTES:  # many long fields: keep each as its size and digest
                body = bound(given, max_chars=1024, max_items=50)
                size = len(canonical(body))
        except (TypeError, ValueError) as exc:
            raise AuditUnavailable(f"audit record is not serialisable: {exc}") from exc
        pending = _Pending(event, body, size)
        with self._cond:
            self._queue.append(pending)
            while not pending.settled:
                if self._committing:
                    self._cond.wait()
                    continue
                self._committing = True
                batch = self._take()
                self._cond.release()
                try:
                    self._commit(batch)
                finally:
                    self._cond.acquire()
                    self._committing = False
                    self._cond.notify_all()
        if pending.error is not None:
            raise pending.error
        assert pending.record is not None
        return pending.record

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
        self._check_head(tail, deep=False)
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
            except (TypeError, ValueError) as exc:
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
        path = tail.path
        if tail.size and tail.size + len(data) > self.max_file_bytes and last is not None:
            path = self._next_file(path)
        ino, size = self._write(path, data)
        head = made[-1][1]
        self._high = head["seq"]
        self._tail_seen = _Tail(path, ino, size, head)
        if self.checkpoint is not None and self.key is not None:
            try:
                checkpoints.write(
                    self.checkpoint, checkpoints.Checkpoint.of(self._real_dir(), head, self.key.public.fingerprint)
                )
            except checkpoints.CheckpointError as exc:
                # the records are on disk (harmless: nothing has run yet) but the head is not kept
                # apart: fail closed, the callers deny
                raise AuditUnavailable(f"records written but the head was not: {exc}") from exc
        for p, record in made:
            p.record = record

    def _write(self, path: Path, data: bytes) -> tuple[int, int]:
        """Append `data` and make it durable, or leave the file exactly as it was."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._tail_seen = None
            raise AuditUnavailable(f"cannot write the audit log {path}: {exc.strerror or exc}") from exc
        try:
            st = os.fstat(fd)
            before = st.st_size
            try:
                view, done = memoryview(data), 0
                while done < len(data):  # a short write is retried: the next one says why (ENOSPC)
                    n = os.write(fd, view[done:])
                    if n <= 0:
                        raise OSError(errno.EIO, f"write returned {n} after {done} of {len(data)} bytes")
                    done += n
                os.fdatasync(fd)
            except OSError as exc:
                self._cut_back(fd, path, before)
                raise AuditUnavailable(f"cannot write the audit log {path}: {exc.strerror or exc}") from exc
            return st.st_ino, before + len(data)
        finally:
            os.close(fd)

    def _cut_back(self, fd: int, path: Path, size: int) -> None:
        """Undo a failed append: shrinking a file needs no space, so this works on a full disk."""
        self._tail_seen = None
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
                os.fdatasync(fd)
        except OSError:
            pass  # not a regular file (a test's /dev/full), or the disk is gone: the tail check reports it

    # --- the end of the log ----------------------------------------------------------------------
    def _locked(self) -> _Flock:
        return _Flock(self._lock_fd)

    def _real_dir(self) -> Path:
        return Path(os.path.realpath(self.directory))

    def _files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if FILE_NAME.match(p.name))

    def _next_file(self, path: Path) -> Path:
        m = FILE_NAME.match(path.name)
        n = int(m.group(1)) + 1 if m else 1
        return self.directory / f"audit-{n:06d}.jsonl"

    def _tail(self) -> _Tail:
        """The file to append to and the last record of the chain. Read from disk unless nothing
        has changed since this writer's last commit: the same file, of the same size, and no next
        file (another process rotating makes exactly that one)."""
        try:
            seen = self._tail_seen
            if seen is not None and seen.path.exists():
                st = os.stat(seen.path)
                if st.st_ino == seen.ino and st.st_size == seen.size and not self._next_file(seen.path).exists():
                    return seen
            files = self._files()
        except OSError as exc:
            raise AuditUnavailable(f"cannot read the audit directory {self.directory}: {exc.strerror}") from exc
        tail: _Tail | None = None
        for path in reversed(files):
            last = last_record(path)
            if last is not None:
                st = os.stat(path)
                tail = _Tail(path, st.st_ino, st.st_size, last)
                break
        if tail is None:
            path = files[-1] if files else self.directory / "audit-000001.jsonl"
            tail = _Tail(path, 0, 0, None)
        self._tail_seen = tail if tail.last is not None else None
        return tail

    def _check_head(self, tail: _Tail, *, deep: bool) -> None:
        """Refuse to extend a log that went backwards: below what this writer saw, or below (or
        beside) its checkpoint. `deep` also finds the checkpoint's record when the log is ahead
        of it (after a crash between the write and the checkpoint)."""
        seq = tail.last["seq"] if tail.last else 0
        if seq < self._high:
            raise AuditUnavailable(
                f"the audit log went backwards: it ends at seq {seq}, this gateway wrote up to {self._high}: "
                "it was truncated or replaced; see `gateway audit verify`"
            )
        if self.checkpoint is None:
            return
        try:
            newest = checkpoints.latest(self.checkpoint)
        except checkpoints.CheckpointError as exc:
            raise AuditUnavailable(str(exc)) from exc
        for cp in [newest] if newest else []:
            if seq < cp.seq:
                raise AuditUnavailable(
                    f"the audit log ends at seq {seq} but its checkpoint {self.checkpoint} says it reached seq "
                    f"{cp.seq} ({cp.ts}): records were removed. See `gateway audit verify`; if the log was "
                    "archived on purpose, move the checkpoint away with it"
                )
            if seq == cp.seq and tail.last is not None and tail.last["hash"] != cp.hash:
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
        self._high = max(self._high, seq)


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


def open_signed(directory: Path, key_dir: Path, redact: list[str] | None = None) -> AuditLog:
    """The gateway's log: signed with the key in `key_dir` (made on first use), its head kept in
    `key_dir/checkpoints/`. Raises AuditUnavailable with the reason."""
    from gateway.audit.keys import AuditKeyError

    try:
        key = SigningKey.load_or_create(key_dir)
    except AuditKeyError as exc:
        raise AuditUnavailable(str(exc)) from exc
    return AuditLog(directory, redact=redact, key=key, checkpoint=checkpoints.default_path(directory, key_dir))
