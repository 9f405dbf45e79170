"""Which calls a writer let go and has not seen end: what marks them after a crash.

A gateway killed with SIGKILL (or crashing) leaves calls it allowed with no record of how they
ended. Each writer keeps a journal of them in the audit directory, `.calls-<16 hex>`: a header
line (`{"pid", "started", "seq"}`: the log's seq when it was made) then one call id per line,
written before the record that lets the call go (so a crash right after that record leaves the
call journaled). The writer holds an exclusive `flock` on its journal for its life; the kernel
drops it when the process dies, however it dies. A writer that starts takes every journal it can
lock (`dead`): its writer is gone, and the log (not the journal) says which of its calls were
allowed and never ended (no `result`, `error`, ... after: ENDS); those get an `interrupted`
record (writer.py), then the journal goes.

Ended calls leave the journal only in memory; past MAX_BYTES the file is written again with the
calls still open (a crash in between leaves ended ones after them: harmless, the log says they
ended). The journal is not fsynced: a process's death does not lose what it wrote, a power cut
may (calls it had not yet flushed are then not marked).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from gateway.audit.files import AuditDir, write_all

NAME = re.compile(r"\.calls-[0-9a-f]{16}\Z", re.ASCII)
MAX_BYTES = 64 * 1024
"""Past this the journal is written again with only the calls still open."""
MAX_READ = 16 * 1024 * 1024
ENDS = frozenset({"result", "error", "approval_void", "approval_withdrawn", "rejected", "interrupted"})
"""The records that end a call. Others may name a running call (its network's connections,
`egress_*`) without ending it."""
CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z", re.ASCII)
"""The ids a journal keeps (the gateway's are 16 hex digits): one per line, nothing to escape."""


class Journal:
    """One writer's journal, made at its first call. `seq` gives the log's seq for the header
    (where a recovery starts reading the log)."""

    def __init__(self, adir: AuditDir, seq: Callable[[], int]) -> None:
        self._dir = adir
        self._seq = seq
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.name = ""
        self._size = 0
        self._open: set[str] = set()

    def opened(self, call_id: str) -> None:
        """`call_id` is about to be allowed: on disk (in the page cache) before this returns.
        Raises OSError when the journal cannot be written."""
        if not CALL_ID.match(call_id):
            return  # not an id the gateway makes: nothing to mark it by
        with self._lock:
            if call_id in self._open:
                return
            if self._fd is None:
                self._make()
            assert self._fd is not None
            if self._size > MAX_BYTES:
                self._compact()
            line = f"{call_id}\n".encode()
            write_all(self._fd, line, self._size)
            self._size += len(line)
            self._open.add(call_id)

    def ended(self, call_id: str) -> None:
        with self._lock:
            self._open.discard(call_id)

    def close(self) -> None:
        """The writer is done: let its journal go (its lock with it: the calls still listed are
        the next writer's to mark interrupted, as a dead writer's are)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _header(self) -> bytes:
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return (json.dumps({"pid": os.getpid(), "started": now, "seq": self._seq()}) + "\n").encode()

    def _make(self) -> None:
        """Made while holding the log's lock (taken on a descriptor of its own: the caller does
        not hold it), and locked before that lock is let go: a writer starting meanwhile never
        takes it for a dead one's."""
        lock = self._dir.lock()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            name = f".calls-{secrets.token_hex(8)}"
            fd = self._dir.create_new(name)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held for the writer's life
                header = self._header()
                write_all(fd, header, 0)
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self._dir.fd)
                raise
            self._fd, self.name, self._size = fd, name, len(header)
        finally:
            os.close(lock)

    def _compact(self) -> None:
        assert self._fd is not None
        data = self._header() + b"".join(f"{c}\n".encode() for c in sorted(self._open))
        write_all(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        self._size = len(data)


def dead(adir: AuditDir, own: str) -> Iterator[tuple[dict[str, Any], set[str]]]:
    """Each journal whose writer is gone (its lock free): its header and call ids. Call with the
    log's lock held. A journal is removed once the consumer asks for the next one (after it has
    recorded what it needed); if the consumer fails, it stays for the next start."""
    try:
        names = sorted(n for n in os.listdir(adir.fd) if NAME.match(n) and n != own)
    except OSError:
        return
    for name in names:
        try:
            fd = adir.open_journal(name)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer is alive
            st = os.fstat(fd)
            try:
                now = os.stat(name, dir_fd=adir.fd, follow_symlinks=False)
            except OSError:
                continue
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                continue  # not the file that was opened: leave it
            yield _read(fd)
            os.unlink(name, dir_fd=adir.fd)
        finally:
            os.close(fd)


def _read(fd: int) -> tuple[dict[str, Any], set[str]]:
    data = os.pread(fd, MAX_READ, 0)
    first, _, rest = data.partition(b"\n")
    try:
        header = json.loads(first)
    except ValueError:
        header = {}
    calls = {t for line in rest.split(b"\n") if CALL_ID.match(t := line.decode("ascii", "replace"))}
    return header if isinstance(header, dict) else {}, calls
