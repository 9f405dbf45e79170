"""Paths no command may read (a role's `deny_read`) or write (`deny_write`): the patterns, and
where they match under the roots.

A pattern (docs/policy.md, "Secrets"):

- `NAME`, without `/`: any path one of whose components it matches (`.env`, `*.pem`,
  `id_rsa*`: fnmatch's `*`, `?` and `[...]`, case-sensitive; `*` matches a leading dot too);
- a path with `/`: that path and everything beneath it, relative to the workspace unless
  absolute (`config/secrets.yaml`, `deploy/**/*.key`: `*` and `?` within one component, `**`
  any number of components);
- `!PATTERN`: an exception. A component (or a path) an exception matches is not denied by the
  patterns that match it there: `.env.*` with `!.env.example`.

Three places use them. The path jail refuses a path that matches (stages/pathjail.py: the
commands' paths, the files tool, the agents' file hooks). The sandbox masks every match under
its roots when it starts (plan.py, `mask` mounts: an empty read-only file or directory over
each, so a program the policy lets run reads nothing there either). Where no sandbox runs the
command (an agent's hook), the jail refuses a recursive read of a tree that holds one (`find`).

`find` walks the roots by descriptor, never following a link, and keeps each directory's
listing until the directory's mtime or ctime changes (ctime cannot be set back by anyone but
root: a listing is never reused after a name was added, removed or renamed in it).
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import os
import re
import stat
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from gateway.sandbox.descriptors import RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, openat2

MAX_ENTRIES = 2_000_000
"""Entries one search may look at across its roots: past it the roots are too large to search
for secrets, and a sandbox is refused (SANDBOX_UNAVAILABLE) rather than started unmasked."""
MAX_CACHED_DIRS = 400_000
"""Directory listings kept between searches; past it the cache starts again empty."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


class TooManyToSearch(Exception):
    """The roots hold more than MAX_ENTRIES entries: a search cannot say what to mask."""


@lru_cache(maxsize=512)
def _component(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern), re.DOTALL)


def validate(entry: str) -> str | None:
    """Why `entry` is not a pattern (None: it is)."""
    body = entry[1:] if entry.startswith("!") else entry
    if not body or body in ("/", "!"):
        return "an empty pattern"
    parts = [p for p in body.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return "'.' and '..' are not allowed in a pattern"
    if "\0" in body:
        return "a NUL byte"
    if "/" not in body and body == "**":
        return "'**' alone would match every path"
    for p in parts:
        if p != "**":
            try:
                _component(p)
            except re.error as exc:  # an unclosed [ is literal for fnmatch; anything else is reported
                return f"component {p!r}: {exc}"
    return None


@dataclass(frozen=True)
class Patterns:
    """A role's `deny_read` (or `deny_write`), compiled; paths are absolute and resolved."""

    written: tuple[str, ...]
    """The entries as the policy writes them (path patterns made absolute), for messages."""
    names: tuple[str, ...] = ()
    paths: tuple[tuple[str, ...], ...] = ()
    except_names: tuple[str, ...] = ()
    except_paths: tuple[tuple[str, ...], ...] = ()
    _name_re: re.Pattern[str] | None = field(default=None, compare=False, hash=False, repr=False)
    _except_re: re.Pattern[str] | None = field(default=None, compare=False, hash=False, repr=False)

    @staticmethod
    def compile(entries: Iterable[str], workspace: Path) -> Patterns | None:
        """The patterns of `entries` (None when there are none). Raises ValueError naming a bad one."""
        written: list[str] = []
        names: list[str] = []
        paths: list[tuple[str, ...]] = []
        except_names: list[str] = []
        except_paths: list[tuple[str, ...]] = []
        for entry in dict.fromkeys(entries):
            why = validate(entry)
            if why is not None:
                raise ValueError(f"{entry!r}: {why}")
            negated = entry.startswith("!")
            body = entry[1:] if negated else entry
            if "/" in body.rstrip("/"):
                absolute = body if body.startswith("/") else f"{workspace}/{body}"
                parts = tuple(p for p in absolute.split("/") if p)
                (except_paths if negated else paths).append(parts)
                written.append(("!" if negated else "") + "/" + "/".join(parts))
            else:
                (except_names if negated else names).append(body.strip("/"))
                written.append(entry)
        if not names and not paths:
            return None
        return Patterns(
            tuple(written), tuple(names), tuple(paths), tuple(except_names), tuple(except_paths),
            _joined(names), _joined(except_names),
        )  # fmt: skip

    def match(self, path: str) -> str | None:
        """The pattern that denies the absolute `path` (None: none does). Every component is
        looked at, the path's own and each directory's above it."""
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts)):
            found = self._at(parts, i)
            if found is not None:
                return found
        return None

    def match_last(self, parts: list[str]) -> str | None:
        """The pattern that denies the path `parts` by its last component (its directories
        above were looked at already: a search descending from a root)."""
        return self._at(parts, len(parts) - 1) if parts else None

    def _at(self, parts: list[str], i: int) -> str | None:
        name = parts[i]
        hit: str | None = None
        if self._name_re is not None and self._name_re.match(name):
            hit = next(n for n in self.names if _component(n).match(name))
        elif self.paths:
            prefix = parts[: i + 1]
            hit = next(("/" + "/".join(p) for p in self.paths if _path_match(p, prefix)), None)
        if hit is None:
            return None
        if self._except_re is not None and self._except_re.match(name):
            return None
        if self.except_paths and any(_path_match(p, parts[: i + 1]) for p in self.except_paths):
            return None
        return hit

    def __add__(self, other: Patterns) -> Patterns:
        names = (*self.names, *(n for n in other.names if n not in self.names))
        excepts = (*self.except_names, *(n for n in other.except_names if n not in self.except_names))
        return Patterns(
            tuple(dict.fromkeys((*self.written, *other.written))), names,
            tuple(dict.fromkeys((*self.paths, *other.paths))), excepts,
            tuple(dict.fromkeys((*self.except_paths, *other.except_paths))), _joined(names), _joined(excepts),
        )  # fmt: skip


