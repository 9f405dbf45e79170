"""The durable process manager, with real processes (no sandbox: `build` runs bash directly)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.executors.processes import NUMBERS, ProcessManager, ProcessRecord, Spawnable
from tests.conftest import PATIENCE_S, eventually

PRINCIPALS = ("alice", "bob")
Events = list[tuple[str, ProcessRecord, dict[str, Any]]]


class Harness:
    """Managers on one state directory, the events they emit and a gate the test can turn."""

    def __init__(self, root: Path) -> None:
        self.state_dir = root / "state"
        self.cwd = root / "work"
        self.cwd.mkdir()
        self.events: Events = []
        self.blocked: set[str] = set()
        self.gate_calls: list[tuple[str, str]] = []
        self.managers: list[ProcessManager] = []

    def build(self, rec: ProcessRecord) -> Spawnable:
        return Spawnable(
            ["bash", "--noprofile", "--norc", "-c", rec.command], {"PATH": os.environ["PATH"], **rec.env}, cwd=rec.cwd
        )

    def gate(self, rec: ProcessRecord, why: str) -> str | None:
        self.gate_calls.append((rec.id, why))
        if "forbidden" in rec.command:
            return "the policy forbids it"
        if rec.id in self.blocked:
            return "no longer allowed"
        return None

    def event(self, name: str, rec: ProcessRecord, details: dict[str, Any]) -> None:
        self.events.append((name, rec, details))

    def manager(self, **kw: Any) -> ProcessManager:
        mgr = ProcessManager(self.state_dir, build=self.build, gate=self.gate, event=self.event, **kw)
        self.managers.append(mgr)
        return mgr

    def start(self, mgr: ProcessManager, command: str, principal: str = "alice", **kw: Any) -> dict[str, Any]:
        args: dict[str, Any] = {"env": {}, "keep_alive": False, "name": None, "max_live": 10, **kw}
        return mgr.start(principal, command, str(self.cwd), **args)

    def named(self, name: str) -> Events:
        return [e for e in self.events if e[0] == name]


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    for mgr in reversed(harness.managers):
        mgr.close()
        for principal in PRINCIPALS:
            mgr.stop_all(principal)


def proc_state(pid: int) -> str | None:
    """The /proc state letter of `pid`, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()[0].decode()


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def until(mgr: ProcessManager, check: Callable[[], bool], timeout: float = PATIENCE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        mgr.tick()
        time.sleep(0.02)


def state(mgr: ProcessManager, pid: str, principal: str = "alice") -> str:
    result = mgr.get(principal, pid)
    assert result["status"] == "ok", result
    return str(result["process"]["state"])


def edit_record(h: Harness, process_id: str, **changes: Any) -> None:
    path = h.state_dir / process_id / "record.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# --- the basic actions ------------------------------------------------------------------------


def test_start_list_get_output_stop(h: Harness) -> None:
    mgr = h.manager()
    started = h.start(mgr, "echo ready; sleep 30", name="server", env={"GREETING": "hi"})
    assert started["status"] == "ok", started
    proc = started["process"]
    pid = proc["id"]
    assert len(pid) == 16 and int(pid, 16) >= 0
    assert proc["state"] == "running" and proc["name"] == "server" and proc["env_names"] == ["GREETING"]
    assert alive(proc["pid"])
    assert h.named("process_started")[0][1].id == pid
    assert h.gate_calls == [(pid, "start")]

    folder = h.state_dir / pid
    assert folder.stat().st_mode & 0o777 == 0o700
    assert (folder / "process.log").stat().st_mode & 0o777 == 0o600
    assert json.loads((folder / "record.json").read_text())["pid"] == proc["pid"]

    listed = mgr.list("alice")
    assert [p["id"] for p in listed["processes"]] == [pid]
    got = mgr.get("alice", pid)["process"]
    assert got["log_path"] == str(folder / "process.log")
    until(mgr, lambda: "ready" in mgr.output("alice", pid, 100)["output"])
    out = mgr.output("alice", pid, 100)
    assert out["output"] == "ready\n" and out["truncated"] is False

    stopped = mgr.stop("alice", pid)
    assert stopped["status"] == "ok"
    assert stopped["process"]["state"] == "stopped" and stopped["process"]["desired"] == "stopped"
    assert not alive(proc["pid"])
    assert h.named("process_stopped")[0][2]["killed"] is False
    mgr.tick()
    assert state(mgr, pid) == "stopped"  # no restart, no exit event after a stop
    assert not h.named("process_exited")


def test_exit_code_wait_for_and_both_streams(h: Harness) -> None:
    mgr = h.manager()
    pid = h.start(mgr, "echo to-stdout; echo to-stderr >&2; exit 3")["process"]["id"]
    assert mgr.wait_for("alice", pid, PATIENCE_S) is True
    got = mgr.get("alice", pid)["process"]
    assert got["state"] == "exited" and got["exit_code"] == 3 and got["ended_at"]
    text = mgr.output("alice", pid, 1000)["output"]
    assert "to-stdout\n" in text and "to-stderr\n" in text
    assert [e[2]["exit_code"] for e in h.named("process_exited")] == [3]


def test_wait_for_a_process_that_keeps_running(h: Harness) -> None:
    mgr = h.manager()
    pid = h.start(mgr, "sleep 30")["process"]["id"]
    assert mgr.wait_for("alice", pid, 0.2) is False
    assert state(mgr, pid) == "running"


def test_stop_kills_the_whole_group_even_when_sigterm_is_ignored(h: Harness) -> None:
    mgr = h.manager()
    command = "trap '' TERM; sleep 30 & echo $! > child.pid; wait"
    started = h.start(mgr, command)["process"]
    child = h.cwd / "child.pid"
    until(mgr, lambda: child.exists() and child.read_text().strip() != "")
    child_pid = int(child.read_text())
    assert alive(child_pid)
    result = mgr.stop("alice", started["id"])
    assert result["process"]["state"] == "stopped"
    assert not alive(started["pid"]) and not alive(child_pid)


def test_stop_all_stops_only_that_principal(h: Harness) -> None:
    mgr = h.manager()
    a1 = h.start(mgr, "sleep 30")["process"]
    a2 = h.start(mgr, "sleep 30")["process"]
    b1 = h.start(mgr, "sleep 30", principal="bob")["process"]
    result = mgr.stop_all("alice")
    assert sorted(result["stopped"]) == sorted([a1["id"], a2["id"]])
    assert not alive(a1["pid"]) and not alive(a2["pid"])
    assert alive(b1["pid"])
    assert state(mgr, b1["id"], "bob") == "running"


# --- isolation, limits, refusals ---------------------------------------------------------------


def test_another_principals_process_is_not_found(h: Harness) -> None:
    mgr = h.manager()
    proc = h.start(mgr, "sleep 30")["process"]
    for result in (
        mgr.get("bob", proc["id"]),
        mgr.output("bob", proc["id"], 100),
        mgr.stop("bob", proc["id"]),
        mgr.get("bob", "0123456789abcdef"),
        mgr.get("alice", "../../etc"),
    ):
        assert result["status"] == "error"
        assert result["error"]["code"] == "PROCESS_NOT_FOUND"
    assert mgr.list("bob")["processes"] == []
    assert mgr.stop_all("bob")["stopped"] == []
    assert alive(proc["pid"])
    with pytest.raises(KeyError):
        mgr.wait_for("bob", proc["id"], 0.1)


def test_process_limit_counts_live_processes(h: Harness) -> None:
    mgr = h.manager()
    first = h.start(mgr, "sleep 30", max_live=2)["process"]
    h.start(mgr, "sleep 30", max_live=2)
    over = h.start(mgr, "sleep 30", max_live=2)
    assert over["status"] == "error" and over["error"]["code"] == "PROCESS_LIMIT"
    assert h.start(mgr, "sleep 30", principal="bob", max_live=2)["status"] == "ok"  # per principal
    mgr.stop("alice", first["id"])
    assert h.start(mgr, "sleep 30", max_live=2)["status"] == "ok"  # a stopped one no longer counts


def test_gate_refusal_at_start(h: Harness) -> None:
    mgr = h.manager()
    result = h.start(mgr, "echo forbidden")
    assert result["status"] == "denied"
    assert result["error"] == {"code": "POLICY_DENIED", "message": "the policy forbids it"}
    assert mgr.list("alice")["processes"] == []
    assert list(h.state_dir.iterdir()) == []
    assert not h.named("process_started")


def test_spawn_failure(h: Harness) -> None:
    mgr = h.manager()
    result = mgr.start("alice", "true", str(h.cwd / "missing"), {}, False, None, 10)
    assert result["status"] == "error" and result["error"]["code"] == "SPAWN_FAILED"
    assert mgr.list("alice")["processes"] == []
    assert [p.name for p in h.state_dir.iterdir()] == [NUMBERS]  # its number is not given again


def test_a_start_that_fails_unexpectedly_leaves_no_descriptor_and_lets_go_of_its_launch(h: Harness) -> None:
    """Popen can fail with other than OSError (here a NUL byte in an argument: ValueError):
    the log, both ends of the hold pipe and what `build` made (a sandbox's ticket, cgroup and
    hold) are let go of all the same, and the error is not swallowed."""
    abandoned: list[str] = []

    def build(rec: ProcessRecord) -> Spawnable:
        env = {"PATH": os.environ["PATH"]}
        return Spawnable(["bash", "-c", "true\0"], env, abandon=lambda: abandoned.append(rec.id))

    mgr = ProcessManager(h.state_dir, build=build, gate=h.gate, event=h.event)
    h.managers.append(mgr)
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(ValueError):
            h.start(mgr, "true")
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert len(abandoned) == 3


# --- logs ------------------------------------------------------------------------------------------


def test_log_rotation_copy_truncate(h: Harness) -> None:
    mgr = h.manager(log_max_bytes=1000)
    command = "printf 'a%.0s' $(seq 3000); while [ ! -e go ]; do sleep 0.02; done; echo AFTER; sleep 30"
    pid = h.start(mgr, command)["process"]["id"]
    log = h.state_dir / pid / "process.log"
    until(mgr, lambda: log.stat().st_size >= 3000)
    mgr.tick()
    rotated = h.state_dir / pid / "process.log.1"
    assert rotated.read_bytes() == b"a" * 3000
    assert rotated.stat().st_mode & 0o777 == 0o600
    assert log.stat().st_size == 0
    (h.cwd / "go").touch()
    until(mgr, lambda: b"AFTER" in log.read_bytes())
    assert log.read_bytes() == b"AFTER\n"  # O_APPEND: it went on at the new end, no hole

    tail = mgr.output("alice", pid, 10)
    assert tail["output"] == "aaaaAFTER\n" and tail["truncated"] is True
    whole = mgr.output("alice", pid, 10_000)
    assert whole["output"] == "a" * 3000 + "AFTER\n" and whole["truncated"] is False


# --- keep-alive ------------------------------------------------------------------------------------


def test_keep_alive_restarts_with_growing_backoff(h: Harness) -> None:
    mgr = h.manager(backoff_initial_s=0.1, backoff_max_s=0.4)
    pid = h.start(mgr, "exit 1", keep_alive=True)["process"]["id"]
    until(mgr, lambda: mgr.get("alice", pid)["process"]["restarts"] >= 4)
    delays = [e[2]["restart_in_s"] for e in h.named("process_exited")]
    assert delays[:5] == [0.1, 0.2, 0.4, 0.4, 0.4][: len(delays[:5])]  # doubling, capped
    assert len(delays) >= 4
    restarted = h.named("process_restarted")
    assert [e[2]["restarts"] for e in restarted][:4] == [1, 2, 3, 4]
    assert all(why == "restart" for _, why in h.gate_calls[1:])  # the gate is asked each time
    assert len(h.gate_calls) == 1 + len(restarted)

    result = mgr.stop("alice", pid)
    assert result["process"]["state"] == "stopped"
    count = mgr.get("alice", pid)["process"]["restarts"]
    time.sleep(0.5)
    mgr.tick()
    assert mgr.get("alice", pid)["process"]["restarts"] == count  # stopped: never again


def test_stable_run_resets_the_backoff(h: Harness) -> None:
    mgr = h.manager(backoff_initial_s=0.1, stable_after_s=0.0)
    pid = h.start(mgr, "exit 1", keep_alive=True)["process"]["id"]
    until(mgr, lambda: mgr.get("alice", pid)["process"]["restarts"] >= 2)
    assert {e[2]["restart_in_s"] for e in h.named("process_exited")} == {0.1}


def test_restart_refused_by_the_gate_fails(h: Harness) -> None:
    mgr = h.manager(backoff_initial_s=0.1)
    pid = h.start(mgr, "exit 1", keep_alive=True)["process"]["id"]
    h.blocked.add(pid)  # the policy changed after the start
    until(mgr, lambda: state(mgr, pid) == "failed")
    got = mgr.get("alice", pid)["process"]
    assert got["restarts"] == 0 and got["desired"] == "running"
    denied = h.named("process_restart_denied")
    assert len(denied) == 1 and denied[0][2]["message"] == "no longer allowed"
    h.blocked.clear()
    time.sleep(0.3)
    mgr.tick()
    assert state(mgr, pid) == "failed"  # no more restarts
    assert state(mgr, pid) not in ("running", "backoff")
    assert h.start(mgr, "sleep 30", max_live=1)["status"] == "ok"  # a failed one is not live


def test_monitor_thread_reaps(h: Harness) -> None:
    mgr = h.manager()
    mgr.start_monitor(interval_s=0.02)
    pid = h.start(mgr, "exit 0")["process"]["id"]
    assert eventually(lambda: state(mgr, pid) == "exited")
    mgr.close()
    assert len(h.named("process_exited")) == 1


def test_no_thread_sees_a_change_before_its_event_is_recorded(h: Harness) -> None:
    """The monitor's thread notices an exit: until the `process_exited` event is recorded (an
    audit record, in the gateway), no other thread may be told the process exited. Before, the
    record was written after the lock was let go: a `get` answered `exited` (or `failed`) with
    no record of it yet, which a crash then would never write (and CI's reads of the audit log
    right after seeing the state raced it)."""
    recording, release = threading.Event(), threading.Event()
    record = h.event

    def slow_record(name: str, rec: ProcessRecord, details: dict[str, Any]) -> None:
        if name == "process_exited":
            recording.set()
            release.wait(PATIENCE_S)  # a slow disk, held until the test has looked
        record(name, rec, details)

    h.event = slow_record  # type: ignore[method-assign]
    mgr = h.manager()
    pid = h.start(mgr, "exit 0")["process"]["id"]
    mgr.start_monitor(interval_s=0.02)
    assert recording.wait(PATIENCE_S)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.append(state(mgr, pid)))
    reader.start()
    reader.join(1.0)  # the old manager answered at once; the new one waits for the record
    before_the_record = list(seen)
    release.set()
    reader.join()
    mgr.close()
    assert before_the_record == [], f"another thread was told {before_the_record} before the record was written"
    assert seen == ["exited"] and len(h.named("process_exited")) == 1


