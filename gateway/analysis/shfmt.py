"""mvdan/sh (the parser behind shfmt) as the confirming parser where bashlex is blind.

bashlex stays the second opinion (the design's parser). Where it cannot confirm a text (it raised,
timed out, or agreed only where it could see), shfmt parses the same text and its full syntax
tree is compared with the primary's simple commands exactly as bashlex's are, without bashlex's
allowances for blind spots: every command at the same place, every word at the same place with
the same value. Agreement confirms; a difference is a denial; shfmt failing stays unconfirmed.

Running it. shfmt has no resident mode (`--to-json` reads one program from stdin and exits), so
it runs once per text, about 2 ms here, and only where bashlex did not confirm. The binary comes
from the `shfmt-py` wheel, found next to this interpreter (never through PATH). It parses text an
agent wrote, so it is treated like any parser of untrusted input: no shell, an empty environment,
cwd `/`, limits on CPU time and data size set before it is given the text, a wall timeout, and a
cap on what it may print (its JSON is 100-300 times the size of the text).

Reading its tree. The typed JSON of mvdan/sh (syntax/typedjson) is walked with a closed
vocabulary: every node type and every field is listed below with what it holds. A node or field
outside it (a newer shfmt, another dialect's construct) is a disagreement, never skipped.
Values are quote-removed with the same lexical rules as the primary (words.py), which are pinned
against bash itself; what is compared is where each parser finds commands and words.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import sysconfig
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from gateway import fdwait
from gateway.analysis import words as lex

MAX_SHFMT_BYTES = 64 * 1024
"""The analyser's own cap (screen.py): shfmt is fast enough for any text the screen lets through;
what bounds it is the size of its JSON (below)."""
MAX_JSON_BYTES = 8 * 1024 * 1024
"""About 30 KiB of dense one-line commands (a command substitution per line), or far more of a
here-document body. Beyond it: `too_large`, unconfirmed."""
CPU_SECONDS = 2
WALL_SECONDS = 5.0
DATA_BYTES = 512 * 1024 * 1024
"""RLIMIT_DATA: Go reserves its heap without counting against it, then each arena counts."""
CACHE_SIZE = 1024


class Disagreement(Exception):
    """shfmt's tree holds what the comparison does not know (an unknown node or field), or reads
    a command differently: a denial."""


class Uncomparable(Exception):
    """A construct both parsers know but model differently (`time` over a pipeline): no
    confirmation either way."""


@dataclass(frozen=True, slots=True)
class Parsed:
    """What shfmt made of a text: `status` ok (and `commands`), or unparsed / too_large /
    timeout / failed with `error`."""

    status: str
    commands: tuple[tuple[tuple[int, int, str], ...], ...] = ()
    error: str = ""


def binary() -> str | None:
    """The shfmt binary that the `shfmt-py` wheel installed beside this interpreter's scripts."""
    return _installed()


@functools.cache
def _installed() -> str | None:
    for scripts in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = os.path.join(scripts, "shfmt")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


# -- running shfmt ----------------------------------------------------------------------------------


