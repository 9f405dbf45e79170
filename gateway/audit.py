"""The audit log: append-only, hash-chained JSON lines, durable before anything acts.

Record (one JSON object per line, keys sorted, compact):
    seq        1, 2, 3 ... across all files of the directory
    ts         UTC ISO 8601
    event      policy_loaded | policy_rejected | decision | approval | result | ...
    call_id, principal, tool, arguments (secrets redacted), decision, rule, reasons,
    policy_sha256, data (event-specific)
    prev       the previous record's hash ("" for the first record)
    hash       SHA-256 of this record's canonical JSON without `hash`

Files are `audit-NNNNNN.jsonl` in the audit directory, rotated by size; the chain runs on across
files. Appends are serialised across threads (a lock) and processes (`flock` on `.lock`), and
each record is one `write` on an O_APPEND descriptor followed by `fdatasync`: when `append`
returns, the record is on disk. Any failure raises `AuditUnavailable`, and the caller denies.

`verify(directory)` walks the chain and names the first record that breaks it: edited (hash),
deleted or reordered (prev / seq), truncated (a last line without its newline).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 64 * 1024 * 1024
REDACTED = "[REDACTED]"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_FILE = re.compile(r"^audit-(\d{6})\.jsonl$")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")
# secrets inside free text (a command line): NAME=value, --password=value / --api-key value,
# Authorization: Bearer value
_IN_TEXT = [
    re.compile(r"(?i)\b([A-Z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)[A-Z0-9_]*=)([^\s;&|'\"]+)"),
    re.compile(r"(?i)(--?[\w-]*(?:password|passwd|token|secret|api[-_]?key)[\w-]*[= ]+)([^\s;&|'\"]+)"),
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)([A-Za-z0-9._~+/=-]{8,})"),  # not "token": prose uses it
]


class AuditUnavailable(Exception):
    """The record could not be made durable. The call must be denied (AUDIT_UNAVAILABLE)."""


def canonical(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


def redact(value: Any, patterns: re.Pattern[str] = SECRET_NAME) -> Any:
    """Replace the values of secret-looking names: dict keys, `NAME=value` strings, and
    `{"name": ..., "value": ...}` assignment records."""
    if isinstance(value, dict):
        if set(value) >= {"name", "value"} and isinstance(value["name"], str) and patterns.search(value["name"]):
            return {**value, "value": REDACTED}
        return {
            k: (REDACTED if isinstance(k, str) and patterns.search(k) else redact(v, patterns))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, patterns) for v in value]
    if isinstance(value, str):
        m = _ASSIGNMENT.match(value)
        if m and patterns.search(m.group(1)):
            return f"{m.group(1)}={REDACTED}"
        for pattern in _IN_TEXT:
            value = pattern.sub(lambda mm: mm.group(1) + REDACTED, value)
    return value


class AuditLog:
    """The writer. One per process and directory is enough; it is safe across threads and
    processes."""

    def __init__(self, directory: Path, max_file_bytes: int = MAX_FILE_BYTES, redact: list[str] | None = None) -> None:
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.secret_names = re.compile("|".join([SECRET_NAME.pattern, *(redact or [])]), re.IGNORECASE)
        self._lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AuditUnavailable(f"cannot open the audit directory {self.directory}: {exc.strerror}") from exc

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one record durably and return it. Raises AuditUnavailable."""
        with self._lock:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            except OSError as exc:
                raise AuditUnavailable(f"cannot lock the audit log: {exc.strerror}") from exc
            try:
                return self._append_locked(event, fields)
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _append_locked(self, event: str, fields: dict[str, Any]) -> dict[str, Any]:
        path, last = self._tail()
        record: dict[str, Any] = {
            "seq": (last["seq"] + 1) if last else 1,
            "ts": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "event": event,
            **redact({k: v for k, v in fields.items() if v is not None}, self.secret_names),
            "prev": last["hash"] if last else "",
        }
        try:
            record["hash"] = digest(record)
            data = (canonical(record) + "\n").encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise AuditUnavailable(f"audit record is not serialisable: {exc}") from exc
        if path.exists() and path.stat().st_size + len(data) > self.max_file_bytes and last is not None:
            path = self._next_file(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(28, f"short write ({written} of {len(data)} bytes)")
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise AuditUnavailable(f"cannot write the audit log {path}: {exc.strerror or exc}") from exc
        return record

    def _files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if _FILE.match(p.name))

    def _next_file(self, path: Path) -> Path:
        m = _FILE.match(path.name)
        n = int(m.group(1)) + 1 if m else 1
        return self.directory / f"audit-{n:06d}.jsonl"

    def _tail(self) -> tuple[Path, dict[str, Any] | None]:
        """The file to append to and the last record of the chain (read from disk: another
        process may have appended since)."""
        try:
            files = self._files()
        except OSError as exc:
            raise AuditUnavailable(f"cannot list the audit directory: {exc.strerror}") from exc
        for path in reversed(files):
            last = _last_record(path)
            if last is not None:
                return path, last
        return (files[-1] if files else self.directory / "audit-000001.jsonl"), None


def _last_record(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size == 0:
                return None
            chunk = 4096
            while True:
                start = max(0, size - chunk)
                f.seek(start)
                data = f.read(size - start)
                lines = data.rstrip(b"\n").split(b"\n")
                if len(lines) > 1 or start == 0:
                    if not data.endswith(b"\n"):
                        raise AuditUnavailable(f"{path} ends in a partial record; run `gateway audit verify`")
                    record = json.loads(lines[-1])
                    if not (
                        isinstance(record, dict)
                        and isinstance(record.get("seq"), int)
                        and isinstance(record.get("hash"), str)
                    ):
                        raise AuditUnavailable(f"{path} ends in a record that is not ours; run `gateway audit verify`")
                    return record
                chunk *= 4
    except (OSError, ValueError, RecursionError) as exc:
        raise AuditUnavailable(f"cannot read the end of the audit log {path}: {exc}") from exc


@dataclass(frozen=True)
class Verification:
    ok: bool
    records: int
    file: str = ""
    line: int = 0
    seq: int | None = None
    problem: str = ""

    def describe(self) -> str:
        if self.ok:
            return f"ok: {self.records} records, chain intact"
        return f"broken at {self.file}:{self.line} (seq {self.seq}): {self.problem}"


def records(directory: Path) -> Iterator[tuple[Path, int, dict[str, Any] | None, bytes]]:
    """Every line of the log in order: (file, line number, record or None if unreadable, raw)."""
    for path in sorted(p for p in Path(directory).iterdir() if _FILE.match(p.name)):
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    yield path, n, json.loads(raw), raw
                except ValueError:
                    yield path, n, None, raw


def verify(directory: Path) -> Verification:
    prev = ""
    expected_seq = 1
    count = 0
    for path, n, record, raw in records(directory):

        def broken(problem: str, seq: Any = None) -> Verification:
            return Verification(False, count, path.name, n, seq, problem)  # noqa: B023 - used at once

        if not raw.endswith(b"\n"):
            return broken("truncated: the last record has no newline")
        if record is None or not isinstance(record, dict):
            return broken("not a JSON record")
        seq = record.get("seq")
        if record.get("hash") != digest(record):
            return broken("edited: the record does not match its hash", seq)
        if record.get("prev") != prev:
            return broken("the chain breaks here: a record before it was deleted, reordered or edited", seq)
        if seq != expected_seq:
            return broken(f"expected seq {expected_seq}", seq)
        prev = record["hash"]
        expected_seq += 1
        count += 1
    return Verification(True, count)
