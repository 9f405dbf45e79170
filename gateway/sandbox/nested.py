"""Nested repositories the agent makes never reach the human's git.

The human's git in the workspace runs what a *nested* repository's configuration says: a
`sub/.git` with `core.fsmonitor` or a filter runs as soon as the human's `git status`, `diff` or
`add -A` looks into `sub` (it registers as an embedded repository or submodule), with the
human's privileges. Mounts cannot forbid a name at every depth, so the gateway watches instead:

- every directory of every write root is watched (inotify); the top `.git` of each write root is
  not (it is read-only to everything but git itself: plan.py);
- a `.git` (directory or gitfile) that appears anywhere else, is moved there, or is written, and
  any change inside such a nested `.git`, by the sandbox's account, is quarantined at once:
  renamed to `.git.quarantined-<time>` through its parent's descriptor (opened beneath the root
  with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: the rename cannot leave the root or follow a
  link), and reported (`nested_repository_quarantined` in the audit log);
- when the gateway (re)starts watching a root, nested `.git` entries owned by the sandbox's
  account (made while no gateway watched) are quarantined the same way.

While git runs in a sandbox as a git write, it does not recurse into nested repositories at all
(git.py), so no race with this watcher can make a git write run a nested repository's programs.
When the gateway runs as an ordinary user, the sandbox's account is that user: every nested
`.git` that appears in a write root is then quarantined, whoever made it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway import fdwait
from gateway.sandbox import descriptors

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE_SELF = 0x400
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
MASK = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB | IN_MOVED_FROM | IN_DELETE_SELF
_EVENT = struct.Struct("iIII")

_libc = ctypes.CDLL(None, use_errno=True)

Report = Callable[[str, dict[str, object]], None]


class GuardUnavailable(Exception):
    """A write root cannot be watched (e.g. fs.inotify.max_user_watches): no launch."""


class NestedRepositoryGuard:
    """Watches write roots for nested repositories and quarantines them. One per process
    (`guard()`), shared by every gateway in it: each root reports to whoever watched it last.

    Fails closed: if a directory cannot be watched (a path past PATH_MAX, no inotify watches
    left), a quarantine fails for another reason than the entry having moved on, or the watcher
    thread meets anything unexpected, the guard is *broken* and `watch()` refuses every launch
    from then on (the reason says what to fix; a gateway restart re-examines everything)."""

    def __init__(self, sandbox_uid: int) -> None:
        self.sandbox_uid = sandbox_uid
        self.tell_apart = os.geteuid() != sandbox_uid
        """The gateway runs as root: the sandbox's account is not the human's, so an owner says
        who made an entry. Otherwise every nested .git made while watched is the agent's."""
        self._reports: dict[str, Report] = {}
        self._fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise GuardUnavailable(f"inotify: {os.strerror(ctypes.get_errno())}")
        self._lock = threading.RLock()
        self._roots: list[str] = []
        self._paths: dict[int, str] = {}  # watch descriptor -> absolute directory path
        self._known: set[str] = set()  # nested .git the human had when watching began
        self._recent: dict[str, list[float]] = {}  # root -> times of its recent quarantines
        self._tripped: dict[str, float] = {}  # root -> when it last tripped
        self.broken: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nested-repositories", daemon=True)
        self._thread.start()

    # --- watching ------------------------------------------------------------------------------
    def watch(self, roots: tuple[Path, ...], report: Report) -> None:
        """Watch these write roots (idempotent); quarantines are told to `report`. Raises
        GuardUnavailable if one cannot be watched, or the guard is broken."""
        with self._lock:
            for root in map(str, roots):
                self._reports[root] = report
                if root in self._roots or not os.path.isdir(root):
                    continue
                self._roots.append(root)
                try:
                    self._walk(root, initial=True)
                except GuardUnavailable as exc:
                    self._break(str(exc))
            if self.broken is not None:
                raise GuardUnavailable(self.broken)
            if not self._thread.is_alive():
                self._break("the nested-repository watcher stopped")
                raise GuardUnavailable(self.broken or "")

    def _break(self, why: str) -> None:
        if self.broken is None:
            self.broken = f"{why}: no command runs until the gateway restarts (docs/sandbox.md, nested repositories)"
            for report in set(self._reports.values()):
                with contextlib.suppress(Exception):
                    report("nested_repository_watch_failed", {"reason": why})

    def _root_of(self, path: str) -> str | None:
        inside = [r for r in self._roots if path == r or path.startswith(r.rstrip("/") + "/")]
        return max(inside, key=len) if inside else None

    def _is_top(self, directory: str) -> bool:
        return directory in self._roots

    def _add(self, directory: str) -> bool:
        wd = _libc.inotify_add_watch(self._fd, os.fsencode(directory), MASK | IN_ONLYDIR | IN_DONT_FOLLOW |
                                     IN_EXCL_UNLINK)  # fmt: skip
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return False  # gone or replaced meanwhile: its parent's event covers it
            hint = " (raise fs.inotify.max_user_watches for large workspaces)" if err == errno.ENOSPC else ""
            raise GuardUnavailable(
                f"cannot watch {directory[:160]}... for nested repositories: {os.strerror(err)}{hint}"
            )
        self._paths[wd] = directory
        return True

    def _walk(self, top: str, initial: bool = False, rescan: bool = False) -> None:
        """Watch `top` and everything below (paths are refreshed on the way), and deal with each
        nested .git found: on a first walk, the sandbox account's are quarantined and the rest
        are the human's (known); on a rescan after lost events, any not known is quarantined;
        in a tree that arrived with an event, every one is."""
        todo = [top]
        while todo:
            directory = todo.pop()
            if not self._add(directory):
                continue
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                if entry.name == ".git" and self._is_top(directory):
                    continue  # the top .git is protected by the sandbox itself
                if entry.name == ".git":
                    path = entry.path
                    if initial and not self._agents_repository(directory):
                        self._known.add(path)
                    elif not (rescan and path in self._known and not self._agents_repository(directory)):
                        self._quarantine(directory, "found" if initial or rescan else "moved in")
                        continue
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)  # a nested repository kept (the human's) is watched too

    def _agents_repository(self, directory: str) -> bool:
        """directory/.git was made or written by the sandbox's account: it, its config, its
        commondir or its gitdir file is owned by that account (or owners tell nothing here)."""
        if not self.tell_apart:
            return False
        git = os.path.join(directory, ".git")
        if any(self._owned(git, name) for name in ("", "config", "commondir", "gitdir")):
            return True
        if os.path.isfile(git) and not os.path.islink(git):  # a gitfile: whose is what it names?
            try:
                pfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return True
            try:
                target = _gitfile_target(pfd, directory)
            finally:
                os.close(pfd)
            return target is None or any(self._owned(target, name) for name in ("", "config", "commondir"))
        return False

    # --- events ------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    if not fdwait.readable(self._fd, 0.5):
                        continue
                    data = os.read(self._fd, 1 << 16)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EINTR):
                        continue
                    raise
                with self._lock:
                    try:
                        self._handle(data)
                    except GuardUnavailable as exc:  # fail closed, and keep quarantining what it can
                        self._break(str(exc))
        except BaseException as exc:  # fail closed: no watcher, no launch
            with self._lock:
                self._break(f"the nested-repository watcher failed: {type(exc).__name__}: {exc}"[:300])

    def _handle(self, data: bytes) -> None:
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            name = os.fsdecode(raw.split(b"\0", 1)[0])
            if mask & IN_Q_OVERFLOW:  # events were lost: look at everything again
                for root in list(self._roots):
                    self._walk(root, rescan=True)
                continue
            directory = self._paths.get(wd)
            if mask & IN_IGNORED:
                self._paths.pop(wd, None)
                continue
            if directory is None or not name:
                continue
            self._event(directory, name, mask)

    def _event(self, directory: str, name: str, mask: int) -> None:
        nested = _nested_git(directory, self._root_of(directory))
        if nested is not None:  # a change inside a nested repository
            parent, _ = os.path.split(nested)
            if not self.tell_apart or self._owned(directory, name) or nested not in self._known:
                self._quarantine(parent, "changed inside")
            return
        if name == ".git" and not self._is_top(directory):
            if mask & (IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB):
                self._quarantine(directory, "created")  # whoever's: a new nested repository
            return
        if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            self._walk(os.path.join(directory, name))

    def _owned(self, directory: str, name: str) -> bool:
        try:
            return os.lstat(os.path.join(directory, name) if name else directory).st_uid == self.sandbox_uid
        except OSError:
            return False

    def _quarantine(self, directory: str, why: str) -> None:
        """Rename directory/.git aside, through descriptors beneath its write root, then watch
        what was moved (under its new name) and the gitdir a gitfile named."""
        root = self._root_of(directory)
        if root is None or directory == root:
            return
        rel = os.path.relpath(directory, root)
        aside = f".git.quarantined-{time.strftime('%Y%m%dT%H%M%S')}-{time.monotonic_ns() % 10**9}"
        opened: list[int] = []
        target: str | None = None
        try:
            rfd = descriptors.open_absolute(root).fd
            opened.append(rfd)
            walk = descriptors.walk_beneath(rfd, rel)
            opened += [o.fd for _, o in walk.found]
            if walk.missing is not None or not walk.found or walk.found[-1][0] != rel or not walk.found[-1][1].is_dir:
                return  # moved or replaced meanwhile: its new place raises its own event
            parent = walk.found[-1][1].fd
            st = os.lstat(".git", dir_fd=parent)
            if stat.S_ISREG(st.st_mode):
                target = _gitfile_target(parent, directory)
            os.rename(".git", aside, src_dir_fd=parent, dst_dir_fd=parent)
        except FileNotFoundError:
            return  # gone meanwhile
        except (OSError, descriptors.PlantedLink, ValueError) as exc:
            self._break(f"cannot quarantine {directory[:200]}/.git: {exc}")
            return
        finally:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._known.discard(os.path.join(directory, ".git"))
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        details: dict[str, object] = {"path": os.path.join(directory, ".git"), "moved_to": aside, "why": why,
                                      "kind": kind}  # fmt: skip
        report = self._reports.get(root)
        if report is not None:
            with contextlib.suppress(Exception):  # the report (an audit record) must not stop the watcher
                report("nested_repository_quarantined", details)
        if kind == "directory":
            self._walk(os.path.join(directory, aside))  # its watches keep their old path otherwise
        if target is not None and self._root_of(target) == root and os.path.isdir(target):
            self._quarantine_repository_dir(target, root)
        self._repeated(root)

    def _quarantine_repository_dir(self, target: str, root: str) -> None:
        """A gitfile's gitdir inside the root (a repository under another name): moved aside too."""
        parent, name = os.path.split(target)
        if name in (".git", "") or parent == "" or target == root:
            return
        rel = os.path.relpath(parent, root)
        opened: list[int] = []
        try:
            rfd = descriptors.open_absolute(root).fd
            opened.append(rfd)
            pfd = rfd
            if rel != ".":
                walk = descriptors.walk_beneath(rfd, rel)
                opened += [o.fd for _, o in walk.found]
                if walk.missing is not None or not walk.found or not walk.found[-1][1].is_dir:
                    return
                pfd = walk.found[-1][1].fd
            os.rename(name, f"{name}.quarantined-{time.monotonic_ns() % 10**9}", src_dir_fd=pfd, dst_dir_fd=pfd)
        except (OSError, descriptors.PlantedLink, ValueError):
            return
        finally:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _repeated(self, root: str) -> None:
        """Nested repositories put back again and again anywhere in one root (a durable process
        racing the human's git, however it names its directories): trip, and let the gateway stop
        what runs there."""
        now = time.monotonic()
        times = [t for t in self._recent.get(root, []) if now - t < TRIP_WINDOW_S] + [now]
        self._recent[root] = times
        if len(times) >= TRIP_COUNT and now - self._tripped.get(root, -1e9) > 5.0:
            self._tripped[root] = now
            report = self._reports.get(root)
            if report is not None:
                with contextlib.suppress(Exception):
                    details = {"path": root, "quarantines": len(times)}
                    report("nested_repository_tripwire", {**details, "window_s": TRIP_WINDOW_S})

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        with contextlib.suppress(OSError):
            os.close(self._fd)


