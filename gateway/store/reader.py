"""Reading the fleet's ledger back as the audit readers read the files (`audit tail|show|query|
calls|replay|export --store`, `tail -f`, `export --follow`): every record of every stream, in the
shape `gateway.audit.records` yields: (where, seq, record or None when the row is not a record,
the raw bytes), or as the `Line`s an export reads (gateway/audit/follow.py).

The order is the fleet's global order where the sequencer has folded the records, and commit
order after that: first the records checkpoint 1 covers, then those checkpoint 2 added, and so
on (within one checkpoint, in the order the store received them), then the records no checkpoint
covers yet, in the order the store received them. Each stream keeps its own order throughout.

Following (`Follower`) remembers how far it has read each stream (its seq) and the newest
checkpoint it has seen; each `read` takes, in one snapshot, the streams' new heads and the records
past what it read, ordered the same way (those a newer checkpoint folded first). A record is
returned once it is committed, and never twice.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from gateway.audit.follow import Line, Position
from gateway.store import db

BATCH = 2000
Row = tuple[Path, int, dict[str, Any] | None, bytes]

_FOLDS = """
WITH heads AS (
    SELECT c.n, h.key AS stream, (h.value->>0)::bigint AS hi
      FROM agw.checkpoint c CROSS JOIN LATERAL jsonb_each(
           CASE WHEN jsonb_typeof(c.body::jsonb->'heads') = 'object' THEN c.body::jsonb->'heads'
                ELSE '{}'::jsonb END) h
     WHERE c.n > %(after)s AND jsonb_typeof(h.value->0) = 'number'
), folds AS (
    SELECT n, stream, hi, coalesce(max(hi) OVER (PARTITION BY stream ORDER BY n
           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS lo
      FROM heads
)
SELECT r.stream, r.seq, r.body FROM agw.record r
  {bounds}
  LEFT JOIN folds f ON f.stream = r.stream AND r.seq > f.lo AND r.seq <= f.hi
 ORDER BY f.n NULLS LAST, r.received_at, r.stream, r.seq
"""
_RECEIVED = "SELECT r.stream, r.seq, r.body FROM agw.record r {bounds} ORDER BY r.received_at, r.stream, r.seq"
_BOUNDS = (
    "JOIN unnest(%(streams)s::text[], %(los)s::bigint[], %(his)s::bigint[]) AS b(stream, lo, hi) "
    "ON r.stream = b.stream AND r.seq > b.lo AND r.seq <= b.hi"
)
_HEADS = (
    "SELECT s.stream, r.seq FROM agw.stream s CROSS JOIN LATERAL "
    "(SELECT seq FROM agw.record WHERE stream = s.stream ORDER BY seq DESC LIMIT 1) r"
)


def _row(stream: str, seq: int, body: Any) -> Row:
    raw = str(body).encode("utf-8")
    try:
        record = json.loads(raw)
    except ValueError:
        record = None
    return Path(f"store:{stream}"), int(seq), record if isinstance(record, dict) else None, raw


def _sql(after: int, bounds: dict[str, tuple[int, int]] | None, folded: bool) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"after": after}
    clause = ""
    if bounds is not None:
        names = sorted(bounds)
        params |= {"streams": names, "los": [bounds[s][0] for s in names], "his": [bounds[s][1] for s in names]}
        clause = _BOUNDS
    return (_FOLDS if folded else _RECEIVED).replace("{bounds}", clause), params


def _rows(
    store: db.Store, after: int = 0, bounds: dict[str, tuple[int, int]] | None = None, *, folded: bool = True
) -> Iterator[Row]:
    """The records (all, or those in `bounds`: stream -> (after seq, up to seq)) in the global
    order, folds from checkpoints after `after` only; streamed from a server-side cursor. A
    checkpoint the database cannot read as JSON (tampered) leaves the order to the store's:
    said on stderr (`audit verify --store` names it)."""
    sent = 0
    try:
        with store.connection() as conn, conn.transaction():
            cur = conn.cursor(name="agw_read")
            cur.itersize = BATCH
            cur.execute(*_sql(after, bounds, folded))
            for stream, seq, body in cur:
                sent += 1
                yield _row(stream, seq, body)
            cur.close()
    except psycopg.errors.DataException as exc:  # a checkpoint that is not JSON
        if not folded or sent:
            raise db.StoreError(f"the store {store.name}: cannot read the ledger: {exc}") from exc
        print(f"gateway: a checkpoint in the store {store.name} is unreadable ({exc}): the records follow in "
              "the order the store received them; see `gateway audit verify --store`", file=sys.stderr)  # fmt: skip
        yield from _rows(store, after, bounds, folded=False)


def records(store: db.Store) -> Iterator[Row]:
    """Every record of the ledger, in the global order (module doc). Raises StoreUnavailable
    when the store cannot be read."""
    yield from _rows(store)


class Follower:
    """Reads the ledger as it grows: `start()` streams what is there, `read()` what came since."""

    def __init__(self, store: db.Store) -> None:
        self.store = store
        self.known: dict[str, int] = {}
        """Each stream's last seq read."""
        self.after = 0
        """The newest checkpoint seen: the records of those up to it were read already."""

    def _snapshot(self, conn: psycopg.Connection[Any]) -> tuple[dict[str, int], int]:
        heads = {str(s): int(q) for s, q in conn.execute(_HEADS).fetchall()}
        row = conn.execute("SELECT coalesce(max(n), 0) FROM agw.checkpoint").fetchone()
        return heads, int(row[0]) if row else 0

    def start(self) -> Iterator[Row]:
        """Everything committed so far, in the global order (streamed)."""
        with self.store.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            heads, newest = self._snapshot(conn)
        self.known, self.after = dict(heads), newest
        yield from _rows(self.store, 0, {s: (0, h) for s, h in heads.items()})

    def read(self) -> list[Row]:
        """The records committed since the last read ([] when none), in the global order: the
        heads, the newest checkpoint and the records are read in one snapshot, so none is
        skipped or read twice."""
        with self.store.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            heads, newest = self._snapshot(conn)
            moved = {s: (self.known.get(s, 0), h) for s, h in heads.items() if h > self.known.get(s, 0)}
            if not moved:
                self.after = newest
                return []
            try:
                rows = [_row(*r) for r in conn.execute(*_sql(self.after, moved, True)).fetchall()]
            except psycopg.errors.DataException:
                raise db.StoreError(
                    f"the store {self.store.name}: a checkpoint is unreadable; see `gateway audit verify --store`"
                ) from None
        self.known.update({s: h for s, (_, h) in moved.items()})
        self.after = newest
        return rows


class StoreLines:
    """The ledger as an export or `tail -f` reads the log (follow.LogReader's `read`): what is
    there in chunks, then what comes. Lines are placed at `store:STREAM` seq N."""

    def __init__(self, store: db.Store, chunk: int = BATCH) -> None:
        self.signed: bool | None = True  # (every committed row is whole: nothing to hold back)
        self.position = Position()
        self.follower = Follower(store)
        self.chunk = chunk
        self._first: Iterator[Row] | None = self.follower.start()

    def read(self, max_bytes: int = 0) -> list[Line]:
        """Up to a chunk of what was there at the start, then each time what came since."""
        del max_bytes  # (the files' reader bounds bytes; rows come in counts here)
        if self._first is not None:
            out = []
            for row in self._first:
                out.append(_line(row))
                if len(out) >= self.chunk:
                    return out
            self._first = None
            if out:
                return out
        return [_line(row) for row in self.follower.read()]


def _line(row: Row) -> Line:
    where, seq, record, raw = row
    at = Position(str(where), seq)
    return Line(record, raw, at, at)


# --- the console's reads (gateway/server/console/fleet.py) ----------------------------------------
def bodies_holding(store: db.Store, needle: str) -> list[bytes]:
    """Every record whose text holds `needle` (lower case: compared with the lower-cased
    record), in the order the store received them (a call's page, the text filter)."""
    with store.connection() as conn:
        rows = conn.execute(
            "SELECT body FROM agw.record WHERE strpos(lower(body), %s) > 0 ORDER BY received_at, stream, seq",
            (needle,),
        ).fetchall()
    return [str(b).encode("utf-8") for (b,) in rows]
