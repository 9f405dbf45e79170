"""The disk budget: what a principal's write roots may hold together (`limits.disk_bytes`).

No filesystem here enforces it for us (project quotas need a kernel built with CONFIG_QUOTA and
a filesystem mounted with them: `project_quotas()` says whether a write root has them, for
`gateway doctor`), so the gateway watches instead:

- **What counts.** A write root's usage is the disk blocks of every file, directory and link
  beneath it (st_blocks, so a sparse file counts what it really holds), each at least
  `MIN_ENTRY_BYTES` (an inode and its directory entry cost the filesystem too: a million empty
  files are not free), a file with several names once. Counted by descriptor: each directory
  opened beneath its parent's descriptor with O_NOFOLLOW (a symlink the agent plants is counted
  as a link, never followed), never leaving the root's filesystem.
- **Bounded work.** A count stops as soon as it passes what it is compared with, so it never
  walks more than the budget's worth of entries; a tree deeper than `MAX_DEPTH` counts as over.
- **When.** One thread (`watch()`) looks at the free space of each watched root's filesystem
  every `POLL_S` (one statvfs: cheap). The roots' usage can only have grown by what the
  filesystem as a whole took since they were last counted, so they are counted again only when
  that could take them past the budget (when a sandbox starts, while it runs, when it ends),
  and every `RESCAN_S` besides while a sandbox runs longer than that (another writer's
  deletions could hide growth). A command's sandbox that takes the principal past its
  budget is stopped (its cgroup killed, else its process group: `Launch.stop_for_disk`), and
  the call fails with DISK_BUDGET.
- **Away from the interpreter lock.** The counts the watch makes while sandboxes run are made
  in a process of its own (disk_counter.py): in the gateway, each entry's system call waits for
  the lock behind every other busy thread, and a count of a few thousand entries took seconds
  while the sandbox it was to stop kept writing. The first budgeted sandbox of a gateway
  process waits until that process is ready (once, about 0.4 s); should it die, it is started
  again and the count is made here meanwhile (slower, never wrong).
- **Already over.** A sandbox that starts while its principal is over the budget may not add
  anything: its own limit is what the roots held when it started (so `rm` works, `dd` does not).
  Roots over twice the budget are not counted to the end: every sandbox is stopped at once.

What a watch cannot stop is what the sandbox writes before it is looked at (a poll, then a
count: tens of MB at a few hundred MB/s): the sandbox refuses fallocate(2) (agw_init.c), the
one way to take gigabytes at once, so space is only taken as fast as data is written.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gateway import fdwait
from gateway.log import log
from gateway.sandbox import descriptors

MIN_ENTRY_BYTES = 4096
"""What each file, directory or link counts at least (a filesystem's block, and its inode)."""
MAX_DEPTH = 512
"""Directories nested deeper than this are not walked: a tree that deep counts as over budget."""
POLL_S = 0.01
"""How often a watched root's filesystem is looked at (statvfs) while a sandbox runs."""
ALIVE_S = 1.0
"""How often the watch asks whether a sandbox nobody ends its watch of (a durable process's) still runs."""
RESCAN_S = 5.0
"""A watched tree is counted at least this often (more rarely when counting it is slow)."""
COUNTER_READY_S = 30.0
"""How long the first budgeted sandbox of a gateway process waits for the counting process to be
ready (once; about 0.4 s). Only a bound: past it, counts are made in the gateway meanwhile."""
RESTOP_BYTES = 1 << 20
"""A stopped sandbox is stopped again whenever its roots' filesystems take this much more after
its stop: a stop that came before the sandbox's processes joined the cgroup it kills missed
them, and they would otherwise run on unwatched (a stopped ticket is not looked at again)."""
SCAN_SHARE = 0.2
"""At most this share of one core goes to the counts made besides (every RESCAN_S): a count that
took t waits t / SCAN_SHARE. A count the free space calls for is made at once (it stops at the
budget, so its work is bounded by the budget's worth of entries)."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TooDeep(Exception):
    """A tree nested deeper than MAX_DEPTH: it cannot be counted in bounded work."""


@dataclass(frozen=True)
class Usage:
    bytes: int
    """What the roots hold (or, when `partial`, at least this: the count stopped early)."""
    entries: int
    partial: bool


def usage(roots: tuple[str, ...], stop_above: int | None = None) -> Usage:
    """The disk usage of `roots` together (see the module's docstring): each inode once, however
    many names or roots reach it. Stops once past `stop_above`. A root that does not exist holds
    nothing. Raises TooDeep, OSError (a root that cannot be opened safely)."""
    seen: set[tuple[int, int]] = set()
    total = entries = 0
    for root in roots:
        try:
            top = descriptors.open_absolute(root)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                continue
            raise
        try:
            st = os.fstat(top.fd)
            if not stat.S_ISDIR(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += _cost(st)
            entries += 1
            stack: list[tuple[int, int]] = [(os.open(".", _DIR_FLAGS, dir_fd=top.fd), 0)]
            try:
                while stack:
                    fd, depth = stack.pop()
                    try:
                        for entry in _entries(fd):
                            name = entry.name
                            try:
                                est = entry.stat(follow_symlinks=False)  # (fstatat beneath fd)
                            except FileNotFoundError:
                                continue  # removed while we counted
                            entries += 1
                            if est.st_nlink > 1 and not stat.S_ISDIR(est.st_mode):
                                key = (est.st_dev, est.st_ino)
                                if key in seen:
                                    continue
                                seen.add(key)
                            total += _cost(est)
                            if stop_above is not None and total > stop_above:
                                return Usage(total, entries, True)
                            if stat.S_ISDIR(est.st_mode) and est.st_dev == st.st_dev:
                                if depth + 1 > MAX_DEPTH:
                                    raise TooDeep(f"{root} nests directories more than {MAX_DEPTH} deep")
                                sub = _open_dir(fd, name)
                                if sub is not None:
                                    stack.append((sub, depth + 1))
                    finally:
                        os.close(fd)
            finally:
                for fd, _ in stack:
                    os.close(fd)
        finally:
            os.close(top.fd)
    return Usage(total, entries, False)


def _cost(st: os.stat_result) -> int:
    return max(st.st_blocks * 512, MIN_ENTRY_BYTES)


def _entries(fd: int) -> Iterator[os.DirEntry[str]]:
    """The entries of the directory open at `fd`, as they are read (a count that stops early
    does not list the rest of a huge directory). scandir reads through a copy of `fd`."""
    try:
        with os.scandir(fd) as it:
            yield from it
    except (FileNotFoundError, NotADirectoryError):
        return


def _open_dir(parent: int, name: str) -> int | None:
    """`name` beneath `parent`, as a directory, never through a link (None: gone, or replaced
    by something else since it was listed)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None  # a link now: counted as one already, or not at all
        raise


def _used(dev_fd: int) -> int:
    """What the filesystem of `dev_fd` has in use, as `usage` would count it at most: the bytes
    statvfs says are not free, and MIN_ENTRY_BYTES for each inode in use (an empty file takes
    no block, and on tmpfs no inode is a block either)."""
    sv = os.fstatvfs(dev_fd)
    return (sv.f_blocks - sv.f_bfree) * sv.f_frsize + max(0, sv.f_files - sv.f_ffree) * MIN_ENTRY_BYTES


# --- the watch ----------------------------------------------------------------------------------


@dataclass
class _Tree:
    """One principal's write roots: when they were last counted, and how full their
    filesystems were then."""

    roots: tuple[str, ...]
    counted: int = -1  # -1: never counted
    counted_at: float = 0.0
    scan_s: float = 0.0
    used_then: dict[int, int] = field(default_factory=dict)  # st_dev -> bytes used on it
    devices: dict[int, int] = field(default_factory=dict)  # st_dev -> a descriptor of a root on it
    tickets: list[Ticket] = field(default_factory=list)
    tripped: str = ""  # set when a count failed (TooDeep, ...): every ticket then trips
    partial: bool = False  # the last count stopped early: `counted` is a lower bound
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self) -> None:
        for root in self.roots:
            try:
                o = descriptors.open_absolute(root)
            except OSError:
                continue
            if o.dev in self.devices:
                os.close(o.fd)
            else:
                self.devices[o.dev] = o.fd

    def close(self) -> None:
        for fd in self.devices.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.devices.clear()

    def used_now(self) -> dict[int, int]:
        out = {}
        for dev, fd in self.devices.items():
            with contextlib.suppress(OSError):
                out[dev] = _used(fd)
        return out

    def at_most(self, now: dict[int, int]) -> int | None:
        """What the roots can hold now at most, from what they held when counted and what their
        filesystems took since (None: not counted yet)."""
        if self.counted < 0:
            return None
        grown = sum(max(0, used - self.used_then.get(dev, used)) for dev, used in now.items())
        return self.counted + grown

    def count(self, stop_above: int, away: _Counter | None = None) -> int:
        """Count the roots now (stopping past `stop_above`), in `away`'s process when it is
        ready. Failures count as over."""
        before = self.used_now()
        started = time.monotonic()
        self.tripped = ""
        try:
            found = away.usage(self.roots, stop_above) if away is not None else None
            if found is None:
                found = usage(self.roots, stop_above)
        except (TooDeep, OSError) as exc:
            self.tripped = f"its write roots cannot be counted: {exc}"
            found = Usage(stop_above + 1, 0, True)
        self.scan_s = time.monotonic() - started
        self.counted_at = time.monotonic()
        self.counted = found.bytes
        self.partial = found.partial
        self.used_then = before  # (taken before the walk: what was written during it shows as growth)
        return found.bytes


class _Counter:
    """`usage()` in a process of its own (disk_counter.py), one count at a time. `usage()`
    answers None while that process is not ready yet, or when it failed (it is then started
    again): the caller counts in this process instead, which is slower, never wrong."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False

    def start(self, wait_s: float = 0.0) -> None:
        """Start the process if it is not running, and wait up to `wait_s` until it is ready."""
        with self._lock:
            if self._proc is None:
                self._spawn()
            proc = self._proc
            if self._ready or proc is None or proc.stdout is None:
                return
            if not fdwait.readable(proc.stdout.fileno(), wait_s):
                return  # (counted here meanwhile)
            if proc.stdout.readline() == b"ready\n":
                self._ready = True
            else:
                self._failed()

    def _spawn(self) -> None:
        self._ready = False
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.sandbox.disk_counter"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            log.warning("disk_counter_unavailable", error=str(exc))
            self._proc = None

    def usage(self, roots: tuple[str, ...], stop_above: int | None) -> Usage | None:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None or proc.stdout is None:
                return None
            if not self._ready:
                if not fdwait.readable(proc.stdout.fileno(), 0):
                    return None  # still starting
                if proc.stdout.readline() != b"ready\n":
                    self._failed()
                    return None
                self._ready = True
            try:
                proc.stdin.write(json.dumps({"roots": list(roots), "stop_above": stop_above}).encode() + b"\n")
                proc.stdin.flush()
                got = json.loads(proc.stdout.readline() or b"null")
            except (OSError, ValueError):
                got = None
            if not isinstance(got, dict):
                self._failed()
                return None
        if "too_deep" in got:
            raise TooDeep(str(got["too_deep"]))
        if "errno" in got:
            raise OSError(int(got["errno"]), str(got["message"]))
        return Usage(int(got["bytes"]), int(got["entries"]), bool(got["partial"]))

    def _failed(self) -> None:
        """The process died or spoke out of turn: end it, and start another (lock held)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            log.warning("disk_counter_failed", exit=proc.poll())
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(5)
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(Exception):
                    stream.close()  # type: ignore[union-attr]
        self._spawn()


class Ticket:
    """One sandbox under a principal's budget. `tripped` is set (the message of the call's
    error) once the watch stopped it, or when `Watch.end` finds the roots over its limit."""

    def __init__(
        self, tree: _Tree, budget: int, source: str, limit: int, stop: Callable[[], None],
        alive: Callable[[], bool] | None = None,
    ) -> None:  # fmt: skip
        self.tree = tree
        self.alive = alive
        """For a sandbox nobody ends the watch of (a durable process's): whether it still runs."""
        self.ended: Callable[[], None] | None = None
        """Called once the watch found, through `alive`, that it ended (its launch lets go of
        what it held for it)."""
        self.budget = budget
        self.source = source
        self.limit = limit
        """The most the roots may hold while it runs: the budget, or what they held at its start."""
        self.stop = stop
        self.tripped: str | None = None
        self.stopped = False
        """The watch stopped the sandbox (else it ended on its own, over the budget)."""
        self.used_at_stop: dict[int, int] = {}
        """What its roots' filesystems held when it was (last) stopped: growth past that by
        RESTOP_BYTES means something of it may still write, and it is stopped again."""
        self.since = time.monotonic()

    def trip(self, found: int, stop: bool = True, starting: bool = False) -> None:
        """Set why the call fails (`found`: what the count found) and, with `stop`, stop the
        sandbox. `starting`: the roots were counted before it ran (a count that stops at twice
        the budget: past that, how much they hold is not known). A sandbox caught running says
        what its roots held, however far past the budget it got."""
        if self.tripped is not None:
            return
        budget = f"the disk budget of {_size(self.budget)} ({self.source})"
        if self.tree.tripped:
            self.tripped = f"{self.tree.tripped}; they are held to {budget}"
        elif starting and found > 2 * self.budget:
            self.tripped = f"the write roots hold more than twice {budget}: free space in them, or ask for a larger one"
        else:
            held = f"more than {_size(found)}" if self.tree.partial else _size(found)
            self.tripped = f"the write roots hold {held}, past {budget}"
            if self.limit > self.budget:
                self.tripped += f" (they held {_size(self.limit)} when it started: nothing more may be added)"
        if stop:
            self.stopped = True
            self.stop_again(self.tree.used_now())

    def stop_again(self, used: dict[int, int]) -> None:
        self.used_at_stop = used
        with contextlib.suppress(Exception):  # stopping must not kill the watch
            self.stop()

    def still_writing(self, used: dict[int, int]) -> bool:
        """Stopped, and its roots' filesystems took RESTOP_BYTES more since (than at the stop,
        or than the least they held since: what others freed does not hide what it writes)."""
        if not self.stopped:
            return False
        for dev, n in used.items():
            if n < self.used_at_stop.get(dev, n):
                self.used_at_stop[dev] = n
        return any(n - self.used_at_stop.get(dev, n) >= RESTOP_BYTES for dev, n in used.items())


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


class Watch:
    """The one thread that watches every running sandbox's budget (`watch()`). Each tree is
    counted under its own lock: a slow count holds up only the calls of the same roots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the trees, and whether any has a sandbox running
        self._wake = threading.Condition(self._lock)
        self._trees: dict[tuple[str, ...], _Tree] = {}
        self._thread: threading.Thread | None = None
        self._counter = _Counter()

    def start(
        self, roots: tuple[str, ...], budget: int, source: str, stop: Callable[[], None],
        alive: Callable[[], bool] | None = None,
    ) -> Ticket:  # fmt: skip
        """Watch a sandbox about to run under `budget` for `roots`; `stop()` ends it when they
        pass it. Counts the roots first if they may be over it already (the ticket's limit is
        then what they hold, up to twice the budget; more is refused). End with `end()`, or
        give `alive`: the watch ends once it says the sandbox has ended."""
        self._counter.start(wait_s=COUNTER_READY_S)  # before it runs: its first counts are made there
        key = tuple(sorted(set(roots)))
        with self._lock:
            tree = self._trees.get(key)
            if tree is None:
                tree = self._trees[key] = _Tree(key)
        with tree.lock:
            if not tree.devices:
                tree.open()
            bound = tree.at_most(tree.used_now())
            found = limit = budget
            if bound is None or bound > budget:  # maybe over already: count (at most twice the budget)
                found = tree.count(2 * budget)
                limit = max(budget, found) if found <= 2 * budget and not tree.tripped else budget
            ticket = Ticket(tree, budget, source, limit, stop, alive)
            if tree.tripped or found > limit:
                ticket.trip(found, starting=True)  # (its launch stops it once it has a process: Launch.started)
            tree.tickets.append(ticket)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="disk-budget", daemon=True)
                self._thread.start()
            self._wake.notify()
        return ticket

    def check(self, roots: tuple[str, ...], budget: int, source: str, adding: int) -> str | None:
        """For a write the gateway makes itself (the files tool), before it: why adding `adding`
        bytes would take `roots` past `budget` (None: it would not)."""
        key = tuple(sorted(set(roots)))
        with self._lock:
            tree = self._trees.get(key)
            if tree is None:
                tree = self._trees[key] = _Tree(key)
        with tree.lock:
            opened = not tree.devices
            if opened:
                tree.open()
            try:
                bound = tree.at_most(tree.used_now())
                if bound is not None and bound + adding <= budget:
                    return None
                found = tree.count(budget)
            finally:
                if opened and not tree.tickets:
                    tree.close()
            if not tree.tripped and found + adding <= budget:
                return None
            held = f"more than {_size(found)}" if tree.partial else _size(found)
            why = tree.tripped or f"the write roots hold {held}"
            return f"{why}: {_size(adding)} more would pass the disk budget of {_size(budget)} ({source})"

    def end(self, ticket: Ticket) -> str | None:
        """The sandbox has ended: stop watching it. Returns why the call fails (None: it stayed
        within the budget): it was stopped, or its roots are over its limit now (a command that
        wrote past it between two polls and ended)."""
        tree = ticket.tree
        with tree.lock:
            if ticket.tripped is None:
                bound = tree.at_most(tree.used_now())
                if bound is None or bound > ticket.limit:
                    found = tree.count(ticket.limit)
                    if found > ticket.limit or tree.tripped:
                        ticket.trip(found, stop=False)  # it ended on its own: nothing to stop
            with contextlib.suppress(ValueError):
                tree.tickets.remove(ticket)
            if not tree.tickets:
                tree.close()  # (its count is kept: the next sandbox of these roots starts from it)
        return ticket.tripped or None

    def _loop(self) -> None:
        looked_alive = time.monotonic()
        while True:
            with self._lock:
                while not any(t.tickets for t in self._trees.values()):
                    self._wake.wait(1.0)
                trees = [t for t in self._trees.values() if t.tickets]
            ended = time.monotonic() - looked_alive >= ALIVE_S
            if ended:
                looked_alive = time.monotonic()
            for tree in trees:
                with tree.lock, contextlib.suppress(Exception):  # the watch itself never dies
                    if ended:
                        self._drop_ended(tree)
                    self._look(tree, self._counter)
            time.sleep(POLL_S)

    @staticmethod
    def _drop_ended(tree: _Tree) -> None:
        for ticket in [t for t in tree.tickets if t.alive is not None and not t.alive()]:
            tree.tickets.remove(ticket)
            if ticket.ended is not None:
                with contextlib.suppress(Exception):
                    ticket.ended()
        if not tree.tickets:
            tree.close()

    @staticmethod
    def _look(tree: _Tree, away: _Counter) -> None:
        now = tree.used_now()
        for ticket in tree.tickets:
            if ticket.still_writing(now):  # its stop missed something: a process not in its cgroup yet
                ticket.stop_again(now)
        running = [t for t in tree.tickets if t.tripped is None]
        if not running:
            return
        since = time.monotonic() - tree.counted_at
        bound = tree.at_most(now)
        if bound is not None and bound <= min(t.limit for t in running):
            # their filesystems did not take enough to put them past any limit. Counted again,
            # besides, every RESCAN_S while a sandbox runs that long (deletions elsewhere on the
            # filesystem could hide what it wrote), and never more than SCAN_SHARE of the time;
            # a short call is counted at its end
            oldest = time.monotonic() - min(t.since for t in running)
            if since < max(RESCAN_S, tree.scan_s / SCAN_SHARE) or oldest < RESCAN_S:
                return
        found = tree.count(max(t.limit for t in running), away)
        for ticket in running:
            if found > ticket.limit or tree.tripped:
                ticket.trip(found)


_WATCH = Watch()


def watch() -> Watch:
    return _WATCH


# --- project quotas (for doctor) ----------------------------------------------------------------

_QUOTACTL_FD = 443  # quotactl_fd(2), Linux 5.14 (x86_64 and the generic table alike)
_Q_GETINFO = 0x800005
_PRJQUOTA = 2


def project_quotas(root: str) -> str:
    """Whether the filesystem of `root` enforces project quotas (what the gateway would use
    instead of watching), as one line for `gateway doctor`."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open {root}: {exc.strerror}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        info = ctypes.create_string_buffer(64)
        cmd = (_Q_GETINFO << 8) | _PRJQUOTA
        if libc.syscall(ctypes.c_long(_QUOTACTL_FD), fd, ctypes.c_uint(cmd), 0, info) == 0:
            return "project quotas are on for this filesystem (the gateway still watches: it does not set them)"
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            return "no project quotas: this kernel has no quotactl_fd (or no CONFIG_QUOTA)"
        if err == errno.ESRCH:
            return "no project quotas: not on for this filesystem (or this kernel has no CONFIG_QUOTA)"
        return f"no project quotas on this filesystem ({os.strerror(err)})"
    finally:
        os.close(fd)
