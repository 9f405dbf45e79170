"""What an awk program runs, reads and writes, read token by token (strings, regular
expressions and comments are told apart from code, as awk's lexer does).

- `system(...)`, a pipe (`print | "cmd"`, `"cmd" | getline`, gawk's `|&`) run a command: code;
- `getline` reads a file or a command's output, `ENVIRON`/`PROCINFO` read the environment,
  `ARGV`/`ARGC` change which files are read, `@` (gawk's `@load`, `@include` and indirect calls
  such as `@f()` with `f = "system"`) loads or calls what is not written here: all refused;
- `print ... > "file"` and `>> "file"` write the file: a jailed write when the target is one
  string literal, a path known only at run time (which the jail refuses) otherwise.

A `/` starts a regular expression where awk's grammar wants an operand (after an operator, `(`,
`,`, `;`, a newline, `print`..., and after the `)` closing an `if`, `while` or `for` condition)
and divides after an operand. The names above are refused anywhere in the text, strings and
regular expressions included, so that no misreading of where a string ends can hide one.
"""

from __future__ import annotations

import re

from gateway.analysis import Expansion, Word
from gateway.programs.facts import Facts

_REFUSED_NAMES = {
    "system": "system() runs a command",
    "getline": "getline reads files or a command's output",
    "ENVIRON": "ENVIRON reads the environment",
    "PROCINFO": "PROCINFO reads and changes gawk's process state",
    "ARGV": "ARGV changes which files awk reads",
    "ARGC": "ARGC changes which files awk reads",
}
_KEYWORDS_BEFORE_OPERAND = frozenset({
    "print", "printf", "return", "in", "case", "do", "else", "delete", "exit", "getline",
})  # fmt: skip
_CONDITION = frozenset({"if", "while", "for"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"(?:0[xX][0-9A-Fa-f]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)")
_CONTINUES = frozenset({",", "&&", "||", "do", "else", "{"})


class AwkError(Exception):
    pass


class _Token:
    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str) -> None:
        self.kind, self.text = kind, text  # kind: string, regex, name, number, op, newline


def tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    parens: list[bool] = []  # for each open paren: does it open an if/while/for condition?
    operand = False  # did an operand just end (so `/` divides)?
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r":
            i += 1
            continue
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":
            i += 2  # a continued line
            continue
        if c == "\\" and text[i + 1 : i + 3] == "\r\n":
            i += 3
            continue
        if c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n":
            out.append(_Token("newline", c))
            operand = False
            i += 1
            continue
        if c == '"':
            j = i + 1
            value = []
            while True:
                if j >= n or text[j] == "\n":
                    raise AwkError("a string is not terminated")
                if text[j] == "\\":
                    if j + 1 >= n:
                        raise AwkError("a string is not terminated")
                    value.append(_unescape(text[j + 1]))
                    j += 2
                    continue
                if text[j] == '"':
                    break
                value.append(text[j])
                j += 1
            out.append(_Token("string", "".join(value)))
            operand = True
            i = j + 1
            continue
        if c == "/" and not operand:
            j = i + 1
            bracket = False
            while True:
                if j >= n or text[j] == "\n":
                    raise AwkError("a regular expression is not terminated")
                ch = text[j]
                if ch == "\\":
                    j += 2
                    continue
                if bracket:
                    if ch == "]":
                        bracket = False
                    elif ch == "[" and text[j + 1 : j + 2] in (":", ".", "="):  # [:alpha:] and friends
                        end = text.find(text[j + 1] + "]", j + 2)
                        if end < 0:
                            raise AwkError("a bracket expression is not terminated")
                        j = end + 2
                        continue
                elif ch == "[":
                    bracket = True
                    j += 1
                    if text[j : j + 1] == "^":
                        j += 1
                    if text[j : j + 1] == "]":  # a leading ] is a member
                        j += 1
                    continue
                elif ch == "/":
                    break
                j += 1
            out.append(_Token("regex", text[i + 1 : j]))
            operand = True
            i = j + 1
            continue
        m = _IDENT.match(text, i)
        if m:
            word = m.group()
            out.append(_Token("name", word))
            operand = word not in _KEYWORDS_BEFORE_OPERAND and word not in _CONDITION
            i = m.end()
            if word in _CONDITION:
                k = i
                while k < n and text[k] in " \t":
                    k += 1
                if k < n and text[k] == "(":
                    out.append(_Token("op", "("))
                    parens.append(True)
                    operand = False
                    i = k + 1
            continue
        m = _NUMBER.match(text, i)
        if m and m.group():
            out.append(_Token("number", m.group()))
            operand = True
            i = m.end()
            continue
        three, two = text[i : i + 3], text[i : i + 2]
        if three in ("**=",):
            op = three
        elif two in ("&&", "||", "|&", ">>", ">=", "<=", "==", "!=", "!~", "++", "--", "+=", "-=", "*=", "/=",
                     "%=", "^=", "**"):  # fmt: skip
            op = two
        else:
            op = c
        i += len(op)
        out.append(_Token("op", op))
        if op == "(":
            parens.append(False)
            operand = False
        elif op == ")":
            condition = parens.pop() if parens else False
            operand = not condition  # after `if (...)` a statement, which may start with /re/
        elif op in ("]", "++", "--"):
            operand = True  # a subscript's end, a postfix increment
        else:
            operand = False
    return out


def _unescape(c: str) -> str:
    return {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "/": "/", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v"}.get(c, "\\" + c)  # fmt: skip


def analyse(text: str) -> Facts:
    """What the awk program `text` writes and runs, or why it cannot be read."""
    for name, why in _REFUSED_NAMES.items():
        if re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", text):
            return Facts(error=f"{why} ({name}), which the gateway does not allow in an awk program")
    try:
        toks = tokens(text)
    except AwkError as exc:
        return Facts(error=f"the awk program cannot be read ({exc})")
    runs: list[str] = []
    writes: list[Word] = []
    for t in toks:
        if t.kind == "op" and t.text == "@":
            return Facts(error="@ (gawk's @load, @include, indirect calls) is not allowed in an awk program")
        if t.kind == "op" and t.text in ("|", "|&"):
            runs.append(f"an awk pipe ({t.text}) runs a command")
    k = 0
    while k < len(toks):
        t = toks[k]
        if t.kind == "name" and t.text in ("print", "printf"):
            k = _print(toks, k + 1, writes)
            continue
        k += 1
    return Facts((), tuple(writes), tuple(runs))


def _print(toks: list[_Token], k: int, writes: list[Word]) -> int:
    """A print statement from token `k`: its redirection, if any. Returns where it ends."""
    depth = 0
    while k < len(toks):
        t = toks[k]
        if t.kind == "newline" and (k == 0 or toks[k - 1].text not in _CONTINUES):
            return k
        if t.kind == "op":
            if t.text in ("(", "["):
                depth += 1
            elif t.text in (")", "]"):
                depth -= 1
                if depth < 0:
                    return k
            elif t.text in (";", "}") and depth <= 0:
                return k
            elif t.text in (">", ">>") and depth == 0:
                end = k + 1
                while end < len(toks) and not (
                    toks[end].kind == "newline" or (toks[end].kind == "op" and toks[end].text in (";", "}", ")"))
                ):
                    end += 1
                target = toks[k + 1 : end]
                if len(target) == 1 and target[0].kind == "string":
                    writes.append(Word(target[0].text))
                else:
                    shown = "".join(x.text for x in target) or "(nothing)"
                    writes.append(Word(shown, (Expansion.PARAMETER,), shown))  # known only at run time
                return end
        k += 1
    return k
