"""What the gateway writes its records to: the seam between the gate and the ledger it keeps.

Two implementations: `AuditLog` (writer.py: the files of one host, the default) and
`StoreLedger` (gateway/store/ledger.py: the fleet's ledger in PostgreSQL, `--store`). The gate
knows only this: an append returns the record once it is durable, or raises AuditUnavailable,
and the caller denies (no record, no call).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gateway.audit.keys import SigningKey


class AuditSink(Protocol):
    directory: Path
    """This host's own directory for the ledger (the file log itself, or the store's local
    state): private to the gateway, hidden from every sandbox."""
    key: SigningKey | None
    """The key its records are signed with, if any."""
    checkpoint: Path | None
    """Where the file log keeps its signed head apart (None for the store: its checkpoints are rows)."""
    secret_names: re.Pattern[str]
    """Names whose values are redacted from every record (the policy's `audit.redact` added)."""
    on_health: Callable[[str | None], None] | None
    """Told when appends start failing (the error) and when they work again (None)."""

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one record durably and return it. Raises AuditUnavailable."""
        ...
