"""The disk budget (issue 23, point 10): one call wrote 3 GB in 115 ms, and nothing stopped it.

The attacks run through the real pipeline (a real sandbox, as the sandbox's account) and the
real MCP server, into a workspace on a tmpfs of its own (so the old code, which stops nothing,
fills that and not the host's disk). Each writer that does not end by itself writes forever:
the only way its call ends is being stopped (or the time limit), whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client, StdioServerParameters

from gateway import sandbox
from gateway.audit import AuditLog, records, verify
from gateway.calls import FilesCall, ProcessCall, RunCall, SessionCall
from gateway.executors import shell
from gateway.pipeline import Gateway
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox import disk, quotas
from gateway.sandbox.identity import hand_over
from tests.conftest import eventually
from tests.server.conftest import GATEWAY, envelope_of
from tests.server.test_profiles import env_without_state
from tests.test_gateway import PERMISSIVE

MiB = 1 << 20
BUDGET = 32 * MiB
DISK = 512 * MiB  # the workspace's own disk: what the old code lets a call fill


def budget_policy() -> dict[str, Any]:
    p: dict[str, Any] = copy.deepcopy(PERMISSIVE)
    p["roles"]["dev"]["limits"].update(disk_bytes=BUDGET, timeout_ms=60_000)
    p["rules"] = [r for r in p["rules"] if r["id"] != "rm"]
    p["tools"].update(session={"allow_from": 1}, processes={"allow_from": 1}, files={"allow_from": 1})
    p["rules"][0]["programs"] += ["dd", "fallocate", "truncate", "rm", "touch", "seq", "cd"]
    return p


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting the workspace's tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "ws"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0755", "tmpfs", str(mnt)], check=True)
    try:
        hand_over(mnt)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def gw(tmp_path: Path, ws: Path) -> Iterator[Gateway]:
    policy = compile_policy(Policy.model_validate(budget_policy()), tmp_path / "p.yaml", ws, sha256="test")
    gateway = Gateway(policy, AuditLog(tmp_path / "audit"))
    try:
        yield gateway
    finally:
        gateway.close()
    assert verify(tmp_path / "audit").ok


def run(gw: Gateway, command: str) -> dict[str, Any]:
    return gw.handle(RunCall(principal="agent", command=command))


def held(ws: Path) -> int:
    return disk.usage((str(ws),)).bytes


def assert_stopped(out: dict[str, Any]) -> None:
    assert out["status"] == "error" and out["error"]["code"] == "DISK_BUDGET", out
    message = out["error"]["message"]
    assert message.startswith("the command was stopped: the write roots hold "), message
    assert "past the disk budget of 32.0 MiB (limits.disk_bytes of role dev)" in message


EMPTY_FILES = "mkdir many && cd many && python3 -c \"import itertools\nfor i in itertools.count(): open(f'{i}', 'wb')\""


# --- attacks: each fails on a gateway with no budget --------------------------------------------


@pytest.mark.parametrize(
    "writer",
    [
        "while true; do head -c 1048576 /dev/zero >> log; done",  # appends, a MiB at a time
        "while true; do dd if=/dev/zero of=big bs=1M count=1000 oflag=append conv=notrunc 2>/dev/null; done",
        # many small files, then many empty ones (each costs the filesystem an inode and an entry)
        "python3 -c \"import itertools\nfor i in itertools.count(): open(f'f{i}', 'wb').write(b'x' * 4096)\"",
        EMPTY_FILES,
        # a sparse file costs nothing until it is written: then it does
        "truncate -s 900M sparse && while true; do dd if=/dev/zero of=sparse bs=1M count=64 conv=notrunc "
        "seek=$((RANDOM % 800)) 2>/dev/null; done",
        # glibc writes the blocks itself when fallocate is refused
        "python3 -c \"import os\nfd = os.open('pre', os.O_CREAT | os.O_WRONLY)\nwhile True: "
        'os.posix_fallocate(fd, 0, 200 << 20)"',
    ],
    ids=["append", "dd", "small-files", "empty-files", "sparse-filled", "posix-fallocate"],
)
def test_a_writer_past_the_budget_is_stopped_and_its_call_fails(gw: Gateway, ws: Path, writer: str) -> None:
    out = run(gw, writer)
    assert_stopped(out)
    assert held(ws) < DISK // 2, held(ws)  # stopped long before the disk filled


def test_a_gateway_whose_other_threads_are_busy_still_stops_a_writer_in_time(gw: Gateway, ws: Path) -> None:
    """A gateway serving other agents has busy threads. A count made under the interpreter's lock
    gave it up and waited for it again at every entry, behind every busy thread: a count of the
    8,000 entries a 32 MiB budget allows took seconds, and a writer of empty files got 550 MB
    onto the disk before it was stopped (CI saw 475 MB). The watch counts in a process of its
    own (disk_counter.py)."""
    done = threading.Event()

    def busy() -> None:  # pure Python: holds the lock but at each switch interval
        n = 0
        while not done.is_set():
            n += 1

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        out = run(gw, EMPTY_FILES)
    finally:
        done.set()
        for t in threads:
            t.join()
    assert_stopped(out)
    assert held(ws) < DISK // 2, held(ws)


def test_fallocate_takes_no_space_at_all(gw: Gateway, ws: Path) -> None:
    """fallocate takes gigabytes in one call, faster than any watch (and with --keep-size past
    RLIMIT_FSIZE): the sandbox refuses it, as a filesystem without it would."""
    for flags in ("", "--keep-size "):
        out = run(gw, f"touch pre-{len(flags)} && fallocate {flags}-l 200M pre-{len(flags)}")
        assert out["status"] == "ok" and out["exit_code"] == 1, out
        assert "not supported" in out["stderr"] or "unsupported" in out["stderr"], out
    assert held(ws) < MiB


def test_hard_links_count_once_and_removing_a_name_frees_nothing(gw: Gateway, ws: Path) -> None:
    out = run(gw, "head -c 20971520 /dev/zero > a && for i in $(seq 50); do ln a l$i; done")
    assert out["status"] == "ok", out  # 51 names of 20 MiB: 20 MiB, not 1 GiB
    out = run(gw, "rm a && head -c 20971520 /dev/zero > b && sleep 600")  # the links still hold a's blocks
    assert_stopped(out)


def test_links_to_outside_are_not_followed_or_counted(gw: Gateway, ws: Path) -> None:
    out = run(gw, "python3 -c \"import os\nos.symlink('/', 'root')\nos.symlink('/usr', 'usr')\"")
    assert out["status"] == "ok", out
    out = run(gw, "head -c 1048576 /dev/zero > f")
    assert out["status"] == "ok", out
    assert held(ws) < 2 * MiB


def test_over_the_budget_nothing_may_be_added_but_rm_works(gw: Gateway, ws: Path) -> None:
    assert_stopped(run(gw, "while true; do head -c 1048576 /dev/zero >> log; done"))
    more = run(gw, "echo more > another")
    assert more["error"]["code"] == "DISK_BUDGET" and "nothing more may be added" in more["error"]["message"], more
    assert run(gw, "ls")["status"] == "ok"  # reading is fine
    assert run(gw, "rm log another")["status"] == "ok"
    assert run(gw, "head -c 1048576 /dev/zero > small")["status"] == "ok"


def test_roots_over_twice_the_budget_refuse_a_command_before_it_runs(gw: Gateway, ws: Path) -> None:
    """A command refused at its start was stopped as soon as it had a process: the stop killed
    its cgroup before the sandbox's processes had joined it, and the command ran (a file it
    made was there every time). It is held, and never let go."""
    (ws / "big").write_bytes(b"x" * (3 * BUDGET))  # (written by the human, not through a call)
    for i in range(5):
        out = run(gw, f"echo more > another{i}")
        assert out["error"] == {
            "code": "DISK_BUDGET",
            "message": "the command was refused: the write roots hold more than twice the disk budget of 32.0 MiB "
            "(limits.disk_bytes of role dev): free space in them, or ask for a larger one",
        }, out
    assert not list(ws.glob("another*"))
    (ws / "big").unlink()
    assert run(gw, "echo more > another")["status"] == "ok"  # room again


def test_roots_over_twice_the_budget_refuse_a_session_and_a_background_process(tmp_path: Path, ws: Path) -> None:
    """Before, a session started there, and a background process ran and wrote its file."""
    (ws / "big").write_bytes(b"x" * (3 * BUDGET))
    policy = compile_policy(Policy.model_validate(budget_policy()), tmp_path / "p.yaml", ws, sha256="test")
    gateway = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    why = "the write roots hold more than twice the disk budget of 32.0 MiB (limits.disk_bytes of role dev)"
    try:
        session = gateway.handle(SessionCall(principal="agent", action="start"))
        assert session["error"]["code"] == "DISK_BUDGET", session
        assert session["error"]["message"].startswith(f"the session was refused: {why}"), session
        process = gateway.handle(ProcessCall(principal="agent", action="start", command="echo x > mine; sleep 600"))
        assert process["error"]["code"] == "DISK_BUDGET", process
        assert process["error"]["message"].startswith(f"the process was refused: {why}"), process
        time.sleep(1)  # (what a started one would have written by now)
        assert sorted(os.listdir(ws)) == ["big"]
    finally:
        gateway.handle(ProcessCall(principal="agent", action="stop_all"))
        gateway.close()


def test_a_stop_that_missed_its_sandbox_is_made_again_while_the_roots_grow(ws: Path) -> None:
    """A stop kills the sandbox's cgroup. One made before the sandbox's processes had joined it
    (a trip between its start and the join: another sandbox of the same principal wrote past
    the limit just then) missed them, and the watch never looked at a stopped sandbox again:
    it ran on, and wrote, unwatched. Played at the watch, with a stop that misses: it is made
    again as long as the roots' filesystem takes more, counted from the least it held since
    the stop (space freed meanwhile, by anyone, does not hide what is written after it)."""
    (ws / "old").write_bytes(b"x" * (8 * MiB))
    stops: list[int] = []
    ticket = disk.watch().start((str(ws),), BUDGET, "a test's budget", lambda: stops.append(held(ws)))
    try:
        (ws / "a").write_bytes(b"x" * BUDGET)
        assert eventually(lambda: stops), "never stopped"
        time.sleep(0.2)  # (the watch's looks at what it held at the stop)
        (ws / "old").unlink()  # 8 MiB freed
        time.sleep(0.2)
        stopped = len(stops)
        (ws / "b").write_bytes(b"x" * (4 * MiB))  # what the sandbox the stop missed writes on
        assert eventually(lambda: len(stops) > stopped), f"not stopped again: {stops}"
    finally:
        assert disk.watch().end(ticket) is not None


@pytest.mark.parametrize("path", ["run-unreleased", "session", "process"])
def test_a_budget_tripped_before_the_sandboxs_processes_start_is_never_escaped(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Another writer of the same principal passes the budget just after a sandbox was prepared,
    before its processes start (and join the cgroup a stop kills): the stop killed an empty
    cgroup and the command ran, and was then looked at no more. A review found it for the calls
    the gateway does not hold itself (a hooked agent's exec, a session, a background process):
    the command made its file every time, and a session started and ran what it was sent."""
    real = sandbox.start

    def start(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        plan, launch = real(*args, **kwargs)
        (ws / "filler").write_bytes(b"x" * (BUDGET + 4 * MiB))  # (the other writer)
        assert eventually(lambda: launch.disk_tripped), "the watch never tripped"
        return plan, launch

    monkeypatch.setattr(sandbox, "start", start)
    policy = compile_policy(Policy.model_validate(budget_policy()), tmp_path / "p.yaml", ws, sha256="test")
    gateway = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    try:
        if path == "run-unreleased":  # what a hooked agent's exec runs (hooks/service.py)
            out = shell.run("touch ran", ws, gateway.profile(policy, "agent"), timeout_ms=30_000)
        elif path == "session":
            out = gateway.handle(SessionCall(principal="agent", action="start"))
            if out["status"] == "ok":  # (the old code: it started, and ran what it was sent)
                gateway.handle(SessionCall(principal="agent", action="exec", session_id=out["session_id"],
                                           command="touch ran"))  # fmt: skip
        else:
            out = gateway.handle(ProcessCall(principal="agent", action="start", command="touch ran; sleep 600"))
        time.sleep(1)  # (what a command that got through would have done by now)
        assert not (ws / "ran").exists(), out
        if path != "process":  # (a background process refused this way has exited: 125, never ran)
            assert out["status"] == "error" and out["error"]["code"] == "DISK_BUDGET", out
    finally:
        gateway.handle(ProcessCall(principal="agent", action="stop_all"))
        gateway.close()


def test_without_cgroups_a_session_past_the_budget_is_stopped(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where there are no cgroups the stop signals the sandbox's process group, by the pid Popen
    gave it: a session never passed its own, so nothing was stopped (a review's session wrote
    300 MiB past a 32 MiB budget, and was told it had been stopped)."""
    support = quotas.cgroup_support()
    monkeypatch.setattr(quotas, "cgroup_support", lambda: dataclasses.replace(support, version=None))
    policy = compile_policy(Policy.model_validate(budget_policy()), tmp_path / "p.yaml", ws, sha256="test")
    gateway = Gateway(policy, AuditLog(tmp_path / "audit"))
    try:
        started = gateway.handle(SessionCall(principal="agent", action="start"))
        assert started["status"] == "ok" and started["sandbox"]["quotas"] == "rlimits", started
        writer = "while true; do head -c 1048576 /dev/zero >> log; done"
        out = gateway.handle(
            SessionCall(principal="agent", action="exec", session_id=started["session_id"], command=writer)
        )
        assert out["error"]["code"] == "DISK_BUDGET", out
        assert held(ws) < DISK // 2, held(ws)
    finally:
        gateway.close()


def test_without_cgroups_a_background_process_past_the_budget_is_never_lost(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without cgroups a background process cannot be stopped by its budget (the sandbox's init
    and command run in a session of their own, out of the reach of a process group). A stop by
    the launch's process group killed its hold and bwrap only: its record said it had exited,
    `stop` no longer reached it, and it wrote on. It stays on record and stoppable."""
    support = quotas.cgroup_support()
    monkeypatch.setattr(quotas, "cgroup_support", lambda: dataclasses.replace(support, version=None))
    policy = compile_policy(Policy.model_validate(budget_policy()), tmp_path / "p.yaml", ws, sha256="test")
    gateway = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    try:
        writer = "while true; do head -c 1048576 /dev/zero >> log; sleep 0.05; done"
        started = gateway.handle(ProcessCall(principal="agent", action="start", command=writer))
        assert started["status"] == "ok" and started["sandbox"]["quotas"] == "rlimits", started
        assert eventually(lambda: held(ws) > BUDGET + 8 * MiB), "it never got past the budget"
        time.sleep(1)  # (the watch's stop, such as it is)
        stopped = gateway.handle(ProcessCall(principal="agent", action="stop_all"))
        assert stopped["status"] == "ok", stopped
        time.sleep(0.5)
        before = held(ws)
        time.sleep(1)
        assert held(ws) == before, "a process no record names still writes"
    finally:
        gateway.handle(ProcessCall(principal="agent", action="stop_all"))
        gateway.close()


@pytest.fixture
def beside(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A workspace on a tmpfs of its own, and a directory outside it on the same tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("mounting the workspace's tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0755", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "ws").mkdir()
        (mnt / "outside").mkdir()
        hand_over(mnt / "ws")
        yield mnt / "ws", mnt / "outside"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_sandbox_caught_far_past_the_budget_is_told_what_its_roots_hold(
    tmp_path: Path, beside: tuple[Path, Path]
) -> None:
    """A writer that got more than twice the budget onto the disk before the watch caught it
    (a sparse file filled 64 MiB at a time, beside a CPU burner: a clean-clone run) was told
    its roots held "more than twice" the budget: the words for a command refused at its start,
    whose count stops there. A running sandbox is told what its roots held. Played without the
    race: 100 MiB moved into the roots at once while a command runs (a rename on their
    filesystem takes no space, so only the watch's next count sees it)."""
    ws, outside = beside
    policy = compile_policy(Policy.model_validate(budget_policy()), tmp_path / "p.yaml", ws, sha256="test")
    gateway = Gateway(policy, AuditLog(tmp_path / "audit"))
    try:
        (outside / "big").write_bytes(b"x" * (100 * MiB))
        got: dict[str, Any] = {}
        call = threading.Thread(target=lambda: got.update(run(gateway, "touch started && sleep 600")))
        call.start()
        assert eventually(lambda: (ws / "started").exists()), "the command never started"
        os.rename(outside / "big", ws / "big")
        call.join(timeout=120)
        assert not call.is_alive(), "the command was never stopped"
    finally:
        gateway.close()
    assert_stopped(got)
    assert "hold more than 100.0 MiB, past" in got["error"]["message"], got


def test_a_session_command_past_the_budget_stops_the_session(gw: Gateway, ws: Path) -> None:
    started = gw.handle(SessionCall(principal="agent", action="start"))
    assert started["status"] == "ok", started
    writer = "while true; do head -c 1048576 /dev/zero >> log; done"
    out = gw.handle(SessionCall(principal="agent", action="exec", session_id=started["session_id"], command=writer))
    assert out["error"]["code"] == "DISK_BUDGET", out
    assert out["error"]["message"].startswith("the session was stopped: the write roots hold ")
    assert "(limits.disk_bytes of role dev)" in out["error"]["message"]
    assert held(ws) < DISK // 2


def test_a_background_process_past_the_budget_is_stopped(tmp_path: Path, ws: Path) -> None:
    """A durable process outlives its call (and the gateway): its sandbox is watched as long as
    it runs, and stopped like any other."""
    policy = compile_policy(Policy.model_validate(budget_policy()), tmp_path / "p.yaml", ws, sha256="test")
    gateway = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")
    try:
        writer = "while true; do head -c 1048576 /dev/zero >> log; done"
        started = gateway.handle(ProcessCall(principal="agent", action="start", command=writer))
        assert started["status"] == "ok", started
        pid = started["process"]["id"]

        def ended() -> dict[str, Any] | None:
            got = gateway.handle(ProcessCall(principal="agent", action="get", process_id=pid))
            return got if got["process"]["state"] != "running" else None

        assert eventually(ended, every=0.2), "the writer still runs"
        assert held(ws) < DISK // 2
        assert run(gateway, "echo still-fine")["status"] == "ok"  # the budget stops writers, not the principal
    finally:
        gateway.handle(ProcessCall(principal="agent", action="stop_all"))
        gateway.close()


def test_the_files_tool_writes_no_further_than_the_budget(gw: Gateway, ws: Path) -> None:
    """The files tool writes as the gateway, with no sandbox to stop: each write is checked first."""
    assert run(gw, "head -c 29360128 /dev/zero > base")["status"] == "ok"  # 28 MiB of the 32
    outs = [gw.handle(FilesCall(principal="agent", action="write", path=f"f{i}", content="x" * MiB)) for i in range(6)]
    assert [o["status"] for o in outs[:2]] == ["ok", "ok"], outs
    refused = [o for o in outs if o["status"] != "ok"]
    assert len(refused) >= 2 and all(o["error"]["code"] == "DISK_BUDGET" for o in refused), outs
    assert "would pass the disk budget of 32.0 MiB (limits.disk_bytes of role dev)" in refused[0]["error"]["message"]
    assert held(ws) <= BUDGET
    assert gw.handle(FilesCall(principal="agent", action="delete", path="f0"))["status"] == "ok"


def test_the_stop_is_on_the_record(gw: Gateway, tmp_path: Path) -> None:
    out = run(gw, "while true; do head -c 1048576 /dev/zero >> log; done")
    assert_stopped(out)
    (result,) = [r for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] == "result"]
    assert result["call_id"] == out["call_id"] and result["data"]["error"]["code"] == "DISK_BUDGET"


def test_the_mcp_server_refuses_a_call_past_the_budget(tmp_path: Path, ws: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(budget_policy(), sort_keys=False))
    args = ["serve", "--stdio", "--principal", "agent", "--policy", str(policy), "--workspace", str(ws)]
    args += ["--audit-dir", str(tmp_path / "audit"), "--state-dir", str(tmp_path / "approvals")]
    server = StdioServerParameters(command=GATEWAY, args=args, env=env_without_state(tmp_path))

    async def scenario() -> dict[str, Any]:
        async with Client(server) as c:
            got = await c.call_tool("run", {"command": "while true; do head -c 1048576 /dev/zero >> log; done"})
            return envelope_of(got)

    out = asyncio.run(scenario())
    assert_stopped(out)
    assert held(ws) < DISK // 2


# --- counting -------------------------------------------------------------------------------------


def test_usage_counts_blocks_each_inode_once_and_never_follows_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "data").write_bytes(b"x" * (3 * MiB))
    for i in range(5):
        os.link(root / "d" / "data", root / f"link{i}")
    with open(root / "sparse", "wb") as f:
        f.truncate(1 << 30)  # a GiB long, nothing in it
    os.symlink("/", root / "up")
    os.symlink("/usr", root / "d" / "usr")
    found = disk.usage((str(root), str(root / "d")))  # nested roots: still once
    assert 3 * MiB <= found.bytes < 3 * MiB + 10 * disk.MIN_ENTRY_BYTES, found
    assert not found.partial


def test_a_count_stops_once_past_what_it_is_compared_with(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for i in range(2000):
        (root / str(i)).touch()
    found = disk.usage((str(root),), stop_above=100 * disk.MIN_ENTRY_BYTES)
    assert found.partial and found.entries < 110, found


def test_a_tree_too_deep_to_count_counts_as_over(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(disk.MAX_DEPTH + 2):  # by descriptor: the path is longer than PATH_MAX
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    with pytest.raises(disk.TooDeep):
        disk.usage((str(root),))


def test_a_budget_under_a_mib_is_refused_at_load() -> None:
    policy = budget_policy()
    policy["roles"]["dev"]["limits"]["disk_bytes"] = 1000
    with pytest.raises(ValueError, match="disk_bytes"):
        Policy.model_validate(policy)
    assert "disk_bytes" in json.dumps(Policy.model_json_schema())
