"""Test-wide setup.

Sandboxed commands run as an unprivileged account (docs/sandbox.md), which must be able to
reach the workspaces tests create under pytest's temp directories: pytest makes them
owner-only, so each is opened for traversal (not listing) here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _traversable(d: Path) -> None:
    if os.geteuid() == 0 and d.owner() == "root":
        d.chmod(d.stat().st_mode & 0o7777 | 0o011)


@pytest.fixture(scope="session", autouse=True)
def _sandbox_can_reach_the_base_temp(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = Path(tmp_path_factory.getbasetemp())
    for d in (base.parent, base):
        _traversable(d)


@pytest.fixture(autouse=True)
def _sandbox_can_reach_tmp_path(request: pytest.FixtureRequest) -> None:
    if "tmp_path" in request.fixturenames:
        _traversable(request.getfixturevalue("tmp_path"))
