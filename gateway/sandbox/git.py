"""Git that cannot be turned against the human.

A repository's `.git` decides what the human's next `git status` runs: `config` (fsmonitor,
hooksPath, filters, aliases), `hooks/`, `info/attributes`, `commondir` and `gitdir` (which point
git at another config), the files a config `include` names. So:

- For every call but a *git write* (below), all of each write root's `.git` is read-only: bound
  read-only by descriptor, or an empty read-only placeholder where there is none yet, so it can
  neither be changed nor created. Nothing else the agent runs can touch it.
- A *git write* is a call whose every program is `git` itself, with a subcommand from
  `WRITE_SUBCOMMANDS`, no option that runs another program, no global option, no variable but
  the author/committer ones, and no redirect that writes (gateway/analysis/git_write.py reads
  that from the analysis; the sandbox is told a plain `git_write`). Only then is `.git` writable, and even
  then `config`, `config.worktree`, `commondir`, `gitdir`, `hooks/` and `info/` at any depth in
  `.git`, and the targets of `include.path` / `core.hooksPath` inside a write root, stay read-only.
- Inside every sandbox git runs with no system config, a read-only global config of the
  gateway's (an identity, `safe.directory=*`), and command-line overrides that switch hooks,
  fsmonitor, pagers and editors off: no program of the agent's choosing runs while `.git` is open.

`survey()` reads what a repository holds; it only reads names and the config's text, by
descriptor; what it returns is opened again, by descriptor, when the sandbox is built.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SENSITIVE = ("config", "config.worktree", "commondir", "gitdir", "hooks", "info", "modules", "worktrees")
"""Names that stay read-only at any depth in .git, even for a git write."""
SKIP_IN_SURVEY = frozenset({"objects", "refs", "logs", "lfs"})  # large and never sensitive

OVERRIDES = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.sshCommand", "false"),
    ("gpg.program", "false"),  # signing and verifying (commit -S, log --show-signature, %G?) run no program
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("protocol.ext.allow", "never"),
    ("submodule.recurse", "false"),
    ("diff.ignoreSubmodules", "all"),
    ("status.submoduleSummary", "false"),
    ("fetch.recurseSubmodules", "false"),
)
"""Passed as command-line configuration (GIT_CONFIG_COUNT...): stronger than the repository's,
and inherited by every git a git starts. Git never looks into a nested repository (whose
configuration the agent could have written: filters, fsmonitor) from a sandbox."""


def environment(global_config: str) -> dict[str, str]:
    """What every sandboxed process gets, so git there reads only the gateway's configuration
    besides the repository's own (which the agent cannot change) and runs no hook or editor."""
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": global_config, "GIT_TERMINAL_PROMPT": "0"}
    env["GIT_CONFIG_COUNT"] = str(len(OVERRIDES))
    for i, (key, value) in enumerate(OVERRIDES):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def global_config(principal: str) -> bytes:
    """The read-only global git config inside the sandbox: who commits, and that the repository
    (owned by another uid than the sandbox's) is trusted."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", principal)
    return (
        "[user]\n"
        f"\tname = agent-gateway ({name})\n"
        f"\temail = {name}@agent-gateway.invalid\n"
        "[safe]\n"
        "\tdirectory = *\n"
        "[init]\n"
        "\tdefaultBranch = main\n"
        "[advice]\n"
        "\tdetachedHead = false\n"
    ).encode()


@dataclass(frozen=True)
class Repository:
    """What one write root's .git holds (names only; contents are never trusted)."""

    root: Path
    kind: str
    """"dir", "file" (a gitdir pointer), or "missing"."""
    initialised: bool
    """.git/HEAD exists: git init will not create config and hooks now."""
    sensitive: tuple[str, ...]
    """Paths relative to the root, inside .git, named in SENSITIVE, at any depth."""
    linked: tuple[Path, ...]
    """Absolute targets of include.path / includeIf.*.path / core.hooksPath (may lie anywhere)."""


def survey(write_roots: Iterable[Path]) -> tuple[Repository, ...]:
    """Each write root's .git, read by descriptor without following symlinks."""
    return tuple(_survey_one(root) for root in write_roots)


def _survey_one(root: Path) -> Repository:
    try:
        rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return Repository(root, "missing", False, (), ())
    try:
        try:
            st = os.lstat(".git", dir_fd=rfd)
        except FileNotFoundError:
            return Repository(root, "missing", False, (), ())
        if not stat.S_ISDIR(st.st_mode):
            return Repository(root, "file", True, (), ())
        gfd = os.open(".git", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rfd)
        try:
            initialised = _exists(gfd, "HEAD")
            sensitive = tuple(f".git/{p}" for p in _sensitive(gfd, "", 0))
            linked = _linked(gfd, root / ".git")
        finally:
            os.close(gfd)
        return Repository(root, "dir", initialised, sensitive, linked)
    finally:
        os.close(rfd)


def _exists(dfd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return False
    return True


def _sensitive(dfd: int, prefix: str, depth: int) -> list[str]:
    out: list[str] = []
    if depth > 6:
        return out
    try:
        names = os.listdir(dfd)
    except OSError:
        return out
    for name in sorted(names):
        if name in SKIP_IN_SURVEY:
            continue
        rel = f"{prefix}{name}"
        if name in SENSITIVE:
            out.append(rel)
            continue
        try:
            st = os.lstat(name, dir_fd=dfd)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and depth > 0:
            with contextlib.suppress(OSError):
                cfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    out += _sensitive(cfd, f"{rel}/", depth + 1)
                finally:
                    os.close(cfd)
    return out


_PATH_KEY = re.compile(r"^\s*(path|hookspath)\s*=\s*(.*?)\s*$", re.IGNORECASE)
_SECTION = re.compile(r"^\s*\[\s*([A-Za-z0-9.-]+)")


def _linked(gfd: int, gitdir: Path) -> tuple[Path, ...]:
    """Targets of include paths and core.hooksPath in .git/config (the file is read-only to the
    agent, but what it names may lie in a write root)."""
    try:
        fd = os.open("config", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=gfd)
    except OSError:
        return ()
    try:
        text = os.read(fd, 1 << 20).decode("utf-8", "replace")
    finally:
        os.close(fd)
    out: list[Path] = []
    section = ""
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            section = m.group(1).lower()
            continue
        m = _PATH_KEY.match(line)
        if not m:
            continue
        key, value = m.group(1).lower(), m.group(2).strip('"')
        wanted = (section in ("include", "includeif") and key == "path") or (section == "core" and key == "hookspath")
        if not wanted or not value:
            continue
        if value.startswith("~"):
            continue  # the human's home: never inside the sandbox
        base = gitdir if key == "path" else gitdir.parent  # hooksPath is relative to the work tree
        path = Path(value) if os.path.isabs(value) else base / value
        out.append(Path(os.path.normpath(path)))
    return tuple(out)
