"""Reading the log from a position, and a cursor that remembers how far an export got.

`LogReader` reads whole lines from a `Position` (a file of the log and a byte offset in it) on,
across rotations, by descriptor (files.py), and returns each with the position after it. It
never returns a line still being written, nor, in a signed log, the records after the last
signature: those belong to a commit still being written (the writer signs each commit's last
record), or to one a crash cut short, which `gateway audit repair` would move aside. An export
therefore never sends a record that could later vanish from the log.

`Cursor` is a small JSON file an exporter keeps: where to read next, and the `seq` and `hash`
of the last record it consumed, with where that record's line starts. On resume the record at
that place must still be there with that hash, or the export stops (exit 2): the log was
replaced, truncated or rewritten since, and guessing a place would skip or repeat records
silently. The cursor is written (to a new file, fsynced, renamed over the old one) only after
the sink has taken everything before it: delivery is at least once, and each record's `hash`
is the key a receiver deduplicates on.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from gateway.audit.files import AuditDir
from gateway.audit.records import AuditUnavailable, last_record, parse

READ_CHUNK = 8 << 20
"""Bytes read from a file at a time."""
MAX_LINE = 2 << 20
"""A line longer than this is not a record (the writer bounds records at 1 MiB)."""


class CursorError(Exception):
    """The cursor cannot be used: unreadable, for another format, or the log moved under it."""


class Position(NamedTuple):
    """A place in the log (a tuple: positions compare in log order)."""

    file: str = ""
    """The log file's name (`audit-000001.jsonl`); "" before the first file."""
    offset: int = 0
    """The byte offset in it of the next line to read."""

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset}


@dataclass(slots=True)
class Line:
    record: dict[str, Any] | None
    """The line as a record; None when it is not one (the reader reports it, and goes on)."""
    raw: bytes
    start: Position
    end: Position
    """The position after this line: where to go on from."""


@dataclass
class LogReader:
    directory: Path
    position: Position = field(default_factory=Position)
    signed: bool | None = None
    """Whether the log is signed (then nothing after its last signature is returned); None:
    found out on the first read from the log's last record."""

    def read(self, max_bytes: int = READ_CHUNK) -> list[Line]:
        """The complete lines from `position` on (about `max_bytes` of them), advancing it.
        Returns [] when there is nothing new yet."""
        with AuditDir(self.directory) as d:
            names = d.names()
            if self.signed is None:
                self.signed = _ends_signed(d, names)
            for name in names:
                if self.position.file and name < self.position.file:
                    continue
                start = self.position.offset if name == self.position.file else 0
                later = name != names[-1]
                lines, at_end = self._read_file(d, name, start, max_bytes, later)
                if lines:
                    return self._released(lines, at_end and not later)
                if later:  # this file is done: go on in the next one
                    self.position = Position(names[names.index(name) + 1], 0)
        return []

    def _read_file(self, d: AuditDir, name: str, start: int, max_bytes: int, later: bool) -> tuple[list[Line], bool]:
        """The whole lines from `start` (about `max_bytes`), and whether they reach the file's end."""
        try:
            fd = d.open_read(name)
        except OSError as exc:
            raise AuditUnavailable(f"cannot open {self.directory / name}: {exc.strerror or exc}") from exc
        try:
            size = os.fstat(fd).st_size
            if size <= start:
                return [], True
            data = os.pread(fd, min(size - start, max(max_bytes, MAX_LINE)), start)
        finally:
            os.close(fd)
        whole = data.rfind(b"\n") + 1
        out: list[Line] = []
        at = start
        for raw in data[:whole].splitlines(keepends=True):
            out.append(Line(_parse(raw), raw, Position(name, at), Position(name, at + len(raw))))
            at += len(raw)
        if whole < len(data) and later and start + len(data) == size:
            # a partial last line in a file the log has moved on from: not a record, reported as such
            out.append(Line(None, data[whole:], Position(name, at), Position(name, size)))
        return out, start + len(data) == size

    def _released(self, lines: list[Line], at_end: bool) -> list[Line]:
        """The lines to hand out: in a signed log, when they reach the end of the log, those up
        to the last signed record (the rest is read again next time); else all of them (what a
        later record follows is whole: a commit that began there ends, signed, further on)."""
        signed_at = [i for i, ln in enumerate(lines) if ln.record is not None and "sig" in ln.record]
        self.signed = self.signed or bool(signed_at)
        if self.signed and at_end:
            lines = lines[: signed_at[-1] + 1] if signed_at else []
        if lines:
            self.position = lines[-1].end
        return lines


