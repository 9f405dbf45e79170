"""Test-wide setup.

Sandboxed commands run as an unprivileged account (docs/sandbox.md), which must be able to
reach the workspaces tests create under pytest's base temp directory: pytest makes
`/tmp/pytest-of-USER` owner-only, so it is opened for traversal (not listing) here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _sandbox_can_reach_tmp_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = Path(tmp_path_factory.getbasetemp())
    for d in (base.parent, base):
        if d.owner() == "root" and os.geteuid() == 0:
            d.chmod(d.stat().st_mode & 0o7777 | 0o011)
