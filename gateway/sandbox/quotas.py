"""Per-sandbox resource quotas: a cgroup for each sandbox, or nothing (the launcher then falls
back to rlimits).

Every sandbox gets its own group, `agent-gateway/<name>`, below the cgroup the gateway itself
runs in (read from /proc/self/cgroup), so the gateway never touches cgroups it was not given.
The helper starts as `agw-init outer --join FILE... -- bwrap ...`: it writes its own pid into
each of `Cgroup.join_files` before it does anything else, so it and everything it forks are
counted from the first instruction.

cgroup v1 (each controller its own hierarchy): one directory per hierarchy, e.g.
`/sys/fs/cgroup/memory/<ours>/agent-gateway/<name>` and `/sys/fs/cgroup/pids/<ours>/...`;
memory is capped by `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`, when swap is
accounted, to the same value, so swap cannot extend it), processes by `pids.max`.

cgroup v2 (one tree): `<ours>/agent-gateway/<name>`, capped by `memory.max`, `memory.swap.max`
= 0 and `pids.max`. The "no internal processes" rule says a cgroup other than the root that
holds processes cannot enable controllers for its children. So when the gateway's own cgroup is
not the root, the gateway (with any children it already has) first moves into a leaf of its
own, `<ours>/agent-gateway-self`, and then enables `+memory +pids` in `<ours>` and in
`<ours>/agent-gateway` (a gateway that finds itself in `agent-gateway-self` already, started by
one that moved there, takes the parent as its own cgroup). If other processes share the
gateway's cgroup (it was started from a login shell, not as a service or scope of its own), or
the controllers were not delegated to it, cgroups are reported unusable, with the reason.

Paths are built only from what the kernel reports (mountinfo, /proc/self/cgroup) and from a
validated name; control files are opened with O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import threading
import time
from dataclasses import dataclass

from gateway.sandbox import proctree

SUBTREE = "agent-gateway"
SELF_LEAF = "agent-gateway-self"  # v2: where the gateway moves itself (no internal processes)
WANTED = ("memory", "pids")
SWEEP_MIN_AGE = 60.0
DURABLE_PREFIX = "d-"
"""The names of durable processes' groups (`d-<random>`): never judged by an owner (`kill_abandoned`);
the process manager ends each once its process has (`end_group`)."""
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Quotas:
    memory_bytes: int | None
    """Memory (and swap) all of one sandbox's processes may use together; None: no cap."""
    pids: int | None
    """Processes and threads one sandbox may hold at once; None: no cap."""
    cpu_seconds: int
    file_bytes: int
    open_files: int
    tmpfs_bytes: int
    """The size= of each private tmpfs (/tmp, /dev/shm, HOME)."""
    disk_bytes: int | None = None
    """What the principal's write roots may hold together (disk.py watches it); None: no budget."""
    disk_source: str = ""
    """Where `disk_bytes` comes from, for the error that stops a call ("limits.disk_bytes of role dev")."""

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "pids", "disk_bytes"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise ValueError(f"{field} must be positive or None, got {value}")
        for field in ("cpu_seconds", "file_bytes", "open_files", "tmpfs_bytes"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")


@dataclass(frozen=True)
class CgroupSupport:
    version: int | None
    """1, 2, or None when cgroups cannot be used here."""
    controllers: tuple[str, ...]
    """Of memory and pids, those a sandbox's group gets."""
    base: str
    """Where the groups go (for doctor; v1: one directory per hierarchy)."""
    reason: str
    """One line for an admin: how they are used, or why not."""


@dataclass(frozen=True)
class _Layout:
    """Where groups are made: one base directory per hierarchy, with the controllers it serves."""

    version: int
    bases: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(c for c in WANTED if any(c in served for _, served in self.bases))


class _Unusable(Exception):
    """Cgroups cannot be used here; the message says why, for an admin."""


# --- kernel files -----------------------------------------------------------------------------


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _write(path: str, text: str) -> None:
    """One write(2), as cgroupfs expects: each write is one command."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _keyed(path: str) -> dict[str, int]:
    """A flat keyed file (`key value` per line: memory.events, pids.events, memory.oom_control)."""
    out: dict[str, int] = {}
    for line in _read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _pids_in(path: str) -> set[int]:
    """The processes of the group at `path`; none for a group that is gone, whether its file
    was not there to open (ENOENT) or the kernel let go of it between the open and the read
    (ENODEV)."""
    try:
        return {int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()}
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV):
            return set()
        raise


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class _Mount:
    root: str  # the directory of the hierarchy mounted here
    point: str
    fstype: str
    options: frozenset[str]  # super options: the v1 controllers of this hierarchy


def _mounts() -> list[_Mount]:
    found = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        opts = frozenset(tail[2].split(","))
        found.append(_Mount(_unescape(fields[3]), _unescape(fields[4]), tail[0], opts))
    return found


def _own_cgroups() -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the v2 path under the key ""."""
    out: dict[str, str] = {}
    for line in _read("/proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _dir_in(mount: _Mount, path: str) -> str | None:
    """Where the cgroup `path` (as /proc/self/cgroup names it) is under this mount."""
    if not path.startswith("/") or ".." in path.split("/"):
        return None  # outside our cgroup namespace's view
    if mount.root != "/":
        if path != mount.root and not path.startswith(mount.root + "/"):
            return None
        path = path[len(mount.root) :] or "/"
    return mount.point.rstrip("/") + path.rstrip("/") if path != "/" else mount.point


# --- finding where groups go --------------------------------------------------------------------

_lock = threading.Lock()
_cached: tuple[CgroupSupport, _Layout | None] | None = None


def cgroup_support() -> CgroupSupport:
    """What cgroups give sandboxes here. Probed once per process, by really creating (and
    removing) a child group; on v2 this may move the gateway into its own leaf (see above)."""
    return _probe()[0]


def _layout() -> _Layout | None:
    return _probe()[1]


def _probe() -> tuple[CgroupSupport, _Layout | None]:
    global _cached
    with _lock:
        if _cached is None:
            _cached = _find()
        return _cached


def _find() -> tuple[CgroupSupport, _Layout | None]:
    try:
        mounts, own = _mounts(), _own_cgroups()
    except OSError as exc:
        return CgroupSupport(None, (), "", f"cannot read /proc/self: {exc.strerror}"), None
    v1 = [c for c in WANTED if c in own and any(m.fstype == "cgroup" and c in m.options for m in mounts)]
    try:
        if v1:
            layout, notes = _find_v1(mounts, own, v1)
        else:
            layout, notes = _find_v2(mounts, own)
    except _Unusable as exc:
        return CgroupSupport(None, (), "", str(exc)), None
    except OSError as exc:  # a control file that did not read as cgroupfs files do
        return CgroupSupport(None, (), "", f"probing cgroups failed: {exc}"), None
    base = ", ".join(b if len(layout.bases) == 1 else f"{'+'.join(s)}: {b}" for b, s in layout.bases)
    how = f"cgroup v{layout.version}: {' and '.join(layout.controllers)} per sandbox under {base}"
    return CgroupSupport(layout.version, layout.controllers, base, "; ".join([how, *notes])), layout


def _find_v1(mounts: list[_Mount], own: dict[str, str], controllers: list[str]) -> tuple[_Layout, list[str]]:
    bases: dict[str, list[str]] = {}
    notes: list[str] = []
    for c in controllers:
        where = None
        for m in mounts:
            if m.fstype == "cgroup" and c in m.options:
                where = _dir_in(m, own[c])
                if where is not None:
                    break
        if where is None:
            notes.append(f"{c}: our cgroup {own[c]} is not visible under any {c} mount")
            continue
        bases.setdefault(os.path.join(where, SUBTREE), []).append(c)
    usable: list[tuple[str, tuple[str, ...]]] = []
    for base, served in bases.items():
        try:
            _ensure_base(1, base, ())
            _try_group(1, base, tuple(served))
            usable.append((base, tuple(served)))
        except OSError as exc:
            notes.append(f"{'+'.join(served)}: cannot create a group under {base}: {exc.strerror or exc}")
    if not usable:
        raise _Unusable("cgroup v1: " + "; ".join(notes or ["no memory or pids hierarchy"]))
    missing = [c for c in WANTED if not any(c in s for _, s in usable)]
    if missing:
        notes.append(f"no {' or '.join(missing)} controller: rlimits stand in for it")
    return _Layout(1, tuple(usable)), notes


def _find_v2(mounts: list[_Mount], own: dict[str, str]) -> tuple[_Layout, list[str]]:
    if "" not in own:
        raise _Unusable("no memory or pids controller: neither a cgroup v1 hierarchy nor cgroup v2 has them")
    where = None
    for m in mounts:
        if m.fstype == "cgroup2":
            where = _dir_in(m, own[""])
            if where is not None:
                break
    if where is None:
        raise _Unusable(f"cgroup v2: our cgroup {own['']} is not visible under any cgroup2 mount")
    if os.path.basename(where) == SELF_LEAF:  # an earlier gateway process (or our parent) already left
        where = os.path.dirname(where)
    try:
        available = set(_read(os.path.join(where, "cgroup.controllers")).split())
    except OSError as exc:
        raise _Unusable(f"cgroup v2: cannot read {where}/cgroup.controllers: {exc.strerror}") from None
    wanted = tuple(c for c in WANTED if c in available)
    if not wanted:
        raise _Unusable(
            f"cgroup v2: memory and pids are not delegated to our cgroup {where} (its cgroup.controllers: "
            f"{' '.join(sorted(available)) or 'none'}); run the gateway as a service with Delegate=yes"
        )
    if not os.access(os.path.join(where, "cgroup.procs"), os.W_OK):
        raise _Unusable(
            f"cgroup v2: {where}/cgroup.procs is not writable by us, so the helper could not move into a group "
            "below it: delegate that cgroup to the gateway's user (Delegate=yes)"
        )
    layout = _v2_layout(where, wanted)
    absent = [c for c in WANTED if c not in wanted]
    notes = [f"no {' or '.join(absent)} controller delegated: rlimits stand in for it"] if absent else []
    return layout, notes


def _v2_layout(own_dir: str, wanted: tuple[str, ...]) -> _Layout:
    """Prepare `own_dir/agent-gateway` so its children get `wanted`. Raises _Unusable."""
    is_root = not os.path.exists(os.path.join(own_dir, "cgroup.type"))  # the root has no cgroup.type
    if not is_root:
        kind = _read(os.path.join(own_dir, "cgroup.type")).strip()
        if kind != "domain":
            raise _Unusable(f"cgroup v2: our cgroup {own_dir} is {kind!r}, not a domain: memory cannot be controlled")
    enabled = set(_read(os.path.join(own_dir, "cgroup.subtree_control")).split())
    if not set(wanted) <= enabled:
        if not is_root:
            _leave(own_dir)
        try:
            _write(os.path.join(own_dir, "cgroup.subtree_control"), " ".join("+" + c for c in wanted))
        except OSError as exc:
            raise _Unusable(
                f"cgroup v2: cannot enable {' '.join(wanted)} in {own_dir}/cgroup.subtree_control: "
                f"{exc.strerror} (the gateway needs a delegated cgroup of its own)"
            ) from None
    base = os.path.join(own_dir, SUBTREE)
    try:
        _ensure_base(2, base, wanted)
        _try_group(2, base, wanted)
    except OSError as exc:
        raise _Unusable(f"cgroup v2: cannot create a group under {base}: {exc.strerror or exc}") from None
    return _Layout(2, ((base, wanted),))


def _leave(own_dir: str) -> None:
    """v2, our cgroup is not the root: move the gateway (and its children) into a leaf of its own,
    so `own_dir` holds no processes and may enable controllers. Raises _Unusable if others share it."""
    here = _pids_in(own_dir)
    ours = _descendants(os.getpid(), here)
    others = here - ours
    if others:
        raise _Unusable(
            f"cgroup v2: our cgroup {own_dir} also holds {len(others)} other process(es), and a cgroup with processes "
            "cannot give controllers to children (no internal processes rule): start the gateway in a cgroup of its "
            "own (a systemd service or `systemd-run --scope` with Delegate=yes)"
        )
    leaf = os.path.join(own_dir, SELF_LEAF)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(leaf, 0o755)
        for pid in sorted(ours, key=lambda p: p != os.getpid()):
            with contextlib.suppress(ProcessLookupError):  # a child that ended meanwhile
                _write(os.path.join(leaf, "cgroup.procs"), str(pid))
    except OSError as exc:
        raise _Unusable(f"cgroup v2: cannot move the gateway into {leaf}: {exc.strerror}") from None


def _descendants(root: int, among: set[int]) -> set[int]:
    """Those of `among` that are `root` or have it as an ancestor."""
    parent: dict[int, int] = {}
    for pid in among:
        try:
            stat = _read(f"/proc/{pid}/stat")
            parent[pid] = int(stat[stat.rindex(")") + 2 :].split()[1])  # after "pid (comm) state"
        except (OSError, ValueError, IndexError):
            continue
    found = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if pid not in found and ppid in found:
                found.add(pid)
                grew = True
    return found & among


def _ensure_base(version: int, base: str, controllers: tuple[str, ...]) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o755)
    if version == 2 and controllers:
        control = os.path.join(base, "cgroup.subtree_control")
        if not set(controllers) <= set(_read(control).split()):
            _write(control, " ".join("+" + c for c in controllers))


_LIMIT_FILES = {
    (1, "memory"): ("memory.limit_in_bytes", "memory.oom_control"),
    (1, "pids"): ("pids.max", "pids.events"),
    (2, "memory"): ("memory.max", "memory.events"),
    (2, "pids"): ("pids.max", "pids.events"),
}


def _try_group(version: int, base: str, controllers: tuple[str, ...]) -> None:
    """Create and remove a child group, checking it has the files we use. Raises OSError."""
    probe = os.path.join(base, f"probe-{os.getpid()}")
    _mkdir_fresh(probe)
    try:
        for c in controllers:
            for f in _LIMIT_FILES[(version, c)]:
                if not os.path.exists(os.path.join(probe, f)):
                    raise OSError(errno.ENOENT, f"the new group has no {f}")
        if not os.access(os.path.join(probe, "cgroup.procs"), os.W_OK):
            raise OSError(errno.EACCES, "its cgroup.procs is not writable by us")
    finally:
        _rmdir_retry(probe, 1.0)


def _mkdir_fresh(path: str) -> None:
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        try:
            os.rmdir(path)  # an empty leftover of the same name
        except OSError:
            raise OSError(errno.EEXIST, "a cgroup of this name exists and is in use", path) from None
        os.mkdir(path, 0o755)


def _rmdir_retry(path: str, timeout: float) -> bool:
    """rmdir, retrying while the kernel still counts a just-exited process. True when gone."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.EAGAIN) or time.monotonic() >= deadline:
                return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


# --- one sandbox's group --------------------------------------------------------------------------


class Cgroup:
    """One sandbox's group (v1: one directory per hierarchy; v2: one directory)."""

    def __init__(self, name: str, version: int, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
        self.name = name
        self.version = version
        self._groups = groups
        self.join_files: tuple[str, ...] = tuple(os.path.join(d, "cgroup.procs") for d, _ in groups)
        """The files the helper writes its pid into (all of them, before anything else)."""
        self.controllers: tuple[str, ...] = tuple(c for c in WANTED if any(c in s for _, s in groups))
        """What this group caps; the launcher uses rlimits for whatever of memory/pids is missing."""

    def __repr__(self) -> str:
        return f"Cgroup({self.name!r}, v{self.version}, {[d for d, _ in self._groups]})"

    @classmethod
    def create(cls, name: str, quotas: Quotas) -> Cgroup | None:
        """A fresh group `name` with `quotas` applied, or None when cgroups cannot be used here.
        Raises ValueError for a bad name, OSError when creating it fails although cgroups work."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"a cgroup name is 1-64 of A-Z a-z 0-9 _ -, not {name!r}")
        layout = _layout()
        if layout is None:
            return None
        return _create_in(layout, name, quotas)

    def _dir(self, controller: str) -> str | None:
        return next((d for d, served in self._groups if controller in served), None)

    def _count(self, controller: str, filename: str, key: str) -> int:
        where = self._dir(controller)
        if where is None:
            return 0
        try:
            return _keyed(os.path.join(where, filename)).get(key, 0)
        except OSError:
            return 0

    def oom_killed(self) -> bool:
        """The kernel's OOM killer killed a process of this group (it hit its memory cap)."""
        filename = "memory.oom_control" if self.version == 1 else "memory.events"
        return self._count("memory", filename, "oom_kill") > 0

    def pids_refused(self) -> bool:
        """A fork or clone in this group was refused by pids.max."""
        return self._count("pids", "pids.events", "max") > 0

    def _members(self) -> set[int]:
        found: set[int] = set()
        for top, _ in self._groups:
            for where, _dirs, _files in os.walk(top):  # sub-groups too; cgroupfs has no symlinks
                found |= _pids_in(where)
        return found

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL every process in the group and wait until it is empty (at most `timeout`
        seconds: a process stuck in the kernel is left for remove()/sweep() to find later).
        v2 uses cgroup.kill (atomic, forks cannot escape); v1 kills each listed pid through a
        pidfd, again until none is left."""
        if self.version == 2:
            for top, _ in self._groups:
                with contextlib.suppress(FileNotFoundError):
                    _write(os.path.join(top, "cgroup.kill"), "1")
        deadline = time.monotonic() + timeout
        while (listed := self._members()) and time.monotonic() < deadline:
            self._kill_listed(listed)
            time.sleep(0.005)

    def _kill_listed(self, listed: set[int]) -> None:
        # a pid read from cgroup.procs may pass to an unrelated process before we signal it:
        # each is pinned with a pidfd and killed only if the group still lists it then
        proctree.signal_pinned(listed, self._members, signal.SIGKILL)

    def remove(self, timeout: float = 2.0) -> None:
        """Remove the group's directories (retrying while the kernel finishes with the last
        process). Never raises: what cannot be removed is left for sweep()."""
        for top, _ in self._groups:
            # deepest first; os.walk reports no errors, and a missing group yields nothing
            for where in [w for w, _d, _f in os.walk(top, topdown=False)] or [top]:
                try:
                    _rmdir_retry(where, timeout)
                except Exception:  # remove() must not raise
                    continue


def _create_in(layout: _Layout, name: str, quotas: Quotas) -> Cgroup:
    made: list[tuple[str, tuple[str, ...]]] = []
    try:
        for base, served in layout.bases:
            _ensure_base(layout.version, base, served)
            where = os.path.join(base, name)
            _mkdir_fresh(where)
            made.append((where, served))
            _apply(layout.version, where, served, quotas)
    except BaseException:
        for where, _ in made:
            _rmdir_retry(where, 0.5)
        raise
    return Cgroup(name, layout.version, tuple(made))


def _apply(version: int, where: str, served: tuple[str, ...], quotas: Quotas) -> None:
    def put(filename: str, value: int | str, optional: bool = False) -> None:
        path = os.path.join(where, filename)
        if optional and not os.path.exists(path):
            return
        _write(path, str(value))

    if "memory" in served and quotas.memory_bytes is not None:
        if version == 1:
            put("memory.limit_in_bytes", quotas.memory_bytes)  # first: memsw may not go below it
            put("memory.memsw.limit_in_bytes", quotas.memory_bytes, optional=True)  # swap accounting on
        else:
            put("memory.max", quotas.memory_bytes)
            put("memory.swap.max", 0, optional=True)  # absent without swap accounting
    if "pids" in served and quotas.pids is not None:
        put("pids.max", quotas.pids)


_OWNED = re.compile(r"s-(\d+)-(\d+)-(\d+)-[0-9a-f]+")
"""s-<pid namespace>-<pid>-<start ticks>-<random>: a pid and its start time name a process only
in the pid namespace that made them (a gateway in a container sees other numbers)."""


def _pid_namespace() -> int:
    """The inode of our pid namespace (0 when it cannot be read: then no group is judged)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (when it started, in clock ticks since boot); None: gone."""
    try:
        raw = _read(f"/proc/{pid}/stat")
        return int(raw[raw.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _running_ticks(pid: int) -> int | None:
    """`_start_ticks` of a process that still runs: None for one that is gone or a zombie (it
    died; only its parent has not collected its status yet, and its sandboxes lost their gateway)."""
    try:
        raw = _read(f"/proc/{pid}/stat")
        fields = raw[raw.rindex(")") + 2 :].split()
        return None if fields[0] in ("Z", "X", "x") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def owned_name(token: str) -> str:
    """The name of a group whose processes must die with this gateway process: it carries our
    pid and start time, so a later gateway can tell the group of a gateway that is gone
    (`kill_abandoned`) from one of a gateway still running on this host."""
    pid = os.getpid()
    if _OWNER[0] != pid:  # read once per process (a fork is a new owner): a call's launch pays nothing
        _OWNER[:] = [pid, f"s-{_pid_namespace()}-{pid}-{_start_ticks(pid) or 0}-"]
    return f"{_OWNER[1]!s}{token}"


_OWNER: list[int | str] = [0, ""]
"""(pid, name prefix) of the process that last named a group: a process's pid namespace and start
time never change while it runs."""


def _owner_state(name: str) -> str:
    """For a group named by `owned_name`: "gone" (its gateway process no longer runs), "live",
    or "foreign" (made in another pid namespace: its owner cannot be judged from here, so it is
    left alone). "other": not such a group."""
    m = _OWNED.fullmatch(name)
    if m is None:
        return "other"  # (an older gateway's s-<pid>-<ticks>-<random> too: swept when empty and old)
    ns = _pid_namespace()
    if ns == 0 or int(m.group(1)) != ns:
        return "foreign"
    return "live" if _running_ticks(int(m.group(2))) == int(m.group(3)) else "gone"


def kill_abandoned() -> int:
    """Kill and remove the groups of sandboxes that were to die with a gateway process that is
    gone (killed with SIGKILL: what the parent-death signals missed, e.g. bwrap's namespace
    init forked the instant its parent died). Durable processes' groups are named otherwise
    (they outlive the gateway on purpose) and are never touched. Returns how many groups."""
    layout = _layout()
    if layout is None:
        return 0
    names: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for base, served in layout.bases:
        try:
            entries = list(os.scandir(base))
        except OSError:
            continue
        for entry in entries:
            if _owner_state(entry.name) != "gone" or not entry.is_dir(follow_symlinks=False):
                continue  # its gateway still runs, or it is not ours to judge
            names.setdefault(entry.name, []).append((entry.path, served))
    for name, groups in names.items():
        group = Cgroup(name, layout.version, tuple(groups))
        group.kill()
        group.remove()
    return len(names)


def end_group(name: str) -> bool:
    """Kill whatever runs in the group `name` (a durable process's, which outlives the gateway
    and so carries no owner) and remove it. Returns whether there was such a group. Raises
    ValueError for a name that is not a durable group's."""
    if not _NAME.fullmatch(name) or not name.startswith(DURABLE_PREFIX):
        raise ValueError(f"not a durable process's cgroup name: {name!r}")
    layout = _layout()
    if layout is None:
        return False
    groups = tuple((os.path.join(base, name), served) for base, served in layout.bases)
    groups = tuple(g for g in groups if os.path.isdir(g[0]))
    if not groups:
        return False
    group = Cgroup(name, layout.version, groups)
    group.kill()
    group.remove()
    return True


def sweep(min_age: float = SWEEP_MIN_AGE) -> int:
    """Remove empty groups left under our base by gateways that crashed; returns how many names
    were removed. Groups younger than `min_age` seconds are left alone: another gateway on this
    host may have just made one and not yet started its sandbox. Groups with processes are kept
    (the kernel refuses to remove them)."""
    layout = _layout()
    if layout is None:
        return 0
    removed: set[str] = set()
    now = time.time()
    for base, _ in layout.bases:
        try:
            entries = list(os.scandir(base))
        except OSError:
            continue
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if _owner_state(entry.name) in ("live", "foreign"):
                    continue  # a running gateway's (maybe a spare made in advance): its own to remove
                if now - entry.stat(follow_symlinks=False).st_mtime < min_age:
                    continue
                os.rmdir(entry.path)
                removed.add(entry.name)
            except OSError:
                continue
    return len(removed)