def _parse(raw: bytes) -> dict[str, Any] | None:
    """One line as a record: by orjson (three times the standard library's speed), and by the
    standard library when orjson refuses it (an integer past 64 bits, a lone surrogate), so
    both read every line alike."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return parse(raw)
    return value if isinstance(value, dict) else None


def _ends_signed(d: AuditDir, names: list[str]) -> bool:
    for name in reversed(names):
        try:
            fd = d.open_read(name)
        except OSError:
            return False
        try:
            last = last_record(fd, name)
        except AuditUnavailable:
            return True  # a torn end: hold back until a signature shows what is whole
        finally:
            os.close(fd)
        if last is not None:
            return "sig" in last
    return False


def line_at(directory: Path, position: Position) -> dict[str, Any] | None:
    """The record whose line starts at `position`, None when there is none there."""
    with AuditDir(directory) as d:
        try:
            fd = d.open_read(position.file)
        except OSError:
            return None
        try:
            data = os.pread(fd, MAX_LINE, position.offset)
        finally:
            os.close(fd)
    end = data.find(b"\n")
    return parse(data[: end + 1]) if end >= 0 else None


@dataclass
class Cursor:
    path: Path
    format: str
    position: Position = field(default_factory=Position)
    """Where reading goes on."""
    last: Position | None = None
    """Where the line of the last record consumed starts (checked on resume)."""
    seq: int | None = None
    hash: str | None = None
    signed: bool | None = None
    sent_through: int = 0
    """Calls ended at or before this `seq` were sent (OTLP, which reads again from the oldest
    call still open)."""

    @classmethod
    def load(cls, path: Path, fmt: str) -> Cursor:
        """The cursor at `path`, or a new one at the log's start if there is no file yet."""
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path, fmt)
        except OSError as exc:
            raise CursorError(f"cursor {path}: {exc.strerror}") from None
        try:
            d = json.loads(raw)
            if not isinstance(d, dict) or d.get("version") != 1:
                raise ValueError('expected {"version": 1, ...}')
            if d.get("format") != fmt:
                raise CursorError(
                    f"cursor {path} is for --format {d.get('format')}, not {fmt}: use one cursor per export stream"
                )
            last = d.get("last")
            return cls(
                path, fmt, Position(str(d["position"]["file"]), int(d["position"]["offset"])),
                Position(str(last["file"]), int(last["offset"])) if isinstance(last, dict) else None,
                d.get("seq") if isinstance(d.get("seq"), int) else None,
                d.get("hash") if isinstance(d.get("hash"), str) else None,
                d.get("signed") if isinstance(d.get("signed"), bool) else None,
                int(d.get("sent_through", 0)),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise CursorError(f"cursor {path}: not a cursor file ({exc}); remove it to export from the start") from None

    def check(self, directory: Path) -> None:
        """The record the cursor says it consumed last is still where it was, with its hash."""
        if self.last is None or self.hash is None:
            return
        found = line_at(directory, self.last)
        if found is None or found.get("hash") != self.hash or found.get("seq") != self.seq:
            got = "nothing" if found is None else f"seq {found.get('seq')} hash {str(found.get('hash'))[:16]}"
            raise CursorError(
                f"cursor {self.path}: the log no longer holds seq {self.seq} (hash {self.hash[:16]}) at "
                f"{self.last.file}:{self.last.offset} ({got} there): it was replaced, truncated or rewritten since "
                "the last export. Check it with `gateway audit verify`; to export it anew, remove the cursor"
            )

    def advance(self, line: Line, position: Position, sent_through: int | None = None) -> None:
        """`line` was consumed and everything before `position` is taken care of."""
        record = line.record or {}
        self.position, self.last = position, line.start
        self.seq = record.get("seq") if isinstance(record.get("seq"), int) else self.seq
        self.hash = record.get("hash") if isinstance(record.get("hash"), str) else self.hash
        if sent_through is not None:
            self.sent_through = sent_through

    def save(self) -> None:
        body = {
            "version": 1, "format": self.format, "position": self.position.to_json(),
            "last": self.last.to_json() if self.last else None, "seq": self.seq, "hash": self.hash,
            "signed": self.signed, "sent_through": self.sent_through,
        }  # fmt: skip
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(body, f)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
