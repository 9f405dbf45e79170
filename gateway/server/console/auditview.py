"""The audit log as the console reads it: the timeline's records, and the chain's verify status.

`AuditView` keeps the records of each log file with the file's size; a request re-reads only
the files whose size changed (the one being appended to; a full file is never rewritten), so a
timeline request costs the new records, not the whole log. Only complete lines are taken.

`VerifyStatus` runs the whole check (`gateway.audit.verify`, with the log's own key and
checkpoint, as `gateway audit verify` does) on a background thread, at most once every
`refresh_s` and never two at once; a request gets the last result and its age at once, whatever
the log's size and however many ask. A check that meets the end of a commit being written (a
torn last line, an unsigned end) is run again under the writer's lock before it is believed.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit import checkpoint as checkpoints
from gateway.audit.files import AuditDir
from gateway.audit.keys import VerifyKey
from gateway.audit.records import parse
from gateway.audit.selection import Selection
from gateway.audit.verify import Verification, verify

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
        for r in reversed(self.records()):
            if before_seq is not None and not (isinstance(r.get("seq"), int) and r["seq"] < before_seq):
                continue
            if not chosen.matches(r):
                continue
            matched += 1
            if len(out) < limit:
                out.append(r)
        return {"records": out, "matched": matched, "truncated": matched > len(out)}

    def call(self, call_id: str) -> dict[str, Any] | None:
        """Everything recorded about one call, in order, with its decision, approvals and result
        picked out (None when the log has no record of it)."""
        rows = [r for r in self.records() if r.get("call_id") == call_id]
        if not rows:
            return None

        def first(event: str) -> dict[str, Any] | None:
            return next((r for r in rows if r.get("event") == event), None)

        return {
            "call_id": call_id,
            "decision": first("decision"),
            "approvals": [r for r in rows if r.get("event") in _APPROVAL_EVENTS],
            "result": next((r for r in reversed(rows) if r.get("event") == "result"), None),
            "records": rows,
        }


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
            result = self._check()
            shown = {**result.to_json(), "state": "ok" if result.ok else "broken", "describe": result.describe(),
                     "checked_at": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
        except Exception as exc:  # a check that cannot run is not a pass
            shown = {"state": "broken", "ok": False, "problem": f"the check could not run: {exc}",
                     "describe": f"the check could not run: {exc}"}  # fmt: skip
        with self._lock:
            self.runs += 1
            self._result, self._checked, self._running = shown, time.monotonic(), False

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
