"""The tool families, one module each: how a call of that family passes the gate
(`Gateway.check_command` / `authorize`) and reaches its executor (`gateway/executors/`).

docs/tools.md documents every tool, action, result and error code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

FAMILIES = ("run", "session", "files", "process", "env", "ask_user", "format_output")


def handler(tool: str) -> Callable[[Any, Any, str], dict[str, Any]]:
    """The `handle(gateway, call, call_id)` of a tool family: `gateway/tools/<tool>.py`."""
    if tool not in FAMILIES:
        raise KeyError(f"no tool {tool!r}")
    found: Callable[[Any, Any, str], dict[str, Any]] = importlib.import_module(f"gateway.tools.{tool}").handle
    return found
