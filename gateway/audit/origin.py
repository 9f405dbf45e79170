"""How the call being handled came to the gateway, recorded with its decision (`data.origin`).

A face (the MCP server) says it once per call (`coming_from`), on the thread that handles the
call; the gate's records of that call (its `decision`, or its `rejected` record) carry it:

    transport         stdio | http
    tool              the tool's name as the client called it (a profile's own names differ
                      from the gateway's tool families)
    request_id        the JSON-RPC request id
    session_id        the MCP session (`Mcp-Session-Id`, streamable HTTP)
    protocol_version  the MCP protocol version the session negotiated
    traceparent, tracestate
                      the client's W3C trace context, when it sent one in `params._meta`

An exporter (otlp.py) makes the call's span a child of the client's and adds the MCP
attributes. Everything here is the client's to say, so it is bounded, and nothing decides on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

MAX_VALUE = 256
"""Characters kept of each value (a traceparent is 55)."""

_ORIGIN: ContextVar[dict[str, Any] | None] = ContextVar("gateway_call_origin", default=None)


def described(
    transport: str,
    tool: str,
    request_id: Any = None,
    session_id: Any = None,
    protocol_version: Any = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An origin from what a face knows of a request (values the client sent are cut short)."""
    out: dict[str, Any] = {"transport": transport, "tool": tool}
    given = {"request_id": request_id, "session_id": session_id, "protocol_version": protocol_version}
    for name in ("traceparent", "tracestate"):
        given[name] = (meta or {}).get(name)
    for k, v in given.items():
        if isinstance(v, int) and not isinstance(v, bool):
            out[k] = v
        elif isinstance(v, str) and v:
            out[k] = v[:MAX_VALUE]
    return out


@contextlib.contextmanager
def coming_from(origin: dict[str, Any] | None) -> Iterator[None]:
    """The calls handled in this context came this way."""
    token = _ORIGIN.set(origin)
    try:
        yield
    finally:
        _ORIGIN.reset(token)


def current() -> dict[str, Any]:
    """`{"origin": ...}` to merge into a record's data, or {} when nothing said how."""
    found = _ORIGIN.get()
    return {"origin": found} if found else {}
