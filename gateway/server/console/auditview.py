"""The audit log as the console reads it: the timeline's records, and the chain's verify status.

`AuditView` keeps the records of each log file with the file's size; a request re-reads only
the files whose size changed (the one being appended to; a full file is never rewritten), so a
timeline request costs the new records, not the whole log. Only complete lines are taken.

`CallIndex` keeps every call of the log folded into one row (gateway/audit/calls.py, the fold
`gateway audit calls` prints), reading only what was appended since it last looked (each file
from where it stopped; a file that shrank or went starts the fold again): the timeline of calls
and the overview count them without reading the log again, and without keeping its records. A
call's page reads its own records back from the log (the lines naming its id).

`VerifyStatus` runs the whole check (`gateway.audit.verify`, with the log's own key and
checkpoint, as `gateway audit verify` does) on a background thread, at most once every
`refresh_s` and never two at once; a request gets the last result and its age at once, whatever
the log's size and however many ask. A check that meets the end of a commit being written (a
torn last line, an unsigned end) is run again under the writer's lock before it is believed.
"""

from __future__ import annotations

import fcntl
import gc
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.audit import checkpoint as checkpoints
from gateway.audit.calls import ENDING, Call, Folder, story
from gateway.audit.files import AuditDir
from gateway.audit.keys import VerifyKey
from gateway.audit.records import parse
from gateway.audit.selection import Selection, strings_of
from gateway.audit.verify import Verification, verify
from gateway.log import log

FILTERS = ("principal", "tool", "decision", "rule", "event", "call_id", "host")
"""Filters on a record's fields; `since`, `until` (any time `gateway audit` takes: ISO 8601, a
date, `2h`, `yesterday`) and `text` (a case-insensitive substring of the record) are the others.
They mean what they mean to `gateway audit query` (gateway/audit/selection.py)."""


_APPROVAL_EVENTS = ("approval", "approval_withdrawn", "supervisor_answer", "supervisor_answer_refused")


