"""The session environment behind the `env` tool: per principal, in the gateway's memory. Part
of the gate (not an executor): the gate decides what a command inherits from it.

Later `run`, `session` and `process` calls of the principal inherit it. A name may be set only
if the policy's `environment.allow` lists it and it is not protected (PATH, HOME, LD_*, BASH_ENV,
... : names that change which program runs or what the shell executes). `effective()` re-checks
against the policy in force, so a name the admin removes stops being passed at once.
"""

from __future__ import annotations

import re
import threading

from gateway.analysis.hazards import PROTECTED_PREFIXES, PROTECTED_VARIABLES
from gateway.audit import SECRET_NAME
from gateway.policy.compile import CompiledPolicy

MAX_VALUE_BYTES = 32 * 1024
MAX_VARIABLES = 256
REDACTED = "[redacted]"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def refusal(policy: CompiledPolicy, name: str, value: str | None = None) -> str | None:
    """Why `name` (= `value`) may not be set, or None."""
    if not _NAME.fullmatch(name):
        return f"{name!r} is not a variable name"
    if name in PROTECTED_VARIABLES or name.startswith(PROTECTED_PREFIXES):
        return f"{name} is protected: it changes which program runs or what the shell executes"
    allowed = policy.policy.environment.allow
    if not any(name == a or (a.endswith("*") and name.startswith(a[:-1])) for a in allowed):
        return f"{name} is not in the policy's environment.allow {allowed}"
    if value is not None:
        if "\0" in value:
            return f"{name}: a value cannot hold a NUL character"
        if len(value.encode()) > MAX_VALUE_BYTES:
            return f"{name}: the value is longer than {MAX_VALUE_BYTES} bytes"
    return None


def secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


class EnvStore:
    def __init__(self) -> None:
        self._vars: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def get(self, principal: str, name: str) -> str | None:
        with self._lock:
            return self._vars.get(principal, {}).get(name)

    def set(self, principal: str, name: str, value: str) -> None:
        with self._lock:
            mine = self._vars.setdefault(principal, {})
            if name not in mine and len(mine) >= MAX_VARIABLES:
                raise ValueError(f"more than {MAX_VARIABLES} variables")
            mine[name] = value

    def unset(self, principal: str, name: str) -> bool:
        with self._lock:
            return self._vars.get(principal, {}).pop(name, None) is not None

    def items(self, principal: str) -> dict[str, str]:
        with self._lock:
            return dict(self._vars.get(principal, {}))

    def effective(self, policy: CompiledPolicy, principal: str) -> dict[str, str]:
        """What calls inherit: only names the policy in force still allows."""
        return {k: v for k, v in self.items(principal).items() if refusal(policy, k, v) is None}
