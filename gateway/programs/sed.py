"""A parser for GNU sed scripts (4.x): which commands run code and which files they name.

Parsed as GNU sed's compiler reads a script (its info manual, "sed scripts"), not searched for
letters: in `1a foo; 2e uname` the `e` is appended text, in `w out; e id` the file is named
`out; e id`, and in `s/x/e/` the `e` is replacement text. What counts:

- the `e` command and the `e` flag of `s` run a command: code;
- `w FILE`, `W FILE` and the `w FILE` flag of `s` write FILE (sed opens them all when it
  starts, whether or not a line reaches the command); `r FILE` and `R FILE` read it.
  A file name runs to the end of the line, `;` and `}` included, as in sed.

Anything the parser does not know (an unknown command, an unterminated `s`, an unbalanced
brace) is an error, and the command is not allowed by a rule relying on the model: sed would
refuse it too, and a parser that guessed could be made to disagree with sed.
"""

from __future__ import annotations

from gateway.analysis import Word
from gateway.programs.facts import Facts

_SIMPLE = frozenset("=dDFgGhHnNpPxz")  # no argument
_NUMBER = frozenset("lLqQ")  # an optional number
_LABEL = frozenset("btT")
_FILE_READ = frozenset("rR")
_FILE_WRITE = frozenset("wW")
_TEXT = frozenset("aic")
_SPACE = " \t\r\f\v"


