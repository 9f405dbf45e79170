"""Durable background processes: the manager behind the `process` tool.

Each process has a folder `<state_dir>/<id>/` (mode 0700) holding `record.json` (the
`ProcessRecord`, written atomically), `sandbox.json` (the sandbox configuration its last start or
restart was launched with, written before it runs) and `process.log` (stdout and stderr, opened
with O_APPEND).
The record, with the pid, is on disk before the command can run: the child starts as
`agw-init hold FD -- argv`, which execs the command only when the gateway sends a byte after the
write, and exits at end-of-file if the gateway dies first.
The process runs in its own session (`start_new_session`), so its pid is also its process group
and session id; stopping it signals the whole group (SIGTERM, SIGKILL after a grace period). In
the gateway the argv from `build` is the sandbox (bwrap without `--die-with-parent`), whose PID
namespace takes every descendant with it: its init is the sandbox helper, which ends when the
command does, so nothing the command left running (`setsid nohup x &`) outlives it, with or
without a gateway. The sandbox's cgroup (`cgroup` in the record) is killed and removed too once
the process is seen to have ended or been stopped, and, when the gateway starts, for every record
that has ended (what a gateway stopped in between left).

Processes outlive the gateway on purpose. On start the gateway calls `rehydrate()`: a record
from an earlier boot is `lost`; a pid that is still the same process (same start time in
`/proc/<pid>/stat`, still its own group and session leader, same user) is adopted; anything else
has exited (and a keep-alive process is scheduled for a restart).

The policy is not decided here: `gate(record, "start" | "restart")` is called before every spawn,
restarts included (the policy may have changed since), and `event(name, record, details)` is
the audit hook. Both are called without the manager's lock held.

The state directory must lie outside every write root and be hidden from the sandbox: whoever
can edit a record can make the gateway signal the pid it names.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.log import log
from gateway.sandbox import helper, identity, proctree, quotas, reaper
from gateway.sandbox.launch import DiskBudgetRefused

GRACE_SECONDS = 2.0
KILL_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.02
LIVE_STATES = ("running", "backoff")
RECORD = "record.json"
SANDBOX = "sandbox.json"
"""The sandbox configuration the last launch (start or restart) used: written before it runs, for
people and tools to read. A restart never reads it back: its sandbox is built anew from the
policy that decided the restart."""
START_SETTLE_S = 30.0
"""A folder without a record this old is an interrupted start (`rehydrate` removes it)."""
LOG = "process.log"
OLD_LOG = "process.log.1"
_ID = re.compile(r"[0-9a-f]{16}")
NUMBERS = ".numbers.json"
"""The last number given to each principal's processes (a dot name: not a process folder)."""
_BY_NUMBER = re.compile(r"daemon-([1-9][0-9]{0,17})")
"""A process named by its principal's number instead of its id (`daemon-3`)."""


