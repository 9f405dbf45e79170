"""The gateway reaps what its killed sandboxes leave: real pid namespaces, real bwrap, real kills."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox import quotas, reaper
from gateway.sandbox.identity import hand_over
from gateway.sandbox.proctree import nspid_depth
from tests.conftest import eventually
from tests.test_gateway import PERMISSIVE

REPO = str(Path(__file__).resolve().parents[2])

# A gateway that is PID 1 of its own pid namespace, as in a container: runs that time out (their
# sandbox's group is SIGKILLed), then the zombies left in the namespace.
AS_INIT = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from test_gateway import PERMISSIVE
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
import gateway.tools  # the tool families register with the gate, as in every face
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
ws = Path(sys.argv[1])
hand_over(ws)
policy = compile_policy(Policy.model_validate(PERMISSIVE), ws.parent / "p.yaml", ws, sha256="t")
gw = Gateway(policy, AuditLog(Path(sys.argv[2])))
statuses = [gw.handle(RunCall(principal="agent", command="sleep 60", timeout_ms=200))["status"] for _ in range(6)]
statuses.append(gw.handle(RunCall(principal="agent", command="echo done"))["status"])


def zombies():
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = open(f"/proc/{p}/stat").read()
        except OSError:
            continue
        if raw[raw.rindex(")") + 2] == "Z":
            found.append(raw[: raw.rindex(")") + 1])
    return found


deadline = time.monotonic() + 120  # the reaper looks every 2 s at most (a bound, on a loaded machine)
while zombies() and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"pid": os.getpid(), "statuses": statuses, "zombies": zombies()}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_gateway_that_is_its_containers_init_runs_sandboxes_and_leaves_no_zombies(tmp_path: Path) -> None:
    """Attack (on an operator): in a container whose init is the gateway, every run that timed
    out left a zombie bwrap (its pid namespace's init, orphaned to PID 1, never reaped) until the
    container's pid limit ran out. Before that, the helper refused `--parent 1`: a gateway that is
    PID 1 could not run anything at all."""
    ws = tmp_path / "ws"
    ws.mkdir()
    got = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", AS_INIT, str(ws), str(tmp_path / "audit"),
         str(Path(REPO) / "tests")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO}, cwd=REPO,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["pid"] == 1
    assert out["statuses"] == ["timeout"] * 6 + ["ok"], out
    assert out["zombies"] == [], out


def test_the_reaper_never_takes_the_exit_status_of_the_gateways_own_children() -> None:
    reaper.start()
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    deadline = time.monotonic() + 10
    while not _is_zombie(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    reaper.poke()
    assert reaper.reap_now() == 0  # a child in our own pid namespace: its Popen's to wait for
    assert child.wait(timeout=10) == 7


def _is_zombie(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2] == "Z"


NO_OWN_PROC = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from test_gateway import PERMISSIVE
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
import gateway.tools  # the tool families register with the gate, as in every face
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from gateway.sandbox import launch
import os
# the launcher's self-check refuses an outer /proc outright (test_doctor); this test is about
# what happens past it, so that check is set aside here
launch.foreign_proc = lambda: None
# bwrap opens /proc/PID/ns/... with its own pid in this namespace; through the host's /proc that
# names another process (a kernel thread's low pid: then it starts) or none (then it fails, which
# this test needs). The next pids here are put where the host has none for a long stretch.
start = int(Path("/proc/sys/kernel/pid_max").read_text()) // 2
while any(os.path.exists(f"/proc/{q}") for q in range(start, start + 2000)):
    start += 2000
Path("/proc/sys/kernel/ns_last_pid").write_text(str(start))
ws = Path(sys.argv[1])
hand_over(ws)
policy = compile_policy(Policy.model_validate(PERMISSIVE), ws.parent / "p.yaml", ws, sha256="t")
out = Gateway(policy, AuditLog(Path(sys.argv[2]))).handle(RunCall(principal="agent", command="echo ran > ran.txt"))
print(json.dumps({"status": out["status"], "code": (out.get("error") or {}).get("code"), "exit": out.get("exit_code")}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_sandbox_that_fails_before_its_command_is_never_reported_as_the_commands_exit(tmp_path: Path) -> None:
    """Red team (issue 12, O2): a gateway in a pid namespace that kept the host's /proc cannot
    start bwrap (`Can't find source path /proc/self/fd/N`, status 1), and the call came back
    `ok` with exit code 1, as if the command had run and failed. The held launch knows better:
    the command never took its go byte, so the call is SANDBOX_UNAVAILABLE."""
    ws = tmp_path / "ws"
    ws.mkdir()
    got = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", NO_OWN_PROC, str(ws), str(tmp_path / "audit"),
         str(Path(REPO) / "tests")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO}, cwd=REPO,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert (out["status"], out["code"]) == ("error", "SANDBOX_UNAVAILABLE"), out
    assert not (ws / "ran.txt").exists()


def _bwrap_children() -> dict[int, str]:
    """This process's children named bwrap in its own pid namespace (the reaper takes those of
    deeper ones), and their state (Z: a zombie nobody reaped)."""
    mine = nspid_depth(os.getpid())
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        state, ppid = raw[raw.rindex(")") + 2 :].split()[:2]
        if comm == "bwrap" and int(ppid) == os.getpid() and nspid_depth(int(entry)) == mine:
            found[int(entry)] = state
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as the sandbox's own account, as in CI (root)")
def test_a_sandbox_stopped_with_no_cgroup_leaves_no_bwrap_for_the_gateway_to_reap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no cgroup, a sandbox past its principal's disk budget is stopped through its process
    group. SIGKILL there ended the guard with bwrap: bwrap, orphaned, came to the gateway (a
    subreaper), which reaps only the orphans of other pid namespaces: a zombie for good, each
    time. SIGTERM ends bwrap through its guard, which reaps it."""
    support = quotas.cgroup_support()
    monkeypatch.setattr(quotas, "cgroup_support", lambda: dataclasses.replace(support, version=None))
    ws = tmp_path / "ws"
    ws.mkdir()
    hand_over(ws)
    budget = copy.deepcopy(PERMISSIVE)
    budget["roles"]["dev"]["limits"].update(disk_bytes=8 << 20, timeout_ms=60_000)
    policy = compile_policy(Policy.model_validate(budget), tmp_path / "p.yaml", ws, sha256="t")
    gw = Gateway(policy, AuditLog(tmp_path / "audit"))
    try:
        before = set(_bwrap_children())
        out = gw.handle(RunCall(principal="agent", command="head -c 268435456 /dev/zero > big"))  # 256 MiB at most
        assert out["status"] == "error" and out["error"]["code"] == "DISK_BUDGET", out
        assert out["sandbox"]["quotas"] == "rlimits", out["sandbox"]
        # a bwrap killed with its guard comes to us when it has ended: wait until none still ends
        assert eventually(lambda: all(state == "Z" for state in _bwrap_children().values()))
        left = {pid for pid, state in _bwrap_children().items() if state == "Z"} - before
        assert not left, f"bwrap zombies left to the gateway: {sorted(left)}"
    finally:
        gw.close()
