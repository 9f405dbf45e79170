"""The nested-repository watcher on its own (real inotify, real renames), and failing closed
through the gateway in a process of its own (a broken watcher refuses every later launch).
The attacks through the shipped policy are in tests/adversarial/test_sandbox_escapes.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.sandbox.identity import hand_over, sandbox_identity
from gateway.sandbox.nested import TRIP_COUNT, NestedRepositoryGuard
from tests.conftest import eventually

Events = list[tuple[str, dict[str, object]]]


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Path, NestedRepositoryGuard, Events]]:
    root = tmp_path / "ws"
    (root / ".git").mkdir(parents=True)
    (root / "human" / ".git").mkdir(parents=True)  # the human's nested repository, there before
    guard = NestedRepositoryGuard(sandbox_identity().uid)
    events: Events = []
    guard.watch((root,), lambda event, data: events.append((event, data)))
    yield root, guard, events
    guard.close()


def test_a_new_nested_repository_is_moved_aside(watched: tuple[Path, NestedRepositoryGuard, Events]) -> None:
    root, _, events = watched
    (root / "a" / "b" / ".git").mkdir(parents=True)
    assert eventually(lambda: not (root / "a" / "b" / ".git").exists())
    assert any(p.name.startswith(".git.quarantined-") for p in (root / "a" / "b").iterdir())
    assert eventually(lambda: events)  # the report follows the rename, from the watcher's thread
    assert events[0][0] == "nested_repository_quarantined" and events[0][1]["why"] in ("created", "moved in")
    assert (root / ".git").is_dir() and (root / "human" / ".git").is_dir()  # the top one and the human's stay


def test_a_gitfile_and_the_repository_it_names_are_moved_aside(
    watched: tuple[Path, NestedRepositoryGuard, Events],
) -> None:
    root, _, _ = watched
    (root / "evil").mkdir()
    (root / "evil" / "config").write_text("[core]\n\tfsmonitor = /bin/false\n")
    (root / "sub").mkdir()
    time.sleep(0.2)  # sub is watched
    (root / "sub" / "pointer").write_text("gitdir: ../evil\n")
    os.rename(root / "sub" / "pointer", root / "sub" / ".git")  # whole, in one step
    assert eventually(lambda: not (root / "sub" / ".git").exists() and not (root / "evil").exists())


def test_a_tree_moved_in_is_searched_and_watched(watched: tuple[Path, NestedRepositoryGuard, Events]) -> None:
    root, _, _ = watched
    staging = root.parent / "staging"
    (staging / "deep" / "er" / ".git").mkdir(parents=True)
    os.rename(staging, root / "moved")  # prepared outside, renamed in at once
    assert eventually(lambda: not (root / "moved" / "deep" / "er" / ".git").exists())
    (root / "moved" / "deep" / "new").mkdir()
    (root / "moved" / "deep" / "new" / ".git").mkdir()  # and the moved tree is watched from now on
    assert eventually(lambda: not (root / "moved" / "deep" / "new" / ".git").exists())


def test_a_repository_that_keeps_coming_back_trips(watched: tuple[Path, NestedRepositoryGuard, Events]) -> None:
    root, _, events = watched
    for i in range(TRIP_COUNT):  # in a new directory each time: the count is per root
        (root / f"sub{i}").mkdir()
        (root / f"sub{i}" / ".git").mkdir()
        assert eventually(lambda i=i: not (root / f"sub{i}" / ".git").exists())
    assert eventually(lambda: any(e == "nested_repository_tripwire" for e, _ in events))


SCRIPT = """
import json, sys
from pathlib import Path
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
import gateway.tools  # the tool families register with the gate, as in every face
from gateway.policy.selftest import load_checked
ws, audit = Path(sys.argv[1]), Path(sys.argv[2])
gw = Gateway(load_checked(Path("policies/default.yaml"), ws), AuditLog(audit))
first = gw.handle(RunCall(principal="agent", command="make deep"))
second = gw.handle(RunCall(principal="agent", command="true"))
print(json.dumps([first.get("status"), first.get("exit_code"), second.get("status"), second.get("error")]))
"""


def test_a_directory_it_cannot_watch_stops_every_later_launch(tmp_path: Path) -> None:
    """A path past PATH_MAX cannot be watched: rather than leave it unwatched, the gateway refuses
    to run anything more (in a process of its own: the watcher is per process)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    name = "a" * 250
    (ws / "Makefile").write_text(f"deep:\n\t@for i in $$(seq 18); do mkdir {name} && cd {name} || exit 1; done\n")
    hand_over(ws)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(ws), str(tmp_path / "audit")], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    first_status, _, second_status, error = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first_status == "ok"
    assert second_status == "error" and error["code"] == "SANDBOX_UNAVAILABLE", error
    assert "nested repositories" in error["message"] and "restarts" in error["message"]