class SedError(Exception):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.reads: list[Word] = []
        self.writes: list[Word] = []
        self.runs: list[str] = []
        self.depth = 0

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def get(self) -> str:
        c = self.peek()
        self.i += 1 if c else 0
        return c

    def blanks(self) -> None:
        while self.peek() and self.peek() in _SPACE:
            self.i += 1

    def parse(self) -> None:
        while True:
            while self.peek() and (self.peek() in _SPACE or self.peek() in ";\n"):
                self.i += 1
            if not self.peek():
                break
            self.command()
        if self.depth:
            raise SedError("unmatched `{'")

    def command(self) -> None:
        addressed = self.address()
        if addressed:
            self.blanks()
            if self.peek() == ",":
                self.i += 1
                self.blanks()
                if not self.address(second=True):
                    raise SedError("unexpected `,'")
            self.blanks()
            if self.peek() == "!":
                self.i += 1
                self.blanks()
                if self.peek() == "!":
                    raise SedError("multiple `!'s")
        elif self.peek() == "!":
            raise SedError("`!' without an address")  # GNU sed accepts it; refused here to stay simple
        c = self.get()
        if not c:
            raise SedError("missing command")
        if c == "#":
            if addressed:
                raise SedError("comments don't accept any addresses")
            self.to_eol()
        elif c == "{":
            self.depth += 1
        elif c == "}":
            if addressed:
                raise SedError("unexpected `}'")
            if not self.depth:
                raise SedError("unexpected `}'")
            self.depth -= 1
            self.end()
        elif c == ":":
            if addressed:
                raise SedError(": doesn't want any addresses")
            if not self.label():
                raise SedError('":" lacks a label')
            self.end()
        elif c in _LABEL or c == "v":
            self.label()
            self.end()
        elif c in _SIMPLE:
            self.end()
        elif c in _NUMBER:
            self.blanks()
            while self.peek().isdigit():
                self.i += 1
            self.end()
        elif c in _TEXT:
            self.text()
        elif c == "e":
            command = self.to_eol().strip()
            self.runs.append(f"sed's e command runs {command!r}" if command else "sed's e command runs a line's text")
        elif c in _FILE_READ:
            self.reads.append(Word(self.filename(c)))
        elif c in _FILE_WRITE:
            self.writes.append(Word(self.filename(c)))
        elif c == "s":
            self.substitute()
        elif c == "y":
            delim = self.delimiter("y")
            self.delimited(delim, "y")
            self.delimited(delim, "y")
            self.end()
        else:
            raise SedError(f"unknown command: `{c}'")

    def address(self, second: bool = False) -> bool:
        c = self.peek()
        if c.isdigit():
            while self.peek().isdigit():
                self.i += 1
            if self.peek() == "~":
                self.i += 1
                while self.peek().isdigit():
                    self.i += 1
            return True
        if c == "$":
            self.i += 1
            return True
        if second and c in "+~":
            self.i += 1
            if not self.peek().isdigit():
                raise SedError(f"expected a number after `{c}'")
            while self.peek().isdigit():
                self.i += 1
            return True
        if c in ("/", "\\"):
            self.i += 1
            delim = c if c == "/" else self.get()
            if not delim or delim in "\n\\":
                raise SedError("unexpected end of regular expression address")
            self.delimited(delim, "address", regex=True)
            while self.peek() in ("I", "M") and self.peek():
                self.i += 1
            return True
        return False

    def delimiter(self, what: str) -> str:
        d = self.get()
        if not d or d in "\n\\":
            raise SedError(f"unterminated `{what}' command")
        return d

    def delimited(self, delim: str, what: str, regex: bool = False) -> str:
        """Up to the next unescaped `delim` (sed's match_slash: brackets do not hide it)."""
        out: list[str] = []
        while True:
            c = self.get()
            if not c:
                raise SedError(f"unterminated `{what}' command")
            if c == delim:
                return "".join(out)
            if c == "\n" and regex:
                raise SedError(f"unterminated `{what}' command")
            if c == "\\":
                n = self.get()
                if not n:
                    raise SedError(f"unterminated `{what}' command")
                out.append(n if n == delim else c + n)
                continue
            out.append(c)

    def substitute(self) -> None:
        delim = self.delimiter("s")
        self.delimited(delim, "s", regex=True)
        self.delimited(delim, "s")
        while True:
            c = self.get()
            if c in ("", "\n", ";"):
                return
            if c == "}" or c == "#":
                self.i -= 1
                return
            if c in "gpiImM" or c.isdigit() or c in _SPACE:
                continue
            if c == "e":
                self.runs.append("the e flag of sed's s command runs the pattern space as a command")
                continue
            if c == "w":
                self.writes.append(Word(self.filename("s///w")))
                return
            raise SedError(f"unknown option to `s': `{c}'")

    def label(self) -> str:
        self.blanks()
        start = self.i
        while self.peek() and self.peek() not in _SPACE and self.peek() not in ";\n}":
            self.i += 1
        return self.s[start : self.i]

    def end(self) -> None:
        self.blanks()
        c = self.peek()
        if c in ("", "\n", ";"):
            self.i += 1 if c else 0
            return
        if c in ("}", "#"):
            return
        raise SedError(f"extra characters after command: {self.s[self.i : self.i + 20]!r}")

    def to_eol(self) -> str:
        start = self.i
        while self.peek() and self.peek() != "\n":
            self.i += 1
        out = self.s[start : self.i]
        self.get()
        return out

    def filename(self, what: str) -> str:
        self.blanks()
        name = self.to_eol()
        if not name:
            raise SedError(f"missing filename in `{what}'")
        return name

    def text(self) -> None:
        """a, i, c: `a\\` and lines of text (each but the last ending in a backslash), or GNU's
        one-line `a text`. Either way the text runs to an unescaped end of line."""
        self.blanks()
        if self.peek() == "\\":
            self.i += 1
            self.blanks()
            if self.peek() == "\n":
                self.i += 1
        while self.peek():
            c = self.get()
            if c == "\\":
                self.get()  # an escaped character, or an escaped newline: the text goes on
            elif c == "\n":
                return


def analyse(text: str) -> Facts:
    """What the sed script `text` reads, writes and runs, or why it cannot be read."""
    p = _Parser(text)
    try:
        p.parse()
    except SedError as exc:
        return Facts(error=f"the sed script cannot be read ({exc}): write it in sed's syntax")
    return Facts(tuple(p.reads), tuple(p.writes), tuple(p.runs))