def _joined(names: Iterable[str]) -> re.Pattern[str] | None:
    found = [_component(n).pattern for n in names]
    return re.compile("|".join(f"(?:{p})" for p in found), re.DOTALL) if found else None


def _path_match(pattern: tuple[str, ...], parts: list[str]) -> bool:
    """Does the path pattern (components, `**` any number of them) match `parts` exactly?"""

    def go(i: int, j: int) -> bool:
        while i < len(pattern):
            if pattern[i] == "**":
                return any(go(i + 1, k) for k in range(j, len(parts) + 1))
            if j >= len(parts) or not _component(pattern[i]).match(parts[j]):
                return False
            i, j = i + 1, j + 1
        return j == len(parts)

    return go(0, 0)


# --- finding the matches under the roots -----------------------------------------------------


@dataclass(frozen=True)
class Hit:
    """A path under a root that a pattern denies."""

    path: str
    root: str
    """The root it lies in (the deepest one)."""
    directory: bool
    pattern: str


_Entry = tuple[str, str, int]  # name, kind ("d" directory, "l" symlink, "f" anything else), inode


@dataclass(frozen=True)
class _Dir:
    """One directory searched: its identity and what the patterns deny in it."""

    dev: int
    ino: int
    stamp: tuple[int, int]  # mtime and ctime (ns): any entry added, removed or renamed changes both
    matched: tuple[tuple[str, str, str], ...]  # name, kind, pattern
    subdirs: tuple[tuple[str, int], ...]  # name, inode (as the listing gives it)
    entries: tuple[_Entry, ...]


def _search(fd: int, where: str, patterns: Patterns) -> _Dir:
    st = os.fstat(fd)
    listing: list[_Entry] = []
    with os.scandir(fd) as it:
        for e in it:
            try:
                kind = "l" if e.is_symlink() else "d" if e.is_dir(follow_symlinks=False) else "f"
            except OSError:
                kind = "f"
            listing.append((e.name, kind, e.inode()))
    parts = [p for p in where.split("/") if p]
    matched: list[tuple[str, str, str]] = []
    subdirs: list[tuple[str, int]] = []
    for name, kind, ino in listing:
        found = patterns.match_last([*parts, name])
        if found is not None:
            matched.append((name, kind, found))
        elif kind == "d":
            subdirs.append((name, ino))
    return _Dir(st.st_dev, st.st_ino, (st.st_mtime_ns, st.st_ctime_ns), tuple(matched), tuple(subdirs), tuple(listing))


IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO = 0x100, 0x200, 0x40, 0x80
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
_WATCH = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_EVENT = struct.Struct("iIII")
_libc = ctypes.CDLL(None, use_errno=True)


