"""The log's head, kept apart from the log: what tells a truncated log from a short one.

After every commit the writer appends the last record's `seq`, `hash` and signature
(`{"log", "seq", "hash", "sig", "ts", "key"}`) as one line to a file outside the audit directory
(replaced by one holding the newest head alone once it passes 1 MiB). The
signature is the record's own, so the checkpoint needs no trust of its own: a checkpoint only
the key's holder could have made says "the log reached at least this record, with this hash".
`verify` fails when the log ends before a checkpoint's `seq` (truncated) or holds another record
at that `seq` (rewritten); the writer refuses to append to such a log, so the head never moves
back silently.

The writer and `verify` use the newest head of that file. Any other file of heads, one JSON object
per line (copied off the machine over time: `gateway audit head >> ...` from cron), is checked
line by line with `verify --checkpoint FILE`.

The file is not fsynced: after a power cut it may be older than the log (never newer, since the
log is made durable first), which `verify` accepts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CheckpointError(Exception):
    """The checkpoint file could not be read, parsed or written."""

    errno: int | None = None
    """The system's error number, when writing failed (ENOSPC: the disk is full)."""


@dataclass(frozen=True)
class Checkpoint:
    log: str  # the audit directory's real path
    seq: int
    hash: str
    sig: str
    ts: str
    key: str  # the signing key's fingerprint

    def line(self) -> str:
        fields = {"log": self.log, "seq": self.seq, "hash": self.hash, "sig": self.sig, "ts": self.ts, "key": self.key}
        return json.dumps(fields, sort_keys=True, separators=(",", ":")) + "\n"  # (asdict deep-copies: every commit)

    @classmethod
    def of(cls, directory: Path | str, record: dict[str, Any], key: str) -> Checkpoint:
        return cls(str(directory), record["seq"], record["hash"], record.get("sig", ""), record["ts"], key)


def _parse(line: str, path: Path, n: int) -> Checkpoint:
    try:
        raw = json.loads(line)
        return Checkpoint(
            str(raw["log"]), int(raw["seq"]), str(raw["hash"]), str(raw["sig"]), str(raw["ts"]), str(raw["key"])
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}:{n or 'last line'}: not a checkpoint ({exc})") from None


def default_path(directory: Path, key_dir: Path) -> Path:
    """Where the writer keeps `directory`'s checkpoint: beside the key, named by the log's path."""
    real = os.path.realpath(directory)
    return Path(key_dir) / "checkpoints" / (hashlib.sha256(real.encode()).hexdigest()[:16] + ".json")


def read(path: Path) -> list[Checkpoint]:
    """Every checkpoint in `path` (one JSON object per line); [] when the file does not exist."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {getattr(exc, 'strerror', None) or exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append(_parse(line, path, n))
    return out


MAX_HEADS_BYTES = 1 << 20


def write(path: Path, checkpoint: Checkpoint) -> None:
    """Add the new head to the checkpoint file: one line appended (readers take the last whole
    line). Past MAX_HEADS_BYTES the file is replaced by one holding the new head alone (rename:
    readers see the old file or the new)."""
    path = Path(path)
    data = checkpoint.line().encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            before = os.fstat(fd).st_size
            if before + len(data) > MAX_HEADS_BYTES:
                _replace(path, data)
            else:
                try:
                    if os.write(fd, data) != len(data):
                        raise OSError(28, "No space left on device (short write)")
                except OSError:
                    with contextlib.suppress(OSError):  # leave no partial head (shrinking needs no space)
                        os.ftruncate(fd, before)
                    raise
        finally:
            os.close(fd)
    except OSError as exc:
        error = CheckpointError(f"cannot write the checkpoint {path}: {exc.strerror or exc}")
        error.errno = exc.errno
        raise error from None


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(28, "short write")
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def latest(path: Path) -> Checkpoint | None:
    """The newest head in the gateway's own checkpoint file (its last whole line), or None."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 8192))
            tail = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint {path}: {exc.strerror}") from None
    lines = tail.split(b"\n")[:-1]  # whatever follows the last newline is an append in progress
    if not lines:
        return None
    return _parse(lines[-1].decode("utf-8", "replace"), path, 0)


def prepare(path: Path, audit_dir: Path) -> None:
    """Make the checkpoint's directory; refuse a checkpoint inside the audit directory (it must be
    kept apart: whoever can rewrite the log must not thereby be able to move its head)."""
    path = Path(path)
    real_dir = os.path.realpath(audit_dir)
    parent = os.path.realpath(path.parent)
    if parent == real_dir or parent.startswith(real_dir + os.sep):
        raise CheckpointError(f"the checkpoint {path} is inside the audit directory {audit_dir}: keep it apart")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise CheckpointError(f"cannot make the checkpoint directory {path.parent}: {exc.strerror}") from None