@dataclass(frozen=True)
class Spawnable:
    """What `build` returns: the argv and environment to start, the descriptors it needs, and
    what to call once it has been forked (the sandbox closes its copies of the descriptors)."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    started: Callable[[], None] = lambda: None
    abandon: Callable[[], None] = lambda: None
    """Called when it was never started after all: what `build` made for it is let go of."""
    cwd: str = "/"
    """Where Popen starts it (the sandbox changes into the call's cwd itself, by its own view)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """What holds it (Landlock, quotas, uid): on its started/restarted records."""
    cgroup: str | None = None
    """The name of its sandbox's cgroup (gateway.sandbox.quotas), when it has one: killed when it ends."""
    config: dict[str, Any] = field(default_factory=dict)
    """The sandbox configuration it is launched with (mounts, Landlock, quotas, network, argv):
    written to the process folder's `sandbox.json` before it starts."""


Build = Callable[["ProcessRecord"], Spawnable]
Gate = Callable[["ProcessRecord", str], str | None]
Event = Callable[[str, "ProcessRecord", dict[str, Any]], None]
_Events = list[tuple[str, "ProcessRecord", dict[str, Any]]]
_Target = tuple["ProcessRecord", "subprocess.Popen[bytes] | None", int, int | None]
"""A process being stopped: its record, our Popen (None when adopted), its pid and start ticks."""
_Targets = list[_Target]
_Records = list["ProcessRecord"]
_Ids = list[str]


@dataclass
class ProcessRecord:
    """One durable process, as stored in `<state_dir>/<id>/record.json`."""

    id: str
    principal: str
    name: str | None
    command: str
    cwd: str
    env: dict[str, str]
    keep_alive: bool
    desired: str
    """"running" or "stopped" (set by stop: never restart it)."""
    pid: int | None
    start_ticks: int | None
    """Field 22 of /proc/<pid>/stat when it started: tells a reused pid apart."""
    boot_id: str
    """/proc/sys/kernel/random/boot_id when it started."""
    started_at: str | None
    ended_at: str | None
    exit_code: int | None
    restarts: int
    next_restart_at: float | None
    """Wall-clock epoch seconds of the next restart (state "backoff")."""
    state: str
    """running | exited | stopped | backoff | failed (the gate refused a restart) | lost (an earlier boot)."""
    failures: int = 0
    """Consecutive runs shorter than stable_after_s: the backoff exponent."""
    number: int | None = None
    """The principal's own number for it: 1, 2, 3... in the order its processes were started,
    never reused (the os profile's daemon `pid`; `daemon-N` names it in the process tool).
    None on records from before numbers."""
    cgroup: str | None = None
    """The cgroup of its last start's sandbox (None: it has none, or a record from before): everything
    left in it is killed once the process has ended."""


_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "principal": (str,),
    "name": (str, type(None)),
    "command": (str,),
    "cwd": (str,),
    "env": (dict,),
    "keep_alive": (bool,),
    "desired": (str,),
    "pid": (int, type(None)),
    "start_ticks": (int, type(None)),
    "boot_id": (str,),
    "started_at": (str, type(None)),
    "ended_at": (str, type(None)),
    "exit_code": (int, type(None)),
    "restarts": (int,),
    "next_restart_at": (float, int, type(None)),
    "state": (str,),
    "failures": (int,),
    "number": (int, type(None)),
    "cgroup": (str, type(None)),
}
_STATES = ("running", "exited", "stopped", "backoff", "failed", "lost")