class _Watcher:
    """inotify on every directory searched: which names changed since a search. Events are
    queued by the kernel within the call that changes a directory, so what was done before a
    drain is seen by it. A directory that cannot be watched (no watches left) makes its tree
    searched whole every time instead."""

    def __init__(self) -> None:
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        self.paths: dict[int, str] = {}
        self.gen = 1
        self.changed: dict[str, int] = {}  # directory -> the generation it last changed in
        self.lost = 0  # the generation events were last lost in: everything changed then

    def watch(self, fd: int, path: str) -> bool:
        """Watch the directory open as `fd` (its inode, whatever its name now), as `path`."""
        if self.fd < 0:
            return False
        wd = _libc.inotify_add_watch(self.fd, f"/proc/self/fd/{fd}".encode(), _WATCH)
        if wd < 0:
            return False
        self.paths[wd] = path  # a directory moved since is known by its new path from now on
        return True

    def drain(self) -> None:
        if self.fd < 0:
            return
        touched = False
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                touched = True
                if mask & IN_Q_OVERFLOW:
                    self.lost = self.gen
                elif mask & IN_IGNORED:
                    self.paths.pop(wd, None)
                elif (path := self.paths.get(wd)) is not None:
                    self.changed[path] = self.gen
        if touched:
            self.gen += 1
        if len(self.changed) > MAX_CACHED_DIRS:
            self.changed.clear()
            self.lost = self.gen - 1


@dataclass
class _Tree:
    """Everything below one root searched for one set of patterns, kept up to date."""

    root: str
    patterns: Patterns
    skip: frozenset[str]
    dirs: dict[str, _Dir] = field(default_factory=dict)
    holding: set[str] = field(default_factory=set)
    """The directories of `dirs` where something matched."""
    gen: int = 0
    watched: bool = True

    def put(self, where: str, found: _Dir) -> None:
        self.dirs[where] = found
        if found.matched:
            self.holding.add(where)
        else:
            self.holding.discard(where)

    def clear(self) -> None:
        self.dirs.clear()
        self.holding.clear()


_watcher: _Watcher | None = None
_trees: dict[tuple[str, tuple[str, ...], frozenset[str], tuple[int, int]], _Tree] = {}
_lock = threading.Lock()


def _identity() -> tuple[int, int]:
    """This thread's file-system identity (fsuid, fsgid): a search sees what it may list, so
    one made as the sandbox's account (identity.acting_as_sandbox) is kept apart from one made
    as the gateway's own user."""
    return _libc.setfsuid(-1), _libc.setfsgid(-1)  # -1 changes nothing and says which it is


def _open_dir(path: str) -> int | None:
    try:
        return openat2(-100, path, _DIR, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES):
            return None  # gone, replaced by a link or a file: its parent's change covers it
        raise


def _walk(tree: _Tree, fd: int, where: str, budget: list[int], watcher: _Watcher | None) -> None:
    """Search the directory `fd` at `where` and everything below it into `tree` (closes `fd`)."""
    stack = [(fd, where)]
    try:
        while stack:
            fd, where = stack.pop()
            try:
                if watcher is not None and not watcher.watch(fd, where):
                    tree.watched = False
                found = _search(fd, where, tree.patterns)
                tree.put(where, found)
                budget[0] -= len(found.entries)
                if budget[0] < 0:
                    raise TooManyToSearch(
                        f"the roots hold more than {MAX_ENTRIES} entries to search for the policy's deny_read "
                        f"patterns (under {tree.root})"
                    )
                base = where.rstrip("/")
                for name, _ in found.subdirs:
                    path = f"{base}/{name}"
                    if path in tree.skip:
                        continue
                    try:
                        child = os.open(name, _DIR, dir_fd=fd)
                    except OSError:
                        continue  # unreadable even to the gateway: the sandbox's account cannot list it
                    stack.append((child, path))
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def _drop(tree: _Tree, where: str) -> None:
    prefix = where.rstrip("/") + "/"
    for path in [p for p in tree.dirs if p == where or p.startswith(prefix)]:
        del tree.dirs[path]
        tree.holding.discard(path)


