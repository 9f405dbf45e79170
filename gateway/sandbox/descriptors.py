"""Opening what the sandbox binds, by descriptor, so no name is resolved twice.

bwrap is handed `O_PATH` descriptors (`--bind-fd`, `--ro-bind-fd`), never names of things an
agent can change. Each descriptor comes from `openat2(2)`:

- a policy root or a system path is opened from `/` with `RESOLVE_NO_SYMLINKS`: the policy
  compiled its roots to real paths, so a symlink anywhere on the way means someone changed the
  tree since, and the root is refused rather than followed;
- a path inside a write root (a protected path, a directory pinned on the way to one) is opened
  component by component beneath the root's descriptor with `RESOLVE_BENEATH |
  RESOLVE_NO_SYMLINKS`: it cannot leave the root and cannot follow a link the agent planted.

bwrap then mounts `/proc/self/fd/N` and compares the mount with the descriptor; the helper inside
compares every mount point with the (st_dev, st_ino) recorded here before the command starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from dataclasses import dataclass

SYS_OPENAT2 = 437  # the same number on every architecture
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
O_PATH = os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """openat2(2). Raises OSError (ENOSYS on kernels before 5.6: the caller refuses to launch)."""
    how = _OpenHow(flags, 0, resolve)
    fd = _libc.syscall(SYS_OPENAT2, ctypes.c_int(dirfd), os.fsencode(path), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))  # fmt: skip
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


@dataclass(frozen=True)
class Opened:
    """An object the sandbox will bind: its descriptor and identity."""

    fd: int
    dev: int
    ino: int
    is_dir: bool


def _opened(fd: int) -> Opened:
    """`fd`'s identity. O_PATH|O_NOFOLLOW opens a trailing symlink *itself*, and bwrap would then
    resolve the link by name (it mounts realpath(/proc/self/fd/N)): a link is refused here."""
    st = os.fstat(fd)
    if stat.S_ISLNK(st.st_mode):
        os.close(fd)
        raise OSError(errno.ELOOP, "a symlink where a directory or file was expected")
    return Opened(fd, st.st_dev, st.st_ino, stat.S_ISDIR(st.st_mode))


def open_absolute(path: str) -> Opened:
    """A trusted absolute path (a policy root, /usr), opened from / without following any symlink."""
    if not os.path.isabs(path):
        raise ValueError(f"not an absolute path: {path}")
    fd = openat2(-100, path, O_PATH, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)  # AT_FDCWD, absolute
    return _opened(fd)


@dataclass(frozen=True)
class Walk:
    """Where a path inside a root led: the objects found on the way (each open), and the first
    component that does not exist (None when the whole path exists)."""

    found: tuple[tuple[str, Opened], ...]
    """(relative path, opened object) for each existing component, outermost first."""
    missing: str | None
    """The relative path of the first missing component (None when the whole path exists, or
    when a file stands where a directory was expected: the walk ends at that file)."""


class PlantedLink(Exception):
    """A component inside a root is a symlink: never followed, the launch is refused."""


def walk_beneath(root_fd: int, relative: str) -> Walk:
    """Open each component of `relative` beneath `root_fd`, never following a symlink and never
    leaving the root. Raises PlantedLink if a component is a symlink, OSError for other errors.
    The caller closes the descriptors in `found`."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"'..' in a path inside a root: {relative}")
    found: list[tuple[str, Opened]] = []
    parent = root_fd
    done: list[str] = []
    try:
        for part in parts:
            done.append(part)
            rel = "/".join(done)
            try:
                fd = openat2(parent, part, O_PATH, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
                opened = _opened(fd)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return Walk(tuple(found), rel)
                if exc.errno == errno.ELOOP:
                    raise PlantedLink(f"{rel} is a symlink") from None
                raise
            found.append((rel, opened))
            if not opened.is_dir and len(done) < len(parts):
                return Walk(tuple(found), None)  # a file where a directory was expected: it is the end
            parent = fd
    except BaseException:
        for _, o in found:
            with contextlib.suppress(OSError):
                os.close(o.fd)
        raise
    return Walk(tuple(found), None)
