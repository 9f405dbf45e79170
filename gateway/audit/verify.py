"""Checking a log, and repairing what a crash can leave: a torn last line, an unsigned end.

`verify(directory, key, heads)` walks every record and names the first problem:
- torn:      the last line has no newline (a crash or power cut while writing): `repair` handles it;
- not canonical: a line is not byte for byte what the writer writes (duplicate keys, reordered
             keys, other escapes): a reader could see something the hash does not cover;
- edited:    a record does not match its hash;
- the chain breaks (a record deleted, reordered or inserted), or seq skips;
- forged:    a signature does not verify with the reviewer's public key (the log was rewritten,
             hashes recomputed, by someone without the private key);
- unsigned end: the log ends in records no signature covers (each commit's last record is
             signed, and through the chain its signature covers every record before it);
- truncated: the log ends before a checkpoint's seq (records at the end were removed);
- rewritten: the log holds another record at a checkpoint's seq.

What a reviewer must hold: the public key (copied off the machine once) and a checkpoint (the
gateway's, or copies shipped elsewhere). Without a key only consistency is checked; without a
checkpoint, truncation at the end cannot be seen. docs/audit.md has the whole trust model.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit.checkpoint import Checkpoint
from gateway.audit.files import AuditDir
from gateway.audit.keys import VerifyKey
from gateway.audit.records import AuditUnavailable, canonical, digest, last_record, parse, records


@dataclass(frozen=True)
class Verification:
    ok: bool
    records: int
    file: str = ""
    line: int = 0
    seq: int | None = None
    problem: str = ""
    signed: int = 0  # signatures checked
    key: str = ""  # the fingerprint checked against
    heads: int = 0  # checkpoints matched
    notes: tuple[str, ...] = field(default=())
    torn: bool = False  # the problem is one `repair` may fix: a torn last line, or an unsigned end
    tail_line: int = 0  # for an unsigned end: the line (in `file`) where the unsigned records start

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
    fingerprint = key.fingerprint if key else ""
    wanted = {cp.seq for cp in heads or ()}
    hashes: dict[int, str] = {}
    prev = ""
    expected_seq = 1
    count = signed = unsigned = 0
    last_path, last_line = "", 0
    unsigned_from: tuple[str, int] = ("", 0)
    lines = list(records(directory))
    for i, (path, n, record, raw) in enumerate(lines):
        last_path, last_line = path.name, n

        def broken(
            problem: str, seq: Any = None, torn: bool = False, at: tuple[Any, ...] = (path, n, count, signed)
        ) -> Verification:
            return Verification(False, at[2], at[0].name, at[1], seq, problem, at[3], fingerprint, 0, (), torn)

        if n == 0:
            return broken(f"the file cannot be read as a log: {raw.decode(errors='replace')}")
        if not raw.endswith(b"\n"):
            if i == len(lines) - 1:
                return broken(
                    "torn: the last record is truncated (a crash or a full disk while it was written; it was "
                    "never acknowledged, so nothing ran on it): `gateway audit repair` moves it aside",
                    torn=True,
                )
            return broken("truncated: a record has no newline")
        if record is None:
            return broken("not a JSON record")
        seq = record.get("seq")
        try:
            exact = raw == (canonical(record) + "\n").encode("utf-8")
        except (TypeError, ValueError):
            exact = False
        if not exact:
            return broken(
                "not canonical: the line is not exactly what the writer writes (duplicate or reordered keys, "
                "spacing, escapes): what a reader sees may not be what the hash covers",
                seq,
            )
        if record.get("hash") != digest(record):
            return broken("edited: the record does not match its hash", seq)
        if record.get("prev") != prev:
            return broken("the chain breaks here: a record before it was deleted, reordered or edited", seq)
        if seq != expected_seq:
            return broken(f"expected seq {expected_seq}", seq)
        sig = record.get("sig")
        if sig is None:
            if not unsigned:
                unsigned_from = (path.name, n)
            unsigned += 1  # covered by the next signature, through the chain
        else:
            if key is not None and (not isinstance(sig, str) or not key.verify(record["hash"], sig)):
                return broken(
                    f"forged: the signature does not verify with key {key.fingerprint}: the log was rewritten "
                    "by someone without the signing key (or signed by another key)",
                    seq,
                )
            signed += 1
            unsigned = 0
        if seq in wanted:
            hashes[seq] = record["hash"]
        prev = record["hash"]
        expected_seq += 1
        count += 1
    end = expected_seq - 1

    def failed(
        problem: str, seq: int, torn: bool = False, at: tuple[str, int] = (last_path, last_line)
    ) -> Verification:
        return Verification(False, count, at[0], at[1], seq, problem, signed, fingerprint, 0, (), torn)

    if key is not None and count and not signed:
        return failed(
            f"not signed by key {fingerprint}: no record of this log carries a signature (a log written by a "
            "gateway with this key always ends in signed records): it was rewritten or replaced",
            end,
        )
    if key is not None and unsigned:
        result = failed(
            f"unsigned end: the last {unsigned} record(s) carry no signature and none follows (every commit "
            "ends in a signed record): they were added without the key, or a crash cut a commit short "
            "(`gateway audit repair` moves them aside if so)",
            end,
            torn=True,
            at=unsigned_from,
        )
        return Verification(**{**result.__dict__, "tail_line": unsigned_from[1]})
    if key is None and signed:
        notes.append("signatures not checked: give the public key (--key) to tell a rewritten log")
        signed = 0
    elif key is None:
        notes.append("the log is not signed: only its consistency is checked")
    here = os.path.realpath(directory)
    matched = 0
    for cp in heads or ():
        elsewhere = f" (the checkpoint names the log {cp.log}, this is {here})" if cp.log != here else ""
        if key is not None and not key.verify(cp.hash, cp.sig):
            return failed(
                f"the checkpoint of {cp.ts} (seq {cp.seq}) is not signed by key {fingerprint}: it is not trustworthy",
                cp.seq,
            )
        if cp.seq > end:
            return failed(
                f"truncated: the log ends at seq {end} but a checkpoint of {cp.ts} shows it reached seq {cp.seq}: "
                f"records {end + 1}..{cp.seq} were removed{elsewhere}",
                end,
            )
        if hashes.get(cp.seq) != cp.hash:
            return failed(
                f"rewritten: record seq {cp.seq} is not the one a checkpoint of {cp.ts} names{elsewhere}", cp.seq
            )
        if elsewhere:
            notes.append(f"a checkpoint of {cp.ts} matched, though it names the log at {cp.log}")
        matched += 1
    if heads is not None and not heads:
        notes.append("no checkpoint: records removed from the end would not show")
    return Verification(True, count, signed=signed, key=fingerprint, heads=matched, notes=tuple(notes))


def record_at(directory: Path, seq: int) -> dict[str, Any] | None:
    """The record with this seq: only the file that holds it is read (files start at rising seqs)."""
    with AuditDir(directory) as d:
        for name in reversed(d.names()):
            data = d.read_all(name)
            first = parse(data.split(b"\n", 1)[0])
            start = first.get("seq") if first else None
            if not isinstance(start, int) or start > seq:
                continue
            for raw in data.split(b"\n"):
                record = parse(raw)
                if record is not None and record.get("seq") == seq:
                    return record
            return None
    return None


@dataclass(frozen=True)
class Repair:
    file: str
    offset: int
    bytes: int
    sha256: str
    kept_as: str
    records: int  # complete but unsigned records moved aside (a commit a crash cut short)


def repair(directory: Path, key: VerifyKey | None) -> Repair | None:
    """Move what a crash left at the end aside (kept whole in `audit-NNNNNN.jsonl.torn-TIME`
    beside the log): a torn last line, and with a key, complete records after the last signature
    (a commit the crash cut short: never acknowledged, so nothing ran on them). None when there
    is nothing to repair; raises AuditUnavailable when the log has any other problem (repair never
    hides tampering). The caller records the repair (`audit_repaired`)."""
    with AuditDir(directory) as d:
        lock_fd = d.lock()
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            result = verify(directory, key)
            if result.ok:
                return None
            if not result.torn or result.file != (d.names() or [""])[-1]:
                raise AuditUnavailable(f"not repairable: {result.describe()}")
            name = result.file
            lines = d.read_all(name).splitlines(keepends=True)
            cut = (result.tail_line or result.line) - 1
            keep, torn = b"".join(lines[:cut]), b"".join(lines[cut:])
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            aside = f"{name}.torn-{stamp}"
            fd = d.create_new(aside)
            try:
                os.write(fd, torn)
                os.fsync(fd)
            finally:
                os.close(fd)
            fd = d.open_write(name)
            try:
                os.ftruncate(fd, len(keep))
                os.fsync(fd)
            finally:
                os.close(fd)
            whole = sum(1 for line in lines[cut:] if line.endswith(b"\n"))
            return Repair(name, len(keep), len(torn), hashlib.sha256(torn).hexdigest(), aside, whole)
        finally:
            os.close(lock_fd)


def head(directory: Path) -> dict[str, Any] | None:
    """The last record (for `gateway audit head`); raises AuditUnavailable on a torn end."""
    with AuditDir(directory) as d:
        for name in reversed(d.names()):
            fd = d.open_read(name)
            try:
                record = last_record(fd, name)
            finally:
                os.close(fd)
            if record is not None:
                return record
    return None
