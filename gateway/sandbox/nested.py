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
import select
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

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
    (`guard()`), shared by every gateway in it: each root reports to whoever watched it last."""

    def __init__(self, sandbox_uid: int) -> None:
        self.sandbox_uid = sandbox_uid
        self.only_sandbox_owned = os.geteuid() != sandbox_uid
        self._reports: dict[str, Report] = {}
        self._fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise GuardUnavailable(f"inotify: {os.strerror(ctypes.get_errno())}")
        self._lock = threading.RLock()
        self._roots: list[str] = []
        self._paths: dict[int, str] = {}  # watch descriptor -> absolute directory path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nested-repositories", daemon=True)
        self._thread.start()

    # --- watching ------------------------------------------------------------------------------
    def watch(self, roots: tuple[Path, ...], report: Report) -> None:
        """Watch these write roots (idempotent); quarantines are told to `report`. Raises
        GuardUnavailable if one cannot be watched."""
        with self._lock:
            for root in map(str, roots):
                self._reports[root] = report
                if root in self._roots or not os.path.isdir(root):
                    continue
                self._roots.append(root)
                self._walk(root, initial=True)

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
            if err in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES):
                return False  # gone or replaced meanwhile: its parent's event covers it
            raise GuardUnavailable(
                f"cannot watch {directory} for nested repositories: {os.strerror(err)} "
                "(raise fs.inotify.max_user_watches for large workspaces)"
            )
        self._paths[wd] = directory
        return True

    def _walk(self, top: str, initial: bool) -> None:
        """Watch `top` and everything below; quarantine nested .git found (all of them when they
        arrived with an event, the sandbox's own on a first walk)."""
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
                    owned = self._owned(directory, ".git")
                    agents = owned if initial else (owned or not self.only_sandbox_owned)
                    if agents and (self.only_sandbox_owned or not initial):
                        self._quarantine(directory, "found" if initial else "moved in")
                        continue
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)  # a nested repository kept (the human's) is watched too

    # --- events ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._fd], [], [], 0.5)
                if not ready:
                    continue
                data = os.read(self._fd, 1 << 16)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    continue
                return
            with self._lock:
                self._handle(data)

    def _handle(self, data: bytes) -> None:
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if mask & IN_Q_OVERFLOW:  # events were lost: look at everything again
                for root in list(self._roots):
                    self._walk(root, initial=True)
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
            if self._owned(directory, name) or not self.only_sandbox_owned:
                self._quarantine(parent, "changed inside")
            return
        if name == ".git" and not self._is_top(directory) and mask & (IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE |
                                                                        IN_ATTRIB):  # fmt: skip
            if self._owned(directory, ".git") or not self.only_sandbox_owned:
                self._quarantine(directory, "created")
            return
        if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and name != ".git":
            self._walk(os.path.join(directory, name), initial=False)

    def _owned(self, directory: str, name: str) -> bool:
        try:
            return os.lstat(os.path.join(directory, name)).st_uid == self.sandbox_uid
        except OSError:
            return False

    def _quarantine(self, directory: str, why: str) -> None:
        """Rename directory/.git aside, through descriptors beneath its write root."""
        root = self._root_of(directory)
        if root is None or directory == root:
            return
        rel = os.path.relpath(directory, root)
        try:
            rfd = descriptors.open_absolute(root).fd
        except OSError:
            return
        opened: list[int] = [rfd]
        try:
            walk = descriptors.walk_beneath(rfd, rel)
            opened += [o.fd for _, o in walk.found]
            if walk.missing is not None or not walk.found or walk.found[-1][0] != rel or not walk.found[-1][1].is_dir:
                return  # moved or replaced meanwhile: its new place raises its own event
            parent = walk.found[-1][1].fd
            aside = f".git.quarantined-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
            st = os.lstat(".git", dir_fd=parent)
            os.rename(".git", aside, src_dir_fd=parent, dst_dir_fd=parent)
        except (OSError, descriptors.PlantedLink, ValueError):
            return
        finally:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        details: dict[str, object] = {"path": os.path.join(directory, ".git"), "moved_to": aside, "why": why,
                                      "kind": kind}  # fmt: skip
        report = self._reports.get(root)
        if report is not None:
            with contextlib.suppress(Exception):  # the report (an audit record) must not stop the watcher
                report("nested_repository_quarantined", details)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        with contextlib.suppress(OSError):
            os.close(self._fd)


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
