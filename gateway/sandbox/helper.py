"""The sandbox helper `agw-init` (agw_init.c), built from source on first use.

The last steps before a command runs (joining cgroups and dropping root on the host; checking
the mounts, Landlock, resource limits and closing inherited descriptors inside the sandbox) are
done by a small C program rather than by Python or a shell, because they must happen in the
very process that then becomes the command, and must not depend on what the sandbox contains.

It ships as source, so it is compiled on the machine that runs it: `helper_path()` builds it
once into a cache directory (`$AGW_CACHE_DIR`, else `~/.cache/agent-gateway/`) under a name
holding the source's hash, so an upgraded source rebuilds and an old binary is never reused.
A static build is tried first (it runs inside any sandbox, whatever libraries are bound there);
a dynamic one is the fallback. The binary is run as root by the gateway, so the cache directory
and the binary must be writable by nobody else: a directory that is refuses, rather than running
code someone else could have put there.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from gateway import private_cache

SOURCE = Path(__file__).with_name("agw_init.c")
COMPILERS = ("cc", "gcc", "clang")
INSTALL_HINT = "apt-get install gcc libc6-dev"
BUILD_TIMEOUT = 180


class HelperUnavailable(Exception):
    """The sandbox helper cannot be built or run here. Callers refuse to execute."""


def helper_path() -> str:
    """The absolute path of a working `agw-init` binary, built on first use.

    Safe to call from several threads and processes at once: one of them compiles (under a lock
    file) and the others wait and reuse its result. Raises HelperUnavailable with what to do."""
    directory = cache_dir()
    path = _build_in(directory)
    if not os.path.isfile(path):  # removed since it was built (a cleaned cache): build again
        _build_in.cache_clear()
        path = _build_in(directory)
    return path


def cache_dir() -> str:
    """Where built helpers are kept: `$AGW_CACHE_DIR`, else `~/.cache/agent-gateway`
    (gateway/private_cache.py)."""
    try:
        return private_cache.cache_dir()
    except private_cache.CacheUnavailable as exc:
        raise HelperUnavailable(str(exc)) from exc


def source_digest() -> str:
    """The first 16 hex digits of the source's sha256: part of the binary's name."""
    return hashlib.sha256(_source()).hexdigest()[:16]


def _source() -> bytes:
    try:
        return SOURCE.read_bytes()
    except OSError as exc:
        why = f"the sandbox helper's source {SOURCE} is missing ({exc})"
        raise HelperUnavailable(f"{why}: reinstall agent-gateway") from exc


@functools.cache  # = lru_cache(maxsize=None)
def _build_in(directory: str) -> str:
    """Build (or find) the helper in `directory`. Only successes are cached: after a failure
    (e.g. no compiler yet) the next call tries again."""
    source = _source()
    name = f"agw-init-{hashlib.sha256(source).hexdigest()[:16]}-{platform.machine() or 'unknown'}"
    directory = _make_private_dir(directory)
    target = os.path.join(directory, name)
    if _usable(target):
        return target
    try:
        lock_fd = os.open(
            os.path.join(directory, f".{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # held until the build is in place
            if not _usable(target):  # not built by whoever held the lock before us
                _compile(source, directory, name, target)
        finally:
            os.close(lock_fd)  # releases the lock
    except OSError as exc:  # a full or read-only disk, say
        raise HelperUnavailable(f"cannot build the sandbox helper in {directory}: {exc}: set AGW_CACHE_DIR") from exc
    return target


def _make_private_dir(directory: str) -> str:
    """`directory`, created and checked private (gateway/private_cache.py: ours, and nobody else
    can change it or a directory above it); its real path."""
    try:
        return private_cache.make_private(directory)
    except private_cache.CacheUnavailable as exc:
        raise HelperUnavailable(str(exc)) from exc


def _usable(path: str) -> bool:
    """A built helper is there, ours and writable by nobody else (anything else is rebuilt)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & 0o022
        and st.st_mode & 0o111 == 0o111
    )


def _compiler() -> str:
    for name in COMPILERS:
        found = shutil.which(name)
        if found is not None:
            return found
    raise HelperUnavailable(f"no C compiler (cc) to build the sandbox helper: {INSTALL_HINT}")


def _compile(source: bytes, directory: str, name: str, target: str) -> None:
    """Compile `source` (the bytes that were hashed, fed on stdin, so the name always matches
    the content) to a temporary file next to `target`, check it runs, and rename it into place:
    a concurrent reader sees either no helper or a complete one."""
    compiler = _compiler()
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        failure = ""
        for link in (["-static"], []):  # static first: it needs no libraries inside the sandbox
            argv = [compiler, "-std=c11", "-O2", *link, "-x", "c", "-o", temporary, "-"]
            try:
                proc = subprocess.run(argv, input=source, capture_output=True, timeout=BUILD_TIMEOUT, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise HelperUnavailable(f"the C compiler {compiler} did not run: {exc}: {INSTALL_HINT}") from exc
            if proc.returncode == 0:
                break
            failure = proc.stderr.decode(errors="replace").strip()[-400:]
        else:
            raise HelperUnavailable(
                f"cannot build the sandbox helper with {compiler} ({failure}): install a working C toolchain "
                f"({INSTALL_HINT})"
            )
        os.chmod(temporary, 0o755)
        _check_runs(temporary, directory)
        os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _check_runs(binary: str, directory: str) -> None:
    """Run the new binary once (it simply execs a no-op program): a cache on a noexec mount
    would otherwise only show up later, as every sandboxed command failing."""
    noop = shutil.which("true")
    program = [os.path.realpath(noop)] if noop else [sys.executable, "-c", ""]
    argv = [binary, "outer", "--", *program]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HelperUnavailable(
            f"the sandbox helper built in {directory} does not run ({exc}): is that directory on a noexec mount? "
            "set AGW_CACHE_DIR to another directory"
        ) from exc
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip()[:200]
        raise HelperUnavailable(f"the sandbox helper built in {directory} fails its self-check: {why}")
