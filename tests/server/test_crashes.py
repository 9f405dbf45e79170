"""Crashes that leave nothing behind: a gateway killed with SIGKILL at random moments around
spawns, many times over, leaves no sandbox running once a gateway runs again.

`run` sandboxes: the helper arms the parent-death signal before bwrap exists (and notices a
parent already gone), and the groups of sandboxes that were to die with a gateway that is gone
are killed when the next one starts (what bwrap's own window let through)."""

from __future__ import annotations

import copy
import json
import os
import random
import secrets
import signal
import time
from pathlib import Path

import pytest

from gateway.audit import AuditLog
from gateway.calls import ProcessCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from tests import crashload
from tests.conftest import eventually
from tests.server.conftest import POLICY

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")

ITERATIONS = 25


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
