"""The HTTP front's limits (`front.py` applies them; `gateway serve` flags set them). Kept apart
from `front.py` so the command line can show the defaults without importing uvicorn."""

from __future__ import annotations

import resource
from dataclasses import dataclass

DEFAULT_MAX_BODY = 16 << 20
"""16 MiB: a 10 MiB files write is 13.4 MiB as base64 (or 10 MiB as plain text) plus its JSON."""


@dataclass(frozen=True)
class FrontLimits:
    """The HTTP front's limits (`gateway serve` flags in brackets)."""

    max_connections: int = 1024
    """Open connections at most (`--max-connections`); never more than a quarter of the descriptor limit."""
    max_connections_per_peer: int = 256
    """Open connections from one address at most (`--max-connections-per-peer`)."""
    header_timeout_s: float = 5.0
    """Seconds a connection has to deliver a request's complete headers (`--header-timeout`)."""
    body_timeout_s: float = 30.0
    """Seconds a request has to deliver its whole body once its headers are in (`--body-timeout`)."""
    write_timeout_s: float = 30.0
    """Seconds an answer waiting in the server may go without the client taking 64 KiB of it (`--write-timeout`)."""
    max_body_bytes: int = DEFAULT_MAX_BODY
    """Largest request body (`--max-body`), checked before authentication and before the SDK."""
    refusal_window_s: float = 10.0
    """auth_refused: after a kind's first record in full, at most one record per window with a count."""

    def problems(self) -> list[str]:
        """What is wrong with these limits, named by their `gateway serve` flags."""
        out = []
        for name, flag in FLAGS.items():
            value = getattr(self, name)
            if isinstance(value, int) and value < 1:
                out.append(f"{flag} {value}: must be at least 1")
            elif not value > 0:
                out.append(f"{flag} {value}: must be more than 0 seconds")
        return out

    def within_descriptors(self) -> tuple[FrontLimits, int, str | None]:
        """These limits fitted to the soft descriptor limit, the listening backlog to use, and a
        note if `max_connections` had to be lowered.

        asyncio accepts up to the backlog's number of connections at once, each a descriptor until
        the front has closed the ones it refuses, so the budget is: a quarter of the limit for open
        connections, an eighth for the accept queue, the rest for the gateway (audit files, pipes
        to sandboxes)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        backlog = min(2048, max(16, soft // 8))
        room = max(16, soft // 4)
        if self.max_connections <= room:
            return self, backlog, None
        lowered = FrontLimits(**{**self.__dict__, "max_connections": room})
        why = f"--max-connections {self.max_connections} lowered to {room}: the descriptor limit is {soft}"
        return lowered, backlog, why


FLAGS = {
    "max_connections": "--max-connections",
    "max_connections_per_peer": "--max-connections-per-peer",
    "header_timeout_s": "--header-timeout",
    "body_timeout_s": "--body-timeout",
    "write_timeout_s": "--write-timeout",
    "max_body_bytes": "--max-body",
}
