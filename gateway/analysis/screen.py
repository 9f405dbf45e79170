"""Refuse text that could look different to a reviewer than to bash, before any parsing.

Control characters (other than tab and newline), bidi overrides, zero-width and other invisible
format characters can make a command read one way on screen and run another way. A text over
`MAX_TEXT_BYTES` is refused to bound the analyser's time and memory (docs/performance.md).
"""

from __future__ import annotations

import unicodedata

from gateway.analysis.model import Denial

MAX_TEXT_BYTES = 64 * 1024

# Unicode categories refused anywhere in the text: controls, format characters (bidi controls,
# zero-width space/joiners, soft hyphen, BOM...), lone surrogates, line/paragraph separators,
# and unassigned and private-use code points, which mean nothing in a command.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Cn", "Co"})
# Nothing a command needs lives above plane 3. (The parser itself only ever sees ASCII: see
# primary.ascii_image for the tree-sitter crash this guards against.)
MAX_CODE_POINT = 0x3FFFF
_ALLOWED_CONTROLS = frozenset({"\t", "\n"})


def screen(text: str) -> Denial | None:
    """A denial for text the analyser must not even parse, or None."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return Denial("invalid_character", f"text is not valid UTF-8 at character {exc.start + 1}")
    if size > MAX_TEXT_BYTES:
        return Denial(
            "too_long",
            f"command text is {size} bytes; the limit is {MAX_TEXT_BYTES} bytes "
            "(write large content with the file tools instead)",
        )
    if not text.strip():
        return Denial("empty", "command text is empty")
    if text.isascii() and text.isprintable():
        return None  # the common case: nothing to look for
    line, col = 1, 0
    for ch in text:
        col += 1
        if ch == "\n":
            line, col = line + 1, 0
            continue
        if ch in _ALLOWED_CONTROLS:
            continue
        if ord(ch) > MAX_CODE_POINT or unicodedata.category(ch) in _REFUSED_CATEGORIES:
            name = unicodedata.name(ch, "control character")
            return Denial(
                "invalid_character",
                f"U+{ord(ch):04X} ({name}) at line {line}, column {col}: control, bidi and "
                "invisible characters are refused because they hide what a command does",
                f"U+{ord(ch):04X}",
            )
    return None
