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

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.audit.checkpoint import Checkpoint
from gateway.audit.files import AuditDir
from gateway.audit.keys import AuditKeyError, VerifyKey
from gateway.audit.records import canonical, digest, last_record, parse, records


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
    tail_line: int = 0  # the line (in `file`) where the unsigned records before a torn line or at the end start
    adopted: int = 0  # signatures made before an adoption under a key the reviewer holds (not checked)

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


PINS = ("audit_key", "audit_adopted")
"""Records that name the key the log is signed with from there on (`data.public`, one line
`ed25519 BASE64`; not `key`, a name every record's redaction hides): `audit_key` opens a signed
log, `audit_adopted` records an adoption (and with --new-key, a change of key)."""


def pinned(record: dict[str, Any]) -> VerifyKey | None:
    """The key a pin record names, or None (not a pin, or a key that does not parse)."""
    data = record.get("data")
    if record.get("event") not in PINS or not isinstance(data, dict) or not isinstance(data.get("public"), str):
        return None
    try:
        return VerifyKey.from_line(data["public"], f"record seq {record.get('seq')}")
    except AuditKeyError:
        return None


class Walk:
    """Checks a log's lines in order, one at a time: `verify` walks the whole log, the writer
    the file it continues from (from `prev` and `seq`, the previous file's last record).

    Each signature must verify with a key of the current epoch: at first any of `keys`, after a
    pin that names one of them (and is signed by it), that key alone. A signature that does not
    verify is held (`pending`), not reported at once: an `audit_adopted` record signed by a key
    the reviewer holds vouches for everything before it (a log adopted under a new key after its
    old one was lost, `gateway audit adopt --new-key`). Whatever is still held at the end, or
    when another problem is found, is a forgery."""

    def __init__(
        self, keys: Sequence[VerifyKey] = (), prev: str = "", seq: int = 1, wanted: frozenset[int] = frozenset()
    ) -> None:
        self.keys = tuple(keys)
        self.epoch = self.keys
        self.prev, self.seq = prev, seq
        self.wanted = wanted
        self.hashes: dict[int, str] = {}
        self.count = self.signed = self.unsigned = self.adopted = 0
        self.unsigned_from: tuple[str, int] = ("", 0)
        self.pending: list[tuple[str, int, Any]] = []  # signatures that did not verify: file, line, seq
        self.named: tuple[str, int] | None = None  # the key the log last named (fingerprint) and where (seq)
        self.adoptions: list[tuple[int, str]] = []  # (seq, fingerprint) of each adoption that vouched
        self.adopted_at: list[tuple[int, Any, Any]] = []  # every audit_adopted: seq, what was checked, by whom
        self.last: dict[str, Any] | None = None
        self.at: tuple[str, int] = ("", 0)  # the last line walked

    @property
    def fingerprint(self) -> str:
        return ", ".join(k.fingerprint for k in self.keys)

    def _result(self, name: str, line: int, seq: Any, problem: str, torn: bool = False, tail: int = 0) -> Verification:
        if self.pending and not problem.startswith("forged"):
            return self.forged()  # the first problem: a signature before this one did not verify
        return Verification(
            False, self.count, name, line, seq, problem, self.signed, self.fingerprint, 0, (), torn, tail
        )

    def forged(self) -> Verification:
        name, line, seq = self.pending[0]
        self.pending = []
        problem = (
            f"forged: the signature does not verify with key {self.fingerprint}: the log was rewritten by someone "
            "without the signing key (or signed by another key)"
        )
        if self.named is not None and self.named[0] not in self.fingerprint:
            problem += (
                f"; the log names key {self.named[0]} (seq {self.named[1]}) as the one it is signed with: if that "
                "key is yours, pass its public key with --key"
            )
        return self._result(name, line, seq, problem)

    def step(self, path: Path, n: int, record: dict[str, Any] | None, raw: bytes, final: bool) -> Verification | None:
        """Check one line (`final`: the last line of the log). A problem comes back as a failed
        Verification naming the line; None when the line is sound."""
        name = path.name
        self.at = (name, n)
        if n == 0:
            return self._result(name, n, None, f"the file cannot be read as a log: {raw.decode(errors='replace')}")
        if not raw.endswith(b"\n"):
            if final:
                # a crash cut this commit short: its complete records before the torn line (after
                # the last signature) were never acknowledged either
                tail = self.unsigned_from[1] if self.keys and self.unsigned and self.unsigned_from[0] == name else 0
                return self._result(
                    name, n, None,
                    "torn: the last record is truncated (a crash or a full disk while it was written; it was never "
                    "acknowledged, so nothing ran on it): `gateway audit repair` moves it aside",
                    torn=True, tail=tail,
                )  # fmt: skip
            return self._result(name, n, None, "truncated: a record has no newline")
        if record is None:
            return self._result(name, n, None, "not a JSON record")
        seq = record.get("seq")
        try:
            exact = raw == (canonical(record) + "\n").encode("utf-8")
        except (TypeError, ValueError):
            exact = False
        if not exact:
            return self._result(
                name, n, seq,
                "not canonical: the line is not exactly what the writer writes (duplicate or reordered keys, "
                "spacing, escapes): what a reader sees may not be what the hash covers",
            )  # fmt: skip
        if record.get("hash") != digest(record):
            return self._result(name, n, seq, "edited: the record does not match its hash")
        if record.get("prev") != self.prev:
            return self._result(
                name, n, seq, "the chain breaks here: a record before it was deleted, reordered or edited"
            )
        if seq != self.seq:
            return self._result(name, n, seq, f"expected seq {self.seq}")
        self._signature(name, n, record)
        if record.get("event") == "audit_adopted":
            data = record.get("data")
            said = data if isinstance(data, dict) else {}
            self.adopted_at.append((seq, said.get("checked"), said.get("by")))
        if seq in self.wanted:
            self.hashes[seq] = record["hash"]
        self.prev = record["hash"]
        self.seq += 1
        self.count += 1
        self.last = record
        return None

    def _signature(self, name: str, n: int, record: dict[str, Any]) -> None:
        seq, sig = record["seq"], record.get("sig")
        pin = pinned(record)
        if pin is not None:
            self.named = (pin.fingerprint, seq)
        if sig is None:
            if not self.unsigned:
                self.unsigned_from = (name, n)
            self.unsigned += 1  # covered by the next signature, through the chain
            return
        self.unsigned = 0
        if not self.keys:  # nothing to check it with: counted, not checked
            self.signed += 1
            return
        if pin is not None and pin in self.keys and isinstance(sig, str) and pin.verify(record["hash"], sig):
            if record.get("event") == "audit_adopted" and self.pending:
                # the holder of a key the reviewer trusts took the log on as it was
                self.adopted += len(self.pending)
                self.adoptions.append((seq, pin.fingerprint))
                self.pending = []
            self.epoch = (pin,)
            self.signed += 1
            return
        if pin is not None:
            self.epoch = ()  # from here on the log says it is signed by a key the reviewer does not hold
        if isinstance(sig, str) and any(k.verify(record["hash"], sig) for k in self.epoch):
            self.signed += 1
        else:
            self.pending.append((name, n, seq))

    def finish(self) -> Verification | None:
        """What the end of the walk shows: a signature still held, a log no key of the reviewer's
        signed, or an end no signature covers."""
        name, line = self.at
        end = self.seq - 1
        if self.pending:
            return self.forged()
        if self.keys and self.count and not self.signed:
            return self._result(
                name, line, end,
                f"not signed by key {self.fingerprint}: no record of this log carries a signature (a log written by "
                "a gateway with this key always ends in signed records): it was rewritten or replaced",
            )  # fmt: skip
        if self.keys and self.unsigned:
            return self._result(
                self.unsigned_from[0], self.unsigned_from[1], end,
                f"unsigned end: the last {self.unsigned} record(s) carry no signature and none follows (every commit "
                "ends in a signed record): they were added without the key, or a crash cut a commit short "
                "(`gateway audit repair` moves them aside if so)",
                torn=True, tail=self.unsigned_from[1],
            )  # fmt: skip
        return None


