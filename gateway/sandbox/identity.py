"""Who sandboxed code runs as: never host root.

When the gateway runs as an unprivileged user, sandboxed code runs as that same user (bwrap
needs no privilege here: unprivileged user namespaces). When the gateway runs as root, it runs
as a dedicated account, `agw-sandbox` (created on first use with `useradd --system`, or named
with `AGW_SANDBOX_USER`), so a command that escaped every other layer would still hold no
privilege on the host, and a per-uid process limit means something.

Files in the write roots must be usable by that account: `hand_over(tree)` gives a tree the
gateway (or a test) created to it, walking by descriptor and never following a symlink; the
files tool creates what it writes with that owner (`own(fd)`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import pwd
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ACCOUNT = "agw-sandbox"


class IdentityUnavailable(Exception):
    """No unprivileged identity to run sandboxed code as."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    name: str
    how: str
    """How it was chosen: "gateway user" (the gateway is not root) or "dedicated account"."""

    @property
    def switch(self) -> bool:
        """The launcher must drop from root to this identity before starting bwrap."""
        return os.geteuid() != self.uid


@functools.lru_cache(maxsize=1)
def sandbox_identity() -> Identity:
    """The uid/gid sandboxed code runs as. Raises IdentityUnavailable (callers refuse to run)."""
    if os.geteuid() != 0:
        name = _name(os.getuid())
        return Identity(os.getuid(), os.getgid(), name, "gateway user")
    wanted = os.environ.get("AGW_SANDBOX_USER", ACCOUNT)
    try:
        entry = pwd.getpwnam(wanted)
    except KeyError:
        if wanted != ACCOUNT:
            raise IdentityUnavailable(f"AGW_SANDBOX_USER names {wanted!r}, which is not an account here") from None
        entry = _create_account()
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise IdentityUnavailable(f"the sandbox account {entry.pw_name!r} has uid or gid 0: it must be unprivileged")
    return Identity(entry.pw_uid, entry.pw_gid, entry.pw_name, "dedicated account")


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _create_account() -> pwd.struct_passwd:
    argv = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
            "--shell", "/usr/sbin/nologin", "--comment", "agent-gateway sandboxed commands", ACCOUNT]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IdentityUnavailable(f"cannot create the sandbox account {ACCOUNT!r}: {exc}") from exc
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(ACCOUNT)  # made now, or by a concurrent gateway
    why = proc.stderr.decode(errors="replace").strip()[:200]
    raise IdentityUnavailable(
        f"cannot create the sandbox account {ACCOUNT!r} ({why}): create an unprivileged account and name it "
        "with AGW_SANDBOX_USER, or run the gateway as an unprivileged user"
    )


# setgroups(2) for this thread alone: glibc's wrapper changes every thread of the process
_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_libc = ctypes.CDLL(None, use_errno=True)


class ActAsUnavailable(Exception):
    """This thread cannot take the sandbox's identity (the files tool then refuses to run)."""


@contextlib.contextmanager
def acting_as_sandbox() -> Iterator[None]:
    """Run the block with this thread's file-system identity the sandbox's: its fsuid and fsgid,
    no supplementary groups, and (the kernel's rule for an fsuid leaving 0) none of root's
    file capabilities. A file a command in the sandbox could not open, the block cannot either
    (/etc/shadow, /root), and what it creates belongs to the sandbox's account. Only this thread
    changes; the identity comes back when the block ends. Nothing changes when the gateway is
    not root (it already is the sandbox's identity). Raises ActAsUnavailable."""
    try:
        ident = sandbox_identity()
    except IdentityUnavailable as exc:
        raise ActAsUnavailable(str(exc)) from exc
    if not ident.switch:
        yield
        return
    number = _SETGROUPS.get(platform.machine())
    if number is None:
        raise ActAsUnavailable(f"dropping groups per thread is not supported on {platform.machine()}")
    groups = os.getgroups()
    _setgroups(number, [])
    try:
        _libc.setfsgid(ident.gid)
        _libc.setfsuid(ident.uid)
        if _libc.setfsuid(-1) != ident.uid or _libc.setfsgid(-1) != ident.gid:  # -1: only reports
            raise ActAsUnavailable("the kernel did not take the sandbox's file-system identity")
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)
        _setgroups(number, groups)


def _setgroups(number: int, groups: list[int]) -> None:
    array = (ctypes.c_uint * max(1, len(groups)))(*groups)
    if _libc.syscall(ctypes.c_long(number), ctypes.c_size_t(len(groups)), array) != 0:
        err = ctypes.get_errno()
        raise ActAsUnavailable(f"setgroups: {os.strerror(err)}")


def own(fd: int) -> None:
    """Give a file or directory the gateway just created (open as `fd`) to the sandbox identity,
    so sandboxed commands can change it later. Nothing to do when the gateway is not root."""
    ident = sandbox_identity()
    if ident.switch:
        os.fchown(fd, ident.uid, ident.gid)


def hand_over(tree: Path) -> None:
    """Give `tree` (a directory the gateway or a test made, e.g. a fresh workspace) and all it
    holds to the sandbox identity. Walks by descriptor: a symlink is re-owned itself, never
    followed, and nothing outside `tree` is touched."""
    ident = sandbox_identity()
    if not ident.switch:
        return
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    top = os.open(tree, flags)
    try:
        _chown_tree(top, ident.uid, ident.gid, flags)
    finally:
        os.close(top)


def _chown_tree(fd: int, uid: int, gid: int, flags: int) -> None:
    os.fchown(fd, uid, gid)
    for name in os.listdir(fd):
        st = os.lstat(name, dir_fd=fd)
        if stat.S_ISDIR(st.st_mode):
            try:
                child = os.open(name, flags, dir_fd=fd)
            except OSError:  # replaced meanwhile: leave it
                continue
            try:
                _chown_tree(child, uid, gid, flags)
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            continue  # a hard link may be another tree's file (/etc/shadow): never re-own it
        else:
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
