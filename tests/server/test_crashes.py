"""Crashes that leave nothing behind: a gateway killed with SIGKILL at random moments around
spawns, many times over, leaves no sandbox running, whether or not a gateway runs again.

`run` sandboxes: the helper in front of bwrap stays as the sandbox's guard and kills bwrap's
process group when its lifeline, a pipe only the gateway holds open, closes; the sandbox's init
(the helper again) ends the sandbox when it closes, too. bwrap's own parent-death signal is
armed only once it has built the sandbox, too late when the gateway died meanwhile, and one
armed before bwrap existed killed its monitor between its clone of the namespace's first
process and its go to it, which then waited for ever."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import random
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog
from gateway.calls import ProcessCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox import quotas
from tests import clonestop, crashload
from tests.conftest import eventually
from tests.server.conftest import GATEWAY, POLICY, env_without_state

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")

ITERATIONS = 25
KILL_TRIES = 60


def _marker() -> str:
    return f"4{secrets.randbelow(10**6):06d}.{secrets.randbelow(10**6):06d}"


def test_kill_9_around_spawns_leaves_no_run_sandbox(tmp_path: Path, ws: Path, policy: CompiledPolicy) -> None:
    marker = _marker()
    rng = random.Random()
    try:
        for i in range(ITERATIONS):
            cfg = {
                "policy": POLICY, "policy_path": str(tmp_path / "policies" / "p.yaml"), "ws": str(ws),
                "audit": str(tmp_path / f"audit{i}"), "state": str(tmp_path / f"state{i}"), "mode": "run",
                "command": f"sleep {marker}", "timeout_ms": 150, "threads": 8,
            }  # fmt: skip
            proc = crashload.start_load(cfg)
            try:
                first = crashload.wait_first(proc)
                assert first.get("status") == "timeout", first  # the sandbox runs here
                time.sleep(rng.uniform(0.0, 0.4))  # somewhere among the spawns of 8 threads
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
        Gateway(policy, AuditLog(tmp_path / "audit-last"), state_dir=tmp_path / "state-last").close()  # a restart
        leaked = crashload.survivors(marker, settle_s=10.0)
        assert not leaked, f"{len(leaked)} sandbox processes outlived a killed gateway and its restart"
    finally:
        crashload.kill_all(crashload.with_marker(marker))


def test_kill_9_during_process_starts_leaves_no_unrecorded_process(tmp_path: Path, ws: Path) -> None:
    """Every durable process that runs after the kills is named by a record: a gateway on each
    state directory finds it and `stop_all` ends it (8 of 30 ran with no record before)."""
    marker = _marker()
    rng = random.Random()
    many = copy.deepcopy(POLICY)
    many["roles"]["dev"]["limits"]["processes"] = 100_000
    compiled = compile_policy(Policy.model_validate(many), tmp_path / "policies" / "p.yaml", ws, sha256="t")
    leaked: list[int] = []
    try:
        for i in range(ITERATIONS):
            state = tmp_path / f"state{i}"
            cfg = {
                "policy": many, "policy_path": str(tmp_path / "policies" / "p.yaml"), "ws": str(ws),
                "audit": str(tmp_path / f"audit{i}"), "state": str(state), "mode": "process",
                "command": f"sleep {marker}", "threads": 4,
            }  # fmt: skip
            proc = crashload.start_load(cfg)
            try:
                first = crashload.wait_first(proc)
                assert first.get("status") == "ok", first
                time.sleep(rng.uniform(0.0, 0.3))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
            gw = Gateway(compiled, AuditLog(tmp_path / f"audit-after{i}"), state_dir=state)
            try:
                stopped = gw.handle(ProcessCall(principal="agent", action="stop_all"))
                assert stopped["status"] == "ok", stopped
            finally:
                gw.close()
            found = crashload.survivors(marker, settle_s=10.0)
            leaked += found
            crashload.kill_all(found)
        assert not leaked, f"{len(leaked)} processes of durable starts ran with no record naming them"
    finally:
        crashload.kill_all(crashload.with_marker(marker))


def test_a_restarted_gateway_revives_a_keep_alive_service_without_any_call(
    tmp_path: Path, ws: Path, policy: CompiledPolicy
) -> None:
    """Rehydration happens when the gateway starts, not on the first process call: a keep-alive
    service that died while no gateway ran is restarted by the next gateway on its own."""
    marker = _marker()
    state = tmp_path / "state"
    first = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=state)
    try:
        out = first.handle(ProcessCall(principal="agent", action="start", command=f"sleep {marker}", keep_alive=True))
        assert out["status"] == "ok", out
        pid = out["process"]["pid"]
        first.close()  # the gateway stops; the service runs on
        # it runs (a group killed while bubblewrap still sets the sandbox up is another story)
        assert eventually(lambda: crashload.with_marker(marker)), "the keep-alive service never started"
        os.killpg(pid, signal.SIGKILL)  # and dies while no gateway runs: its group, and what runs
        # in its namespace (a durable sandbox has no --die-with-parent, and its namespace's init
        # is in a session of its own: killing the group alone left it running in 1 of 4 loaded runs)
        crashload.kill_all(crashload.with_marker(marker))
        assert not crashload.survivors(marker)
        second = Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=state)  # no call is made to it
        try:
            record = next(state.glob("processes/*/record.json"))
            assert eventually(lambda: crashload.with_marker(marker)), "the keep-alive service stayed down"
            # the restart's count is saved after its command started (the record written before it
            # names the new pid): the monitor's thread may not have written it yet
            assert eventually(lambda: json.loads(record.read_text())["restarts"] == 1), record.read_text()
            saved = json.loads(record.read_text())
            assert saved["restarts"] == 1 and saved["state"] == "running" and saved["pid"] != pid
        finally:
            second.handle(ProcessCall(principal="agent", action="stop_all"))
            second.close()
    finally:
        crashload.kill_all(crashload.with_marker(marker))


@contextlib.contextmanager
def _cgroup_of_its_own() -> Iterator[list[str]]:
    """The `cgroup.procs` files of a cgroup made for this test below its own (one per cgroup v1
    hierarchy of memory and pids, or one in v2; none where it cannot be made). A server started
    in it puts its sandboxes' groups below it, where no other gateway on this host looks: every
    gateway that starts kills what runs in the groups of gateways that are gone (quotas.
    kill_abandoned), and the gateways of other tests on the host would hide a leak here."""
    made: list[str] = []
    own = quotas._own_cgroups()
    name = f"agw-kill-test-{secrets.token_hex(4)}"
    for mount in quotas._mounts():
        served = [c for c in quotas.WANTED if c in mount.options] if mount.fstype == "cgroup" else [""]
        if not served or served[0] not in own:
            continue
        where = quotas._dir_in(mount, own[served[0]])
        if where is not None and os.path.join(where, name) not in made:
            with contextlib.suppress(OSError):
                os.mkdir(os.path.join(where, name))
                made.append(os.path.join(where, name))
    try:
        yield [os.path.join(d, "cgroup.procs") for d in made]
    finally:
        for top in made:
            for where, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(where)


class _StdioGateway:
    """A real `gateway serve --stdio`, spoken to in raw JSON-RPC lines (no client library between
    the call and the kill: the kill lands where the test says), started in the cgroups `join`."""

    def __init__(self, tmp_path: Path, policy_file: Path, ws: Path, join: list[str]) -> None:
        argv = [GATEWAY, "serve", "--stdio", "--principal", "agent", "--policy", str(policy_file),
                "--workspace", str(ws), "--audit-dir", str(tmp_path / "audit"),
                "--state-dir", str(tmp_path / "approvals"), "--process-dir", str(tmp_path / "state")]  # fmt: skip
        joining = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        argv = ["/bin/sh", "-c", joining, "sh", *join, "--", *argv]
        tmp_path.mkdir(parents=True, exist_ok=True)
        with (tmp_path / "serve.err").open("w") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env=env_without_state(tmp_path))  # fmt: skip
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "killer", "version": "1"}}
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        assert self.proc.stdout is not None
        answer = self.proc.stdout.readline()  # bounded: the server answers or dies (EOF)
        assert '"id":1' in answer.replace(" ", ""), (answer, (tmp_path / "serve.err").read_text())
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def test_kill_9_of_a_real_server_right_after_a_run_starts_leaves_nothing_running(
    tmp_path: Path, ws: Path, policy_file: Path
) -> None:
    """A real server killed 0-40 ms after a run's sandbox starts, 60 times: nothing of any sandbox
    runs on, with no gateway started again (bwraps ran on before: the namespace's init, re-parented
    to the host's init before it armed its parent-death signal, then ran the command; later, under
    load, the namespace's first process, waiting for the go of a monitor killed right after it
    was forked: 6 of 255 tries killed the moment it was seen, none of 120 with the fix)."""
    base = _marker()  # each try's command is `sleep <base><try>`
    rng = random.Random()
    leaked: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: crashload.kill_all(crashload.with_marker(base)))
        join = stack.enter_context(_cgroup_of_its_own())
        for i in range(KILL_TRIES):
            server = _StdioGateway(tmp_path / f"try{i}", policy_file, ws, join)
            mine = f"{base}{i:03d}"
            try:
                server.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                             "params": {"name": "run", "arguments": {"command": f"sleep {mine}"}}})  # fmt: skip
                if i % 4 == 0:  # 0-40 ms after its sandbox appears: built, or running its command
                    assert eventually(functools.partial(crashload.with_marker, mine), every=0.001), "no run"
                    time.sleep(rng.uniform(0.0, 0.04))
                elif i % 4 == 2:  # 0-10 ms after bwrap forked the namespace's first process: mid-build
                    assert eventually(functools.partial(_building, mine), every=0.001), "no sandbox was built"
                    time.sleep(rng.uniform(0.0, 0.01))
                else:  # the moment it is seen: a loaded monitor may not have let that process go on yet
                    assert eventually(functools.partial(_building, mine), every=0.0), "no sandbox was built"
            finally:
                server.kill()
            # looked for before the next server starts: a gateway that starts kills what runs in the
            # cgroups of gateways that are gone, which would hide the leak
            found = crashload.survivors(mine, settle_s=5.0)
            leaked += _described(found)
            crashload.kill_all(found)
        assert not leaked, f"{len(leaked)} sandbox processes outlived their killed gateway: {leaked}"


@pytest.mark.skipif(os.geteuid() != 0, reason="traces the gateway and its sandbox's processes (root)")
def test_kill_9_of_a_server_whose_bwrap_just_cloned_its_sandbox_leaves_nothing_running(
    tmp_path: Path, ws: Path, policy_file: Path
) -> None:
    """The window itself, every time: bwrap's monitor held (traced) at the instant it has cloned
    the sandbox's first process, before it tells that process to go on, and the server killed
    there. That first process (PID 1 of the new namespace, still bwrap) waits for the go on an
    eventfd nobody will ever write, with no parent-death signal armed yet: it ran on for ever,
    as the sandbox account, out of every cgroup kill but a later gateway's."""
    mine = _marker()
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: crashload.kill_all(crashload.with_marker(mine)))
        join = stack.enter_context(_cgroup_of_its_own())
        server = _StdioGateway(tmp_path / "server", policy_file, ws, join)
        stack.callback(server.kill)
        tracer = clonestop.Tracer(server.proc.pid)
        server.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "run", "arguments": {"command": f"sleep {mine}"}}})  # fmt: skip
        held = tracer.hold_monitor_at_clone(mine)
        stack.callback(clonestop.release, held.monitor)
        server.kill()
        assert clonestop.wait_gone(held.monitor), "the held bwrap outlived its gateway"
        found = crashload.survivors(mine, settle_s=5.0)
        assert not found, f"the sandbox outlived its killed gateway: {_described(found)} ({held.events})"


def _building(marker: str) -> bool:
    """Whether bwrap is building the sandbox of the command holding `marker` (its monitor and its
    namespace's first process both run, until that one execs the helper), or has built it."""
    names = []
    for pid in crashload.with_marker(marker):
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return names.count("bwrap") >= 2 or "init" in names or "sleep" in names


def _described(pids: list[int]) -> list[str]:
    """Each survivor as it stands: what it is, whose, and where it waits (its state, the kernel
    function it sleeps in, its signal masks and parent-death signal's absence tell which step of
    the sandbox's start it never left; its descriptors name the pipe or eventfd it reads)."""
    out = []
    for pid in pids:
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = dict(
                line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line
            )
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            fds = {}
            for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
                with contextlib.suppress(OSError):
                    fds[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        fds = {fd: what for fd, what in fds.items() if not what.startswith("/")}  # pipes, eventfds, sockets
        fields = ("Name", "PPid", "State", "NSpid", "SigBlk", "SigCgt")
        where = " ".join(f"{k}={status.get(k, '?').strip()}" for k in fields)
        out.append(f"{pid} uid {uid}: {args[0].decode(errors='replace')} [{where} wchan={wchan} fds={fds}]")
    return out
