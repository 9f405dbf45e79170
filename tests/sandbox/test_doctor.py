"""`gateway doctor`, run as a real process on this host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.sandbox import landlock
from tests import clonestop

GATEWAY = Path(sys.executable).parent / "gateway"
ITEMS = {"own_proc", "bubblewrap", "user_namespaces", "sandbox_uid", "landlock", "cgroups", "helper", "seccomp",
         "nested", "hook_mode"}  # fmt: skip
# The Landlock ABI each mainline kernel introduced: a kernel that has Landlock has at least this.
LANDLOCK_SINCE = [((6, 15), 7), ((6, 12), 6), ((6, 10), 5), ((6, 7), 4), ((6, 2), 3), ((5, 19), 2), ((5, 13), 1)]


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [str(GATEWAY)] if GATEWAY.exists() else [sys.executable, "-m", "gateway"]
    return subprocess.run(
        [*argv, "doctor", *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def doctor_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = doctor("--json", *args, env=env)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def landlock_floor() -> int:
    return next((abi for since, abi in LANDLOCK_SINCE if kernel() >= since), 0)


def expected_cgroup_version() -> int:
    """Read off the host independently of quotas.py: v1 when a v1 hierarchy has memory or pids."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" - ", 1)[1].split() for line in f if " - cgroup" in line]
    v1 = any(m[0] == "cgroup" and {"memory", "pids"} & set(m[2].split(",")) for m in mounts)
    return 1 if v1 else 2


def test_doctor_json_says_this_host_can_run_sandboxed_commands() -> None:
    code, report = doctor_json()
    assert code == 0, report
    assert report["ok"] is True and report["blocked_by"] == []
    assert set(report["items"]) == ITEMS
    for key, item in report["items"].items():
        assert isinstance(item["ok"], bool) and isinstance(item["required"], bool), key
        assert item["detail"], key
    for key in ("own_proc", "bubblewrap", "user_namespaces", "sandbox_uid", "helper", "seccomp", "nested"):
        assert report["items"][key]["ok"] and report["items"][key]["required"], key
    assert report["items"]["bubblewrap"]["version"].startswith("bubblewrap ")
    assert report["items"]["user_namespaces"]["unprivileged_starts"] is True
    assert os.path.isfile(report["items"]["helper"]["path"])
    assert report["items"]["seccomp"]["setid_refused"] is True  # fail closed without it (test_helper)


def test_doctor_names_the_landlock_abi() -> None:
    _, report = doctor_json()
    item = report["items"]["landlock"]
    assert item["abi"] == landlock.abi()
    if item["abi"]:
        assert item["ok"] and item["detail"] == f"ABI {item['abi']}"
        assert item["abi"] >= landlock_floor()  # on this host (Linux 6.18): ABI 7
    assert item["required"] is False  # no policy asked for it


@pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root on this host")
def test_doctor_names_the_cgroup_version_and_controllers() -> None:
    _, report = doctor_json()
    item = report["items"]["cgroups"]
    assert item["ok"] is True and item["required"] is False
    assert item["version"] == expected_cgroup_version()  # this host: cgroup v1
    assert item["controllers"] == ["memory", "pids"]
    assert item["detail"].startswith(f"cgroup v{item['version']}: memory and pids per sandbox under ")
    assert item["fallback"] == []


def test_doctor_says_which_agents_hook_mode_sandboxes() -> None:
    """Hook mode is a sandbox only where the agent lets the hook rewrite a shell call: doctor
    says so plainly for each agent (issue 23)."""
    _, report = doctor_json()
    item = report["items"]["hook_mode"]
    assert item["required"] is False and item["ok"] is True
    assert item["agents"]["claude-code"].startswith("sandboxed") and item["agents"]["codex"].startswith("sandboxed")
    assert item["agents"]["gemini"].startswith("NOT sandboxed") and item["agents"]["file tools"].startswith("NOT")
    assert "gemini: NOT sandboxed" in doctor().stdout


