"""Applying a plan: what refuses a launch (nothing runs), with real descriptors and real runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway import sandbox
from gateway.executors import shell
from gateway.sandbox import landlock
from gateway.sandbox.identity import hand_over
from gateway.sandbox.quotas import Quotas

Q = Quotas(memory_bytes=1 << 30, pids=256, cpu_seconds=60, file_bytes=1 << 30, open_files=256, tmpfs_bytes=64 << 20)


def profile(ws: Path, **kw: object) -> sandbox.Profile:
    base: dict[str, object] = {"principal": "agent", "read_roots": (ws,), "write_roots": (ws,),
                               "protected": (ws / "conf" / "secret",), "private": (), "quotas": Q}  # fmt: skip
    return sandbox.Profile(**(base | kw))  # type: ignore[arg-type]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "conf").mkdir(parents=True)
    (w / "conf" / "secret").write_text("keep\n")
    hand_over(w)
    return w


def test_a_symlink_on_the_way_to_a_protected_path_refuses_the_launch(ws: Path, tmp_path: Path) -> None:
    """conf/ swapped for a link to a directory of the user's: never followed, nothing runs."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(ws / "conf", ws / "conf.real")
    (ws / "conf").symlink_to(elsewhere)
    with pytest.raises(sandbox.SandboxUnavailable, match="symlink"):
        shell.run("touch ran", ws, profile(ws))
    assert not (ws / "ran").exists()


def test_a_protected_path_is_read_only_and_a_missing_one_cannot_be_made(ws: Path) -> None:
    out = shell.run("echo x > conf/secret; mkdir -p new/deeper; echo x > new/deeper/key", ws,
                    profile(ws, protected=(ws / "conf" / "secret", ws / "new" / "deeper" / "key")))  # fmt: skip
    assert "Read-only file system" in out["stderr"], out
    assert (ws / "conf" / "secret").read_text() == "keep\n"
    assert not (ws / "new" / "deeper").exists()  # the first missing component is a read-only placeholder


def test_a_policy_that_requires_landlock_refuses_where_there_is_none(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This kernel has Landlock; the kernel's answer is replaced to stand for one that has not
    (the helper's own refusal on a Landlock-less kernel is shown with seccomp in test_helper)."""
    monkeypatch.setattr(landlock, "abi", lambda: 0)
    with pytest.raises(sandbox.SandboxUnavailable, match="requires Landlock"):
        shell.run("touch ran", ws, profile(ws, landlock="required"))
    assert not (ws / "ran").exists()
    out = shell.run("touch ran", ws, profile(ws))  # optional: runs, and says Landlock was not there
    assert out["exit_code"] == 0 and out["sandbox"]["landlock"].startswith("unavailable")


def test_a_write_root_its_account_cannot_write_is_refused_with_what_to_do(tmp_path: Path) -> None:
    ws = tmp_path / "root-owned"
    ws.mkdir()
    if os.geteuid() != 0:
        pytest.skip("only root makes a tree the sandbox's account does not own")
    with pytest.raises(sandbox.SandboxUnavailable, match="chown -R"):
        shell.run("true", ws, profile(ws, protected=()))