def _refresh(tree: _Tree, watcher: _Watcher | None, budget: list[int]) -> None:
    """Bring `tree` up to date: search again each directory that changed since (a directory
    that appeared below one is searched whole; one that went is forgotten with what was below
    it), or all of it when changes may have been missed."""
    if watcher is not None:
        watcher.drain()
    now = watcher.gen if watcher is not None else 0
    whole = not tree.dirs or watcher is None or not tree.watched or watcher.lost >= tree.gen
    if whole:
        tree.clear()
        tree.watched = True
        fd = _open_dir(tree.root)
        if fd is not None:
            _walk(tree, fd, tree.root, budget, watcher)
        tree.gen = now
        return
    assert watcher is not None
    changed = sorted((p for p, g in watcher.changed.items() if g >= tree.gen and p in tree.dirs), key=len)
    for where in changed:
        old = tree.dirs.get(where)
        if old is None:
            continue  # forgotten with a directory above it that went
        fd = _open_dir(where)
        if fd is None:
            _drop(tree, where)
            continue
        try:
            if not watcher.watch(fd, where):
                tree.watched = False
            found = _search(fd, where, tree.patterns)
            if (found.dev, found.ino) != (old.dev, old.ino):  # replaced by another directory: all of it anew
                _drop(tree, where)
                _walk(tree, os.dup(fd), where, budget, watcher)
                continue
            tree.put(where, found)
            base = where.rstrip("/")
            before = dict(old.subdirs)
            now_there = dict(found.subdirs)
            for name, ino in before.items():
                if now_there.get(name) != ino:
                    _drop(tree, f"{base}/{name}")
            for name, ino in now_there.items():
                path = f"{base}/{name}"
                if path in tree.skip or (before.get(name) == ino and path in tree.dirs):
                    continue
                try:
                    child = os.open(name, _DIR, dir_fd=fd)
                except OSError:
                    continue
                _walk(tree, child, path, budget, watcher)
        finally:
            os.close(fd)
    tree.gen = now


def _inside(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def find(
    roots: Iterable[str], patterns: Patterns | None, skip: Iterable[str] = (), limit: int = MAX_ENTRIES
) -> tuple[Hit, ...]:
    """Every path under `roots` (absolute, resolved) that `patterns` deny, outermost only (a
    denied directory is one hit). `skip`: directories not searched (what the sandbox hides or
    replaces). A denied name that is a symlink counts by its target, when that lies under a
    root. A regular file with other hard links under the roots has each of them found too.
    Raises TooManyToSearch past `limit` entries. What was searched is kept, and only what
    changed since (inotify) is searched again."""
    global _watcher
    if patterns is None:
        return ()
    root_list = sorted(dict.fromkeys(roots), key=len)
    skipped = frozenset(skip)
    budget = [limit]
    hits: dict[str, Hit] = {}
    linked: set[tuple[int, int]] = set()  # (dev, ino) of found files with more than one name
    who = _identity()
    with _lock:
        if _watcher is None:
            _watcher = _Watcher()
        for root in root_list:
            # (a root at or inside a skipped directory is shown all the same: searched)
            # a root inside this one is searched on its own (it may lie in a directory skipped here)
            inner = skipped | {r for r in root_list if r != root and _inside(r, root)}
            key = (root, patterns.written, inner, who)
            tree = _trees.get(key)
            if tree is None:
                if len(_trees) > 64:
                    _trees.clear()
                tree = _trees[key] = _Tree(root, patterns, inner)
            try:
                _refresh(tree, _watcher, budget)
            except BaseException:
                tree.clear()  # half searched: never reused
                raise
            for where in tree.holding:
                base = where.rstrip("/")
                for name, kind, pattern in tree.dirs[where].matched:
                    _found(hits, linked, f"{base}/{name}", kind, pattern, root_list)
        if linked:
            for tree in (_trees[k] for k in _trees if k[0] in root_list and k[1] == patterns.written and k[3] == who):
                for where, d in tree.dirs.items():
                    for name, kind, ino in d.entries:
                        path = f"{where.rstrip('/')}/{name}"
                        if kind == "f" and (d.dev, ino) in linked and path not in hits:
                            root = max((r for r in root_list if _inside(path, r)), key=len)
                            hits[path] = Hit(path, root, False, "(a hard link of a denied file)")
    return tuple(hits[p] for p in sorted(hits))


def _found(
    hits: dict[str, Hit], linked: set[tuple[int, int]], path: str, kind: str, pattern: str, roots: list[str]
) -> None:
    if kind == "l":  # its target, where a root shows it (the link itself leads there)
        target = os.path.realpath(path)
        inside = [r for r in roots if _inside(target, r)]
        if inside and target not in hits:
            hits[target] = Hit(target, max(inside, key=len), os.path.isdir(target), pattern)
        return
    root = max((r for r in roots if _inside(path, r)), key=len)
    hits[path] = Hit(path, root, kind == "d", pattern)
    if kind == "f":
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            linked.add((st.st_dev, st.st_ino))


def denied_files(
    roots: Iterable[str], patterns: Patterns | None, skip: Iterable[str] = ()
) -> frozenset[tuple[int, int]]:
    """The (st_dev, st_ino) of every regular file `find` finds: a file opened under another name
    (a hard link made before the search) is one of them when its identity is here."""
    out: set[tuple[int, int]] = set()
    for hit in find(roots, patterns, skip):
        if hit.directory:
            continue
        try:
            st = os.stat(hit.path, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.add((st.st_dev, st.st_ino))
    return frozenset(out)
