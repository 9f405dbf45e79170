"""Regular expressions an agent supplies (files grep, ask_user validation), compiled with RE2.

Python's `re` backtracks: `(a*)*b` against a line of a's takes exponential time, holding the
GIL, so one pattern would freeze every client of the gateway. RE2 matches in linear time. It
refuses what needs backtracking (backreferences, lookaround); such a pattern is an invalid
input with RE2's reason.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import re2

MAX_PATTERN = 1000  # characters

logging.getLogger("absl").setLevel(logging.CRITICAL)


def safe_regex(pattern: str) -> Any:
    """The compiled pattern. Raises ValueError naming what is wrong."""
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"longer than {MAX_PATTERN} characters")
    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise ValueError(
            f"invalid regular expression {pattern!r} (RE2 syntax: no backreferences or lookaround): {exc}"
        ) from None


# --- policy patterns -------------------------------------------------------------------------------

MAX_BACKTRACKING_INPUT = 4096
"""The longest argument matched against a policy pattern that needs backtracking (lookaround,
backreferences, Unicode classes): beyond it the pattern cannot decide (`PolicyPattern`)."""

_SAFE_IN = {"LITERAL", "RANGE", "NEGATE"}
_SAFE_AT = {"AT_BEGINNING", "AT_BEGINNING_STRING", "AT_END_STRING"}


class PolicyPattern:
    """A policy's argument pattern (Python `re` syntax, as admins write it), matched in linear
    time where RE2 reads it exactly as Python does; otherwise with Python's `re`, and only on
    arguments up to MAX_BACKTRACKING_INPUT characters: `fullmatch` then returns None for a
    longer one, and the caller decides (an allow rule does not match; a deny rule applies). An
    agent chooses the argument, so it never chooses how long a check takes."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._python = re.compile(pattern)
        self._linear: Any = None
        if _reads_the_same(pattern):
            try:
                self._linear = re2.compile(pattern)
            except re2.error:
                self._linear = None

    @property
    def linear(self) -> bool:
        return self._linear is not None

    def fullmatch(self, value: str) -> bool | None:
        if self._linear is not None:
            return self._linear.fullmatch(value) is not None
        if len(value) > MAX_BACKTRACKING_INPUT:
            return None
        return self._python.fullmatch(value) is not None


def _reads_the_same(pattern: str) -> bool:
    """Whether RE2 gives `pattern` exactly Python's meaning: literals, `.`, sets of literals and
    ranges, repeats, groups, alternation and anchors at the start (and `$` only at the very
    end); no flags, Unicode classes, POSIX classes, lookaround or backreferences."""
    if "[:" in pattern:
        return False  # RE2 reads [[:alpha:]] as a POSIX class, Python as a set of characters
    try:
        parsed = _sre_parse(pattern)
    except (re.error, RecursionError):
        return False
    if parsed.state.flags & ~re.UNICODE:
        return False
    items = list(parsed.data)
    if items and str(items[-1][0]) == "AT" and str(items[-1][1]) == "AT_END":
        items = items[:-1]  # `$` last: Python's "or before a final newline" cannot matter in a full match
    return _items_same(items)


def _items_same(items: Any) -> bool:
    for op, arg in items:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL", "ANY"):
            continue
        if name == "IN":
            if any(str(o) not in _SAFE_IN for o, _ in arg):
                return False
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            if not _items_same(arg[2]):
                return False
        elif name == "SUBPATTERN":
            _group, add, remove, inner = arg
            if add or remove or not _items_same(inner):
                return False
        elif name == "BRANCH":
            if not all(_items_same(alt) for alt in arg[1]):
                return False
        elif name == "AT":
            if str(arg) not in _SAFE_AT:
                return False
        else:
            return False
    return True


def _sre_parse(pattern: str) -> Any:
    import warnings
    from re import _parser  # type: ignore[attr-defined]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _parser.parse(pattern)
