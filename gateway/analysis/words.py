"""Lexical rules bash applies inside a word, which tree-sitter-bash leaves to us.

tree-sitter gives the structure of a word (quoted parts, expansions) but not its value: it does
no quote removal, and a glob, a tilde or a brace expansion is just text in a `word` node. These
functions turn source text into the value bash would pass, and say when that value is unknown.
They are pure and small so that tests can pin them against bash itself.
"""

from __future__ import annotations

import re

from gateway.analysis.model import Expansion


class UnmodelledEscape(ValueError):
    """An ANSI-C escape whose value depends on the locale or is not a character (a raw byte)."""


def _byte(value: int) -> str:
    if value > 0x7F:
        raise UnmodelledEscape(f"byte 0x{value:02x}")  # bash emits a raw byte, not a character
    return chr(value)


class UnmodelledSubstitution(ValueError):
    """Text that tree-sitter called plain content contains a live `$(` or backtick."""


_NAME_START = re.compile(r"[A-Za-z_0-9@*#?$!{(\[-]")


def unquoted(text: str, *, at_word_start: bool, assignment: bool = False) -> tuple[str, set[Expansion]]:
    """Value of an unquoted `word` node: backslash escapes removed, globs and tildes noted.

    `at_word_start` says whether this text begins the shell word (tilde expansion only happens
    there, and in assignments also after `=` and `:`).
    """
    out: list[str] = []
    kinds: set[Expansion] = set()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n:
                if text[i + 1] != "\n":  # backslash-newline is a line continuation: removed
                    out.append(text[i + 1])
                i += 2
                continue
            out.append(c)  # a trailing lone backslash stays
            i += 1
            continue
        if c in "*?[":
            kinds.add(Expansion.GLOB)
        elif c == "~" and ((i == 0 and at_word_start) or (assignment and i > 0 and text[i - 1] in "=:")):
            kinds.add(Expansion.TILDE)
        elif c == "`":
            raise UnmodelledSubstitution(text)
        elif c == "$" and i + 1 < n and _NAME_START.match(text[i + 1]):
            # tree-sitter should have made this an expansion node; if it did not, we do not
            # know what it is, so the value is unknown and a `$(` could hide a command.
            if text[i + 1] in "([":
                raise UnmodelledSubstitution(text)
            kinds.add(Expansion.PARAMETER)
        out.append(c)
        i += 1
    return "".join(out), kinds


def double_quoted(text: str) -> tuple[str, set[Expansion]]:
    """Value of literal text inside "...": only \\$ \\` \\" \\\\ and \\newline are escapes."""
    return _backslashed(text, '$`"\\\n')


def heredoc_text(text: str) -> tuple[str, set[Expansion]]:
    """Literal text of an unquoted here-document: \\$ \\` \\\\ and \\newline are escapes."""
    return _backslashed(text, "$`\\\n")


def _backslashed(text: str, escapes: str) -> tuple[str, set[Expansion]]:
    """Literal text where a backslash escapes only the characters of `escapes` (a backslash
    before a newline removes both), `$NAME` is a parameter, and a substitution is refused."""
    out: list[str] = []
    kinds: set[Expansion] = set()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in escapes:
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        if c == "`":
            raise UnmodelledSubstitution(text)
        if c == "$" and i + 1 < n and _NAME_START.match(text[i + 1]):
            if text[i + 1] in "([":
                raise UnmodelledSubstitution(text)
            kinds.add(Expansion.PARAMETER)
        out.append(c)
        i += 1
    return "".join(out), kinds


_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_OCT = "01234567"
_HEX = "0123456789abcdefABCDEF"