def run(text: str, path: str | None = None, wall_seconds: float | None = None, lang: str = "bash") -> dict[str, Any]:
    """shfmt's tree for `text` read as `lang` (bash, or zsh: gateway/analysis/zsh.py): {"status":
    "ok", "tree": ...} or a failure status with an error. Never raises."""
    wall_seconds = WALL_SECONDS if wall_seconds is None else wall_seconds
    data = text.encode("utf-8")
    if len(data) > MAX_SHFMT_BYTES:
        return {
            "status": "too_large",
            "error": f"the text is {len(data)} bytes; shfmt is asked up to {MAX_SHFMT_BYTES}",
        }
    path = path or binary()
    if path is None:
        return {"status": "failed", "error": "shfmt is not installed (the shfmt-py package)"}
    try:
        proc = subprocess.Popen(
            [path, "-ln", lang, "--to-json"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",  # no EditorConfig of the agent's (flags turn it off; this makes sure)
            env={"GOMAXPROCS": "1"},
            close_fds=True,
        )
    except OSError as exc:
        return {"status": "failed", "error": f"shfmt could not be started: {exc}"}
    try:
        return _exchange(proc, data, wall_seconds)
    except Exception as exc:  # any failure here is a missing opinion, not an allow
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()


def _exchange(proc: subprocess.Popen[bytes], data: bytes, wall_seconds: float) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    # the limits hold before shfmt sees a byte of the text: it is blocked reading stdin until then
    resource.prlimit(proc.pid, resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS + 1))
    resource.prlimit(proc.pid, resource.RLIMIT_DATA, (DATA_BYTES, DATA_BYTES))
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, 0))
    deadline = time.monotonic() + wall_seconds
    out, err = bytearray(), bytearray()
    stdin_fd, stdout_fd, stderr_fd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    os.set_blocking(stdin_fd, False)
    pending = memoryview(data)
    if not pending:
        proc.stdin.close()
    readers = {stdout_fd: out, stderr_fd: err}
    exited = _pidfd(proc.pid)  # readable once it has exited: waited for without polling
    gone = exited is None
    try:
        while readers or not gone:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"status": "timeout", "error": f"shfmt did not answer within {wall_seconds}s"}
            writers = [stdin_fd] if not proc.stdin.closed else []
            watched = [*readers] if gone or exited is None else [*readers, exited]
            readable, writable = fdwait.ready(watched, writers, left)
            if writable:
                try:
                    sent = os.write(stdin_fd, pending[:65536])
                except BrokenPipeError:
                    sent = len(pending)  # it exited; its status says why
                pending = pending[sent:]
                if not pending:
                    proc.stdin.close()
            for fd in readable:
                if fd == exited:
                    gone = True
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    del readers[fd]
                    continue
                readers[fd] += chunk
                if len(out) > MAX_JSON_BYTES:
                    return {"status": "too_large", "error": f"shfmt's syntax tree is over {MAX_JSON_BYTES} bytes"}
                if len(err) > 4096:
                    del readers[stderr_fd]
    finally:
        if exited is not None:
            os.close(exited)
    try:
        code = proc.wait(max(0.0, deadline - time.monotonic()))  # exited by now where pidfds exist
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"shfmt did not exit within {wall_seconds}s"}
    message = err.decode("utf-8", "replace").strip().splitlines()
    if code == 1 and message:
        return {"status": "unparsed", "error": message[0][:300]}
    if code != 0:
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return {"status": "failed", "error": f"shfmt failed ({why}){': ' + message[0][:200] if message else ''}"}
    try:
        tree = json.loads(out)
    except ValueError as exc:
        return {"status": "failed", "error": f"shfmt printed no JSON: {exc}"}
    return {"status": "ok", "tree": tree}


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # a kernel before 5.3: Popen.wait's polling instead
        return None


