"""What a record is: its canonical form, hash, redaction and size bounds, and reading records back.

Record (one JSON object per line, keys sorted, compact):
    seq        1, 2, 3 ... across all files of the directory
    ts         UTC ISO 8601
    event      policy_loaded | policy_rejected | decision | approval | result | ...
    call_id, principal, tool, arguments (secrets redacted), decision, rule, reasons,
    policy_sha256, data (event-specific)
    prev       the previous record's hash ("" for the first record)
    hash       SHA-256 of this record's canonical JSON without `hash` and `sig`
    sig        Ed25519 signature of `hash` by the gateway's audit key (base64; keys.py)

A record never carries unbounded agent data: a string longer than MAX_FIELD_CHARS is kept as its
length, SHA-256 and first characters, a list longer than MAX_LIST_ITEMS as its first items and
its length (`bound`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_FIELD_CHARS = 64 * 1024  # a command is at most 64 KiB (the analyser's cap): kept whole
MAX_LIST_ITEMS = 1000
REDACTED = "[REDACTED]"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
FILE_NAME = re.compile(r"^audit-(\d{6})\.jsonl$")
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
    body = {k: v for k, v in record.items() if k not in ("hash", "sig")}
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


def bound(value: Any, max_chars: int = MAX_FIELD_CHARS, max_items: int = MAX_LIST_ITEMS) -> Any:
    """`value` with every over-long string replaced by its length, SHA-256 and first characters,
    and every over-long list cut (its length kept): no request, however large, makes a large record."""
    if isinstance(value, str):
        if len(value) <= max_chars:
            return value
        data = value.encode("utf-8", "surrogatepass")
        return {
            "omitted": "too long to record",
            "chars": len(value),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "head": value[:200],
        }
    if isinstance(value, dict):
        out = {k: bound(v, max_chars, max_items) for k, v in list(value.items())[:max_items]}
        if len(value) > max_items:
            out["(omitted)"] = {"omitted": f"{len(value) - max_items} more entries", "entries": len(value)}
        return out
    if isinstance(value, list | tuple):
        kept = [bound(v, max_chars, max_items) for v in value[:max_items]]
        if len(value) > max_items:
            kept.append({"omitted": f"{len(value) - max_items} more items", "items": len(value)})
        return kept
    return value


def last_record(path: Path) -> dict[str, Any] | None:
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
                        raise AuditUnavailable(
                            f"{path} ends in a partial record (a crash while writing): run `gateway audit repair`"
                        )
                    record = json.loads(lines[-1])
                    if not (
                        isinstance(record, dict)
                        and isinstance(record.get("seq"), int)
                        and isinstance(record.get("hash"), str)
                    ):
                        raise AuditUnavailable(f"{path} ends in a record that is not ours; run `gateway audit verify`")
                    return record
                chunk *= 4
    except ValueError as exc:
        raise AuditUnavailable(
            f"{path} ends in a record that is not JSON ({exc}): see `gateway audit verify`, `gateway audit repair`"
        ) from exc
    except (OSError, RecursionError) as exc:
        raise AuditUnavailable(f"cannot read the end of the audit log {path}: {exc}") from exc


def records(directory: Path) -> Iterator[tuple[Path, int, dict[str, Any] | None, bytes]]:
    """Every line of the log in order: (file, line number, record or None if unreadable, raw)."""
    for path in sorted(p for p in Path(directory).iterdir() if FILE_NAME.match(p.name)):
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    yield path, n, json.loads(raw), raw
                except ValueError:
                    yield path, n, None, raw
