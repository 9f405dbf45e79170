"""Brace expansion, done now: `mkdir -p out/{arm64,x86_64}` checks two literal words.

Bash brace-expands a word before any other expansion: `pre{a,b}post` becomes `preapost
prebpost`, `f{1..3}` becomes `f1 f2 f3`. Those words are as literal as any other, so the
analyser expands them and every later stage (rules, the path jail) sees each one.

Only plain words are expanded: unquoted text made of letters, digits and `_ . / , { } + = : @ % -`
(no quote, backslash, `$`, glob or `~`). A word with anything else keeps its brace expansion
marked as known only at run time, as before. A word that would expand to more than MAX_WORDS
words, or nest deeper than MAX_DEPTH, is refused (`TooLarge`): the work is the agent's to
choose, so it is bounded. `tests/analysis/test_bash_argv.py` checks the result against bash.
"""

from __future__ import annotations

import itertools
import re

MAX_WORDS = 256
"""The most words one brace word may expand to (`{1..100000}` is refused, not expanded)."""
MAX_DEPTH = 16

_PLAIN = re.compile(r"[A-Za-z0-9_./,{}+=:@%-]+")
_INTEGER = re.compile(r"-?[0-9]{1,9}")
_STEP = re.compile(r"-?[1-9][0-9]{0,8}")
_LETTER = re.compile(r"[A-Za-z]")


class TooLarge(Exception):
    """The word expands to more than MAX_WORDS words (or nests deeper than MAX_DEPTH)."""


class NotPlain(Exception):
    """The word has braces bash would keep as text (`{}`, `{a}`, `{a,b`, a lone `}`) or a
    sequence we do not model: it is not expanded here (it stays known only at run time)."""


def plain(raw: str) -> bool:
    """Whether `raw` (a word as written) is plain enough to expand here."""
    return _PLAIN.fullmatch(raw) is not None


def expand(word: str) -> list[str]:
    """The words bash makes of the plain word `word`, in bash's order (empty words dropped, as
    bash drops the empty results of an unquoted expansion). Raises TooLarge, or NotPlain when
    a brace in it is one bash keeps as text."""
    if not plain(word):
        raise NotPlain(word)
    out = [w for w in _expand(word, 0) if w]
    if len(out) > MAX_WORDS:
        raise TooLarge(f"expands to more than {MAX_WORDS} words")
    return out


def _expand(s: str, depth: int) -> list[str]:
    if depth > MAX_DEPTH:
        raise TooLarge(f"braces nested deeper than {MAX_DEPTH}")
    i = s.find("{")
    if i < 0:
        if "}" in s:
            raise NotPlain(s)
        return [s]
    if "}" in s[:i]:
        raise NotPlain(s)
    close, commas = _match(s, i)
    if close < 0:
        raise NotPlain(s)
    if commas:
        cuts = [i, *commas, close]
        alternatives: list[str] = []
        for a, b in itertools.pairwise(cuts):
            alternatives.extend(_expand(s[a + 1 : b], depth + 1))
            _bound(len(alternatives))
    else:
        seq = _sequence(s[i + 1 : close])
        if seq is None:
            raise NotPlain(s)
        alternatives = seq
    posts = _expand(s[close + 1 :], depth + 1)
    _bound(len(alternatives) * len(posts))
    return [s[:i] + a + p for a in alternatives for p in posts]


def _bound(n: int) -> None:
    if n > MAX_WORDS:
        raise TooLarge(f"expands to more than {MAX_WORDS} words")


def _match(s: str, start: int) -> tuple[int, list[int]]:
    """The `}` closing the `{` at `start` (-1 if none) and the commas at its top level."""
    depth = 0
    commas: list[int] = []
    for j in range(start, len(s)):
        c = s[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j, commas
        elif c == "," and depth == 1:
            commas.append(j)
    return -1, []


def _sequence(inner: str) -> list[str] | None:
    """`x..y` or `x..y..step` of integers or of single letters of one case; None for anything
    else (bash keeps some as text and reads others in ways not modelled here)."""
    parts = inner.split("..")
    if len(parts) not in (2, 3):
        return None
    step = 1
    if len(parts) == 3:
        if _STEP.fullmatch(parts[2]) is None:
            return None
        step = abs(int(parts[2]))
    a, b = parts[0], parts[1]
    if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
        x, y = int(a), int(b)
        if abs(y - x) // step + 1 > MAX_WORDS:
            raise TooLarge(f"{{{inner}}} expands to more than {MAX_WORDS} words")
        if _zero_padded(a) or _zero_padded(b):
            return None  # bash pads to the wider endpoint, with rules for signs: not modelled
        values = range(x, y + 1, step) if x <= y else range(x, y - 1, -step)
        return [str(v) for v in values]
    if _LETTER.fullmatch(a) and _LETTER.fullmatch(b) and a.islower() == b.islower():
        x, y = ord(a), ord(b)
        codes = range(x, y + 1, step) if x <= y else range(x, y - 1, -step)
        return [chr(c) for c in codes]
    return None


def _zero_padded(n: str) -> bool:
    digits = n.lstrip("-")
    return len(digits) > 1 and digits.startswith("0")