class _Cache:
    """Finished parses by the text's digest (a timeout or a crash is not kept)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[bytes, Parsed] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> Parsed | None:
        with self._lock:
            found = self._data.get(key)
            if found is not None:
                self._data.move_to_end(key)
            return found

    def put(self, key: bytes, value: Parsed) -> None:
        with self._lock:
            self._data[key] = value
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


cache = _Cache(CACHE_SIZE)


def parse(text: str, path: str | None = None, use_cache: bool = True) -> Parsed:
    """The simple commands shfmt finds in `text`, each as (start, end, value) per word, with
    character offsets; or why it could not say. Raises `Disagreement` / `Uncomparable` (kept in
    the cache as such: the same tree gives the same answer)."""
    key = hashlib.sha256(text.encode("utf-8")).digest()
    found = cache.get(key) if use_cache else None
    if found is None:
        reply = run(text, path)
        if reply["status"] != "ok":
            found = Parsed(reply["status"], error=str(reply.get("error", "")))
        else:
            try:
                found = Parsed("ok", Extractor(text).file(reply["tree"]))
            except Disagreement as exc:
                found = Parsed("disagreed", error=str(exc))
            except Uncomparable as exc:
                found = Parsed("uncomparable", error=str(exc))
            except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
                found = Parsed("disagreed", error=f"unexpected shape in shfmt's tree: {type(exc).__name__}: {exc}")
        if use_cache and found.status not in ("timeout", "failed"):
            cache.put(key, found)
    return found


# -- the closed vocabulary --------------------------------------------------------------------------
# Field kinds: pos (a position), flag (true), op (an operator's text), text, lit (a Lit without a
# Type key), word / words, stmt / stmts, comments, and typed slots (cmd, arith, test, loop, part)
# whose nodes carry a Type. Fields of other dialects (zsh, mksh, bats) are left out on purpose.

POS = "pos"
FLAG = "flag"
OP = "op"
TEXT = "text"

_FIELDS: dict[str, dict[str, str]] = {
    "File": {"Name": TEXT, "Stmts": "stmts", "Last": "comments"},
    "Stmt": {
        "Comments": "comments",
        "Cmd": "cmd",
        "Position": POS,
        "Semicolon": POS,
        "Negated": FLAG,
        "Background": FLAG,
        "Redirs": "redirs",
    },
    "Comment": {"Hash": POS, "Text": TEXT},
    # commands
    "CallExpr": {"Assigns": "assigns", "Args": "words"},
    "IfClause": {
        "Position": POS,
        "ThenPos": POS,
        "FiPos": POS,
        "Cond": "stmts",
        "CondLast": "comments",
        "Then": "stmts",
        "ThenLast": "comments",
        "Else": "if",
        "Last": "comments",
    },
    "WhileClause": {
        "WhilePos": POS,
        "DoPos": POS,
        "DonePos": POS,
        "Until": FLAG,
        "Cond": "stmts",
        "CondLast": "comments",
        "Do": "stmts",
        "DoLast": "comments",
    },
    "ForClause": {
        "ForPos": POS,
        "DoPos": POS,
        "DonePos": POS,
        "Select": FLAG,
        "Loop": "loop",
        "Do": "stmts",
        "DoLast": "comments",
    },
    "WordIter": {"Name": "lit", "InPos": POS, "Items": "words"},
    "CStyleLoop": {"Lparen": POS, "Rparen": POS, "Init": "arith", "Cond": "arith", "Post": "arith"},
    "CaseClause": {"Case": POS, "In": POS, "Esac": POS, "Word": "word", "Items": "items", "Last": "comments"},
    "CaseItem": {
        "Op": OP,
        "OpPos": POS,
        "Comments": "comments",
        "Patterns": "words",
        "Stmts": "stmts",
        "Last": "comments",
    },
    "Block": {"Lbrace": POS, "Rbrace": POS, "Stmts": "stmts", "Last": "comments"},
    "Subshell": {"Lparen": POS, "Rparen": POS, "Stmts": "stmts", "Last": "comments"},
    "BinaryCmd": {"OpPos": POS, "Op": OP, "X": "stmt", "Y": "stmt"},
    "FuncDecl": {"Position": POS, "RsrvWord": FLAG, "Parens": FLAG, "Name": "lit", "Body": "stmt"},
    "ArithmCmd": {"Left": POS, "Right": POS, "X": "arith"},
    "TestClause": {"Left": POS, "Right": POS, "X": "test"},
    "DeclClause": {"Variant": "lit", "Args": "assigns"},
    "LetClause": {"Let": POS, "Exprs": "ariths"},
    "TimeClause": {"Time": POS, "PosixFormat": FLAG, "Stmt": "stmt"},
    "CoprocClause": {"Coproc": POS, "Name": "word", "Stmt": "stmt"},
    # pieces
    "Assign": {"Append": FLAG, "Naked": FLAG, "Name": "lit", "Index": "arith", "Value": "word", "Array": "array"},
    "ArrayExpr": {"Lparen": POS, "Rparen": POS, "Elems": "elems", "Last": "comments"},
    "ArrayElem": {"Index": "arith", "Value": "word", "Comments": "comments"},
    "Redirect": {"OpPos": POS, "Op": OP, "N": "lit", "Word": "word", "Hdoc": "word"},
    "Word": {"Parts": "parts"},
    # word parts
    "Lit": {"ValuePos": POS, "ValueEnd": POS, "Value": TEXT},
    "SglQuoted": {"Left": POS, "Right": POS, "Dollar": FLAG, "Value": TEXT},
    "DblQuoted": {"Left": POS, "Right": POS, "Dollar": FLAG, "Parts": "parts"},
    "ParamExp": {
        "Dollar": POS,
        "Rbrace": POS,
        "Short": FLAG,
        "Excl": FLAG,
        "Length": FLAG,
        "Param": "lit",
        "Index": "arith",
        "Slice": "slice",
        "Repl": "repl",
        "Names": OP,
        "Exp": "exp",
    },
    "Slice": {"Offset": "arith", "Length": "arith"},
    "Replace": {"All": FLAG, "Orig": "word", "With": "word"},
    "Expansion": {"Op": OP, "Word": "word"},
    "CmdSubst": {"Left": POS, "Right": POS, "Stmts": "stmts", "Last": "comments"},
    "ArithmExp": {"Left": POS, "Right": POS, "Bracket": FLAG, "X": "arith"},
    "ProcSubst": {"OpPos": POS, "Rparen": POS, "Op": OP, "Stmts": "stmts", "Last": "comments"},
    "ExtGlob": {"OpPos": POS, "Op": OP, "Pattern": "lit"},
    # arithmetic and test expressions
    "BinaryArithm": {"OpPos": POS, "Op": OP, "X": "arith", "Y": "arith"},
    "UnaryArithm": {"OpPos": POS, "Op": OP, "Post": FLAG, "X": "arith"},
    "ParenArithm": {"Lparen": POS, "Rparen": POS, "X": "arith"},
    "BinaryTest": {"OpPos": POS, "Op": OP, "X": "test", "Y": "test"},
    "UnaryTest": {"OpPos": POS, "Op": OP, "X": "test"},
    "ParenTest": {"Lparen": POS, "Rparen": POS, "X": "test"},
}
# which node types each slot may hold (typed slots carry a Type key; the rest are implied)
_TYPED: dict[str, frozenset[str]] = {
    "cmd": frozenset(
        {
            "CallExpr",
            "IfClause",
            "WhileClause",
            "ForClause",
            "CaseClause",
            "Block",
            "Subshell",
            "BinaryCmd",
            "FuncDecl",
            "ArithmCmd",
            "TestClause",
            "DeclClause",
            "LetClause",
            "TimeClause",
            "CoprocClause",
        }
    ),
    "part": frozenset({"Lit", "SglQuoted", "DblQuoted", "ParamExp", "CmdSubst", "ArithmExp", "ProcSubst", "ExtGlob"}),
    "arith": frozenset({"BinaryArithm", "UnaryArithm", "ParenArithm", "Word"}),
    "test": frozenset({"BinaryTest", "UnaryTest", "ParenTest", "Word"}),
    "loop": frozenset({"WordIter", "CStyleLoop"}),
}
_IMPLIED = {
    "stmt": "Stmt",
    "word": "Word",
    "lit": "Lit",
    "if": "IfClause",
    "array": "ArrayExpr",
    "slice": "Slice",
    "repl": "Replace",
    "exp": "Expansion",
}
_LISTS = {
    "stmts": "Stmt",
    "words": "Word",
    "comments": "Comment",
    "redirs": "Redirect",
    "assigns": "Assign",
    "items": "CaseItem",
    "elems": "ArrayElem",
}
_TYPED_LISTS = {"parts": "part", "ariths": "arith"}
_POS_KEYS = frozenset({"Offset", "Line", "Col"})

Entry = tuple[int, int, str]
"""A word as (start, end, value): character offsets into the text, the quote-removed value."""


class Extractor:
    """One walk over one shfmt tree: checks it against the vocabulary and collects the simple
    commands the primary records (`SyntacticCommand`), in the same shape."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        self._chars: list[int] | None = None
        self.commands: list[tuple[Entry, ...]] = []

    # -- positions and source ---------------------------------------------------------------

    def char(self, offset: int) -> int:
        if len(self.data) == len(self.text):
            return offset
        if self._chars is None:
            table = [0] * (len(self.data) + 1)
            pos = 0
            for i, ch in enumerate(self.text):
                for k in range(len(ch.encode("utf-8"))):
                    table[pos + k] = i
                pos += len(ch.encode("utf-8"))
            table[len(self.data)] = len(self.text)
            self._chars = table
        return self._chars[offset]

    @staticmethod
    def offset(node: dict[str, Any], key: str) -> int:
        pos = node.get(key)
        if not isinstance(pos, dict) or not isinstance(pos.get("Offset", 0), int):
            raise Disagreement(f"shfmt gave no position {key!r}")
        return int(pos.get("Offset", 0))  # encoding/json leaves a zero out

    def span(self, node: dict[str, Any]) -> tuple[int, int]:
        start, end = self.offset(node, "Pos"), self.offset(node, "End")
        if not 0 <= start <= end <= len(self.data):
            raise Disagreement(f"shfmt gave a span {start}-{end} outside the text")
        return start, end

    def src(self, start: int, end: int) -> str:
        return self.data[start:end].decode("utf-8")

    # -- the vocabulary check ---------------------------------------------------------------

    def check(self, node: Any, kind: str) -> None:
        """`node` is a `kind` node with only known fields of known shapes (children are checked
        as they are visited)."""
        if not isinstance(node, dict):
            raise Disagreement(f"shfmt gave a {type(node).__name__} where a {kind} belongs")
        fields = _FIELDS[kind]
        for key, value in node.items():
            if key in ("Type", "Pos", "End"):
                continue
            what = fields.get(key)
            if what is None:
                raise Disagreement(f"unknown field {kind}.{key} in shfmt's tree")
            if what == POS:
                if not isinstance(value, dict) or not set(value) <= _POS_KEYS:
                    raise Disagreement(f"{kind}.{key} is not a position")
            elif what == FLAG:
                if value is not True:
                    raise Disagreement(f"{kind}.{key} is not a flag")
            elif what in (OP, TEXT):
                if not isinstance(value, str):
                    raise Disagreement(f"{kind}.{key} is not text")
            elif (what in _LISTS or what in _TYPED_LISTS) and not isinstance(value, list):
                raise Disagreement(f"{kind}.{key} is not a list")

    def typed(self, node: Any, slot: str) -> str:
        kind = node.get("Type") if isinstance(node, dict) else None
        if kind not in _TYPED[slot]:
            raise Disagreement(f"unknown node {kind!r} in shfmt's tree (where a {slot} belongs)")
        self.check(node, kind)
        return str(kind)

    def implied(self, node: Any, kind: str) -> None:
        if isinstance(node, dict) and node.get("Type", kind) != kind:
            raise Disagreement(f"unknown node {node.get('Type')!r} in shfmt's tree (where a {kind} belongs)")
        self.check(node, kind)

    def children(self, node: dict[str, Any], kind: str) -> None:
        """Visit every child of a checked node for the commands inside it."""
        for key, what in _FIELDS[kind].items():
            value = node.get(key)
            if value is None or what in (POS, FLAG, OP, TEXT):
                continue
            if what in _TYPED:
                self.visit(value, what)
            elif what in _IMPLIED:
                self.visit(value, _IMPLIED[what])
            elif what in _LISTS:
                for item in value:
                    self.visit(item, _LISTS[what])
            else:
                for item in value:
                    self.visit(item, _TYPED_LISTS[what])

    # -- the walk -----------------------------------------------------------------------------

    def file(self, tree: Any) -> tuple[tuple[Entry, ...], ...]:
        if not isinstance(tree, dict) or tree.get("Type") != "File":
            raise Disagreement("shfmt's tree does not start with a File")
        self.check(tree, "File")
        self.children(tree, "File")
        return tuple(self.commands)

    def visit(self, node: Any, kind: str) -> None:
        if kind in _TYPED:
            kind = self.typed(node, kind)
        else:
            self.implied(node, kind)
        clause = node.get("Cmd") if kind == "Stmt" else None
        if isinstance(clause, dict) and clause.get("Type") in ("TimeClause", "CoprocClause"):
            self.keyword_clause(clause, self.typed(clause, "cmd"))
            for item in node.get("Redirs", []):
                self.visit(item, "Redirect")
            return
        if kind == "CallExpr" and node.get("Args"):
            self.commands.append(tuple(self.word(w) for w in node["Args"]))
        elif kind == "DeclClause":
            self.implied(node["Variant"], "Lit")
            variant = self.span(node["Variant"])
            head: Entry = (self.char(variant[0]), self.char(variant[1]), str(node["Variant"]["Value"]))
            self.commands.append((head, *(self.assign(a) for a in node.get("Args", []))))
        elif kind == "TestClause":
            left, right = self.offset(node, "Left"), self.offset(node, "Right")
            leaves: list[Entry] = []
            self.test_leaves(node["X"], leaves)
            self.commands.append(
                (
                    (self.char(left), self.char(left + 2), "[["),
                    *sorted(leaves),
                    (self.char(right), self.char(right + 2), "]]"),
                )
            )
        elif kind == "LetClause":
            let = self.offset(node, "Let")
            exprs = [self.arith_word(e) for e in node.get("Exprs", [])]
            self.commands.append(((self.char(let), self.char(let + 3), "let"), *exprs))
        self.children(node, kind)

    def keyword_clause(self, node: dict[str, Any], kind: str) -> None:
        """`time [-p] cmd` and `coproc cmd`: the primary reads the keyword as the first word of
        the command it runs (and unwraps it, as a wrapper); shfmt as a clause around a statement.
        Compared where that statement is a plain simple command."""
        keyword = "time" if kind == "TimeClause" else "coproc"
        start = self.offset(node, "Time" if kind == "TimeClause" else "Coproc")
        words: list[Entry] = [(self.char(start), self.char(start + len(keyword)), keyword)]
        inner = node.get("Stmt")
        if node.get("PosixFormat"):
            after = start + len(keyword)
            end = self.offset(inner, "Pos") if inner is not None else len(self.data)
            found = re.fullmatch(rb"([ \t]+)-p[ \t]*", self.data[after:end])
            if found is None:
                raise Uncomparable("`time -p`: shfmt gave no place for -p")
            at = after + found.end(1)
            words.append((self.char(at), self.char(at + 2), "-p"))
        if inner is None and kind == "TimeClause":
            self.commands.append(tuple(words))
            return
        self.implied(inner, "Stmt")
        assert isinstance(inner, dict)
        cmd = inner.get("Cmd")
        if (
            "Name" in node
            or inner.get("Negated")
            or not isinstance(cmd, dict)
            or cmd.get("Type") != "CallExpr"
            or not cmd.get("Args")
            or cmd.get("Assigns")
        ):
            raise Uncomparable(
                f"`{keyword}` before anything but a plain simple command: the parsers model it differently"
            )
        self.check(cmd, "CallExpr")
        self.commands.append((*words, *(self.word(w) for w in cmd["Args"])))
        for item in inner.get("Redirs", []):
            self.visit(item, "Redirect")
        for word in cmd["Args"]:
            self.visit(word, "Word")

    def test_leaves(self, node: Any, out: list[Entry]) -> None:
        kind = self.typed(node, "test")
        if kind == "Word":
            out.append(self.word(node))
            return
        if kind == "ParenTest":
            left, right = self.offset(node, "Lparen"), self.offset(node, "Rparen")
            out += [(self.char(left), self.char(left + 1), "("), (self.char(right), self.char(right + 1), ")")]
        else:
            op = str(node["Op"])
            at = self.offset(node, "OpPos")
            if self.data[at : at + len(op)] != op.encode():
                raise Disagreement(f"test operator {op!r} is not at {at}")
            out.append((self.char(at), self.char(at + len(op)), op))
        for key in ("X", "Y"):
            if key in node:
                self.test_leaves(node[key], out)

    def assign(self, node: Any) -> Entry:
        """An operand of declare / export / local ...: as the primary reads it, `name=value`
        quote-removed after the `=`, or the word itself."""
        self.implied(node, "Assign")
        start, end = self.span(node)
        if "Name" not in node:
            if "Value" not in node:
                raise Disagreement("a declaration operand with neither name nor value")
            return self.word(node["Value"])
        if "Value" in node:
            value_start = self.span(node["Value"])[0]
            value = self.src(start, value_start) + self.word(node["Value"])[2]
        elif "Array" in node:
            value = self.src(start, end)  # kept as written, as the primary does
        else:
            value = self.src(start, end)
        return self.char(start), self.char(end), value

    def arith_word(self, node: Any) -> Entry:
        """An argument of `let`: the words in it quote-removed, the operators between as written."""
        start, end = self.span(node)
        leaves: list[tuple[int, int, str]] = []
        self.arith_leaves(node, leaves)
        out: list[str] = []
        pos = start
        for a, b, value in sorted(leaves):
            out.append(self.src(pos, a))
            out.append(value)
            pos = b
        out.append(self.src(pos, end))
        return self.char(start), self.char(end), "".join(out)

    def arith_leaves(self, node: Any, out: list[tuple[int, int, str]]) -> None:
        kind = self.typed(node, "arith")
        if kind == "Word":
            a, b = self.span(node)
            out.append((a, b, self.word(node)[2]))
            return
        for key in ("X", "Y"):
            if key in node:
                self.arith_leaves(node[key], out)

    def word(self, node: Any) -> Entry:
        """A word's span and value, by the primary's rules: quotes removed, expansions kept as
        written."""
        self.implied(node, "Word")
        parts = node.get("Parts") or []
        if not parts:
            raise Disagreement("a word without parts in shfmt's tree")
        start, end = self.span(node)
        values: list[str] = []
        for i, part in enumerate(parts):
            kind = self.typed(part, "part")
            values.append(self.part_value(part, kind, first=i == 0, quoted=False))
        return self.char(start), self.char(end), "".join(values)

    def part_value(self, part: dict[str, Any], kind: str, first: bool, quoted: bool) -> str:
        try:
            if kind == "Lit":
                value = str(part.get("Value", ""))
                if quoted:
                    return lex.double_quoted(value)[0]
                return lex.unquoted(value, at_word_start=first)[0]
            if kind == "SglQuoted":
                value = str(part.get("Value", ""))
                return lex.ansi_c(value) if part.get("Dollar") else value
            if kind == "DblQuoted":
                inner = part.get("Parts") or []
                return "".join(self.part_value(p, self.typed(p, "part"), first=False, quoted=True) for p in inner)
        except (lex.UnmodelledSubstitution, lex.UnmodelledEscape) as exc:
            raise Disagreement(f"a {kind} the primary would not take: {exc}") from None
        start, end = self.span(part)
        raw = self.src(start, end)
        if kind == "ExtGlob":
            return lex.unquoted(raw, at_word_start=False)[0]
        return raw  # $x ${x} $(...) $((...)) <(...): kept as written
