"""A host's bounded local spool for the store's ledger (`--store-spool DIR`, issue 25 point 6).

Opt-in, per host, as sudo's relay does with `store_first`: when a commit cannot reach the store,
the very records the ledger built (the same seq, prev, hash and signature: the stream's chain
goes on) are appended to the stream's spool file in DIR, written and fsynced (the file, and the
directory when the file is new) before the append returns; the call runs, recorded. While the
spool holds records every later append goes there too, so the spool holds one run of the
chain, in order. The ledger forwards it (ledger.py: `forward`) once the store answers, verified
first, and then removes the file.

One file per stream (`<stream>.spool`, one canonical record a line), held with `flock` by the
process writing it: a file nobody holds belongs to a gateway that is gone (an orphan), and the
next gateway started with the same DIR forwards it before it opens its own stream. The bound
(`--store-spool-max`, bytes) is per file: an append past it is refused (fail closed), naming the
spool and its bound. DIR is the gateway's own, hidden from every sandbox as the audit keys are.

`check` is what the forwarder trusts of a file: every line the canonical form of a record that
hashes to its `hash`, names the stream, follows the line before it (seq + 1, `prev`), and every
signature verifies. Only what a completed write put there counts: an unterminated last line, and
(when signed) records after the last signature, are a batch whose write never returned (its
calls never ran), and are left out.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.audit.keys import VerifyKey
from gateway.audit.records import AuditUnavailable, canonical, digest

ENV = "AGW_STORE_SPOOL"
ENV_MAX = "AGW_STORE_SPOOL_MAX"
DEFAULT_MAX = 64 * 1024 * 1024
SUFFIX = ".spool"


class SpoolError(Exception):
    """A spool file that cannot be trusted or read: nothing of it is inserted."""


def file_name(stream: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:-]", "_", stream) + SUFFIX


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class Spool:
    """The spool file of one stream in `directory`, written only by the process holding it."""

    def __init__(self, directory: Path, stream: str, max_bytes: int = DEFAULT_MAX) -> None:
        self.directory = Path(directory)
        self.stream = stream
        self.max_bytes = max_bytes
        self.path = self.directory / file_name(stream)
        self._fd: int | None = None
        self.size = 0
        self.count = 0
        """Records it holds (written and not yet forwarded)."""

    @property
    def holding(self) -> bool:
        return self.count > 0

    def write(self, lines: list[str]) -> None:
        """Append these records (canonical JSON, one a line) durably. Raises AuditUnavailable
        naming the spool when it is full or cannot be written (the caller denies)."""
        data = "".join(line + "\n" for line in lines).encode()
        if self.size + len(data) > self.max_bytes:
            raise AuditUnavailable(
                f"the spool {self.path} is full ({self.size} bytes held, {len(data)} more would pass its bound of "
                f"{self.max_bytes} bytes, --store-spool-max): nothing runs unrecorded until the store takes it"
            )
        try:
            if self._fd is None:
                self._fd = self._create()
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            if self._fd is not None:  # what part of the batch got there is not a record: cut it off
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self.size)
            raise AuditUnavailable(f"cannot write the spool {self.path}: {exc} (nothing runs unrecorded)") from exc
        self.size += len(data)
        self.count += len(lines)

    def _create(self) -> int:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o600)
        if not _lock(fd):  # (O_EXCL made it: nobody else can hold it)
            os.close(fd)
            raise OSError(f"{self.path} is held by another process")
        _sync_dir(self.directory)
        return fd

    def read(self) -> str:
        """What the file holds now (read through the descriptor this process holds)."""
        if self._fd is None:
            return ""
        return _read_fd(self._fd, self.path)

    def clear(self) -> None:
        """Everything in it is in the store: remove the file (durably), and let go of it."""
        if self._fd is None:
            return
        os.unlink(self.path)
        _sync_dir(self.directory)
        os.close(self._fd)
        self._fd = None
        self.size = self.count = 0

    def close(self) -> None:
        """Let go of the file, leaving what it holds for the next gateway to forward."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Orphan(Spool):
    """The spool file of a gateway that is gone, held now by this process to forward it."""

    def __init__(self, path: Path, fd: int) -> None:
        super().__init__(path.parent, path.name.removesuffix(SUFFIX), max_bytes=0)
        self.path = path
        self._fd = fd
        self.size = os.fstat(fd).st_size
        self.count = 1 if self.size else 0


