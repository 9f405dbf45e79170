"""The defaults the faces share (the CLI's options, the server's and the registration's): where
the policy, the gateway's state, its tokens and its audit keys are when nothing names them.
`$XDG_STATE_HOME` is read once, when this module is first imported."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_POLICY = Path("policies/default.yaml")
PROFILE_POLICIES = DEFAULT_POLICY.parent / "profiles"
"""The shipped policy layers of the profiles (`gateway serve --profile NAME`), one per seed."""
STATE_HOME = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "agent-gateway"
DEFAULT_STATE_DIR = str(STATE_HOME / "approvals")
DEFAULT_TOKENS = str(STATE_HOME / "tokens" / "tokens.json")
DEFAULT_PROCESS_DIR = str(STATE_HOME)
DEFAULT_AUDIT_KEYS = str(STATE_HOME / "audit-keys")
