"""Reading the fleet's ledger back as the audit readers read the files (`audit tail|show|query|
calls --store`): every record of every stream, in the order the store received them (each
stream in its own order), in the shape `gateway.audit.records` yields: (where, seq, record or
None when the row is not a record, the raw bytes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.store import db

BATCH = 2000


def records(store: db.Store) -> Iterator[tuple[Path, int, dict[str, Any] | None, bytes]]:
    """Every record of the ledger (a server-side cursor: the rows are not all held at once).
    Raises StoreUnavailable when the store cannot be read."""
    with store.connection() as conn, conn.transaction():
        cur = conn.cursor(name="agw_read")
        cur.itersize = BATCH
        cur.execute("SELECT stream, seq, body FROM agw.record ORDER BY received_at, stream, seq")
        for stream, seq, body in cur:
            raw = str(body).encode("utf-8")
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            yield Path(f"store:{stream}"), int(seq), record if isinstance(record, dict) else None, raw
        cur.close()