def verify(
    directory: Path,
    key: VerifyKey | None = None,
    heads: Sequence[Checkpoint] | None = None,
    *,
    also: Sequence[VerifyKey] = (),
) -> Verification:
    """Walk every record of the log (see the module's docstring). `key` and `also`: the keys the
    reviewer trusts (more than one for a log adopted under a new key); `heads`: checkpoints."""
    notes: list[str] = []
    keys = ([key] if key is not None else []) + list(also)
    walk = Walk(keys, wanted=frozenset(cp.seq for cp in heads or ()))
    lines = records(directory)
    ahead = next(lines, None)
    while ahead is not None:
        path, n, record, raw = ahead
        ahead = next(lines, None)
        problem = walk.step(path, n, record, raw, final=ahead is None)
        if problem is not None:
            return problem
    problem = walk.finish()
    if problem is not None:
        return problem
    count, signed, end, fingerprint = walk.count, walk.signed, walk.seq - 1, walk.fingerprint
    last_path, last_line = walk.at

    def failed(problem: str, seq: int) -> Verification:
        return Verification(False, count, last_path, last_line, seq, problem, signed, fingerprint)

    for seq, checked, by in walk.adopted_at:
        notes.append(
            f"seq {seq}: the log was adopted (`gateway audit adopt`) by {by or 'someone'}; checked then: {checked}"
        )
    for seq, adopter in walk.adoptions:
        notes.append(
            f"records before seq {seq} were adopted under key {adopter} (`gateway audit adopt --new-key`): "
            f"{walk.adopted} signature(s) before it were made with another key and are not checked here; "
            "pass that key too (--key OLD --key NEW) to check them"
        )
    if not keys and signed:
        notes.append("signatures not checked: give the public key (--key) to tell a rewritten log")
        signed = 0
    elif not keys:
        notes.append("the log is not signed: only its consistency is checked")
    here = os.path.realpath(directory)
    matched = 0
    for cp in heads or ():
        elsewhere = f" (the checkpoint names the log {cp.log}, this is {here})" if cp.log != here else ""
        if keys and not any(k.verify(cp.hash, cp.sig) for k in keys):
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
        if walk.hashes.get(cp.seq) != cp.hash:
            return failed(
                f"rewritten: record seq {cp.seq} is not the one a checkpoint of {cp.ts} names{elsewhere}", cp.seq
            )
        if elsewhere:
            notes.append(f"a checkpoint of {cp.ts} matched, though it names the log at {cp.log}")
        matched += 1
    if heads is not None and not heads:
        notes.append("no checkpoint: records removed from the end would not show")
    return Verification(
        True, count, signed=signed, key=fingerprint, heads=matched, notes=tuple(notes), adopted=walk.adopted
    )


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
