"""The tool families, one module each: how a call of that family passes the gate
(`Gateway.check_command` / `authorize`) and reaches its executor (`gateway/executors/`).
Importing this package registers every family with the gate (gateway/families.py): the gate
never imports a family, it looks the call's tool up there. `replies.py` is what the families
share of their replies; it is not a family.

docs/tools.md documents every tool, action, result and error code.
"""

from __future__ import annotations

from typing import Any

from gateway import families
from gateway.tools import ask_user, env, files, format_output, process, run, session, upstream

_REGISTERED = (
    families.Family("run", run.handle),
    families.Family("session", session.handle, session.arguments),
    families.Family("files", files.handle, files.arguments),
    # the process manager adopts what still runs of a gateway before (with a state directory)
    families.Family("process", process.handle, start=process.manager),
    families.Family("env", env.handle, env.arguments),
    families.Family("ask_user", ask_user.handle),
    families.Family("format_output", format_output.handle),
    families.Family("upstream", upstream.handle, upstream.arguments),
)
FAMILIES = tuple(f.name for f in _REGISTERED)
for _family in _REGISTERED:
    families.register(_family)


def handler(tool: str) -> families.Handler:
    """The `handle(gateway, call, call_id)` of a tool family."""
    return families.handler(tool)


def arguments(call: Any) -> dict[str, Any]:
    """What the audit log keeps of a call's arguments (gateway/families.py)."""
    return families.arguments(call)