def ansi_c(body: str) -> str:
    """Decode the body of $'...' as bash does. A decoded NUL ends the string, as in bash."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            i += 2
        elif e in _OCT:
            j = i + 1
            while j < n and j < i + 4 and body[j] in _OCT:
                j += 1
            out.append(_byte(int(body[i + 1 : j], 8) & 0xFF))
            i = j
        elif e == "x":
            j = i + 2
            while j < n and j < i + 4 and body[j] in _HEX:
                j += 1
            if j == i + 2:
                out.append("\\x")
                i += 2
            else:
                out.append(_byte(int(body[i + 2 : j], 16)))
                i = j
        elif e in "uU":
            width = 4 if e == "u" else 8
            j = i + 2
            while j < n and j < i + 2 + width and body[j] in _HEX:
                j += 1
            if j == i + 2:
                out.append("\\" + e)
                i += 2
            else:
                code = int(body[i + 2 : j], 16)
                if code > 0x7F:
                    # bash converts \u above ASCII by the locale (literally under LC_ALL=C)
                    raise UnmodelledEscape(f"\\{e}{body[i + 2 : j]}")
                out.append(chr(code))
                i = j
        elif e == "c" and i + 2 < n:
            ch = body[i + 2]
            if ch == "\\" and i + 3 < n and body[i + 3] == "\\":
                out.append(chr(0x1C))
                i += 4
            else:
                # bash: TOCTRL(c) is DEL for '?', else toupper(c) & 0x1f
                out.append("\x7f" if ch == "?" else chr(ord(ch.upper()) & 0x1F) if ch.isascii() else "")
                if not ch.isascii():
                    raise UnmodelledEscape(f"\\c{ch}")
                i += 3
        else:
            out.append("\\" + e)
            i += 2
    value = "".join(out)
    nul = value.find("\x00")
    return value if nul < 0 else value[:nul]


def has_brace_expansion(skeleton: str) -> bool:
    """Would bash brace-expand this word? `skeleton` is the word's unquoted text, with every
    quoted or expanded part replaced by a neutral character and escaped characters by another.

    Conservative: any `{...}` holding a top-level comma or a `..` counts.
    """
    depth_starts: list[int] = []
    for i, c in enumerate(skeleton):
        if c == "{":
            depth_starts.append(i)
        elif c == "}" and depth_starts:
            start = depth_starts.pop()
            inner = skeleton[start + 1 : i]
            if "," in inner or ".." in inner:
                return True
    return False


def escape_mask(text: str) -> str:
    """Unquoted text with each escaped character (and its backslash) replaced by `_`, so that
    `\\{a,b}` is not taken for a brace expansion."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == "\\" and i + 1 < n:
            out.append("__")
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def heredoc_delimiter(start: str) -> tuple[str, bool]:
    """The delimiter bash looks for, and whether the here-document is quoted (no expansion).

    Any quote or backslash in the word makes it quoted; the delimiter is the word after quote
    removal.
    """
    quoted = any(c in start for c in "'\"\\")
    if not quoted:
        return start, False
    out: list[str] = []
    i, n = 0, len(start)
    quote = ""
    while i < n:
        c = start[i]
        if quote:
            if c == quote:
                quote = ""
            elif quote == '"' and c == "\\" and i + 1 < n and start[i + 1] in '$`"\\':
                out.append(start[i + 1])
                i += 1
            else:
                out.append(c)
        elif c in "'\"":
            quote = c
        elif c == "\\" and i + 1 < n:
            out.append(start[i + 1])
            i += 1
        else:
            out.append(c)
        i += 1
    return "".join(out), True


def join_continuations(text: str) -> str:
    """Remove backslash-newline pairs as bash does in an unquoted here-document body
    (a backslash escaped by another backslash does not start a continuation)."""
    if "\\\n" not in text:
        return text
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == "\\" and i + 1 < n:
            if text[i + 1] != "\n":
                out.append(text[i : i + 2])
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def unquoted_expansion(raw: str) -> bool:
    """Does the word as written (`raw`) hold a `$` expansion or a backquote outside quotes? Such a
    word's value is split at IFS and globbed again by the shell."""
    quote = ""
    k = 0
    while k < len(raw):
        c = raw[k]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            k += 1  # the next character is literal (inside double quotes too, where it matters not)
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c == "`":
            return True
        elif c == "$" and k + 1 < len(raw):
            nxt = raw[k + 1]
            if nxt == "'" or nxt == '"':  # $'...' and $"...": quoted text
                quote = nxt
                k += 1
            elif nxt.isalnum() or nxt in "_{(@*#?!$-":
                return True
        k += 1
    return False


_NUMERIC_PARAMETERS = frozenset("!$?#")


def numeric_only(raw: str) -> bool:
    """Is every expansion in the word as written (`raw`) one whose value is a number:
    `$((...))`, `$[...]`, `$!`, `$$`, `$?`, `$#`, `${#NAME}`, `${#NAME[@]}`? Such a value is
    `-?[0-9]+`: never an option other than `-` and digits, never a path separator. Words
    holding any other expansion (or none) are not numeric_only."""
    quote = ""
    found = False
    k, n = 0, len(raw)
    while k < n:
        c = raw[k]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            k += 1
        elif c == '"' and quote == '"':
            quote = ""
        elif c in "'\"" and not quote:
            quote = c
        elif c == "`":
            return False
        elif c == "$" and k + 1 < n:
            nxt = raw[k + 1]
            if nxt in "'\"" and not quote:  # $'...', $"...": quoted text (a translation is refused below)
                if nxt == '"':
                    return False
                quote = "'"
                k += 1
            elif raw.startswith("$((", k) or nxt == "[":
                end = arithmetic_end(raw, k)
                if end < 0:
                    return False
                found, k = True, end
                continue
            elif nxt in _NUMERIC_PARAMETERS:
                found, k = True, k + 2
                continue
            elif nxt == "{" and re.match(r"\$\{#[A-Za-z_][A-Za-z0-9_]*(\[[@*]\])?\}", raw[k:]):
                found, k = True, raw.index("}", k) + 1
                continue
            elif nxt.isalnum() or nxt in "_{(@*#?!$-":
                return False
        k += 1
    return found


def arithmetic_end(raw: str, start: int) -> int:
    """The index after the `))` (or `]`) closing the arithmetic expansion at `start`, or -1
    when it cannot be told (quotes or a substitution inside: such a word is not numeric_only)."""
    close = "]" if raw[start + 1] == "[" else "))"
    depth = 0
    k = start + (2 if close == "]" else 3)
    while k < len(raw):
        c = raw[k]
        if c in "'\"`\\" or (raw.startswith("$(", k) and not raw.startswith("$((", k)):
            return -1
        if c in "([":
            depth += 1
        elif depth == 0 and raw.startswith(close, k):
            return k + len(close)
        elif c in ")]":
            depth -= 1
            if depth < 0:
                return -1
        k += 1
    return -1
