"""Stop bubblewrap's monitor at the exact moment it has cloned the sandbox's first process, before
it lets that process go on: the window in which the death of the gateway used to leave a
sandbox behind (bwrap's first process waits for its monitor's go on an eventfd, and has no
parent-death signal armed yet; a monitor killed there leaves it waiting for ever).

`Tracer(pid)` traces every thread of a gateway process (`PTRACE_SEIZE`) and,
through fork/vfork/clone events, everything it starts: the helper in front of bwrap, bwrap. Each
tracee runs on at once (its signals delivered as they come) until a bwrap process with a given
marker on its command line reports the fork of a process in new namespaces
(`hold_monitor_at_clone`). That bwrap stays stopped in its fork event, still traced;
every other tracee is let go (the new first process too: it runs into its wait for the go).
The caller then kills the gateway, and `wait_gone` waits for the held monitor to die.

The test process must be allowed to trace the gateway (root, or its parent under Yama's
default scope); the held monitor drops privileges and changes uid, which a root tracer follows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import eventually

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_GETEVENTMSG = 0x4201
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
OPTIONS = 0x2 | 0x4 | 0x8 | 0x10  # PTRACE_O_TRACEFORK | TRACEVFORK | TRACECLONE | TRACEEXEC
EVENT_FORK, EVENT_VFORK, EVENT_CLONE, EVENT_EXEC, EVENT_STOP = 1, 2, 3, 4, 128
WALL = 0x40000000  # __WALL: threads and clone children too
STOPS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> int:
    got = int(_libc.ptrace(request, tid, ctypes.c_void_p(addr), ctypes.c_void_p(data)))
    if got == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")
    return got


def _event_message(tid: int) -> int:
    msg = ctypes.c_ulong(0)
    if _libc.ptrace(PTRACE_GETEVENTMSG, tid, None, ctypes.byref(msg)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"PTRACE_GETEVENTMSG {tid}: {os.strerror(err)}")
    return msg.value


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _holds(pid: int, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _in_new_namespace(child: int, parent: int) -> bool:
    try:
        return os.readlink(f"/proc/{child}/ns/pid") != os.readlink(f"/proc/{parent}/ns/pid")
    except OSError:
        return False


@dataclass
class Held:
    monitor: int
    """bwrap's monitor, stopped in its fork event (still traced)."""
    first: int
    """The sandbox's first process (the new PID namespace's init), running, untraced."""
    events: list[str] = field(default_factory=list)
    """What the tracees did on the way (for a failure's message)."""


