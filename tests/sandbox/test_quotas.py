"""Per-sandbox cgroups, on the real kernel: real groups, real processes, real OOM kills."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.sandbox import quotas
from gateway.sandbox.quotas import Cgroup, CgroupSupport, Quotas
from tests.conftest import PATIENCE_S

MiB = 1 << 20
REPO = str(Path(__file__).resolve().parents[2])
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root on this host")


def q(memory: int | None = 64 * MiB, pids: int | None = 16) -> Quotas:
    return Quotas(memory, pids, cpu_seconds=60, file_bytes=1 << 30, open_files=1024, tmpfs_bytes=64 * MiB)


@pytest.fixture
def support() -> CgroupSupport:
    found = quotas.cgroup_support()
    if found.version is None:
        pytest.skip(f"cgroups cannot be used on this host: {found.reason}")
    return found


MakeGroup = Callable[..., Cgroup]


@pytest.fixture
def make_group(support: CgroupSupport) -> Iterator[MakeGroup]:
    made: list[Cgroup] = []

    def make(quota: Quotas | None = None) -> Cgroup:
        group = Cgroup.create(f"test-{os.getpid()}-{secrets.token_hex(4)}", quota or q())
        assert group is not None
        made.append(group)
        return group

    yield make
    for group in made:
        group.kill()
        group.remove()


def needs(support: CgroupSupport, controller: str) -> None:
    if controller not in support.controllers:
        pytest.skip(f"no {controller} controller here: {support.reason}")


def start_in(group: Cgroup, shell: str) -> subprocess.Popen[str]:
    """`shell` run by a child that has joined the group before it runs anything else."""
    joins = "; ".join(f"echo $$ > {shlex.quote(f)}" for f in group.join_files)
    return subprocess.Popen(
        ["sh", "-c", f"set -e; {joins}; {shell}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def python_in(group: Cgroup, code: str) -> subprocess.Popen[str]:
    return start_in(group, f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}")


def members(group: Cgroup) -> set[int]:
    found: set[int] = set()
    for f in group.join_files:
        if os.path.exists(f):
            with open(f) as procs:
                found |= {int(p) for p in procs.read().split()}
    return found


def wait_for(condition: Callable[[], bool], timeout: float = PATIENCE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def dirs(group: Cgroup) -> list[str]:
    return [os.path.dirname(f) for f in group.join_files]


def control(group: Cgroup, filename: str) -> str:
    for d in dirs(group):
        if os.path.exists(os.path.join(d, filename)):
            with open(os.path.join(d, filename)) as f:
                return f.read().strip()
    raise AssertionError(f"no {filename} in {dirs(group)}")


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", "/etc", "a b", "x" * 65, "caf\u00e9", "a\nb"])
def test_a_name_is_never_a_path(bad: str) -> None:
    with pytest.raises(ValueError, match="cgroup name"):
        Cgroup.create(bad, q())


def test_quotas_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        q(memory=0)
    with pytest.raises(ValueError):
        q(pids=-1)
    assert q(memory=None, pids=None).memory_bytes is None


@root_only
def test_support_is_probed_once_and_says_where(support: CgroupSupport, make_group: MakeGroup) -> None:
    assert support.version in (1, 2)
    assert support.controllers and set(support.controllers) <= {"memory", "pids"}
    assert quotas.SUBTREE in support.base and support.base in support.reason
    assert quotas.cgroup_support() is support
    bases = {os.path.dirname(d) for d in dirs(make_group())}
    assert all(b in support.base and os.path.basename(b) == quotas.SUBTREE for b in bases)
    assert not any(os.path.exists(os.path.join(b, f"probe-{os.getpid()}")) for b in bases)  # the probe is gone


@root_only
def test_limits_are_written(support: CgroupSupport, make_group: MakeGroup) -> None:
    group = make_group(q(64 * MiB, 16))
    assert group.controllers == support.controllers
    assert len(group.join_files) == (len(support.base.split(", ")) if support.version == 1 else 1)
    if "memory" in support.controllers:
        if support.version == 1:
            assert control(group, "memory.limit_in_bytes") == str(64 * MiB)
            memsw = [d for d in dirs(group) if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes"))]
            if memsw:
                assert control(group, "memory.memsw.limit_in_bytes") == str(64 * MiB)
        else:
            assert control(group, "memory.max") == str(64 * MiB)
    if "pids" in support.controllers:
        assert control(group, "pids.max") == "16"
    unlimited = make_group(q(None, None))
    if "pids" in support.controllers:
        assert control(unlimited, "pids.max") == "max"


@root_only
def test_a_name_in_use_is_refused(make_group: MakeGroup) -> None:
    group = make_group()
    child = start_in(group, "exec sleep 30")
    wait_for(lambda: child.pid in members(group))
    with pytest.raises(OSError, match="in use"):
        Cgroup.create(group.name, q())
    group.kill()
    child.wait(timeout=10)


# --- what the kernel does with them -----------------------------------------------------------------


@root_only
def test_memory_cap_gets_the_child_oom_killed(support: CgroupSupport, make_group: MakeGroup) -> None:
    needs(support, "memory")
    group = make_group(q(64 * MiB, 16))
    assert not group.oom_killed()
    child = python_in(group, "data = b'x' * (200 << 20); print('survived', len(data))")  # every page touched
    out, err = child.communicate(timeout=120)
    assert child.returncode == -9, (child.returncode, out, err)
    assert "survived" not in out
    assert group.oom_killed()
    assert not group.pids_refused()


@root_only
def test_a_small_allocation_is_not_an_oom(support: CgroupSupport, make_group: MakeGroup) -> None:
    needs(support, "memory")
    group = make_group(q(64 * MiB, 16))
    child = python_in(group, "data = b'x' * (8 << 20); print('fine', len(data))")
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and "fine" in out
    assert not group.oom_killed()


FORK_64 = """
import os, time
kids = []
for _ in range(64):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print(len(kids))
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
"""


@root_only
def test_pids_cap_refuses_forks_past_it(support: CgroupSupport, make_group: MakeGroup) -> None:
    needs(support, "pids")
    group = make_group(q(None, 16))
    assert not group.pids_refused()
    child = python_in(group, FORK_64)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    made = int(out)
    assert 8 <= made <= 15  # the parent is one of the 16
    assert group.pids_refused()
    assert not group.oom_killed()


@root_only
def test_kill_ends_a_group_full_of_sleepers(make_group: MakeGroup) -> None:
    group = make_group(q(64 * MiB, 32))
    # eight sleepers, and one that left the session and its parent (setsid, double fork)
    child = start_in(group, "for i in 1 2 3 4 5 6 7 8; do sleep 300 & done; (setsid sleep 300 &); wait")
    wait_for(lambda: len(members(group)) >= 10)
    listed = members(group)
    group.kill()
    assert members(group) == set()
    assert child.wait(timeout=10) == -9
    for pid in listed:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert f.read() != b"sleep\x00300\x00", f"{pid} still sleeps"
        except FileNotFoundError:
            pass


@root_only
def test_kill_of_an_empty_group_returns_at_once(make_group: MakeGroup) -> None:
    group = make_group()
    started = time.monotonic()
    group.kill(timeout=3600)  # a kill that waited for its timeout would take an hour
    assert time.monotonic() - started < 600  # a bound so the old kill fails, not a measure of speed


@root_only
def test_kill_goes_on_while_the_groups_below_are_being_removed(make_group: MakeGroup) -> None:
    """A group removed while kill() lists its members answers ENODEV on a read of a
    cgroup.procs opened a moment before (the kernel has let go of it): that escaped kill()
    and ended the thread that stops a sandbox past its disk budget (seen in a CI run). A
    group that is gone has no members: kill() goes on."""
    group = make_group()
    below = [os.path.join(d, "below") for d in dirs(group)]
    stop = threading.Event()

    def churn() -> None:  # a sub-group made and removed as fast as the kernel lets
        while not stop.is_set():
            for d in below:
                with contextlib.suppress(FileExistsError, FileNotFoundError):
                    os.mkdir(d)
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(d)

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            group.kill(timeout=1)
    finally:
        stop.set()
        churner.join(10)
        for d in below:
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(d)


@root_only
def test_remove_leaves_nothing_and_never_raises(make_group: MakeGroup) -> None:
    group = make_group()
    child = start_in(group, "exec sleep 300")
    wait_for(lambda: child.pid in members(group))
    group.remove(timeout=0.2)  # a process is in it: the kernel refuses, remove() does not raise
    assert all(os.path.isdir(d) for d in dirs(group))
    group.kill()
    child.wait(timeout=10)
    group.remove()  # right after the last process exited: retried until the kernel lets go
    assert not any(os.path.exists(d) for d in dirs(group))
    group.remove()  # already gone: still fine


@root_only
def test_sweep_removes_old_empty_leftovers_only(make_group: MakeGroup) -> None:
    leftover, busy, fresh = make_group(), make_group(), make_group()
    child = start_in(busy, "exec sleep 300")
    wait_for(lambda: child.pid in members(busy))
    long_ago = time.time() - 3600  # as if a gateway that crashed an hour ago had left them
    for d in dirs(leftover) + dirs(busy):
        os.utime(d, (long_ago, long_ago))
    assert quotas.sweep() >= 1
    assert not any(os.path.exists(d) for d in dirs(leftover))
    assert all(os.path.isdir(d) for d in dirs(busy))  # has a process: kept
    assert all(os.path.isdir(d) for d in dirs(fresh))  # may be another gateway's, about to start
    busy.kill()
    child.wait(timeout=10)


# --- cgroup v2 mechanics that need no controller ------------------------------------------------------
# This host binds memory and pids to v1 hierarchies, but it mounts cgroup2 too (no controllers):
# creating, joining, cgroup.kill, removing, and leaving a cgroup for a leaf of our own can be
# exercised there. Limits and their events cannot.


def _cgroup2_dir() -> str:
    own = quotas._own_cgroups().get("")
    for m in quotas._mounts():
        if m.fstype == "cgroup2" and own is not None:
            where = quotas._dir_in(m, own)
            if where is not None:
                return where
    pytest.skip("no cgroup2 mount shows our cgroup")


@root_only
def test_v2_group_is_killed_with_cgroup_kill_and_removed() -> None:
    where = _cgroup2_dir()
    layout = quotas._v2_layout(where, ())  # no controllers: only the tree mechanics
    assert layout.version == 2
    group = quotas._create_in(layout, f"test-{os.getpid()}-v2", q())
    try:
        assert group.join_files == (os.path.join(where, quotas.SUBTREE, group.name, "cgroup.procs"),)
        assert os.path.exists(os.path.join(dirs(group)[0], "cgroup.kill"))
        child = start_in(group, "for i in 1 2 3 4; do sleep 300 & done; (setsid sleep 300 &); wait")
        wait_for(lambda: len(members(group)) >= 6)
        group.kill()
        assert members(group) == set()
        assert child.wait(timeout=10) == -9
        assert not group.oom_killed() and not group.pids_refused()
    finally:
        group.kill()
        group.remove()
    assert not os.path.exists(dirs(group)[0])
    quotas._rmdir_retry(os.path.join(where, quotas.SUBTREE), 1.0)


LEAVE = """
import json, os, subprocess, sys
from gateway.sandbox import quotas
here = sys.argv[1]
with open(os.path.join(here, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
kid = subprocess.Popen(["sleep", "300"])  # born in `here`, like a worker the gateway started
try:
    quotas._leave(here)
    result = {"moved": True}
except quotas._Unusable as exc:
    result = {"moved": False, "why": str(exc)}
def v2_path(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return next(line[3:].strip() for line in f if line.startswith("0::"))
result["self_in"], result["kid_in"] = v2_path(os.getpid()), v2_path(kid.pid)
with open(os.path.join(here, "cgroup.procs")) as f:
    result["left_here"] = f.read().split()
print(json.dumps(result), flush=True)
kid.kill()
kid.wait()
"""


@root_only
@pytest.mark.parametrize("shared", [False, True])
def test_v2_gateway_moves_to_a_leaf_of_its_own_unless_others_share_its_cgroup(shared: bool) -> None:

    top = _cgroup2_dir()
    here = os.path.join(top, f"test-{os.getpid()}-leave-{int(shared)}")
    os.mkdir(here)
    outsider = None
    try:
        if shared:  # e.g. the login shell the gateway was started from
            outsider = subprocess.Popen(["sleep", "300"])
            with open(os.path.join(here, "cgroup.procs"), "w") as f:
                f.write(str(outsider.pid))
        proc = subprocess.run(
            [sys.executable, "-c", LEAVE, here], capture_output=True, text=True, timeout=60, cwd=os.getcwd()
        )
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        if shared:
            assert not result["moved"]
            assert "1 other process" in result["why"] and "no internal processes" in result["why"]
        else:
            assert result["moved"], result
            assert result["self_in"].endswith(f"/{os.path.basename(here)}/{quotas.SELF_LEAF}")
            assert result["kid_in"] == result["self_in"]  # its children go with it
            assert result["left_here"] == []  # so `here` may now enable controllers
    finally:
        if outsider is not None:
            outsider.kill()
            outsider.wait()
        quotas._rmdir_retry(os.path.join(here, quotas.SELF_LEAF), 2.0)
        quotas._rmdir_retry(here, 2.0)
    assert not os.path.exists(here)


@root_only
def test_descendants_follow_the_parent_chain() -> None:
    child = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        among = {os.getpid(), child.pid, grandchild, 1}
        assert quotas._descendants(os.getpid(), among) == {os.getpid(), child.pid, grandchild}
        assert quotas._descendants(child.pid, among | {stranger.pid}) == {child.pid, grandchild}
    finally:
        os.kill(grandchild, 9)
        child.kill()
        child.wait()
        stranger.kill()
        stranger.wait()


# --- groups that die with their gateway -----------------------------------------------------------
def owned_group(name: str | None = None) -> Cgroup:
    group = Cgroup.create(name or quotas.owned_name(secrets.token_hex(6)), q())
    assert group is not None
    return group


@root_only
def test_a_gateway_in_another_pid_namespace_leaves_a_live_gateways_groups_alone(support: CgroupSupport) -> None:
    """Attack: a gateway started in a container (own pid namespace, same cgroup tree) judged the
    groups of a gateway running on the host "abandoned" (their pid and start time mean nothing
    there) and killed its sandboxes; empty spare groups made in advance were swept from under it."""
    busy, spare = owned_group(), owned_group()
    child = start_in(busy, "exec sleep 300")
    try:
        wait_for(lambda: child.pid in members(busy))
        long_ago = time.time() - 3600
        for d in dirs(spare):
            os.utime(d, (long_ago, long_ago))
        code = "from gateway.sandbox import quotas; print(quotas.kill_abandoned(), quotas.sweep())"
        other = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO},
        )  # fmt: skip
        assert other.returncode == 0, other.stderr
        time.sleep(0.5)  # a kill, had there been one, has landed
        assert child.poll() is None, "the other namespace's gateway killed a live sandbox"
        assert all(os.path.isdir(d) for d in dirs(spare)), "a live gateway's spare group was swept"
        quotas.kill_abandoned()  # (other, dead gateways' groups may be killed: not this live one's)
        assert child.poll() is None
    finally:
        busy.kill()
        child.wait(timeout=10)
        busy.remove()
        spare.remove()


@root_only
def test_the_groups_of_a_gateway_that_is_gone_are_killed(support: CgroupSupport) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ns = os.stat("/proc/self/ns/pid").st_ino
    group = owned_group(f"s-{ns}-{int(gone.stdout)}-1-{secrets.token_hex(6)}")
    child = start_in(group, "exec sleep 300")
    try:
        wait_for(lambda: child.pid in members(group))
        assert quotas.kill_abandoned() >= 1
        child.wait(timeout=10)
        assert not any(os.path.exists(d) for d in dirs(group))
    finally:
        group.kill()
        group.remove()


@root_only
def test_the_groups_of_a_gateway_that_died_a_zombie_are_killed(support: CgroupSupport) -> None:
    """A gateway killed while its parent does not collect its status (a supervisor script busy
    elsewhere) stays a zombie: same pid, same start time in /proc/PID/stat. Its sandboxes' groups
    were judged "live" and whatever the parent-death signals missed ran on, never killed or swept
    by the next gateway (red team 16). A zombie is gone."""
    dead = subprocess.Popen(["sleep", "300"])  # the gateway, not collected after it dies
    ns = os.stat("/proc/self/ns/pid").st_ino
    ticks = quotas._start_ticks(dead.pid)
    group = owned_group(f"s-{ns}-{dead.pid}-{ticks}-{secrets.token_hex(6)}")
    child = start_in(group, "exec sleep 300")
    try:
        wait_for(lambda: child.pid in members(group))
        os.kill(dead.pid, signal.SIGKILL)
        wait_for(lambda: Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
        assert quotas._start_ticks(dead.pid) == ticks  # what the owner check saw: a live gateway
        assert quotas.kill_abandoned() >= 1
        child.wait(timeout=10)
        assert not any(os.path.exists(d) for d in dirs(group))
    finally:
        dead.wait()
        group.kill()
        group.remove()
