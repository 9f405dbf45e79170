"""Durable processes in the real sandbox, through the gateway: nothing a process started outlives
it. Its sandbox's init is the helper, which ends the sandbox when the process's command ends
(its PID namespace goes with it), and its cgroup is killed once the gateway sees it end, or sees,
when it starts, that it ended while no gateway ran."""

from __future__ import annotations

import contextlib
import copy
import os
import secrets
import signal
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
from gateway.sandbox.identity import hand_over
from tests import crashload
from tests.conftest import eventually
from tests.server.conftest import POLICY

DETACHING: dict[str, Any] = copy.deepcopy(POLICY)
DETACHING["rules"].append({
    "id": "detach", "decision": "allow", "justification": "a process may leave children behind",
    "programs": ["setsid", "nohup", "python3"], "accept_unknown": True, "examples": {"match": ["setsid nohup sleep 1"]},
})  # fmt: skip
STUBBORN = "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(float(sys.argv[1]))\n"
"""A child that ignores SIGTERM: only SIGKILL (or its namespace's end) ends it."""
WAIT_FOR_GO = "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)\n"
"""A main process that runs until the test says so."""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    hand_over(w)
    return w


@pytest.fixture
def policy(ws: Path) -> CompiledPolicy:
    return compile_policy(Policy.model_validate(DETACHING), ws.parent / "p.yaml", ws, sha256="test")


@pytest.fixture
def marker() -> Iterator[str]:
    """A number no other process has on its command line: `sleep <marker>N` is findable."""
    mark = f"4{secrets.randbelow(10**5):05d}.{secrets.randbelow(10**4):04d}"
    try:
        yield mark
    finally:
        crashload.kill_all(crashload.with_marker(mark))


def sleeping(marker: str) -> list[int]:
    """The processes running the program `marker` names (a sleep, the stubborn python), not the
    sandbox around them, whose command lines hold the marker from the start."""
    found = []
    for pid in crashload.with_marker(marker):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() in ("sleep", "python3"):
                found.append(pid)
    return found


def gateway(policy: CompiledPolicy, tmp_path: Path) -> Gateway:
    return Gateway(policy, AuditLog(tmp_path / "audit"), state_dir=tmp_path / "state")


def process(gw: Gateway, action: str, **kw: Any) -> dict[str, Any]:
    return gw.handle(ProcessCall(principal="agent", action=action, **kw))  # type: ignore[arg-type]


def state(gw: Gateway, process_id: str) -> str:
    return str(process(gw, "get", process_id=process_id)["process"]["state"])


def test_what_a_durable_process_leaves_running_ends_with_it(
    policy: CompiledPolicy, tmp_path: Path, marker: str
) -> None:
    """`setsid nohup sleep &` and exit: the record said exited, `stop` said not running, and the
    sleep ran on (and after the gateway exited). Must hold: once the process has ended, nothing
    it started runs."""
    gw = gateway(policy, tmp_path)
    try:
        out = process(gw, "start", command=f"setsid nohup sleep {marker}1 >/dev/null 2>&1 & echo started")
        assert out["status"] == "ok", out
        pid = out["process"]["id"]
        assert eventually(lambda: state(gw, pid) == "exited")
        assert not crashload.survivors(marker), "what the process left running outlived it"
        stopped = process(gw, "stop", process_id=pid)
        assert stopped["error"]["code"] == "DAEMON_NOT_RUNNING", stopped
    finally:
        gw.close()
    assert not crashload.with_marker(marker)


def test_stopping_a_durable_process_ends_everything_in_its_sandbox(
    policy: CompiledPolicy, tmp_path: Path, marker: str, ws: Path
) -> None:
    """Children in sessions of their own, one ignoring SIGTERM: a stop ends them all."""
    (ws / "stubborn.py").write_text(STUBBORN)
    gw = gateway(policy, tmp_path)
    try:
        command = (
            f"setsid nohup sleep {marker}1 >/dev/null 2>&1 & setsid python3 stubborn.py {marker}2 & sleep {marker}3"
        )
        out = process(gw, "start", command=command)
        assert out["status"] == "ok", out
        assert eventually(lambda: sleeping(f"{marker}1") and sleeping(f"{marker}2") and sleeping(f"{marker}3"))
        assert process(gw, "stop", process_id=out["process"]["id"])["status"] == "ok"
        assert not crashload.survivors(marker), "a stopped process's children ran on"
    finally:
        gw.close()


def test_a_process_that_ends_while_no_gateway_runs_leaves_nothing(
    policy: CompiledPolicy, tmp_path: Path, marker: str, ws: Path
) -> None:
    """The gateway stops (durable processes run on, by design); the process then ends, having
    started a detached child. Must hold: the child ends with it, with no gateway to see it."""
    (ws / "wait.py").write_text(WAIT_FOR_GO)
    gw = gateway(policy, tmp_path)
    try:
        command = f"setsid nohup sleep {marker}1 >/dev/null 2>&1 & python3 wait.py"
        out = process(gw, "start", command=command)
        assert out["status"] == "ok", out
        assert eventually(lambda: sleeping(f"{marker}1"))
    finally:
        gw.close()
    (ws / "go").touch()  # the process ends, no gateway running
    assert not crashload.survivors(marker), "a detached child outlived its process while no gateway ran"


@pytest.mark.skipif(quotas.cgroup_support().version is None, reason="needs cgroups: the sweep kills a cgroup")
def test_a_gateway_that_starts_ends_what_runs_in_the_sandbox_of_an_ended_process(
    policy: CompiledPolicy, tmp_path: Path, marker: str
) -> None:
    """While no gateway runs, the process's bwrap is killed (an admin, the OOM killer): its
    sandbox, which no parent-death signal ties to it, runs on. The next gateway finds the process
    gone and records it exited. Must hold: it also ends what runs in that process's cgroup."""
    gw = gateway(policy, tmp_path)
    try:
        out = process(gw, "start", command=f"setsid nohup sleep {marker}1 >/dev/null 2>&1 & sleep {marker}2")
        assert out["status"] == "ok", out
        process_id, bwrap = out["process"]["id"], out["process"]["pid"]
        assert eventually(lambda: sleeping(f"{marker}1") and sleeping(f"{marker}2"))
    finally:
        gw.close()
    os.kill(bwrap, signal.SIGKILL)
    assert not eventually(lambda: not sleeping(f"{marker}2"), seconds=2.0), "it ended with its bwrap"
    again = gateway(policy, tmp_path)
    try:
        assert state(again, process_id) == "exited"
        assert not crashload.survivors(marker), "what ran in an ended process's sandbox ran on"
    finally:
        again.close()