class Tracer:
    """Traces every thread of `pid` from now on, and what they start (see above)."""

    def __init__(self, pid: int) -> None:
        self.traced: set[int] = set()
        self.events: list[str] = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                _ptrace(PTRACE_SEIZE, int(task), 0, OPTIONS)
                self.traced.add(int(task))

    def hold_monitor_at_clone(self, marker: str, bound_s: float = 120.0) -> Held:
        """Let the tracees run until a bwrap whose command line holds `marker` clones into new
        namespaces, and hold it there; every other tracee is let go. Raises TimeoutError when
        none did within `bound_s` (a bound on a loaded machine, never a measurement)."""
        deadline = time.monotonic() + bound_s
        while True:
            if time.monotonic() > deadline:
                self._let_go()
                raise TimeoutError(f"no bwrap cloned its sandbox within {bound_s} s: {self.events[-20:]}")
            tid, status = os.waitpid(-1, os.WNOHANG | WALL)
            if tid == 0:
                time.sleep(0.0005)
                continue
            if not os.WIFSTOPPED(status):
                self.traced.discard(tid)
                continue
            self.traced.add(tid)
            sig, event = os.WSTOPSIG(status), status >> 16
            if event in (EVENT_FORK, EVENT_VFORK, EVENT_CLONE):
                new = _event_message(tid)
                self.traced.add(new)
                exe = os.path.basename(_exe(tid))
                self.events.append(f"{tid} ({exe}) event {event}: {new}")
                if event == EVENT_FORK and exe == "bwrap" and _holds(tid, marker) and _in_new_namespace(new, tid):
                    self.traced.discard(tid)  # stays stopped in its fork event, traced
                    self._let_go()
                    return Held(tid, new, self.events)
                _ptrace(PTRACE_CONT, tid)
            elif event or sig == signal.SIGTRAP:
                _ptrace(PTRACE_CONT, tid)  # an exec, a new tracee's first stop, a group stop
            else:
                _ptrace(PTRACE_CONT, tid, 0, sig)  # a signal on its way: delivered

    def _let_go(self) -> None:
        """Detach every tracee: each is stopped first (a tracee is detached only in a stop), a
        signal that stopped it is passed on, and a child it forked meanwhile is let go too."""
        left = set(self.traced)
        for tid in sorted(left):
            with contextlib.suppress(ProcessLookupError):
                _ptrace(PTRACE_INTERRUPT, tid)
        deadline = time.monotonic() + 60.0
        while left and time.monotonic() < deadline:
            for tid in sorted(left):
                try:
                    got, status = os.waitpid(tid, os.WNOHANG | WALL)
                except ChildProcessError:
                    left.discard(tid)
                    continue
                if got == 0:
                    continue
                left.discard(tid)
                if not os.WIFSTOPPED(status):
                    continue
                sig, event = os.WSTOPSIG(status), status >> 16
                if event in (EVENT_FORK, EVENT_VFORK, EVENT_CLONE):
                    left.add(_event_message(tid))  # its new child starts traced: let it go too
                passed = 0 if event or sig == signal.SIGTRAP or sig in STOPS else sig
                with contextlib.suppress(ProcessLookupError):
                    _ptrace(PTRACE_DETACH, tid, 0, passed)
            time.sleep(0.0005)
        self.traced.clear()


def wait_gone(pid: int, bound_s: float = 120.0) -> bool:
    """Wait for a held (traced) process to end; whether it did within `bound_s`. A process
    killed while held ends at once: SIGKILL needs no tracer's leave."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            got, status = os.waitpid(pid, os.WNOHANG | WALL)
        except ChildProcessError:
            return True
        if got and not os.WIFSTOPPED(status):
            return True
        time.sleep(0.001)
    return False


def release(pid: int) -> None:
    """Let a held process go on (a test that ends without it killed)."""
    with contextlib.suppress(OSError):
        _ptrace(PTRACE_DETACH, pid)


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: it waits only to be collected)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def held_until_given_up(script: str, marker: str, bound_s: float = 120.0) -> tuple[str, bool]:
    """Run `python -c script`, which reads a line from stdin and then starts a bwrap whose
    command line holds `marker` and gives up on it after a time limit of its own. That bwrap's
    monitor is held at its clone until the script gives up on it. Returns what the script
    printed, and whether bwrap's first process had ended 10 s later (a settle, not a measure: it
    ends as a group's SIGKILL lands). Raises AssertionError naming what never happened."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    held = None
    try:
        tracer = Tracer(proc.pid)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        held = hold = tracer.hold_monitor_at_clone(marker, bound_s)
        # its end goes to us first (we trace it): the script's wait for it returns only after this
        assert wait_gone(hold.monitor, bound_s), "the script never gave up on the held bwrap"
        try:
            out = proc.communicate(timeout=bound_s)[0]
        except subprocess.TimeoutExpired:  # a bound: the script reads bwrap's output to its end
            raise AssertionError("the script never returned after giving up on its bwrap") from None
        return out, bool(eventually(lambda: not running(hold.first), seconds=10.0))
    finally:
        proc.kill()
        proc.wait(30)
        if held is not None:
            release(held.monitor)
            with contextlib.suppress(ProcessLookupError):
                os.kill(held.first, signal.SIGKILL)
