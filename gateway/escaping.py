"""Text an agent wrote, shown to a person on one line: every character that could hide or
rewrite what is shown (line breaks, control, bidi and invisible characters) as an escape. A
shared value: the approval prompts, the console and the audit log's readers use it."""

from __future__ import annotations

import unicodedata


def escaped(text: str) -> str:
    """`text` on one line: line breaks, tabs, control, bidi and invisible characters as escapes
    (a terminal shows exactly what is there, and nothing can hide the rest of the line)."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable() and unicodedata.category(ch) not in ("Cf", "Co", "Cn"):
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):04x}}}")
    return "".join(out)


def shortened(text: str, width: int, whole: str) -> str:
    """`text` (already escaped) cut to about `width` characters; a cut says how much is left and
    where to read it whole (`whole`, e.g. "approvals show ID"), never silently."""
    if len(text) <= width:
        return text
    return f"{text[:width]}...[+{len(text) - width} chars: {whole}]"
