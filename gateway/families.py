"""The tool families the gate hands calls to, registered by the families themselves.

The gate (gateway/pipeline.py) never imports a tool family: `Gateway.handle` looks the call's
tool up here. `gateway/tools/__init__.py` registers every family of `gateway/tools/` when it is
imported, which each face that serves tools does (the server, the CLI's `run`, the hook daemon).
A tool nobody registered is refused like an unknown one (`handler` raises KeyError: the call is
denied with INTERNAL_ERROR and recorded), never run some other way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Handler = Callable[[Any, Any, str], dict[str, Any]]
"""`handle(gateway, call, call_id)`: the family's whole call, through the gate's methods."""


@dataclass(frozen=True)
class Family:
    name: str
    handle: Handler
    arguments: Callable[[Any], dict[str, Any]] | None = None
    """What the audit log keeps of a call's arguments, where the family keeps less than all of
    them (typed input, file content, secret values as sizes). None: the call's own fields."""
    start: Callable[[Any], object] | None = None
    """What the family starts with each gateway (the process family adopts what still runs)."""


_FAMILIES: dict[str, Family] = {}
_LOCK = threading.Lock()


def register(family: Family) -> None:
    """Make `family` reachable by its name. A second registration under a name replaces the
    first (a module imported again)."""
    with _LOCK:
        _FAMILIES[family.name] = family


def registered() -> tuple[Family, ...]:
    with _LOCK:
        return tuple(_FAMILIES.values())


def handler(tool: str) -> Handler:
    """The `handle(gateway, call, call_id)` of the family named `tool`; KeyError when none is."""
    with _LOCK:
        family, known = _FAMILIES.get(tool), bool(_FAMILIES)
    if family is None:
        raise KeyError(
            f"no tool {tool!r}" if known else f"no tool {tool!r}: no tool family is registered (import gateway.tools)"
        )
    return family.handle


def arguments(call: Any) -> dict[str, Any]:
    """What the audit log keeps of a call's arguments: its family's own `arguments(call)` where
    it keeps less than everything, else the call's fields without the ones the gateway sets."""
    with _LOCK:
        family = _FAMILIES.get(call.tool)
    if family is not None and family.arguments is not None:
        return family.arguments(call)
    dumped: dict[str, Any] = call.model_dump(exclude={"tool", "principal"}, exclude_none=True)
    return dumped


def start(gateway: Any) -> None:
    """Start what each registered family keeps for `gateway` (called as the gateway starts)."""
    for family in registered():
        if family.start is not None:
            family.start(gateway)