# --- a gateway restart -------------------------------------------------------------------------------


def test_survives_a_gateway_restart_and_is_adopted(h: Harness) -> None:
    a = h.manager()
    proc = h.start(a, "sleep 30")["process"]
    a.close()  # the gateway goes away; the process does not

    b = h.manager()
    b.rehydrate()
    adopted = h.named("process_adopted")
    assert [e[1].id for e in adopted] == [proc["id"]]
    got = b.get("alice", proc["id"])["process"]
    assert got["state"] == "running" and got["pid"] == proc["pid"]
    assert b.get("bob", proc["id"])["error"]["code"] == "PROCESS_NOT_FOUND"
    b.tick()
    assert state(b, proc["id"]) == "running"

    assert b.stop("alice", proc["id"])["process"]["state"] == "stopped"
    assert not alive(proc["pid"])
    record = json.loads((h.state_dir / proc["id"] / "record.json").read_text())
    assert record["state"] == "stopped" and record["desired"] == "stopped"


def test_adopted_process_exit_is_noticed(h: Harness) -> None:
    a = h.manager()
    proc = h.start(a, "while [ ! -e go ]; do sleep 0.02; done")["process"]
    a.close()
    b = h.manager()
    b.rehydrate()
    assert state(b, proc["id"]) == "running"
    (h.cwd / "go").touch()
    until(b, lambda: state(b, proc["id"]) == "exited")
    exited = h.named("process_exited")
    assert len(exited) == 1 and exited[0][2]["exit_code"] is None  # not our child: no status


