"""Checking a log, and repairing the one thing a crash can leave: a torn last record.

`verify(directory, key, heads)` walks every record and names the first problem:
- torn:      the last line is incomplete (a crash or power cut while writing): `repair` handles it;
- edited:    a record does not match its hash;
- the chain breaks (a record deleted, reordered or inserted), or seq skips;
- forged:    a signature does not verify with the reviewer's public key (the log was rewritten,
             hashes recomputed, by someone without the private key);
- unsigned:  the log ends in records no signature covers (each commit's last record is signed,
             and through the chain its signature covers every record before it);
- truncated: the log ends before a checkpoint's seq (records at the end were removed);
- rewritten: the log holds another record at a checkpoint's seq.

What a reviewer must hold: the public key (copied off the machine once) and a checkpoint (the
gateway's, or copies shipped elsewhere). Without a key only consistency is checked; without a
checkpoint, truncation at the end cannot be seen. docs/audit.md has the whole trust model.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit.checkpoint import Checkpoint
from gateway.audit.keys import VerifyKey
from gateway.audit.records import FILE_NAME, AuditUnavailable, digest, last_record, records


@dataclass(frozen=True)
class Verification:
    ok: bool
    records: int
    file: str = ""
    line: int = 0
    seq: int | None = None
    problem: str = ""
    signed: int = 0  # records whose signature was checked
    key: str = ""  # the fingerprint checked against
    heads: int = 0  # checkpoints matched
    notes: tuple[str, ...] = field(default=())
    torn: bool = False  # the only problem is a torn last record: `repair` can fix it

    def describe(self) -> str:
        if not self.ok:
            text = f"broken at {self.file}:{self.line} (seq {self.seq}): {self.problem}"
        else:
            text = f"ok: {self.records} records, chain intact"
            if self.key:
                text += f", every record covered by {self.signed} signatures valid for key {self.key}"
            if self.heads:
                text += f", {self.heads} checkpoint(s) matched"
        return "\n".join([text, *(f"note: {n}" for n in self.notes)])

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "records": self.records,
            "signed": self.signed,
            "key": self.key or None,
            "checkpoints": self.heads,
            "problem": self.problem or None,
            "file": self.file or None,
            "line": self.line or None,
            "seq": self.seq,
            "torn": self.torn,
            "notes": list(self.notes),
        }


def verify(directory: Path, key: VerifyKey | None = None, heads: Sequence[Checkpoint] | None = None) -> Verification:
    notes: list[str] = []
    wanted = {cp.seq for cp in heads or ()}
    hashes: dict[int, str] = {}
    prev = ""
    expected_seq = 1
    count = signed = unsigned = 0
    last_path, last_line = "", 0
    for path, n, record, raw in records(directory):
        last_path, last_line = path.name, n

        def broken(
            problem: str, seq: Any = None, torn: bool = False, at: tuple[Any, ...] = (path, n, count, signed)
        ) -> Verification:
            return Verification(
                False, at[2], at[0].name, at[1], seq, problem, at[3], key.fingerprint if key else "", 0, (), torn
            )

        if not raw.endswith(b"\n") or record is None:
            if _is_last(directory, path, n):
                return broken(
                    "torn: the last record is truncated (a crash or a full disk while it was written; it was "
                    "never acknowledged, so nothing ran on it): `gateway audit repair` moves it aside",
                    torn=True,
                )
            return broken("truncated: a record has no newline" if record else "not a JSON record")
        if not isinstance(record, dict):
            return broken("not a JSON record")
        seq = record.get("seq")
        if record.get("hash") != digest(record):
            return broken("edited: the record does not match its hash", seq)
        if record.get("prev") != prev:
            return broken("the chain breaks here: a record before it was deleted, reordered or edited", seq)
        if seq != expected_seq:
            return broken(f"expected seq {expected_seq}", seq)
        sig = record.get("sig")
        if sig is None:
            unsigned += 1  # covered by the next signature, through the chain
        elif key is not None:
            if not isinstance(sig, str) or not key.verify(record["hash"], sig):
                return broken(
                    f"forged: the signature does not verify with key {key.fingerprint}: the log was rewritten "
                    "by someone without the signing key (or signed by another key)",
                    seq,
                )
            signed += 1
            unsigned = 0
        else:
            signed += 1
            unsigned = 0
        if seq in wanted:
            hashes[seq] = record["hash"]
        prev = record["hash"]
        expected_seq += 1
        count += 1
    fingerprint = key.fingerprint if key else ""
    if key is not None and count and not signed:
        return Verification(
            False, count, last_path, last_line, expected_seq - 1,
            f"not signed by key {fingerprint}: no record of this log carries a signature (a log written by a "
            "gateway with this key always ends in signed records): it was rewritten or replaced",
            0, fingerprint,
        )  # fmt: skip
    if key is not None and unsigned:
        return Verification(
            False, count, last_path, last_line, expected_seq - 1,
            f"unsigned end: the last {unsigned} record(s) carry no signature and none follows (every commit "
            "ends in a signed record): they were added without the key, or the log was cut inside a commit",
            signed, fingerprint,
        )  # fmt: skip
    if key is None and signed:
        notes.append("signatures not checked: give the public key (--key) to tell a rewritten log")
        signed = 0
    elif key is None:
        notes.append("the log is not signed: only its consistency is checked")
    matched = 0
    for cp in heads or ():
        if key is not None and not key.verify(cp.hash, cp.sig):
            return Verification(
                False, count, last_path, last_line, cp.seq,
                f"the checkpoint of {cp.ts} (seq {cp.seq}) is not signed by key {fingerprint}: it is not trustworthy",
                signed, fingerprint,
            )  # fmt: skip
        if cp.seq >= expected_seq:
            return Verification(
                False, count, last_path, last_line, expected_seq - 1,
                f"truncated: the log ends at seq {expected_seq - 1} but a checkpoint of {cp.ts} shows it reached "
                f"seq {cp.seq}: records {expected_seq}..{cp.seq} were removed",
                signed, fingerprint,
            )  # fmt: skip
        if hashes.get(cp.seq) != cp.hash:
            return Verification(
                False, count, last_path, last_line, cp.seq,
                f"rewritten: record seq {cp.seq} is not the one a checkpoint of {cp.ts} names",
                signed, fingerprint,
            )  # fmt: skip
        matched += 1
    if heads is not None and not heads:
        notes.append("no checkpoint: records removed from the end would not show")
    return Verification(True, count, signed=signed, key=fingerprint, heads=matched, notes=tuple(notes))


def _is_last(directory: Path, path: Path, line: int) -> bool:
    """Whether (path, line) is the last line of the log's last file."""
    files = _files(directory)
    if not files or files[-1] != path:
        # a torn record followed only by empty files is still the last one
        later = files[files.index(path) + 1 :] if path in files else []
        if any(p.stat().st_size for p in later):
            return False
    with open(path, "rb") as f:
        return sum(1 for _ in f) == line


