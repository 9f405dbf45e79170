"""The audit log: append-only, hash-chained, signed JSON lines, durable before anything acts.

- records.py     what a record is: canonical JSON, hash, redaction, size bounds; reading back
- writer.py      `AuditLog`: group-committed, fdatasynced appends that never leave a torn record
- keys.py        the Ed25519 signing key, kept apart from the log and out of every sandbox
- checkpoint.py  the log's signed head, kept apart, so a truncated log cannot pass for a short one
- journal.py     each writer's calls allowed and not ended: `interrupted` records after a crash
- reserve.py     disk space kept for refusals and results, given back when the disk is full
- verify.py      `verify` (names the first problem: torn, edited, chain, forged, truncated,
                 rewritten); `AuditLog.repair` moves a torn end aside and records it

Files are `audit-NNNNNN.jsonl` in the audit directory, rotated by size; the chain runs on across
files. docs/audit.md has the record format and the trust model.
"""

from gateway.audit.checkpoint import Checkpoint, CheckpointError
from gateway.audit.keys import AuditKeyError, SigningKey, VerifyKey
from gateway.audit.records import (
    MAX_FILE_BYTES,
    REDACTED,
    SECRET_NAME,
    AuditUnavailable,
    bound,
    canonical,
    digest,
    records,
    redact,
)
from gateway.audit.verify import Verification, verify
from gateway.audit.writer import AuditLog, Repair, open_signed

__all__ = [
    "MAX_FILE_BYTES",
    "REDACTED",
    "SECRET_NAME",
    "AuditKeyError",
    "AuditLog",
    "AuditUnavailable",
    "Checkpoint",
    "CheckpointError",
    "Repair",
    "SigningKey",
    "Verification",
    "VerifyKey",
    "bound",
    "canonical",
    "digest",
    "open_signed",
    "records",
    "redact",
    "verify",
]