def orphans(directory: Path) -> list[Orphan]:
    """The spool files in `directory` no live process holds, each now held by this one (the
    caller forwards or closes each). Raises SpoolError when the directory cannot be read."""
    found: list[Orphan] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return found
    except OSError as exc:
        raise SpoolError(f"cannot read the spool directory {directory}: {exc}") from exc
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        path = Path(directory) / name
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # forwarded and removed meanwhile
        except OSError as exc:
            raise SpoolError(f"cannot open the spool {path}: {exc}") from exc
        try:
            # held: a live gateway's; gone from its name once locked: forwarded meanwhile
            if not _lock(fd) or not _same(fd, path):
                os.close(fd)
                continue
        except OSError:
            os.close(fd)
            continue
        found.append(Orphan(path, fd))
    return found


def _same(fd: int, path: Path) -> bool:
    try:
        at = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (at.st_dev, at.st_ino) == (mine.st_dev, mine.st_ino)


def _read_fd(fd: int, path: Path) -> str:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    at = 0
    while at < size:
        chunk = os.pread(fd, size - at, at)
        if not chunk:
            break
        chunks.append(chunk)
        at += len(chunk)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpoolError(f"the spool {path} is not UTF-8 text (byte {exc.start}): it was edited") from exc


@dataclass
class Checked:
    records: list[dict[str, Any]]
    lines: list[str]
    dropped: int = 0
    """Records of an unfinished last write, left out (their write never returned)."""


def check(text: str, path: Path, stream: str | None, keys: list[VerifyKey]) -> Checked:
    """The spool's records, verified as the forwarder must trust them (see the module's doc).
    `stream`: the stream it must hold (None: any one, named alike by every line); `keys`: those
    its signatures must verify with (none: the chain only). Raises SpoolError naming the line."""
    lines = text.split("\n")
    torn = lines.pop()  # "" after the last newline; else a line whose write never finished
    dropped = 1 if torn else 0
    records: list[dict[str, Any]] = []
    signed_to = 0
    for n, line in enumerate(lines, 1):
        at = f"the spool {path} line {n}"
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise SpoolError(f"{at}: not a JSON record (edited): {exc}") from exc
        if not isinstance(record, dict) or canonical(record) != line:
            raise SpoolError(f"{at}: not a record in canonical form (edited)")
        if digest(record) != record.get("hash"):
            raise SpoolError(f"{at}: the record does not match its hash (edited)")
        want = stream if stream is not None else (records[0]["stream"] if records else record.get("stream"))
        if not isinstance(record.get("stream"), str) or record.get("stream") != want:
            raise SpoolError(f"{at}: the record names stream {record.get('stream')!r}, not {want!r}")
        seq = record.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise SpoolError(f"{at}: the record has no seq")
        if records and (seq != records[-1]["seq"] + 1 or record.get("prev") != records[-1]["hash"]):
            raise SpoolError(
                f"{at}: seq {seq} does not follow seq {records[-1]['seq']} on the line before it "
                "(removed, reordered or edited)"
            )
        sig = record.get("sig")
        if sig is not None:
            if keys and not any(k.verify(str(record["hash"]), str(sig)) for k in keys):
                raise SpoolError(f"{at}: the signature of seq {seq} does not verify (forged)")
            signed_to = len(records) + 1
        records.append(record)
    if keys and signed_to < len(records):  # an unfinished batch: its last record (signed) never written
        dropped += len(records) - signed_to
        records = records[:signed_to]
    return Checked(records, [canonical(r) for r in records], dropped)
