"""Regular expressions an agent supplies (files grep, ask_user validation), compiled with RE2.

Python's `re` backtracks: `(a*)*b` against a line of a's takes exponential time, holding the
GIL, so one pattern would freeze every client of the gateway. RE2 matches in linear time. It
refuses what needs backtracking (backreferences, lookaround); such a pattern is an invalid
input with RE2's reason.
"""

from __future__ import annotations

import logging
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
