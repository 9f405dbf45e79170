"""Globs, expanded now within a budget: which directories a pattern lists, and what it matches.

A glob is a read: `echo /etc/ssl/private/*` lists a directory whatever the program, so every
directory a pattern lists must lie inside the read roots (the path jail checks `listed`). What
it matches is agent data: a file named `--compress-program=bash` turns `sort *` into code
execution, so the jail refuses a match that would reach the program as an option.

Matching follows bash's defaults for `bash -c` (no dotglob, globstar, nullglob, extglob): `*`
and `?` never match a leading `.`; `**` is `*`; `.` and `..` are never matched; an unmatched
pattern is passed as written. A bracket expression is taken to match any one character (a
superset of bash's: the jail then checks at least every path bash would pass). Symlinked
directories are followed, as bash does.

The work is the agent's to choose (`ls */*/*/*/*` over a tree it made), so it is bounded per
decision: at most MAX_ENTRIES directory entries read and MAX_MATCHES matches, else `TooCostly`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

MAX_ENTRIES = 20_000
"""Directory entries one decision's globs may read."""
MAX_MATCHES = 2_000
"""Matches one decision's globs may produce."""

_MAGIC = re.compile(r"[*?[]")


class TooCostly(Exception):
    """The globs of one decision read more than MAX_ENTRIES entries or match more than
    MAX_MATCHES paths."""


@dataclass
class Budget:
    """What one decision's globs may still read and match."""

    entries: int = MAX_ENTRIES
    matches: int = MAX_MATCHES

    def read(self, n: int) -> None:
        self.entries -= n
        if self.entries < 0:
            raise TooCostly(f"the globs read more than {MAX_ENTRIES} directory entries")

    def matched(self, n: int) -> None:
        self.matches -= n
        if self.matches < 0:
            raise TooCostly(f"the globs match more than {MAX_MATCHES} paths")


@dataclass
class Expanded:
    """One pattern expanded against one directory."""

    words: list[str]
    """What bash passes: each match as it would be written (relative stays relative), or the
    pattern itself when nothing matches."""
    paths: list[str]
    """The absolute path of each match (the pattern's own path when nothing matches)."""
    listed: list[str] = field(default_factory=list)
    """Every directory whose entries were read (absolute)."""


def has_magic(pattern: str) -> bool:
    return _MAGIC.search(pattern) is not None


def expand(pattern: str, cwd: str, budget: Budget) -> Expanded:
    """Expand `pattern` (a word's value, `~` already replaced) in `cwd`. Raises TooCostly."""
    absolute = pattern.startswith("/")
    parts = pattern.split("/")
    if absolute:
        parts = parts[1:]
    # (text as written so far, absolute path so far)
    found: list[tuple[str, str]] = [("/" if absolute else "", "/" if absolute else cwd)]
    listed: list[str] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt: list[tuple[str, str]] = []
        for written, path in found:
            sep = "" if written in ("", "/") else "/"
            if not has_magic(part):
                child = os.path.join(path, part) if part else path
                if last or part == "" or os.path.isdir(child):
                    nxt.append((f"{written}{sep}{part}" if part or written else part, child))
                continue
            listed.append(path)
            for name in _matching(path, part, budget):
                child = os.path.join(path, name)
                if last or os.path.isdir(child):
                    nxt.append((f"{written}{sep}{name}", child))
        found = nxt
        if not found:
            break
    if last_exists := [f for f in found if os.path.lexists(f[1])]:
        budget.matched(len(last_exists))
        ordered = sorted(last_exists)
        return Expanded([w for w, _ in ordered], [p for _, p in ordered], listed)
    whole = pattern if absolute else os.path.join(cwd, pattern)
    return Expanded([pattern], [whole], listed)


def _matching(directory: str, part: str, budget: Budget) -> list[str]:
    """The names in `directory` that `part` matches (bash's rules, brackets as any char)."""
    regex = _translate(part)
    hidden = part.startswith((".", "["))
    try:
        with os.scandir(directory) as it:
            names = []
            for entry in it:
                budget.read(1)
                names.append(entry.name)
    except OSError:
        return []  # unreadable or gone: bash matches nothing there either
    return sorted(n for n in names if (hidden or not n.startswith(".")) and regex.fullmatch(n))


def _translate(part: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = _bracket_end(part, i)
            if end < 0:
                out.append(re.escape(c))
            else:
                out.append(".")  # any one character: a superset of the bracket expression
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _bracket_end(part: str, start: int) -> int:
    """The index of the `]` closing the bracket expression at `start` (-1: none, a literal `[`)."""
    j = start + 1
    if j < len(part) and part[j] in "!^":
        j += 1
    if j < len(part) and part[j] == "]":
        j += 1  # a `]` first in the set is a member
    while j < len(part):
        if part[j : j + 2] == "[:":
            close = part.find(":]", j + 2)
            if close < 0:
                return -1
            j = close + 2
            continue
        if part[j] == "]":
            return j
        j += 1
    return -1