def record_at(directory: Path, seq: int) -> dict[str, Any] | None:
    """The record with this seq: only the file that holds it is read (files start at rising seqs)."""
    for path in reversed(_files(directory)):
        with open(path, "rb") as f:
            first = f.readline()
            try:
                start = json.loads(first).get("seq") if first else None
            except (ValueError, AttributeError):
                start = None
            if not isinstance(start, int) or start > seq:
                continue
            f.seek(0)
            for raw in f:
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("seq") == seq:
                    return record
            return None
    return None


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir() if FILE_NAME.match(p.name))


@dataclass(frozen=True)
class Repair:
    file: str
    offset: int
    bytes: int
    sha256: str
    kept_as: str


def repair(directory: Path) -> Repair | None:
    """Move a torn last record aside (kept whole in `audit-NNNNNN.jsonl.torn-TIME` beside the log)
    and cut the file at the last complete record. None when there is nothing to repair; raises
    AuditUnavailable when the log has another problem (repair never hides tampering). The caller
    records the repair in the log (`audit_repaired`). Run it with no gateway writing."""
    import fcntl

    lock_fd = os.open(Path(directory) / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        result = verify(directory)
        if result.ok:
            return None
        if not result.torn:
            raise AuditUnavailable(f"not repairable: {result.describe()}")
        path = Path(directory) / result.file
        with open(path, "rb") as f:
            lines = f.readlines()
        keep = b"".join(lines[: result.line - 1])
        torn = b"".join(lines[result.line - 1 :])
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = path.with_name(f"{path.name}.torn-{stamp}")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, torn)
            os.fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, len(keep))
            os.fsync(fd)
        finally:
            os.close(fd)
        return Repair(path.name, len(keep), len(torn), hashlib.sha256(torn).hexdigest(), aside.name)
    finally:
        os.close(lock_fd)


def head(directory: Path) -> dict[str, Any] | None:
    """The last record (for `gateway audit head`); raises AuditUnavailable on a torn end."""
    for path in reversed(_files(directory)):
        record = last_record(path)
        if record is not None:
            return record
    return None
