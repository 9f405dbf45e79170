"""The tool families, one module each: how a call of that family passes the gate
(`Gateway.check_command` / `authorize`) and reaches its executor (`gateway/executors/`).

docs/tools.md documents every tool, action, result and error code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

FAMILIES = ("run", "session", "files", "process", "env", "ask_user", "format_output", "upstream")


def handler(tool: str) -> Callable[[Any, Any, str], dict[str, Any]]:
    """The `handle(gateway, call, call_id)` of a tool family: `gateway/tools/<tool>.py`."""
    if tool not in FAMILIES:
        raise KeyError(f"no tool {tool!r}")
    found: Callable[[Any, Any, str], dict[str, Any]] = importlib.import_module(f"gateway.tools.{tool}").handle
    return found


def arguments(call: Any) -> dict[str, Any]:
    """What the audit log keeps of a call's arguments: the family's own `arguments(call)` where it
    keeps less than everything (typed input, file content and secret values as sizes), else the
    call's fields without the ones the gateway sets."""
    module = importlib.import_module(f"gateway.tools.{call.tool}")
    own = getattr(module, "arguments", None)
    if callable(own):
        found: dict[str, Any] = own(call)
        return found
    dumped: dict[str, Any] = call.model_dump(exclude={"tool", "principal"}, exclude_none=True)
    return dumped