class AuditView:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, list[dict[str, Any]]]] = {}

    def records(self) -> list[dict[str, Any]]:
        """Every record in the log, oldest first."""
        with self._lock, AuditDir(self.directory) as d:
            names = d.names()
            files: dict[str, tuple[int, list[dict[str, Any]]]] = {}
            for name in names:
                try:
                    fd = d.open_read(name)
                except OSError:
                    continue
                with os.fdopen(fd, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    known = self._files.get(name)
                    if known is not None and known[0] == size:
                        files[name] = known
                        continue
                    data = f.read(size)
                end = data.rfind(b"\n") + 1  # a line being written is taken next time
                rows = [r for r in (parse(line) for line in data[:end].splitlines()) if r is not None]
                files[name] = (size if end == len(data) else -1, rows)
            self._files = files
            return [r for name in names if name in files for r in files[name][1]]

    def query(self, filters: dict[str, str], limit: int, before_seq: int | None = None) -> dict[str, Any]:
        """The newest `limit` records matching every filter (older than `before_seq` if given)."""
        chosen = Selection.of(  # raises TimeSpecError: a time it cannot read (the API answers 400)
            since=filters.get("since"), until=filters.get("until"), events=[filters.get("event") or ""],
            call_ids=[filters.get("call_id") or ""], principal=filters.get("principal"), tool=filters.get("tool"),
            decision=filters.get("decision"), rule=filters.get("rule"), host=filters.get("host"),
            text=filters.get("text"),
        )  # fmt: skip
        out: list[dict[str, Any]] = []
        matched = 0
        records = self.records()
        for at in range(len(records) - 1, -1, -1):
            r = records[at]
            where = self.position(at, r)
            if before_seq is not None and not (where is not None and where < before_seq):
                continue
            if not chosen.matches(r):
                continue
            matched += 1
            if len(out) < limit:
                out.append(r)
        return {"records": out, "matched": matched, "truncated": matched > len(out)}

    def position(self, at: int, record: dict[str, Any]) -> int | None:
        """Where a record stands for paging (`before_seq`): its seq in the one chain of a file log."""
        seq = record.get("seq")
        return seq if isinstance(seq, int) else None


MAX_ASKS = 1000
"""Decision records of unanswered asks kept for the inbox's cards (the oldest go first)."""
MAX_CHILDREN = 200
"""Calls a call carried (a session write's lines) listed on its page."""
CHUNK = 4 << 20
"""Bytes of the log read at a time while folding."""
MAX_CALLS = 1_000_000
"""Calls the console keeps folded (about 1.4 KB each); older ones are let go and counted."""


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(line)
    except (orjson.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class CallIndex:
    def __init__(self, directory: Path, max_calls: int = MAX_CALLS) -> None:
        self.directory = Path(directory)
        self.max_calls = max_calls
        self._lock = threading.Lock()
        self._reset()
        self.reads = 0  # bytes read so far (tests check a refresh reads only what was appended)

    def _reset(self) -> None:
        self.folder = Folder()
        self._offsets: dict[str, int] = {}
        self.asks: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.dropped = 0
        """The oldest calls let go to keep `max_calls` (the pages say so: `gateway audit calls`
        reads them all)."""

    def refresh(self) -> None:
        """Fold what was appended since the last look (without the cycle collector meanwhile:
        the fold makes objects by the hundred thousand and frees none that form cycles, and the
        collector's passes over them cost a third of a large log's fold)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._refresh()
        finally:
            if collecting:
                gc.enable()

    def _refresh(self) -> None:
        with self._lock, AuditDir(self.directory) as d:
            names = d.names()
            sizes: dict[str, int] = {}
            for name in names:
                try:
                    fd = d.open_read(name)
                except OSError:
                    continue
                try:
                    sizes[name] = os.fstat(fd).st_size
                finally:
                    os.close(fd)
            if any(sizes.get(name, -1) < done for name, done in self._offsets.items()):
                self._reset()  # a file went or was cut back: nothing folded from it holds; fold again
            for name in names:
                if sizes.get(name, 0) > self._offsets.get(name, 0):
                    self._fold_file(d, name)

    def _fold_file(self, d: AuditDir, name: str) -> None:
        """Fold the complete lines appended to one file, a chunk at a time."""
        try:
            fd = d.open_read(name)
        except OSError:
            return
        try:
            done = self._offsets.get(name, 0)
            while True:
                data = os.pread(fd, CHUNK, done)
                end = data.rfind(b"\n") + 1  # a line being written is taken next time
                if end == 0:
                    if len(data) == CHUNK:  # one line longer than a chunk: read it whole
                        data = os.pread(fd, os.fstat(fd).st_size - done, done)
                        end = data.rfind(b"\n") + 1
                    if end == 0:
                        break
                self.reads += end
                for line in data[:end].splitlines():
                    r = _parse(line)
                    if r is not None:
                        self._add(r)
                done += end
                self._offsets[name] = done
        finally:
            os.close(fd)

    def warm(self) -> None:
        """Fold the log now (at start, on a thread), so the first visit finds it folded."""
        try:
            self.refresh()
        except Exception as exc:  # the next request folds it again, and says what fails
            log.warning("console_calls_failed", error=f"{type(exc).__name__}: {exc}")

    def _add(self, r: dict[str, Any]) -> None:
        call = self.folder.add(r)
        if call is None:
            return
        calls = self.folder.calls
        if len(calls) > self.max_calls:  # the oldest call goes (dicts keep the order calls began)
            del calls[next(iter(calls))]
            self.dropped += 1
        event = r.get("event")
        if event == "decision" and r.get("decision") == "ask":
            self.asks[call.call_id] = r
            while len(self.asks) > MAX_ASKS:
                self.asks.popitem(last=False)
        elif event in ("approval", *ENDING):
            self.asks.pop(call.call_id, None)

    def ask(self, call_id: str) -> dict[str, Any] | None:
        """The decision record of an ask not answered yet, if the fold has it. Never waits for
        a fold under way (a large log's first one takes seconds): the inbox must not."""
        if self._lock.locked():
            return self.asks.get(call_id)
        self.refresh()
        return self.asks.get(call_id)

    def calls(self, chosen: Selection, limit: int, before_seq: int | None, texts: set[str] | None) -> dict[str, Any]:
        """The newest `limit` calls the selection keeps (begun before `before_seq` if given);
        `texts`: the ids of the calls whose records hold the text filter (`text_calls`)."""
        self.refresh()
        fields = replace(chosen, text=None)
        with self._lock:
            everything = list(self.folder.calls.values())
        out: list[Call] = []
        matched = 0
        for call in reversed(everything):
            where = self.position(call)
            if before_seq is not None and not (where is not None and where < before_seq):
                continue
            if texts is not None and call.call_id not in texts and call.parent not in texts:
                continue
            if not call.matches(fields):
                continue
            matched += 1
            if len(out) < limit:
                out.append(call)
        return {"calls": out, "matched": matched, "truncated": matched > len(out), "dropped": self.dropped,
                "next_before": self.position(out[-1]) if out else None}  # fmt: skip

    def position(self, call: Call) -> int | None:
        """Where a call stands for paging (`before_seq`): the seq of its first record in the one
        chain of a file log."""
        return call.first_seq

    def all_calls(self) -> list[Call]:
        self.refresh()
        with self._lock:
            return list(self.folder.calls.values())

    def _lines(self, needle: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(line, its lower-case form) of every complete line holding `needle` (lower case)."""
        with AuditDir(self.directory) as d:
            for name in d.names():
                try:
                    fd = d.open_read(name)
                except OSError:
                    continue
                with os.fdopen(fd, "rb") as f:
                    data = f.read()
                data = data[: data.rfind(b"\n") + 1]
                low = data.lower()
                at = low.find(needle)
                while at >= 0:
                    start = low.rfind(b"\n", 0, at) + 1
                    stop = low.find(b"\n", at)
                    yield data[start:stop], low[start:stop]
                    at = low.find(needle, stop)

    def text_calls(self, chosen: Selection) -> set[str]:
        """The ids of the calls one of whose records holds the text filter (as `gateway audit
        calls --text` finds them: any key or value of a record, case-insensitive)."""
        assert chosen.text is not None
        needle = chosen.text.encode()
        found: set[str] = set()
        if all(32 <= b < 127 and b not in b'"\\' for b in needle):  # as written in a line: look in the lines
            for line, _ in self._lines(needle):
                r = _parse(line)
                if r is not None and isinstance(r.get("call_id"), str):
                    found.add(r["call_id"])
            return found
        for r in self.every_record():  # text JSON writes escaped, or not ASCII: look in the values
            if isinstance(r.get("call_id"), str) and any(chosen.text in v.lower() for v in strings_of(r)):
                found.add(r["call_id"])
        return found

    def every_record(self) -> Iterator[dict[str, Any]]:
        return _all_records(self.directory)

    def call(self, call_id: str) -> dict[str, Any] | None:
        """Everything recorded about one call, in order: its row, its story, its decision,
        approvals and result picked out, and every record (None when the log has none)."""
        needle = b'"call_id":' + orjson.dumps(call_id).lower()
        rows = [r for line, _ in self._lines(needle) if (r := _parse(line)) is not None and r.get("call_id") == call_id]
        if not rows:
            return None
        folded = Folder(keep_records=False)
        for r in rows:
            folded.add(r)
        self.refresh()
        with self._lock:
            children = [c.to_json() for c in self.folder.calls.values() if c.parent == call_id][:MAX_CHILDREN]

        def first(event: str) -> dict[str, Any] | None:
            return next((r for r in rows if r.get("event") == event), None)

        return {
            "call_id": call_id,
            "call": folded.calls[call_id].to_json(),
            "story": story(rows),
            "decision": first("decision"),
            "approvals": [r for r in rows if r.get("event") in _APPROVAL_EVENTS],
            "result": next((r for r in reversed(rows) if r.get("event") == "result"), None),
            "records": rows,
            "parts": children,
        }


def _all_records(directory: Path) -> Iterator[dict[str, Any]]:
    with AuditDir(directory) as d:
        for name in d.names():
            try:
                fd = d.open_read(name)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                for raw in f:
                    r = _parse(raw) if raw.endswith(b"\n") else None
                    if r is not None:
                        yield r


class VerifyStatus:
    def __init__(
        self, directory: Path, key: Callable[[], VerifyKey | None], checkpoint: Path | None, refresh_s: float = 5.0
    ) -> None:
        self.directory = Path(directory)
        self.key = key
        self.checkpoint = checkpoint
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._result: dict[str, Any] | None = None
        self._checked = 0.0
        self._running = False
        self.runs = 0  # how many checks ran (tests read it: requests must not each start one)

    def get(self) -> dict[str, Any]:
        """The last result (`state`: ok, broken, or checking before the first one), starting a
        new check in the background when it is older than `refresh_s`."""
        now = time.monotonic()
        with self._lock:
            start = not self._running and (self._result is None or now - self._checked >= self.refresh_s)
            if start:
                self._running = True
                threading.Thread(target=self._run, name="console-verify", daemon=True).start()
            if self._result is None:
                return {"state": "checking", "ok": None}
            return {**self._result, "age_s": round(now - self._checked, 1)}

    def _run(self) -> None:
        try:
            shown = {**self.checked(), "checked_at": datetime.now(UTC).isoformat(timespec="seconds")}
        except Exception as exc:  # a check that cannot run is not a pass
            shown = {"state": "broken", "ok": False, "problem": f"the check could not run: {exc}",
                     "describe": f"the check could not run: {exc}"}  # fmt: skip
        with self._lock:
            self.runs += 1
            self._result, self._checked, self._running = shown, time.monotonic(), False

    def checked(self) -> dict[str, Any]:
        """One whole check, as the page shows it (`state`, `ok`, `describe` and the details)."""
        result = self._check()
        return {**result.to_json(), "state": "ok" if result.ok else "broken", "describe": result.describe()}

    def _check(self) -> Verification:
        key = self.key()
        heads = []
        if self.checkpoint is not None:  # read before the log: the log is then at least as new
            newest = checkpoints.latest(self.checkpoint)
            heads = [newest] if newest else []
        result = verify(self.directory, key, heads)
        if result.ok or not result.torn:
            return result
        # maybe a commit being written: look again while the writer cannot write
        with AuditDir(self.directory) as d:
            lock_fd = d.lock()
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                if self.checkpoint is not None:
                    newest = checkpoints.latest(self.checkpoint)
                    heads = [newest] if newest else []
                return verify(self.directory, key, heads)
            finally:
                os.close(lock_fd)
