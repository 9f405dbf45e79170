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

from gateway.audit.files import AuditDir
from gateway.audit.files import AuditUnavailable as AuditUnavailable

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_FIELD_CHARS = 64 * 1024  # a command is at most 64 KiB (the analyser's cap): kept whole
MAX_LIST_ITEMS = 1000
MAX_KEY_CHARS = 200
MAX_DEPTH = 32
MAX_NODES = 20_000
RESERVED = frozenset({"seq", "ts", "event", "prev", "hash", "sig"})  # the writer's own fields
REDACTED = "[REDACTED]"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")
# secrets inside free text (a command line): NAME=value, --password=value / --api-key value,
# Authorization: Bearer value
_IN_TEXT = [
    re.compile(r"(?i)\b([A-Z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)[A-Z0-9_]*=)([^\s;&|'\"]+)"),
    re.compile(r"(?i)(--?[\w-]*(?:password|passwd|token|secret|api[-_]?key)[\w-]*[= ]+)([^\s;&|'\"]+)"),
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)([A-Za-z0-9._~+/=-]{8,})"),  # not "token": prose uses it
]
# a word every pattern above needs (same flags): text without one skips them all
_IN_TEXT_HINT = re.compile(r"(?i)token|key|secret|passw|credential|auth|bearer|basic")


def canonical(record: dict[str, Any]) -> str:
    """The one byte form of a record: what is hashed and what is written (verify compares them)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k not in ("hash", "sig")}
    return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


def _may_hold_secret(value: Any) -> bool:
    """A boolean, a number or null under a secret-looking name (`password: false`, `token_count`)
    carries no secret and is kept; a string, or anything holding strings, is redacted whole."""
    return not (value is None or isinstance(value, bool | int | float))


def redact(value: Any, patterns: re.Pattern[str] = SECRET_NAME) -> Any:
    """Replace the values of secret-looking names: dict keys, `NAME=value` strings, and
    `{"name": ..., "value": ...}` assignment records."""
    if isinstance(value, dict):
        if set(value) >= {"name", "value"} and isinstance(value["name"], str) and patterns.search(value["name"]):
            if not _may_hold_secret(value["value"]):
                return value
            return {**value, "value": REDACTED}
        return {
            k: (REDACTED if isinstance(k, str) and patterns.search(k) and _may_hold_secret(v) else redact(v, patterns))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v, patterns) for v in value]
    if isinstance(value, str):
        m = _ASSIGNMENT.match(value)
        if m and patterns.search(m.group(1)):
            return f"{m.group(1)}={REDACTED}"
        if _IN_TEXT_HINT.search(value):
            for pattern in _IN_TEXT:
                value = pattern.sub(lambda mm: mm.group(1) + REDACTED, value)
    return value


def _summary(data: bytes, chars: int, head: str) -> dict[str, Any]:
    return {
        "omitted": "too long to record",
        "chars": chars,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "head": head,
    }


def bound(value: Any, max_chars: int = MAX_FIELD_CHARS, max_items: int = MAX_LIST_ITEMS) -> Any:
    """`value` cut to a size a record can carry: a string longer than `max_chars` becomes its
    length, SHA-256 and first characters; a list or mapping keeps `max_items` entries and its
    length; a key longer than MAX_KEY_CHARS is shortened and marked with its digest; nesting
    deeper than MAX_DEPTH and anything past MAX_NODES values are summarised. Never recurses
    deeper than MAX_DEPTH, whatever it is given."""
    budget = [MAX_NODES]

    def cut(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            return {"omitted": "too many values to record"}
        if isinstance(v, str):
            if len(v) <= max_chars:
                return v
            return _summary(v.encode("utf-8", "surrogatepass"), len(v), v[:200])
        if isinstance(v, dict | list | tuple) and depth >= MAX_DEPTH:
            return {"omitted": f"nested deeper than {MAX_DEPTH}"}
        if isinstance(v, dict):
            out: dict[Any, Any] = {}
            for k, item in list(v.items())[:max_items]:
                if isinstance(k, str) and len(k) > MAX_KEY_CHARS:
                    k = f"{k[:MAX_KEY_CHARS]}...sha256:{hashlib.sha256(k.encode('utf-8', 'surrogatepass')).hexdigest()}"
                out[k] = cut(item, depth + 1)
            if len(v) > max_items:
                out["(omitted)"] = {"omitted": f"{len(v) - max_items} more entries", "entries": len(v)}
            return out
        if isinstance(v, list | tuple):
            kept = [cut(item, depth + 1) for item in v[:max_items]]
            if len(v) > max_items:
                kept.append({"omitted": f"{len(v) - max_items} more items", "items": len(v)})
            return kept
        return v

    return cut(value, 0)


def stub(fields: dict[str, Any], data: bytes) -> dict[str, Any]:
    """A record's fields when even the bounded form is too large: who, what and the decision
    (short strings only), and the rest as its size and digest."""
    keep = ("call_id", "principal", "tool", "decision", "rule", "policy_sha256")
    out: dict[str, Any] = {k: fields[k] for k in keep if isinstance(fields.get(k), str) and len(fields[k]) <= 200}
    out["data"] = _summary(data, len(data), "")
    return out


def last_record(fd: int, name: str) -> dict[str, Any] | None:
    """The last record of one log file (read from its end), None when the file is empty."""
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        chunk = 4096
        while True:
            start = max(0, size - chunk)
            data = os.pread(fd, size - start, start)
            lines = data.rstrip(b"\n").split(b"\n")
            if len(lines) > 1 or start == 0:
                if not data.endswith(b"\n"):
                    raise AuditUnavailable(
                        f"{name} ends in a partial record (a crash while writing): run `gateway audit repair`"
                    )
                record = json.loads(lines[-1])
                if not (
                    isinstance(record, dict)
                    and isinstance(record.get("seq"), int)
                    and isinstance(record.get("hash"), str)
                ):
                    raise AuditUnavailable(f"{name} ends in a record that is not ours; run `gateway audit verify`")
                return record
            chunk *= 4
    except (ValueError, RecursionError) as exc:
        raise AuditUnavailable(
            f"{name} ends in a line that is not a record ({exc}): see `gateway audit verify`"
        ) from exc
    except OSError as exc:
        raise AuditUnavailable(f"cannot read the end of the audit log {name}: {exc.strerror or exc}") from exc


def parse(raw: bytes) -> dict[str, Any] | None:
    """One line as a record, or None when it is not a JSON object (however deeply nested)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def records(directory: Path) -> Iterator[tuple[Path, int, dict[str, Any] | None, bytes]]:
    """Every line of the log in order: (file, line number, record or None if unreadable, raw).
    Files are opened by descriptor, never through a link (files.py)."""
    with AuditDir(directory) as d:
        for name in d.names():
            try:
                fd = d.open_read(name)
            except OSError as exc:
                yield Path(directory) / name, 0, None, f"cannot open: {exc.strerror or exc}".encode()
                continue
            with os.fdopen(fd, "rb") as f:
                for n, raw in enumerate(f, 1):
                    yield Path(directory) / name, n, parse(raw), raw
