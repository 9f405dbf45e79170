"""The `methings` profile (seed 000), first slice: `local_run_shell` and `termux_run_shell`.
(Sessions and `termux_fs` are not built yet: docs/tools.md says what is.)
"""

from __future__ import annotations

from gateway.server.specs import Spec

NAME = "methings"
SPECS: tuple[Spec, ...] = ()
