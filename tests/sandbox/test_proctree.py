"""Signalling a sandbox's processes as root: only processes still below the sandbox once pinned.

The race itself (a listed process exits and its pid goes to an unrelated process before the
gateway signals it) takes microseconds and cannot be aimed from a test; the stale listing it
leaves is reproduced instead: the first look at the tree names a real process that is not
below the root (as a recycled pid would be), the second look is the real /proc."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gateway.sandbox import proctree

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(SLEEPER)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[bytes]]:
    """A shell with two sleeping children: what a sandbox's command might be."""
    proc = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"])
    deadline = time.monotonic() + 30
    while len(proctree.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    yield proc
    proc.kill()
    proc.wait()


def test_every_process_below_is_signalled(tree: subprocess.Popen[bytes]) -> None:
    below = proctree.descendants(tree.pid)
    assert proctree.signal_descendants(tree.pid, signal.SIGTERM) == len(below) == 2
    assert tree.wait(timeout=30) == 0  # its children ended, so `wait` returned


def test_a_pid_no_longer_below_once_pinned_is_never_signalled(
    tree: subprocess.Popen[bytes], victim: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = proctree.descendants
    looks: list[int] = []

    def stale_then_real(pid: int) -> list[int]:
        looks.append(pid)
        return [*real(pid), victim.pid] if len(looks) == 1 else real(pid)

    monkeypatch.setattr(proctree, "descendants", stale_then_real)
    assert proctree.signal_descendants(tree.pid, signal.SIGTERM) == 2
    time.sleep(0.2)
    assert victim.poll() is None  # the process that took a listed pid lives on
    assert tree.wait(timeout=30) == 0


def test_spared_processes_are_not_signalled(tree: subprocess.Popen[bytes]) -> None:
    first, *_ = proctree.children(tree.pid)
    assert proctree.signal_descendants(tree.pid, signal.SIGTERM, spare=frozenset({first})) == 1
    time.sleep(0.2)
    assert first in proctree.descendants(tree.pid)
