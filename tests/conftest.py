"""Test-wide setup.

Sandboxed commands run as an unprivileged account (docs/sandbox.md), which must be able to
reach the workspaces tests create under pytest's temp directories: pytest makes them
owner-only, so each is opened for traversal (not listing) here.

The gateway's state (approvals, tokens, the audit signing key and checkpoints) defaults to
$XDG_STATE_HOME/agent-gateway: tests point it at a directory of their own, set before any
gateway module computes its defaults, so no run touches the user's state.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

PATIENCE_S = 120.0
"""How long a test waits for another thread or process to act. Only a bound, so that a broken
test ends: never a measure of speed (CI is a shared, loaded machine)."""


def eventually(check: Callable[[], T], seconds: float = PATIENCE_S, every: float = 0.02) -> T:
    """Wait until `check()` is true, for what another thread or process does (a report from a
    watcher's thread, a record a monitor writes, a prompt a sandboxed shell prints). Returns
    the last value `check()` gave: falsy if the deadline passed, so `assert eventually(...)`."""
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(every)


_STATE = tempfile.mkdtemp(prefix="agw-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE
atexit.register(shutil.rmtree, _STATE, True)

# The tool families register with the gate when gateway.tools is imported (gateway/families.py),
# as every face that serves tools does: a test that builds a Gateway itself gets them too.
import gateway.tools  # noqa: E402, F401


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


def _zombie_children() -> list[int]:
    """This process's children that have exited and not been waited for."""
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if raw[raw.rindex(b")") + 2 :].split()[0] == b"Z":
                found.append(pid)
    return found


def reap_adopted_orphans() -> int:
    """Wait for the exited children no one here will wait for: processes this test process
    adopted (an in-process gateway makes it a subreaper, gateway/sandbox/reaper.py) when a gateway
    it started as a subprocess was killed and left its sandboxes behind. A child that a Popen of
    this process owns (subprocess's, asyncio's, multiprocessing's) is left to it. Returns how many."""
    zombies = _zombie_children()
    if not zombies:
        return 0
    owned = {
        getattr(o, "pid", None)
        for o in gc.get_objects()
        if type(o).__name__ == "Popen" and getattr(o, "returncode", 0) is None
    }
    count = 0
    for pid in zombies:
        if pid in owned:
            continue
        with contextlib.suppress(ChildProcessError, OSError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                count += 1
    return count


@pytest.fixture(autouse=True)
def _no_orphan_left_unreaped() -> Iterator[None]:
    """test_crashes alone left about 300 zombie sandbox inits in the test process (issue 23)."""
    yield
    reap_adopted_orphans()