def test_reused_pid_is_not_adopted(h: Harness) -> None:
    a = h.manager()
    proc = h.start(a, "sleep 30")["process"]
    a.close()
    record = json.loads((h.state_dir / proc["id"] / "record.json").read_text())
    edit_record(h, proc["id"], start_ticks=record["start_ticks"] + 1)

    b = h.manager()
    b.rehydrate()
    assert not h.named("process_adopted")
    assert state(b, proc["id"]) == "exited"
    assert [e[1].id for e in h.named("process_exited")] == [proc["id"]]
    b.stop("alice", proc["id"])
    assert alive(proc["pid"])  # never signalled: to B it is someone else's process
    # (the fixture's finalizer stops it through A, whose child it is)


def test_keep_alive_process_that_died_meanwhile_is_restarted(h: Harness) -> None:
    a = h.manager(backoff_initial_s=0.1)
    proc = h.start(a, "exit 1", keep_alive=True)["process"]
    a.close()
    assert eventually(lambda: not alive(proc["pid"]))

    b = h.manager(backoff_initial_s=0.1)
    b.rehydrate()
    assert state(b, proc["id"]) == "backoff"
    until(b, lambda: b.get("alice", proc["id"])["process"]["restarts"] >= 1)
    assert h.gate_calls[-1] == (proc["id"], "restart")


