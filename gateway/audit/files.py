"""The audit directory, opened once and used by descriptor.

Whoever can write the audit directory must not turn the gateway (often root) against anything
else: every log file is opened relative to the directory's descriptor, never through a symlink
(`O_NOFOLLOW`; names are plain `audit-NNNNNN.jsonl`, so there is no other component), without
blocking (a FIFO planted under a log's name does not hang a reader), and used only if it is a
regular file. Swapping the directory's own path for a link later does not move a writer that
has it open.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path


class AuditUnavailable(Exception):
    """The record could not be made durable. The call must be denied (AUDIT_UNAVAILABLE)."""


FILE_NAME = re.compile(r"audit-(\d{6})\.jsonl\Z", re.ASCII)
LOCK = ".lock"


class AuditDir:
    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = Path(path)
        try:
            if create:
                self.path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise AuditUnavailable(f"cannot open the audit directory {self.path}: {exc.strerror}") from exc

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> AuditDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def names(self) -> list[str]:
        """The log's files, in order."""
        try:
            return sorted(n for n in os.listdir(self.fd) if FILE_NAME.match(n))
        except OSError as exc:
            raise AuditUnavailable(f"cannot list the audit directory {self.path}: {exc.strerror}") from exc

    def real(self) -> str:
        """Where the directory is now (what the open descriptor names)."""
        return os.readlink(f"/proc/self/fd/{self.fd}") if os.path.exists("/proc/self/fd") else str(self.path)

    def _open(self, name: str, flags: int, mode: int = 0o600) -> int:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=self.fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise OSError(22, f"{name} is not a regular file")
        return fd

    def open_read(self, name: str) -> int:
        return self._open(name, os.O_RDONLY)

    def open_append(self, name: str) -> int:
        return self._open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def open_write(self, name: str, create: bool = False) -> int:
        return self._open(name, os.O_WRONLY | (os.O_CREAT if create else 0))

    def open_journal(self, name: str) -> int:
        return self._open(name, os.O_RDWR)

    def create_new(self, name: str) -> int:
        return self._open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)

    def lock(self) -> int:
        try:
            return self._open(LOCK, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise AuditUnavailable(f"cannot open {self.path / LOCK}: {exc.strerror or exc}") from exc

    def read_all(self, name: str) -> bytes:
        fd = self.open_read(name)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    """Write all of `data` (at `offset`, or the file's position); a short write is retried, so
    the next one says why (ENOSPC)."""
    view, done = memoryview(data), 0
    while done < len(data):
        n = os.write(fd, view[done:]) if offset is None else os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"write returned {n} after {done} of {len(data)} bytes")
        done += n
