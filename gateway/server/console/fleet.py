"""The console of a gateway run with `--store`: the fleet's inbox and the fleet's ledger.

- `FleetInbox`: the asks of every gateway of the fleet (rows of `agw.approval`, through
  gateway/store/approvals.py). The console runs inside a gateway, connected as the gateway's
  database login, which may not answer; so an answer carries the supervisor's own console
  secret to the database (`agw.answer_with_secret()`, migrations/0007), which checks it against
  the fleet's tokens and records the secret's supervisor as who answered, and this console's
  host, the secret's id and the gateway's login as where from. Exactly one answer wins there,
  as from `gateway approvals --store`. The console's own `supervisor_answer` record is written
  inside the answer's transaction, before it commits: an answer that cannot be recorded is
  rolled back, and nobody ever sees it.
- `FleetAuditView`, `FleetCallIndex`: the timeline of records and of calls, a call's page and the
  overview over every stream of the store (gateway/store/reader.py's Follower), each look
  reading only the records past each stream's last seq folded. Records are paged by their place in the
  order read (a seq is per stream in the store, not one count for the fleet).
- `Fleet.records`: every record of the fleet, for the console's what-if replay (gateway/replay.py),
  as `gateway audit replay --store` reads it.
- `FleetVerifyStatus`: `gateway audit verify --store`'s check (gateway/store/ledger.py) in the
  background, as for the files. No key is pinned here (the console holds only its own host's
  key): signatures are checked against the keys the streams name themselves, and the result
  says so; a reviewer pins the hosts' keys with `gateway audit verify --store --key`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from gateway.audit.calls import Call
from gateway.audit.sink import AuditSink
from gateway.server.console.auditview import AuditView, CallIndex, VerifyStatus
from gateway.server.console.feed import AnswerRefused
from gateway.store import approvals, db, ledger, reader

STORE_INTERVAL_S = 1.0
"""How often the feed reads the fleet's pending asks (one indexed query)."""


class FleetInbox:
    """The fleet's asks, answered with the supervisor's secret (see the module's docstring)."""

    interval_s = STORE_INTERVAL_S
    needs_secret = True

    def __init__(self, store: db.Store, host: str, where: str) -> None:
        self.store = store
        self.host = host
        """This gateway's host in the fleet (a secret limited to hosts is checked against it)."""
        self.where = where
        """What `answered_from` says the answer came from (this console)."""

    def pending(self) -> list[dict[str, Any]]:
        return approvals.pending(self.store)

    def answered(self, call_ids: list[str]) -> set[str]:
        return {c for c, s in approvals.states(self.store, call_ids).items() if s in ("approved", "denied")}

    def answer(
        self, supervisor: str, secret: str, call_id: str, approved: bool, reason: str, scope: str,
        digest: str | None, record: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:  # fmt: skip
        if not secret:  # a session opened before it kept secrets: the store would refuse it anyway
            raise AnswerRefused("this session holds no secret to answer with: sign in again")
        try:
            return approvals.answer_with_secret(
                self.store, secret, self.host, call_id, approved, reason, scope, self.where, digest,
                record=lambda row: record({**row["request"], "digest": row["digest"], "host": row["host"]}),
            )  # fmt: skip
        except approvals.ApprovalError as exc:
            raise AnswerRefused(str(exc)) from None


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except (orjson.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class _Reader:
    """What was appended to the fleet's ledger since the last look (reader.Follower: each
    stream's last seq read; the global order where the sequencer folded the records)."""

    def __init__(self, store: db.Store) -> None:
        self.follower = reader.Follower(store)
        self.started = False

    def new(self) -> list[bytes]:
        if self.started:
            return [raw for _, _, _, raw in self.follower.read()]
        try:  # read whole before it counts as read: a first read cut short starts over
            rows = [raw for _, _, _, raw in self.follower.start()]
        except BaseException:
            self.follower = reader.Follower(self.follower.store)
            raise
        self.started = True
        return rows


class FleetAuditView(AuditView):
    """The timeline of records over the fleet's ledger (only what is new is read)."""

    def __init__(self, store: db.Store, directory: Path) -> None:
        super().__init__(directory)  # this host's directory of the ledger: nothing is read from it
        self._reader = _Reader(store)
        self._records: list[dict[str, Any]] = []

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            self._records.extend(r for r in map(_parse, self._reader.new()) if r is not None)
            return list(self._records)

    def position(self, at: int, record: dict[str, Any]) -> int | None:
        return at


class FleetCallIndex(CallIndex):
    """The calls folded over the fleet's ledger; a call's page and the text filter ask the store
    for the records that hold what is looked for."""

    def __init__(self, store: db.Store, directory: Path) -> None:
        self.store = store
        self._reader = _Reader(store)
        self._began: dict[str, int] = {}
        self._counter = itertools.count()
        super().__init__(directory)  # this host's directory of the ledger: nothing is read from it

    def _refresh(self) -> None:
        with self._lock:
            for raw in self._reader.new():
                self.reads += len(raw)
                r = _parse(raw)
                if r is None:
                    continue
                self._add(r)
                call_id = r.get("call_id")
                if isinstance(call_id, str) and call_id not in self._began:
                    self._began[call_id] = next(self._counter)

    def position(self, call: Call) -> int | None:
        return self._began.get(call.call_id)

    def _lines(self, needle: bytes) -> Iterator[tuple[bytes, bytes]]:
        for raw in reader.bodies_holding(self.store, needle.decode("utf-8", "replace")):
            yield raw, raw.lower()

    def every_record(self) -> Iterator[dict[str, Any]]:
        for _, _, record, _ in reader.records(self.store):  # a server-side cursor: not all held at once
            if record is not None:
                yield record


class FleetVerifyStatus(VerifyStatus):
    """`gateway audit verify --store` in the background (see the module's docstring)."""

    def __init__(self, store: db.Store, directory: Path, refresh_s: float = 5.0) -> None:
        super().__init__(directory, lambda: None, None, refresh_s)
        self.store = store

    def checked(self) -> dict[str, Any]:
        result = ledger.verify_store(self.store)
        lines = result.lines()
        note = "signatures checked against the keys the streams name (pin the hosts' keys: gateway audit verify " \
               "--store --key)"  # fmt: skip
        return {"state": "ok" if result.ok else "broken", "ok": result.ok, "fleet": True, "streams": result.streams,
                "records": result.records, "checkpoints": result.checkpoints, "problems": result.problems,
                "describe": f"{lines[0]}; {note}" if result.ok else "\n".join(lines)}  # fmt: skip


class Fleet:
    """What the console of a `--store` gateway reads and answers through."""

    def __init__(self, audit: ledger.StoreLedger, port: int) -> None:
        self.store = audit.store
        self.directory = audit.directory
        self.inbox = FleetInbox(audit.store, audit.host, f"{audit.host}:{port}")

    def view(self) -> FleetAuditView:
        return FleetAuditView(self.store, self.directory)

    def calls(self) -> FleetCallIndex:
        return FleetCallIndex(self.store, self.directory)

    def verify(self) -> FleetVerifyStatus:
        return FleetVerifyStatus(self.store, self.directory)

    def records(self) -> Iterator[reader.Row]:
        """Every record of every stream, in the fleet's global order (what-if replay reads it)."""
        return reader.records(self.store)


def fleet_of(audit: AuditSink, port: int) -> Fleet | None:
    """The fleet a gateway's console reads, when its ledger is the store; None on files."""
    return Fleet(audit, port) if isinstance(audit, ledger.StoreLedger) else None