def test_record_from_another_boot_is_lost(h: Harness) -> None:
    a = h.manager()
    proc = h.start(a, "sleep 30")["process"]
    a.close()
    edit_record(h, proc["id"], boot_id="00000000-0000-0000-0000-000000000000")

    b = h.manager()
    b.rehydrate()
    cleared = h.named("process_cleared")
    assert [e[1].id for e in cleared] == [proc["id"]]
    got = b.get("alice", proc["id"])["process"]
    assert got["state"] == "lost" and got["pid"] is None
    assert not h.named("process_adopted")
    b.tick()
    assert state(b, proc["id"]) == "lost"


def test_corrupt_record_is_skipped(h: Harness) -> None:
    a = h.manager()
    good = h.start(a, "sleep 30")["process"]
    a.close()
    for name, text in (("0123456789abcdef", "{not json"), ("fedcba9876543210", '{"id": "fedcba9876543210"}')):
        folder = h.state_dir / name
        folder.mkdir()
        (folder / "record.json").write_text(text)
    (h.state_dir / "aaaaaaaaaaaaaaaa").mkdir()  # no record yet: a start in progress, maybe
    interrupted = h.state_dir / "bbbbbbbbbbbbbbbb"  # no record, long ago: a start a crash cut short
    interrupted.mkdir()
    (interrupted / "output.log").write_text("")
    os.utime(interrupted, (time.time() - 3600, time.time() - 3600))

    b = h.manager()
    b.rehydrate()
    corrupt = sorted(e[1].id for e in h.named("process_record_corrupt"))
    assert corrupt == ["0123456789abcdef", "fedcba9876543210"]
    assert [e[1].id for e in h.named("process_start_interrupted")] == ["bbbbbbbbbbbbbbbb"]
    assert not interrupted.exists() and (h.state_dir / "aaaaaaaaaaaaaaaa").is_dir()
    assert [p["id"] for p in b.list("alice")["processes"]] == [good["id"]]
    assert state(b, good["id"]) == "running"