def test_doctor_text_is_one_line_per_item_and_a_verdict() -> None:
    proc = doctor()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(ITEMS) + 1
    for line in lines[:-1]:
        assert any(f"  {answer}  " in line for answer in ("yes", "no ", "NO ")), line
    assert lines[-1] == "=> commands can run sandboxed here"
    assert any(line.startswith("Landlock") and f"ABI {landlock.abi()}" in line for line in lines)


def test_a_policy_that_requires_landlock(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nsandbox:\n  require_landlock: true\n")
    code, report = doctor_json("--policy", str(policy))
    item = report["items"]["policy"]
    assert item["required"] is True and item["require_landlock"] is True
    assert report["items"]["landlock"]["required"] is True
    if landlock.abi():
        assert code == 0 and item["ok"] and "requires Landlock" in item["detail"]
    else:
        assert code == 1 and "policy" in report["blocked_by"]


def test_a_policy_without_requirements(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n")
    code, report = doctor_json("--policy", str(policy))
    assert code == 0
    assert report["items"]["policy"]["ok"] and report["items"]["policy"]["require_landlock"] is False


def test_a_broken_policy_is_a_usage_error(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 7\n")
    proc = doctor("--policy", str(policy))
    assert proc.returncode == 2
    assert str(policy) in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="AGW_SANDBOX_USER only matters when the gateway runs as root")
def test_exit_1_names_what_blocks() -> None:
    env = {"AGW_SANDBOX_USER": "agw-no-such-account"}
    code, report = doctor_json(env=env)
    assert code == 1
    assert report["ok"] is False and report["blocked_by"] == ["sandbox uid"]
    assert "agw-no-such-account" in report["items"]["sandbox_uid"]["detail"]
    proc = doctor(env=env)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "=> commands cannot run sandboxed here: blocked by sandbox uid"
    assert any(line.startswith("sandbox uid") and "  NO  " in line for line in proc.stdout.splitlines())


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_gateway_in_a_pid_namespace_that_kept_an_outer_proc_is_told_and_runs_nothing(tmp_path: Path) -> None:
    """bwrap names its children by the pids it sees; through an outer namespace's /proc those
    name other processes. Doctor says so (required), and no sandbox starts (the launcher's
    self-check refuses), whatever pids the host happens to have."""
    argv = [str(GATEWAY)] if GATEWAY.exists() else [sys.executable, "-m", "gateway"]
    proc = subprocess.run(["unshare", "--pid", "--fork", *argv, "doctor", "--json"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    item = report["items"]["own_proc"]
    assert item["ok"] is False and item["required"] is True
    assert "/proc belongs to another pid namespace" in item["detail"] and "--mount-proc" in item["detail"]
    assert "own /proc" in report["blocked_by"]
    bwrap = report["items"]["bubblewrap"]
    assert bwrap["ok"] is False and "/proc belongs to another pid namespace" in bwrap["detail"], bwrap
    # with a /proc of its own, the same namespace is fine
    mounted = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *argv, "doctor", "--json"],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert json.loads(mounted.stdout)["items"]["own_proc"]["ok"] is True, mounted.stdout


USERNS_PROBE = """
import sys
sys.stdin.readline()
from gateway import doctor
from gateway.sandbox import launch
doctor.TIMEOUT = 3
item = doctor._user_namespaces(launch.bwrap_binary(), doctor._identity())
print(f"{item.ok} {item.detail}")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="traces doctor's bwrap (root)")
def test_a_user_namespace_probe_given_up_on_leaves_no_bwrap_waiting() -> None:
    """Doctor's own bwrap (the user-namespace probe) held right after it cloned its first
    process, until doctor gives up on it: killing bwrap's monitor alone left that process
    waiting for its go for ever, holding doctor's pipes (doctor never answered). Doctor kills
    the probe's process group, of its own, which that process shares."""
    out, ended = clonestop.held_until_given_up(USERNS_PROBE, "--disable-userns")
    assert out.startswith("False ") and "bwrap fails" in out, out
    assert ended, "bwrap's first process waits on"