def _parse_record(data: Any) -> ProcessRecord:
    """A record from its JSON, every field checked. Raises ValueError."""
    if not isinstance(data, dict):
        raise ValueError("not an object")
    known = {f.name for f in fields(ProcessRecord)}
    if set(data) - known:
        raise ValueError(f"unknown fields: {sorted(set(data) - known)}")
    values: dict[str, Any] = {}
    for name, types in _TYPES.items():
        if name not in data:
            if name in ("failures", "number", "cgroup"):
                continue
            raise ValueError(f"missing field {name}")
        value = data[name]
        bool_ok = bool in types
        if not isinstance(value, types) or (isinstance(value, bool) and not bool_ok):
            raise ValueError(f"field {name} has the wrong type")
        values[name] = value
    env = values["env"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("env must map strings to strings")
    if values["state"] not in _STATES or values["desired"] not in ("running", "stopped"):
        raise ValueError("unknown state")
    if not _ID.fullmatch(values["id"]):
        raise ValueError("malformed id")
    if values["next_restart_at"] is not None:
        values["next_restart_at"] = float(values["next_restart_at"])
    return ProcessRecord(**values)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _age_seconds(iso: str | None) -> float:
    if iso is None:
        return 0.0
    try:
        return max(0.0, time.time() - datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return 0.0


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class _Stat:
    state: str
    pgrp: int
    session: int
    start_ticks: int
    uid: int


def _stat(pid: int) -> _Stat | None:
    """What /proc says about `pid`, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold anything: split after the last ")"
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return _Stat(rest[0].decode(), int(rest[2]), int(rest[3]), int(rest[19]), uid)
    except (IndexError, ValueError):
        return None


def _same_process(pid: int | None, start_ticks: int | None) -> bool:
    """`pid` is still the process we started, alive (not a zombie), leading its own group and
    session, and ours."""
    if pid is None or start_ticks is None or pid <= 1:
        return False
    st = _stat(pid)
    return (
        st is not None
        and st.start_ticks == start_ticks
        and st.state not in ("Z", "X", "x")
        and st.pgrp == pid
        and st.session == pid
        and st.uid in _our_uids()
    )


def _our_uids() -> tuple[int, ...]:
    """Who our processes run as: the gateway's user, or the sandbox account it switches to."""
    try:
        return (os.getuid(), identity.sandbox_identity().uid)
    except Exception:
        return (os.getuid(),)


def _error(code: str, message: str, status: str = "error") -> dict[str, Any]:
    return {"status": status, "error": {"code": code, "message": message}}


def _not_found(process_id: str) -> dict[str, Any]:
    return _error("PROCESS_NOT_FOUND", f"no process {process_id!r}")


def _tail(path: Path, count: int) -> tuple[bytes, int]:
    """The last `count` bytes of `path` and its size (b"", 0 when missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return b"", 0
    try:
        size = os.fstat(fd).st_size
        if count <= 0:
            return b"", size
        start = max(0, size - count)
        chunks = []
        left = size - start
        while left > 0:
            chunk = os.pread(fd, min(left, 1 << 20), start)
            if not chunk:
                break
            chunks.append(chunk)
            start += len(chunk)
            left -= len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)


class ProcessManager:
    """The record table and the processes behind it. One lock guards the table; `tick` (the
    monitor) and the API calls may run concurrently."""

    def __init__(
        self,
        state_dir: Path,
        *,
        build: Build,
        gate: Gate,
        event: Event,
        log_max_bytes: int = 8 << 20,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        stable_after_s: float = 30.0,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state_dir, 0o700)
        self._build = build
        self._gate = gate
        self._event = event
        self.log_max_bytes = log_max_bytes
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self._lock = threading.RLock()
        self._records: dict[str, ProcessRecord] = {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._sandboxes: dict[str, dict[str, Any]] = {}  # what held each one's last start
        self._boot_id = boot_id()
        self._numbers: dict[str, int] = {}  # the last number given, per principal
        self._stop_monitor = threading.Event()
        self._monitor: threading.Thread | None = None
        self._ended_groups: list[str] = []
        """Cgroups of sandboxes whose process ended: killed and removed off the lock (`_end_groups`)."""

    # --- persistence -------------------------------------------------------------------------

    def _dir(self, process_id: str) -> Path:
        return self.state_dir / process_id

    def log_path(self, process_id: str) -> Path:
        return self._dir(process_id) / LOG

    def _persist(self, rec: ProcessRecord) -> None:
        self._write_json(rec.id, RECORD, asdict(rec))

    def _write_json(self, process_id: str, name: str, value: Any) -> None:
        """Atomically write `value` as `name` in the process's folder, fsynced."""
        folder = self._dir(process_id)
        tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            data = json.dumps(value, ensure_ascii=False, indent=1, default=str).encode()
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, folder / name)
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _save(self, rec: ProcessRecord) -> None:
        """Persist, logging (not raising) a failure: the table in memory stays the truth."""
        try:
            self._persist(rec)
        except OSError as exc:
            log.warning("process_record_write_failed", process_id=rec.id, error=str(exc))

    def _load_numbers(self) -> None:
        """The last number of each principal: the larger of the file's and the records' (a file
        lost or behind never makes a number be given twice while its record exists)."""
        try:
            fd = os.open(self.state_dir / NUMBERS, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                saved = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            saved = {}
        if isinstance(saved, dict):
            for who, n in saved.items():
                if isinstance(who, str) and isinstance(n, int) and not isinstance(n, bool):
                    self._numbers[who] = max(self._numbers.get(who, 0), n)
        for rec in self._records.values():
            if rec.number is not None:
                self._numbers[rec.principal] = max(self._numbers.get(rec.principal, 0), rec.number)

    def _next_number(self, principal: str) -> int:
        """The principal's next number, on disk before anyone is told it (under the lock)."""
        n = self._numbers.get(principal, 0) + 1
        data = json.dumps({**self._numbers, principal: n}, sort_keys=True).encode()
        tmp = self.state_dir / f"{NUMBERS}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.state_dir / NUMBERS)
        self._numbers[principal] = n
        return n

    def _emit(self, events: _Events) -> None:
        """Record events, with the lock held: no other thread is told of a change (a `get`, a
        `list`, a `wait_for`) before its event is recorded (an audit record, in the gateway)."""
        for name, rec, details in events:
            self._event(name, rec, details)

    # --- spawning ----------------------------------------------------------------------------

    def _spawn(self, rec: ProcessRecord) -> str | None:
        """Start `rec`'s command; fill pid, start_ticks, boot_id, started_at. Returns an error
        message when it cannot start; raises DiskBudgetRefused when its principal's write roots
        hold too much to start anything in.

        The process is held (`agw-init hold`) until its record, with its pid, is on disk: a
        gateway killed in between leaves a process that reads end-of-file and never runs its
        command, never one that runs with no record naming it."""
        try:
            spawn = self._build(rec)
        except DiskBudgetRefused:
            raise
        except Exception as exc:  # e.g. the sandbox is unavailable: no start, and say why
            return f"cannot build the sandbox: {exc}"
        try:  # what it is launched with, on disk before it runs (a start or restart without it does not run)
            self._write_json(rec.id, SANDBOX, {"launched_at": _now_iso(), **spawn.config})
        except OSError as exc:
            spawn.abandon()
            return f"cannot write the sandbox configuration: {exc}"
        try:
            holder = helper.helper_path()
            logfd = os.open(
                self.log_path(rec.id),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
        except (OSError, helper.HelperUnavailable) as exc:
            spawn.abandon()
            return f"cannot open the log: {exc}" if isinstance(exc, OSError) else str(exc)
        hold_r, hold_w = os.pipe()  # both close-on-exec: only this child gets the read end
        try:
            proc = subprocess.Popen(
                [holder, "hold", str(hold_r), "--", *spawn.argv],
                env=spawn.env,
                cwd=spawn.cwd,
                stdin=subprocess.DEVNULL,
                stdout=logfd,
                stderr=logfd,
                start_new_session=True,
                close_fds=True,
                pass_fds=(*spawn.pass_fds, hold_r),
            )
        except BaseException as exc:  # whatever ends the start, nothing made for it is left open
            os.close(hold_w)
            os.close(logfd)
            os.close(hold_r)
            spawn.abandon()
            if not isinstance(exc, OSError):
                raise
            return str(exc)
        os.close(logfd)
        os.close(hold_r)
        # (not its pid: a disk stop with no cgroup would signal that group, which is the hold and
        # bwrap only, while the sandbox's init and command run on in a session of their own,
        # then untracked; the stop of a background process is its cgroup's kill)
        spawn.started()
        st = _stat(proc.pid)
        before = replace(rec)
        rec.pid = proc.pid
        rec.start_ticks = st.start_ticks if st else None
        rec.boot_id = self._boot_id
        rec.started_at = _now_iso()
        rec.ended_at = None
        rec.exit_code = None
        rec.next_restart_at = None
        rec.state = "running"
        rec.cgroup = spawn.cgroup
        try:
            self._persist(rec)
        except OSError as exc:  # no record, no run: the held process is told nothing and ends
            os.close(hold_w)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_WAIT_SECONDS)
            spawn.abandon()
            for f in fields(ProcessRecord):
                setattr(rec, f.name, getattr(before, f.name))
            return f"cannot write the process record: {exc}"
        try:
            os.write(hold_w, b"g")
        finally:
            os.close(hold_w)
        self._children[rec.id] = proc
        self._sandboxes[rec.id] = spawn.summary
        return None

    def _live_count(self, principal: str) -> int:
        return sum(1 for r in self._records.values() if r.principal == principal and r.state in LIVE_STATES)

    # --- the API -----------------------------------------------------------------------------

    def start(
        self,
        principal: str,
        command: str,
        cwd: str,
        env: dict[str, str],
        keep_alive: bool,
        name: str | None,
        max_live: int,
    ) -> dict[str, Any]:
        """Start a durable process. Result fields of the `process` tool's start action."""
        limit_msg = f"{principal} already has {max_live} live processes (the limit): stop one first"
        with self._lock:
            if self._live_count(principal) >= max_live:
                return _error("PROCESS_LIMIT", limit_msg)
            process_id = secrets.token_hex(8)
            while process_id in self._records or self._dir(process_id).exists():
                process_id = secrets.token_hex(8)
        rec = ProcessRecord(
            id=process_id,
            principal=principal,
            name=name,
            command=command,
            cwd=cwd,
            env=dict(env),
            keep_alive=keep_alive,
            desired="running",
            pid=None,
            start_ticks=None,
            boot_id=self._boot_id,
            started_at=None,
            ended_at=None,
            exit_code=None,
            restarts=0,
            next_restart_at=None,
            state="running",
        )
        denial = self._gate(replace(rec), "start")  # outside the lock: it may wait for a human
        if denial is not None:
            return _error("POLICY_DENIED", denial, status="denied")
        with self._lock:
            if self._live_count(principal) >= max_live:  # counted again: another start may have won
                return _error("PROCESS_LIMIT", limit_msg)
            try:  # a number only for a start the gate let through
                rec.number = self._next_number(principal)
            except OSError as exc:
                return _error("SPAWN_FAILED", f"cannot record the process's number: {exc}")
            folder = self._dir(process_id)
            try:
                folder.mkdir(mode=0o700)
                os.chmod(folder, 0o700)
            except OSError as exc:
                return _error("SPAWN_FAILED", f"cannot create the process folder: {exc}")
            try:
                failure = self._spawn(rec)
            except DiskBudgetRefused as exc:
                shutil.rmtree(folder, ignore_errors=True)
                return _error("DISK_BUDGET", f"the process was refused: {exc}")
            if failure is not None:
                shutil.rmtree(folder, ignore_errors=True)
                return _error("SPAWN_FAILED", failure)
            self._records[process_id] = rec  # on disk already (_spawn wrote it before the command could run)
            view = self._view(rec)
            held = self._sandboxes.get(process_id, {})
            self._emit([("process_started", replace(rec), {"pid": rec.pid, **({"sandbox": held} if held else {})})])
        return {"status": "ok", "process": view, **({"sandbox": held} if held else {})}

    def list(self, principal: str) -> dict[str, Any]:
        with self._lock:
            mine = [r for r in self._records.values() if r.principal == principal]
            mine.sort(key=lambda r: (r.started_at or "", r.id))
            return {"status": "ok", "processes": [self._view(r) for r in mine]}

    def _find(self, principal: str, process_id: str) -> ProcessRecord | None:
        """`principal`'s process `process_id`, or named `daemon-N` by its number (the
        principal's own: another principal's number N is never found)."""
        by_number = _BY_NUMBER.fullmatch(process_id)
        if by_number is not None:
            n = int(by_number.group(1))
            return next((r for r in self._records.values() if r.principal == principal and r.number == n), None)
        rec = self._records.get(process_id)
        return rec if rec is not None and rec.principal == principal else None

    def get(self, principal: str, process_id: str) -> dict[str, Any]:
        with self._lock:
            rec = self._find(principal, process_id)
            if rec is None:
                return _not_found(process_id)
            return {"status": "ok", "process": self._view(rec)}

    def output(self, principal: str, process_id: str, max_bytes: int) -> dict[str, Any]:
        """The tail of the log (reaching into the rotated one when the current one is short)."""
        with self._lock:
            rec = self._find(principal, process_id)
            if rec is None:
                return _not_found(process_id)
            state, process_id, number = rec.state, rec.id, rec.number
        data, size = _tail(self.log_path(process_id), max_bytes)
        older, old_size = b"", 0
        if len(data) < max_bytes:
            older, old_size = _tail(self._dir(process_id) / OLD_LOG, max_bytes - len(data))
        text = (older + data).decode("utf-8", "replace")
        return {
            "status": "ok",
            "process_id": process_id,
            "number": number,
            "state": state,
            "output": text,
            "truncated": size + old_size > max_bytes,
        }

    def stop(self, principal: str, process_id: str) -> dict[str, Any]:
        """Stop it for good: desired=stopped, SIGTERM to its group, SIGKILL after the grace."""
        with self._lock:
            rec = self._find(principal, process_id)
            if rec is None:
                return _not_found(process_id)
            was = rec.state
        self._stop_many([rec])  # a failed one is marked stopped too (its restarts end)
        if was not in LIVE_STATES:
            with self._lock:
                out = _error("DAEMON_NOT_RUNNING", f"process {rec.id} is not running (it is {was})")
                return {**out, "process": self._view(rec)}
        with self._lock:
            return {"status": "ok", "process": self._view(rec)}

    def stop_all(self, principal: str) -> dict[str, Any]:
        """Stop every process of `principal` (and nobody else's)."""
        with self._lock:
            mine = [
                r for r in self._records.values() if r.principal == principal and r.state in (*LIVE_STATES, "failed")
            ]
        stopped = self._stop_many(mine)
        with self._lock:
            return {"status": "ok", "stopped": stopped, "processes": [self._view(r) for r in mine]}

    def _stop_many(self, records: _Records) -> _Ids:
        """Signal all of them together; wait; SIGKILL what is left; record. Returns the ids of
        those that were live (running or waiting to restart)."""
        events: _Events = []
        targets: _Targets = []
        was_live: _Ids = []
        with self._lock:
            for rec in records:
                rec.desired = "stopped"
                rec.next_restart_at = None
                if rec.state == "running" and rec.pid is not None:
                    targets.append((rec, self._children.get(rec.id), rec.pid, rec.start_ticks))
                    was_live.append(rec.id)
                elif rec.state in ("backoff", "failed"):
                    if rec.state == "backoff":
                        was_live.append(rec.id)
                    rec.state = "stopped"
                    events.append(("process_stopped", replace(rec), {"was": "not running"}))
                self._save(rec)
            self._emit(events)
            events = []
        self._signal_all(targets, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        left = [t for t in targets if not self._gone(t)]
        while left and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            left = [t for t in left if not self._gone(t)]
        killed = {t[0].id for t in left}
        # SIGKILL what is left, and the group of every child (members that outlived its leader)
        self._signal_all([t for t in targets if t[1] is not None or t in left], signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while left and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            left = [t for t in left if not self._gone(t)]
        reaper.poke()  # the orphaned namespace inits of what we started are ours to reap
        with self._lock:
            for rec, proc, _pid, _ticks in targets:
                if rec.state == "running":
                    code = proc.returncode if proc is not None else None
                    self._finish(rec, code)
                self._children.pop(rec.id, None)
                self._save(rec)
                details = {"exit_code": rec.exit_code, "killed": rec.id in killed}
                if any(t[0] is rec for t in left):
                    details["still_running"] = True
                events.append(("process_stopped", replace(rec), details))
            self._emit(events)
        self._end_groups()
        return was_live

    @staticmethod
    def _signal_all(targets: _Targets, sig: int) -> None:
        for _rec, proc, pid, ticks in targets:
            # our child: its pid stays taken while its group has members, so the group is ours (and
            # pids are handed out cyclically: a just-freed one is not reused within milliseconds)
            if proc is None and not _same_process(pid, ticks):
                continue  # adopted and gone (or the pid now belongs to someone else): never signal
            # the sandbox's PID-namespace init (the helper, bwrap --as-pid-1) and the command run
            # in a session of their own (--new-session), so the group of `pid` is not enough.
            # SIGTERM goes to the command's processes (below the init) and leaves bwrap standing,
            # so the SIGKILL round still finds the init: killing it ends the whole namespace.
            direct = set(proctree.namespace_inits(pid))
            # each pinned by a pidfd and seen still below `pid` before it is signalled (a pid freed
            # after the listing may name another process by then)
            proctree.signal_descendants(pid, sig, spare=frozenset() if sig == signal.SIGKILL else frozenset(direct))
            if sig == signal.SIGKILL or not direct:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)

    @staticmethod
    def _gone(target: _Target) -> bool:
        _rec, proc, pid, ticks = target
        if proc is not None:
            return proc.poll() is not None
        return not _same_process(pid, ticks)

    def wait_for(
        self, principal: str, process_id: str, timeout_s: float, cancel: threading.Event | None = None
    ) -> bool:
        """True when the process is no longer running within `timeout_s` (it exited, or is
        waiting to restart); the wait also ends once `cancel` is set (the process runs on).
        Raises KeyError for an unknown id."""
        deadline = time.monotonic() + timeout_s
        while True:
            if cancel is not None and cancel.is_set():
                deadline = time.monotonic()  # look once more, below, and answer
            with self._lock:
                rec = self._find(principal, process_id)
                if rec is None:
                    raise KeyError(process_id)
                proc = self._children.get(process_id)
                running = rec.state == "running"
            if not running:
                return True
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, min(POLL_SECONDS * 5, deadline - time.monotonic())))
            else:
                time.sleep(POLL_SECONDS)
            self._reap([process_id])
            if time.monotonic() >= deadline:
                with self._lock:
                    return rec.state != "running"

    # --- the monitor -------------------------------------------------------------------------

    def _finish(self, rec: ProcessRecord, exit_code: int | None) -> dict[str, Any]:
        """Record an exit (the lock is held). Returns the details of the exit event. Its sandbox's
        cgroup is killed once the lock is released (`_end_groups`)."""
        if rec.cgroup is not None:
            self._ended_groups.append(rec.cgroup)
        rec.ended_at = _now_iso()
        rec.exit_code = exit_code
        self._children.pop(rec.id, None)
        details: dict[str, Any] = {"exit_code": exit_code, "pid": rec.pid}
        if rec.desired == "stopped":
            rec.state = "stopped"
        elif rec.keep_alive:
            if _age_seconds(rec.started_at) >= self.stable_after_s:
                rec.failures = 0
            delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(rec.failures, 62))
            rec.failures += 1
            rec.state = "backoff"
            rec.next_restart_at = time.time() + delay
            details["restart_in_s"] = delay
        else:
            rec.state = "exited"
        return details

    def _end_groups(self) -> None:
        """Kill what is left in the cgroups of processes that ended and remove the groups, off the
        lock (a kill waits for its group to empty). A group already gone costs nothing."""
        with self._lock:
            names, self._ended_groups = self._ended_groups, []
        for name in names:
            try:
                quotas.end_group(name)
            except (OSError, ValueError) as exc:
                log.warning("process_cgroup_not_ended", cgroup=name, error=str(exc))

    def _reap(self, ids: _Ids | None = None) -> _Events:
        """Notice exits among running processes; emits their events."""
        events: _Events = []
        with self._lock:
            for rec in list(self._records.values()):
                if rec.state != "running" or (ids is not None and rec.id not in ids):
                    continue
                proc = self._children.get(rec.id)
                if proc is not None:
                    code = proc.poll()
                    if code is None:
                        continue
                    exit_code: int | None = code
                elif _same_process(rec.pid, rec.start_ticks):
                    continue
                else:
                    exit_code = None  # adopted: not our child, its status is not ours to read
                stopping = rec.desired == "stopped"
                details = self._finish(rec, exit_code)
                self._save(rec)
                if not stopping:  # a stop reports its own event
                    events.append(("process_exited", replace(rec), details))
            self._load_numbers()
            self._emit(events)
        self._end_groups()
        return events

    def _restart_due(self) -> None:
        now = time.time()
        with self._lock:
            due = [
                replace(r)
                for r in self._records.values()
                if r.state == "backoff" and r.desired == "running" and (r.next_restart_at or 0.0) <= now
            ]
        for snapshot in due:
            denial = self._gate(snapshot, "restart")  # the policy may have changed since the start
            events: _Events = []
            with self._lock:
                rec = self._records.get(snapshot.id)
                if rec is None or rec.state != "backoff" or rec.desired != "running":
                    continue  # stopped meanwhile
                if denial is not None:
                    rec.state = "failed"
                    rec.next_restart_at = None
                    events.append(("process_restart_denied", replace(rec), {"message": denial}))
                else:
                    try:
                        failure = self._spawn(rec)
                    except DiskBudgetRefused as exc:
                        failure = f"its principal's disk budget refused it: {exc}"
                    if failure is None:
                        rec.restarts += 1
                        held = self._sandboxes.get(rec.id, {})
                        details = {"pid": rec.pid, "restarts": rec.restarts, **({"sandbox": held} if held else {})}
                        events.append(("process_restarted", replace(rec), details))
                    else:
                        delay = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(rec.failures, 62))
                        rec.failures += 1
                        rec.next_restart_at = time.time() + delay
                        events.append(
                            ("process_spawn_failed", replace(rec), {"message": failure, "restart_in_s": delay})
                        )
                self._save(rec)
                self._emit(events)

    def _rotate_logs(self) -> None:
        with self._lock:
            ids = [r.id for r in self._records.values()]
        for process_id in ids:
            path = self.log_path(process_id)
            try:
                if os.lstat(path).st_size <= self.log_max_bytes:
                    continue
                # copy-truncate: the process writes with O_APPEND, so it goes on at the new end
                tmp = path.with_name(f".{OLD_LOG}.tmp")
                with open(path, "rb") as src:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                    with os.fdopen(fd, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(tmp, path.with_name(OLD_LOG))
                os.truncate(path, 0)
            except OSError as exc:
                if not isinstance(exc, FileNotFoundError):
                    log.warning("process_log_rotation_failed", process_id=process_id, error=str(exc))

    def tick(self) -> None:
        """One monitor pass: reap exits, restart what is due (asking the gate), rotate logs."""
        self._reap()
        self._restart_due()
        self._rotate_logs()

    def start_monitor(self, interval_s: float = 0.5) -> None:
        if self._monitor is not None and self._monitor.is_alive():
            return
        self._stop_monitor.clear()

        def loop() -> None:
            while not self._stop_monitor.is_set():
                try:
                    self.tick()
                except Exception as exc:  # the monitor must outlive a failing hook
                    log.error("process_monitor_failed", error=repr(exc))
                self._stop_monitor.wait(interval_s)

        self._monitor = threading.Thread(target=loop, name="process-monitor", daemon=True)
        self._monitor.start()

    def close(self) -> None:
        """Stop the monitor. The processes keep running: they outlive the gateway by design."""
        self._stop_monitor.set()
        if self._monitor is not None:
            self._monitor.join(timeout=10)
            self._monitor = None

    # --- rehydration -------------------------------------------------------------------------

    def rehydrate(self) -> None:
        """Load every record (on gateway start): adopt what still runs, mark the rest."""
        events: _Events = []
        try:
            folders = sorted(self.state_dir.iterdir())
        except OSError as exc:
            log.error("process_state_unreadable", path=str(self.state_dir), error=str(exc))
            return
        with self._lock:
            for folder in folders:
                if folder.name.startswith(".") or folder.name in self._records:
                    continue
                interrupted = self._interrupted_start(folder)
                if interrupted is None:
                    continue  # no record yet, made moments ago: a start under way; the next load decides
                if interrupted:
                    shutil.rmtree(folder, ignore_errors=True)
                    events.append(("process_start_interrupted", _stub(folder.name), {
                        "path": str(folder),
                        "reason": "a gateway stopped before this start's record was written; the command "
                        "never ran (it waits for its record), so the folder was removed",
                    }))  # fmt: skip
                    continue
                try:
                    if not folder.is_dir() or folder.is_symlink():
                        raise ValueError("not a directory")
                    rec = _parse_record(json.loads((folder / RECORD).read_bytes()))
                    if rec.id != folder.name:
                        raise ValueError("the record's id is not its folder's name")
                except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
                    stub = _stub(folder.name)
                    events.append(("process_record_corrupt", stub, {"path": str(folder), "error": str(exc)}))
                    continue
                self._records[rec.id] = rec
                ended = rec.state not in LIVE_STATES or rec.state == "backoff"
                if ended and rec.cgroup is not None and rec.boot_id == self._boot_id:  # nothing of it may run
                    self._ended_groups.append(rec.cgroup)
                if rec.state not in LIVE_STATES:
                    continue
                if rec.boot_id != self._boot_id:
                    rec.state = "lost"
                    rec.pid = None
                    rec.start_ticks = None
                    rec.next_restart_at = None
                    self._save(rec)
                    events.append(("process_cleared", replace(rec), {"reason": "started before the last boot"}))
                elif rec.state == "backoff":
                    continue  # its restart stays scheduled
                elif _same_process(rec.pid, rec.start_ticks):
                    events.append(("process_adopted", replace(rec), {"pid": rec.pid}))
                else:
                    details = self._finish(rec, None)
                    details["reason"] = "exited while the gateway was down"
                    self._save(rec)
                    events.append(("process_exited", replace(rec), details))
            self._load_numbers()
            self._emit(events)
        self._end_groups()

    @staticmethod
    def _interrupted_start(folder: Path) -> bool | None:
        """True: a process folder with no record, settled for START_SETTLE_S: what a gateway
        killed between making the folder and writing the record leaves. Its command was held
        until the record existed, so it never ran. None: no record but younger (maybe a start
        under way). False: anything else (a record, readable or not: loaded or reported)."""
        try:
            st = folder.lstat()
            if not stat.S_ISDIR(st.st_mode) or (folder / RECORD).exists() or (folder / RECORD).is_symlink():
                return False
        except OSError:
            return False
        return True if time.time() - st.st_mtime >= START_SETTLE_S else None

    # --- views -------------------------------------------------------------------------------

    def _view(self, rec: ProcessRecord) -> dict[str, Any]:
        """What the agent sees (the env's names only: values may be secrets), with the absolute
        path of its log."""
        return {
            "id": rec.id,
            "number": rec.number,
            "name": rec.name,
            "command": rec.command,
            "cwd": rec.cwd,
            "env_names": sorted(rec.env),
            "keep_alive": rec.keep_alive,
            "state": rec.state,
            "desired": rec.desired,
            "pid": rec.pid,
            "started_at": rec.started_at,
            "ended_at": rec.ended_at,
            "exit_code": rec.exit_code,
            "restarts": rec.restarts,
            "next_restart_at": rec.next_restart_at,
            "log_path": str(self.log_path(rec.id)),
        }


def _stub(process_id: str) -> ProcessRecord:
    """A record for an event about a folder whose own record is missing or unreadable."""
    return ProcessRecord(
        id=process_id,
        principal="",
        name=None,
        command="",
        cwd="",
        env={},
        keep_alive=False,
        desired="stopped",
        pid=None,
        start_ticks=None,
        boot_id="",
        started_at=None,
        ended_at=None,
        exit_code=None,
        restarts=0,
        next_restart_at=None,
        state="lost",
    )