TRIP_COUNT = 6
TRIP_WINDOW_S = 30.0


def _gitfile_target(parent_fd: int, directory: str) -> str | None:
    """The gitdir a `.git` file names (`gitdir: PATH`), read by descriptor, as an absolute path."""
    try:
        fd = os.open(".git", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent_fd)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096).decode("utf-8", "replace")
    finally:
        os.close(fd)
    if not text.startswith("gitdir:"):
        return None
    value = text[len("gitdir:") :].strip().splitlines()[0] if text[len("gitdir:") :].strip() else ""
    if not value:
        return None
    return os.path.normpath(value if os.path.isabs(value) else os.path.join(directory, value))


def _nested_git(directory: str, root: str | None) -> str | None:
    """The nested `.git` directory `directory` lies in (not the root's own), or None."""
    if root is None:
        return None
    parts = os.path.relpath(directory, root).split("/")
    for i, part in enumerate(parts):
        if part == ".git" and i > 0:
            return os.path.join(root, *parts[: i + 1])
    return None


_GUARD: NestedRepositoryGuard | None = None
_GUARD_LOCK = threading.Lock()


def guard(sandbox_uid: int) -> NestedRepositoryGuard:
    """The process's watcher (made on first use)."""
    global _GUARD
    with _GUARD_LOCK:
        if _GUARD is None:
            _GUARD = NestedRepositoryGuard(sandbox_uid)
        return _GUARD
