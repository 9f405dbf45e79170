"""The files an asked command runs, and an approval bound to their content.

A supervisor who approves `make build` or `bash deploy.sh` approves what those files say at the
time they read them. `named()` finds the files of the principal's roots an analysed command
runs: a script given to a shell or an interpreter (`bash x.sh`, `sh x`, `python3 x.py`, `node
x.js`, `perl x.pl`, `ruby x.rb`, a script on the interpreter's stdin: `bash < x.sh`), a program
named by a path (`./x.sh`, `tools/gen`), make's makefile (`-f F`, else GNUmakefile, makefile,
Makefile in the directory make runs in, `-C` included: the ones before the one make would read
are bound as absent, so planting one voids the approval), a patch (`git apply P`, `git am P`,
`patch -i P`, `patch < P`, `patch FILE P`). `bind()` reads each as the sandbox's account would
(its file-system identity; opened with openat2 beneath the root it lies in, so a symlink the
agent planted cannot lead the read out of the roots) and keeps its SHA-256 and size; `changed()`
reads them again and names each file whose content is not what was approved.

The files those load are bound too (`Follow`): make's `include`/`-include`/`sinclude`/`load`
lines (searched in make's directory, then its `-I` directories), a shell script's `source F` /
`. F`; and the files the environment the command starts with names (LOADER_VARIABLES:
MAKEFILES, MAKEFLAGS' `-I`, NODE_OPTIONS, RUBYOPT, BASH_ENV, PYTHONSTARTUP).

What an interpreter imports is bound too (gateway/imports.py reads the bound text): Python's
imports and Node's relative requires, each as a *lookup* of the directory the interpreter looks
in (`python-lookup`, `node-lookup`: every file it could load the module from there, python's
`__pycache__` copies with their content), so a module planted ahead of the approved one voids
the approval; the module found is bound and read for its own imports in turn.

A file that cannot be bound (named by an expansion, unreadable, leading out of its root, too
large, an include named by a variable or a pattern) is listed with its `error`: an approval of
that call is void, as the supervisor is told. What an interpreter loads by a name known only at
run time (`importlib.import_module(x)`, `require(x)`, a package of the workspace's node_modules)
is listed as a `notice`: shown to the supervisor (`NOT BOUND`), voiding nothing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import stat
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from gateway import imports
from gateway.analysis import Command, RedirectMode, Word
from gateway.analysis.model import Context, Expansion
from gateway.analysis.primary import parse_tree
from gateway.sandbox import identity
from gateway.sandbox.descriptors import RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, open_absolute, openat2

MAX_BYTES = 64 << 20
"""A file larger than this is not read whole: it cannot be bound."""
MAX_FILES = 64
"""Files bound per call at most; a call naming more cannot be bound (an error entry)."""
MAX_LOOKUPS = 512
"""Module lookups (and notices) per call at most; past them, the call cannot be bound."""
MAX_CWDS = 16
"""Directories a text's `cd`s may lead to that are followed; past them nothing can be bound."""
UNFIXED = "known only at run time (named by an expansion, or in a directory the text does not fix)"
HEAD_CHARS = 4000
"""Characters of each file shown to the supervisor (`approvals show`)."""

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
_RUBY_LONG_WITH_VALUE = (
    "--encoding", "--external-encoding", "--internal-encoding", "--enable", "--disable", "--dump",
    "--backtrace-limit", "--crash-report", "--parser",
)  # fmt: skip
# per interpreter: options taking a value (apart), and options whose value is the program text
# (perl's -x takes its directory attached only: `perl -x s.pl` runs s.pl)
_INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "shell": (frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}), frozenset({"-c"})),
    "python": (frozenset({"-W", "-X", "--check-hash-based-pycs"}), frozenset({"-c", "-m"})),
    "node": (frozenset({"-r", "--require", "--import", "--loader"}), frozenset({"-e", "--eval", "-p", "--print"})),
    "perl": (frozenset({"-I", "-M", "-m"}), frozenset({"-e", "-E"})),
    "ruby": (frozenset({"-I", "-r", "-C", *_RUBY_LONG_WITH_VALUE}), frozenset({"-e"})),
}
# options whose value is a file of code the interpreter loads before the script (when it is a path)
_PRELOADS = {"node": frozenset({"-r", "--require", "--import", "--loader"}), "ruby": frozenset({"-r"})}
MAKEFILES = ("GNUmakefile", "makefile", "Makefile")
# GNU make's long options (getopt_long takes any unambiguous prefix: `--dir=sub` is --directory)
# -> its short letter; the ones taking a value apart marked
_MAKE_LONG = {
    "always-make": "B", "directory": "C=", "debug": "d", "environment-overrides": "e", "eval": "E=",
    "file": "f=", "makefile": "f=", "help": "h", "ignore-errors": "i", "include-dir": "I=", "jobs": "j",
    "jobserver-style": "-=", "keep-going": "k", "load-average": "l", "check-symlink-times": "L",
    "just-print": "n", "dry-run": "n", "recon": "n", "old-file": "o=", "assume-old": "o=",
    "output-sync": "O", "print-data-base": "p", "question": "q", "no-builtin-rules": "r",
    "no-builtin-variables": "R", "shuffle": "-", "silent": "s", "quiet": "s", "no-silent": "-",
    "no-keep-going": "S", "stop": "S", "touch": "t", "trace": "-", "version": "v",
    "print-directory": "w", "no-print-directory": "-", "what-if": "W=", "new-file": "W=",
    "assume-new": "W=", "warn-undefined-variables": "-", "jobserver-auth": "-=", "jobserver-fds": "-=",
}  # fmt: skip
_MAKE_SHORT_WITH_VALUE = "CEfIoW"
_MAKE_LONGS = {name: (code[0], code.endswith("=")) for name, code in _MAKE_LONG.items()}


@dataclass(frozen=True)
class BoundFile:
    """One file an asked command runs, as the sandbox's account read it."""

    path: str
    """Absolute, as the command names it (relative to its cwd)."""
    why: str
    """What runs it (`make's makefile`, `bash's script`, ...)."""
    sha256: str | None = None
    """None: absent (or unreadable: see `error`)."""
    bytes: int | None = None
    error: str = ""
    head: str = ""
    """The first HEAD_CHARS characters (shown to the supervisor; not part of the binding); for
    a lookup, what it found."""
    kind: str = "file"
    """`file`; `python-lookup` / `node-lookup`: where an interpreter looks for a module the
    bound code imports (`path` is the directory and the name): `sha256` binds what is there
    (the files a module could be loaded from, `__pycache__`'s compiled ones with their content),
    so one planted ahead of the approved module voids the approval; `notice`: what the bound
    code loads that cannot be bound (`why` says what), told to the supervisor, voiding nothing."""

    @property
    def state(self) -> tuple[str | None, int | None, str]:
        """What the approval binds."""
        return (self.sha256, self.bytes, self.error)

    def describe(self) -> str:
        if self.kind == "notice":
            return f"{self.path}: NOT BOUND: {self.why}"
        if self.kind.endswith("-lookup"):
            found = f"finds {self.head}" if self.head else "nothing there now (one planted voids the approval)"
            return f"{self.path}: looked up, {found}"
        if self.error:
            return f"{self.path}: cannot be bound ({self.error})"
        if self.sha256 is None:
            return f"{self.path}: absent"
        return f"{self.path}: {self.bytes} bytes, sha256 {self.sha256}"

    def to_json(self, head: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "why": self.why, "sha256": self.sha256, "bytes": self.bytes}
        if self.error:
            out["error"] = self.error
        if self.kind != "file":
            out["kind"] = self.kind
        if (head or self.kind != "file") and self.head:
            out["head"] = self.head
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> BoundFile:
        return BoundFile(
            str(data.get("path", "?")), str(data.get("why", "")), data.get("sha256"), data.get("bytes"),
            str(data.get("error", "")), str(data.get("head", "")), str(data.get("kind", "file")),
        )  # fmt: skip


LOADER_VARIABLES = ("MAKEFILES", "MAKEFLAGS", "GNUMAKEFLAGS", "NODE_OPTIONS", "RUBYOPT", "BASH_ENV", "PYTHONSTARTUP")
"""Variables of the environment that make a program named in the text load files: bound too."""
MAX_DEPTH = 8
"""Files loading files (an include of an include...) followed this deep; past it, unbindable."""
MAX_SCAN = 1 << 20
"""A makefile or script larger than this is not read for the files it loads: they cannot be bound."""


@dataclass(frozen=True)
class Follow:
    """How a bound file is read for the files it loads in turn: make's `include`, `-include`,
    `sinclude` and `load` lines (relative names against make's directory, then its `-I`
    directories), a shell script's `source F` / `. F` (relative to where the script runs)."""

    kind: str
    """`make`, `shell`, or `shebang` (a program named by a path: followed as a shell script when
    its `#!` line names a shell)."""
    dirs: tuple[str, ...] | str
    """Where the program runs (relative names lead there); a string: why that is known only at run time."""
    incdirs: tuple[Word, ...] = ()
    """make's include directories (`-I`, MAKEFLAGS), each relative to make's directory."""
    depth: int = 0
    top: str = ""
    """python: the script's `sys.path[0]` (empty: the bound script's own directory)."""
    package: str | None = None
    """python: the directory of the package the bound module belongs to (its relative imports)."""
    rest: tuple[str, ...] = ()
    """python-lookup: the components of the module name below the one looked for."""
    leaves: tuple[str, ...] = ()
    """python-lookup: what `from M import a, b` names, looked for as modules when M is a package."""

    @staticmethod
    def python(top: str = "", package: str | None = None, depth: int = 0) -> Follow:
        return Follow("python", (), depth=depth, top=top, package=package)

    @staticmethod
    def node(depth: int = 0) -> Follow:
        return Follow("node", (), depth=depth)

    @staticmethod
    def make(bases: list[Path] | str, incdirs: list[Word]) -> Follow:
        return Follow("make", bases if isinstance(bases, str) else tuple(map(str, bases)), tuple(incdirs))

    @staticmethod
    def shell(bases: list[Path] | str, shebang: bool = False) -> Follow:
        dirs = bases if isinstance(bases, str) else tuple(map(str, bases))
        return Follow("shebang" if shebang else "shell", dirs)

    def include(self, word: Word, why: str, out: dict[str, str], follows: dict[str, Follow]) -> None:
        """A makefile MAKEFILES names, searched for as an include: every candidate kept."""
        for group in self._candidates(word.value if word.literal else "$", why, "MAKEFILES"):
            for f in group:
                out.setdefault(f.path, f.why)
                if f.follow is not None:
                    follows.setdefault(f.path, f.follow)

    def _candidates(self, name: str, why: str, line: str, sets_makeflags: bool = False) -> list[list[Found]]:
        """Where make looks for an included `name`: one group per directory make may run in,
        tried in order (make reads the first that exists)."""
        if any(c in name for c in "$*?[\\") or name.startswith("~"):
            return [
                [Found(f"?{name}", f"{why} ({line}: named by a variable, a pattern or ~, known only when make runs)")]
            ]
        nxt = replace(self, depth=self.depth + 1)
        if name.startswith("/"):
            return [[Found(_join("/", name), why, nxt)]]
        if isinstance(self.dirs, str):
            return [[Found(f"?{name}", f"{why}, in a directory known only at run time: {self.dirs}")]]
        groups = []
        for d in self.dirs:
            group = [Found(_join(d, name), why, nxt)]
            for inc in self.incdirs:
                if not inc.literal:
                    group.append(
                        Found(f"?{inc.raw or inc.value}/{name}", f"{why} (an include directory named by an expansion)")
                    )
                    break
                group.append(Found(_join(_join(d, inc.value), name), why, nxt))
            if sets_makeflags:  # the makefile may add include directories: past the known ones, unknown
                group.append(
                    Found(f"?{name}", f"{why} (the makefiles set MAKEFLAGS, which may add include directories)")
                )
            groups.append(group)
        return groups

    def loads(self, content: bytes, path: str) -> list[list[Found]]:
        """The files `content` (the file at `path`) loads, in groups of alternatives (make's
        search: the first that exists is read); an unbindable one as a `?` entry."""
        text = content.decode("utf-8", "surrogateescape")
        name = os.path.basename(path)
        if self.depth >= MAX_DEPTH:
            return [[Found(f"?{path}", f"a file {name} loads (more than {MAX_DEPTH} levels of files loading files)")]]
        if self.kind == "make":
            return self._make_loads(text, name)
        if self.kind == "python":
            return self._python_loads(text, path)
        if self.kind == "node":
            return self._node_loads(text, path)
        if self.kind == "shebang" and not _shell_shebang(text):
            return []
        return self._shell_loads(text, name)

    def _python_loads(self, text: str, path: str) -> list[list[Found]]:
        """Where python looks for each module the text imports: one lookup each (gateway/imports.py)."""
        top = self.top or os.path.dirname(path)
        wanted, notices = imports.python_imports(text, top, self.package)
        name = os.path.basename(path)
        groups = [[Found(f"!{path}", f"{name}: {n}")] for n in notices]
        for w in wanted:
            why = f"{name} line {w.line} imports {'.'.join((w.name, *w.rest))}"
            look = Follow("python-lookup", (w.directory,), depth=self.depth + 1, top=top, rest=w.rest, leaves=w.leaves)
            groups.append([Found(_join(w.directory, w.name), why, look)])
        return groups

    def _node_loads(self, text: str, path: str) -> list[list[Found]]:
        """Where node looks for each file the text requires; a package from a node_modules of the
        roots cannot be bound (all of it could run): a notice."""
        directory = os.path.dirname(path)
        wanted, packages, notices = imports.node_requires(text, directory)
        name = os.path.basename(path)
        groups = [[Found(f"!{path}", f"{name}: {n}")] for n in notices]
        for w in wanted:
            look = Follow("node-lookup", (directory,), depth=self.depth + 1)
            groups.append([Found(_join(directory, w.name), f"{name} line {w.line} loads {w.name}", look)])
        if packages and _node_modules_above(directory):
            shown = ", ".join(packages[:8]) + (f" and {len(packages) - 8} more" if len(packages) > 8 else "")
            groups.append([Found(f"!{path}", f"{name} loads {shown} from a node_modules of the workspace")])
        return groups

    def _make_loads(self, text: str, name: str) -> list[list[Found]]:
        text = re.sub(r"\\\r?\n[ \t]*", " ", text)  # make joins a continued line with one space
        sets_makeflags = _MAKEFLAGS_SET.search(text) is not None
        groups: list[list[Found]] = []
        for raw in text.split("\n"):
            m = _MAKE_DIRECTIVE.match(_uncomment(raw))
            if m is None or not m.group(2).strip():
                continue
            directive, names = m.group(1), m.group(2).strip()
            why = f"a file {name} {'loads' if directive.endswith('load') else 'includes'} ({directive})"
            if "$" in names:  # a variable or a function: what it names is known only when make runs
                groups.append(
                    [Found(f"?{names}", f"{why}: named by a variable or function, known only when make runs")]
                )
                continue
            for word in names.split():
                if directive.endswith("load"):  # a shared object make loads: bound, not read for more
                    word = word.split("(", 1)[0]
                    groups += [[f._replace(follow=None) for f in g] for g in self._candidates(word, why, directive)]
                else:
                    groups += self._candidates(word, why, directive, sets_makeflags)
        return groups

    def _shell_loads(self, text: str, name: str) -> list[list[Found]]:
        why = f"a file {name} sources"
        if not _SOURCE_HINT.search(text):
            return []
        root = parse_tree(text)
        if root.has_error:
            return [[Found(f"?{name}", f"{why}: the shell parser cannot read {name} whole to tell which")]]
        data = text.encode("utf-8", "surrogateescape")
        nodes = [root]
        sourced: list[str | None] = []  # None: named by an expansion
        moves = False
        while nodes:
            node = nodes.pop()
            nodes.extend(reversed(node.children))
            if node.type != "command":
                continue
            head = node.child_by_field_name("name")
            program = data[head.start_byte : head.end_byte].decode("utf-8", "surrogateescape") if head else ""
            if program in ("cd", "pushd", "popd"):
                moves = True
            if program not in ("source", "."):
                continue
            args = node.children_by_field_name("argument")
            if args and data[args[0].start_byte : args[0].end_byte] == b"--":
                args = args[1:]
            sourced.append(_static_word(args[0], data) if args else None)
        groups: list[list[Found]] = []
        nxt = replace(self, kind="shell", depth=self.depth + 1)
        for target in sourced:
            if target is None or target.startswith(("-", "~")):
                groups.append(
                    [Found(f"?{name}: source", f"{why} a file named by an expansion, known only at run time")]
                )
            elif target.startswith("/"):
                groups.append([Found(_join("/", target), why, nxt)])
            elif isinstance(self.dirs, str) or moves:
                where = self.dirs if isinstance(self.dirs, str) else f"{name} changes directory"
                groups.append([Found(f"?{target}", f"{why}, in a directory known only at run time: {where}")])
            else:
                groups += [[Found(_join(d, target), why, nxt)] for d in self.dirs]
        return groups


class Found(NamedTuple):
    """A file an asked command runs: where, why, and how it is read for the files it loads."""

    path: str
    why: str
    follow: Follow | None = None


_MAKE_DIRECTIVE = re.compile(r"^[ \t]*(-include|sinclude|include|-load|load)(?:[ \t]+(.*)|$)")
_MAKEFLAGS_SET = re.compile(
    r"^[ \t]*(?:(?:override|export|unexport|private)[ \t]+)*(?:GNU)?MAKEFLAGS[ \t]*(?:\+|::?|:::|\?|!)?=", re.M
)
_SOURCE_HINT = re.compile(r"(?:^|[\s;&|(){}`!])(?:source|\.)(?:[ \t]|$)", re.M)


def _uncomment(line: str) -> str:
    """A makefile line without its comment (a `#` not escaped by a backslash)."""
    m = re.search(r"(?<!\\)#", line)
    return line if m is None else line[: m.start()]


def _shell_shebang(text: str) -> bool:
    """Does the `#!` line run a shell (`#!/bin/sh`, `#!/usr/bin/env bash`)?"""
    if not text.startswith("#!"):
        return False
    words = text[2:].split("\n", 1)[0].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return bool(words) and os.path.basename(words[0]) in SHELLS


def _static_word(node: Any, data: bytes) -> str | None:
    """The text of a shell word with nothing expanded in it (`lib.sh`, 'lib.sh', "lib.sh"), or None."""
    raw = data[node.start_byte : node.end_byte].decode("utf-8", "surrogateescape")
    if node.type == "raw_string":
        return raw[1:-1]
    if node.type == "string" and all(c.type == "string_content" for c in node.named_children):
        inner = raw[1:-1]
        return None if any(c in inner for c in "$`\\") else inner
    if node.type == "word" and not any(c in raw for c in "$`\\*?[{'\""):
        return raw
    return None


def _interpreter(program: str) -> str | None:
    name = os.path.basename(program)
    if name in SHELLS:
        return "shell"
    for family in ("python", "node", "perl", "ruby"):
        if name == family or (name.startswith(family) and all(c.isdigit() or c == "." for c in name[len(family) :])):
            return family
    return None


STDIN_NAMES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
"""Names a program given a file reads its standard input by (`make -f -`, `bash /dev/stdin`)."""


def _stdin_of(cmd: Command) -> Word | None:
    return next((r.target for r in cmd.redirects if r.mode is RedirectMode.READ and r.fd in (None, 0)), None)


def _stdin_source(cmd: Command) -> Word | str | None:
    """Where a program's standard input comes from: a file (`< x.mk`), or why that is known only
    at run time (`cat x.py | python3`: another command's output), or None (text of the command
    itself, a here-document, or the gateway's own empty input). The first command of a pipeline
    is counted as reading a pipe too."""
    for r in cmd.redirects:
        if r.fd in (None, 0) and r.mode is RedirectMode.READ:
            return r.target
        if r.fd in (None, 0) and r.mode in (RedirectMode.HEREDOC, RedirectMode.HERESTRING):
            return None
    if Context.PIPELINE in cmd.context:
        return "reads it from a pipe: what another command writes there is known only at run time"
    return None


@dataclass
class _Run:
    """What an interpreter's command line makes it read: its script (and files it loads first),
    a module it looks up beneath its directory (`python -m NAME`), the directory it changes to
    before it looks (`ruby -C DIR`), or why that cannot be told from the text."""

    files: list[Word]
    module: Word | None = None
    directory: Word | None = None
    unknown: str = ""


# per interpreter, its one-letter options (they may be grouped, `-xe`, `-Bm mod`): plain flags;
# those whose value is the rest of the word or else the next word; those whose value can only be
# the rest of the word; those whose value is program text. A letter outside these is unknown and
# the script cannot be told (no approval can bind it).
_SHORT: dict[str, tuple[str, str, str, str]] = {
    "shell": ("abefhklmnprstuvxBCDEHPTis", "oO", "", "c"),
    "python": ("bBdEhiIOPqsSuvVxR", "WXm", "", "c"),
    "perl": ("acnpsStTuUvwWX", "I", "CdDFiMmVx", "eE"),
    "ruby": ("acdhlnpsSvwy", "CIrE", "xFKTWi0", "e"),
}


def _script(cmd: Command, family: str) -> _Run:
    """The script an interpreter runs: its first operand, else its stdin; none with -c/-e (the
    analyser read the text); the files `node -r ./x.js` or `ruby -r ./x.rb` load first; the
    module of `python -m NAME`; ruby's `-C DIR`."""
    takes, inline = _INTERPRETERS[family]
    preloads = _PRELOADS.get(family, frozenset())
    run = _Run([])
    words = list(cmd.argv[1:])

    def value_of(flag: str, value: Word | None) -> None:
        if value is None:
            return
        if flag in preloads and value.value.startswith(("/", "./", "../")):
            run.files.append(value)  # a path: the file is loaded as code (a bare name is a package)
        elif family == "ruby" and flag == "-C":
            run.directory = value

    k = 0
    while k < len(words):
        w = words[k]
        v = w.value
        nxt = words[k + 1] if k + 1 < len(words) else None
        if v == "--":
            k += 1
            break
        if not v.startswith(("-", "+")) or v in ("-", "+"):
            break
        if v.startswith("--") or family == "node":
            flag, eq, attached = v.partition("=")
            if flag in inline:
                return _Run([])  # the program text is an argument: the analyser read it
            if flag in takes:
                value_of(flag, Word(attached, w.expansions, w.raw) if eq else nxt)
            k += 2 if flag in takes and not eq else 1
            continue
        plain, apart, attached_only, text = _SHORT[family]
        if not w.literal:
            run.unknown = f"{family} option {w.raw or v} known only at run time"
            return run
        k += 1
        body = v[1:]
        for n, ch in enumerate(body):
            rest = body[n + 1 :]
            if ch in text:
                return _Run([])  # the program text is an argument: the analyser read it
            if ch in apart:
                value = Word(rest, w.expansions, w.raw) if rest else nxt
                if not rest:
                    k += 1
                if family == "python" and ch == "m":
                    run.module = value
                    return run  # the module runs; what follows are its arguments
                value_of(f"-{ch}", value)
                break
            if ch in attached_only:
                value_of(f"-{ch}", Word(rest, w.expansions, w.raw))
                break
            if family == "perl" and ch in "l0":
                continue  # their digits follow: not letters of this table
            if ch.isdigit() and family == "perl":
                continue
            if ch not in plain:
                run.unknown = f"{family} option -{ch} (in {v}) is not one the gateway knows"
                return run
    if k < len(words):
        run.files.append(words[k])  # `-` or /dev/stdin: named() reads it as the stdin's source
        return run
    run.files.append(Word("-"))  # no script: it reads its standard input
    return run


def _getopt(
    words: list[Word], short_values: str, longs: dict[str, tuple[str, bool]], *, permute: bool
) -> Iterator[tuple[str, Word | None]]:
    """(option, its value) for each option of `short_values` or `longs` that takes one, as glibc's
    getopt_long reads `words`: short options grouped (`-kC sub`, `-sfx.mk`), a value attached or
    in the next word; long options by their name or a prefix that names one (`longs`: name ->
    (key, takes a value); names sharing a key are one option, as getopt_long judges ambiguity),
    the value after `=` or in the next word. `--` ends the options; so does the first operand
    unless `permute` (GNU programs read options after operands too). The value is None when the
    text ends first."""
    k = 0
    while k < len(words):
        w = words[k]
        v = w.value
        nxt = words[k + 1] if k + 1 < len(words) else None
        k += 1
        if v == "--":
            return
        if not v.startswith("-") or v == "-":
            if permute:
                continue
            return
        if v.startswith("--"):
            name, eq, value = v[2:].partition("=")
            hits = {longs[name]} if name in longs else {longs[o] for o in longs if name and o.startswith(name)}
            if len(hits) != 1:
                continue  # unknown or ambiguous: the program refuses to start
            key, takes = hits.pop()
            if takes:
                yield key, (Word(value, w.expansions, w.raw) if eq else nxt)
                k += 0 if eq else 1
            continue
        for n, letter in enumerate(v[1:], 1):
            if letter in short_values:
                rest = v[n + 1 :]
                yield letter, (Word(rest, w.expansions, w.raw) if rest else nxt)
                k += 0 if rest else 1
                break


def _make(cmd: Command) -> tuple[list[Word], list[Word], list[Word]]:
    """make's `-f` files, its `-C` directories (each relative to the one before, as make
    changes into them in turn) and its `-I` include directories, parsed as getopt does: `-kC
    sub`, `-sfx.mk`, `--dir=sub`, `--include-dir=inc`."""
    files: list[Word] = []
    dirs: list[Word] = []
    incdirs: list[Word] = []
    for key, arg in _getopt(list(cmd.argv[1:]), _MAKE_SHORT_WITH_VALUE, _MAKE_LONGS, permute=True):
        if arg is not None and key in "CfI":
            {"C": dirs, "f": files, "I": incdirs}[key].append(arg)
    return files, dirs, incdirs


def _makeflags_words(value: str) -> list[str]:
    """MAKEFLAGS as make reads it from the environment: a first word without a dash is a group
    of one-letter flags (`ks -I inc`)."""
    words = value.split()
    if words and not words[0].startswith("-"):
        words[0] = "-" + words[0]
    return words


def _makeflags_includes(value: str) -> list[Word]:
    """The include directories (`-I DIR`, `--include-dir=DIR`) MAKEFLAGS gives make."""
    words = [Word(w) for w in _makeflags_words(value)]
    return [arg for key, arg in _getopt(words, _MAKE_SHORT_WITH_VALUE, _MAKE_LONGS, permute=True)
            if key == "I" and arg is not None]  # fmt: skip


def _makeflags_eval(value: str) -> bool:
    """Does MAKEFLAGS give make text to evaluate (`--eval=TEXT`, `-E TEXT`): it may include anything."""
    words = [Word(w) for w in _makeflags_words(value)]
    return any(key == "E" for key, _ in _getopt(words, _MAKE_SHORT_WITH_VALUE, _MAKE_LONGS, permute=True))


def _makeflags_makefiles(value: str) -> list[str]:
    """The makefiles a `MAKEFILES=...` override in MAKEFLAGS (after its ` -- `) names."""
    words = _makeflags_words(value)
    return (
        [w.split("=", 1)[1] for w in words[words.index("--") + 1 :] if w.startswith("MAKEFILES=")]
        if "--" in words
        else []
    )


# the variable holding options an interpreter reads before its command line's
_ENV_OPTIONS = {"node": "NODE_OPTIONS", "ruby": "RUBYOPT"}
_NODE_PRELOADS = ("--require", "-r", "--import", "--loader", "--experimental-loader")


def _env_preloads(family: str, value: str | None) -> list[Word]:
    """The files NODE_OPTIONS (`--require ./x.js`, `-r`, `--import`, `--loader`) or RUBYOPT
    (`-r./x.rb`; a word without a dash gets one, as ruby reads it) make the interpreter load
    first: paths only (a bare name is a package of the system's). A `file:` URL cannot be told."""
    if not value:
        return []
    try:
        words = shlex.split(value) if family == "node" else value.split()
    except ValueError:
        return [Word(value, (Expansion.PARAMETER,), value)]  # unbalanced quotes: node refuses; unbindable
    out: list[str] = []
    k = 0
    while k < len(words):
        w = words[k] if family == "node" or words[k].startswith("-") else "-" + words[k]
        nxt = words[k + 1] if k + 1 < len(words) else ""
        k += 1
        if family == "node":
            flag, eq, attached = w.partition("=")
            if flag in _NODE_PRELOADS:
                out.append(attached if eq else nxt)
                k += 0 if eq else 1
        elif w.startswith("-r"):
            out.append(w[2:] or nxt)
            k += 0 if w[2:] else 1
    return [
        Word(v, (Expansion.PARAMETER,), v) if v.startswith("file:") else Word(v)
        for v in out
        if v.startswith(("/", "./", "../", "file:"))
    ]


def _git_patches(cmd: Command) -> tuple[list[Word], list[Word]]:
    """git apply's / git am's patches, and the `-C` directories they are relative to."""
    args = list(cmd.argv[1:])
    k = 0
    dirs: list[Word] = []
    while k < len(args) and args[k].value.startswith("-"):
        if args[k].value == "-C" and k + 1 < len(args):
            dirs.append(args[k + 1])
        k += 2 if args[k].value in ("-C", "-c", "--git-dir", "--work-tree", "--namespace") else 1
    if k >= len(args) or args[k].value not in ("apply", "am"):
        return [], dirs
    operands = [w for w in args[k + 1 :] if not w.value.startswith("-")]
    return operands or [Word("-")], dirs  # none: the patch comes on its standard input


# GNU patch's options taking a value (getopt: `-Ni fix.diff` is -N, then -i fix.diff)
_PATCH_SHORT_WITH_VALUE = "BdDFgiopVrYz"
_PATCH_LONG_WITH_VALUE = (
    "--prefix", "--directory", "--ifdef", "--fuzz", "--get", "--input", "--output", "--strip", "--reject-file",
    "--version-control", "--basename-prefix", "--suffix", "--quoting-style", "--reject-format", "--read-only",
)  # fmt: skip


def _patches(cmd: Command) -> tuple[list[Word], list[Word]]:
    """patch's patch files (-i, its second operand, else its standard input: `-`) and the
    directories it changes to first (-d: an -i file is read from there)."""
    args = list(cmd.argv[1:])
    out: list[Word] = []
    dirs: list[Word] = []
    operands: list[Word] = []
    k = 0
    while k < len(args):
        w = args[k]
        v = w.value
        nxt = args[k + 1] if k + 1 < len(args) else None
        k += 1
        if v == "--":
            operands.extend(args[k:])
            break
        if v.startswith("--"):
            flag, eq, value = v.partition("=")
            full = [o for o in _PATCH_LONG_WITH_VALUE if o == flag] or [
                o for o in _PATCH_LONG_WITH_VALUE if len(flag) > 3 and o.startswith(flag)
            ]
            if len(full) != 1:
                continue  # a flag (or ambiguous: patch refuses to start)
            arg = Word(value, w.expansions, w.raw) if eq else nxt
            k += 0 if eq else 1
            if arg is not None and full[0] in ("--input", "--directory"):
                (out if full[0] == "--input" else dirs).append(arg)
            continue
        if not v.startswith("-") or v == "-":
            operands.append(w)
            continue
        for n, ch in enumerate(v[1:], 1):
            if ch in _PATCH_SHORT_WITH_VALUE:
                rest = v[n + 1 :]
                arg = Word(rest, w.expansions, w.raw) if rest else nxt
                if not rest:
                    k += 1
                if arg is not None and ch in "id":
                    (out if ch == "i" else dirs).append(arg)
                break
    if len(operands) >= 2:
        out.append(operands[1])
    return out or [Word("-")], dirs


def _join(base: Path | str, value: str) -> str:
    """`value` against `base`, as the kernel would resolve it: `..` is left in (resolved beneath
    the root, where a link on the way leads), anything else normalised."""
    joined = os.path.join(str(base), value)
    return joined if ".." in Path(joined).parts else os.path.normpath(joined)


# wrappers that change directory before they start their program: {name: (letters, long options)}
_CHDIR_WRAPPERS = {"env": "C", "sudo": "D"}
_WRAPPER_VALUES = {"env": "uCaS", "sudo": "CDghpRrtTUu"}
_WRAPPER_LONGS = {
    "env": {"chdir": ("C", True), "unset": ("u", True), "split-string": ("S", True), "argv0": ("a", True)},
    "sudo": {"chdir": ("D", True), "close-from": ("C", True), "group": ("g", True), "host": ("h", True),
             "prompt": ("p", True), "chroot": ("R", True), "role": ("r", True), "type": ("t", True),
             "command-timeout": ("T", True), "other-user": ("U", True), "user": ("u", True)},
}  # fmt: skip


def _wrapper_directory(cmd: Command) -> Word | str | None:
    """The directory `env -C DIR` / `sudo -D DIR` starts its program in (None: its own), or why
    it cannot be told (`find -execdir` runs its program in each file's directory)."""
    name = os.path.basename(cmd.program)
    if name == "find":
        found = {w.value for w in cmd.argv[1:]} & {"-execdir", "-okdir"}
        return f"find {sorted(found)[0]} runs it in each found file's directory" if found else None
    if name not in _CHDIR_WRAPPERS:
        return None
    letter = _CHDIR_WRAPPERS[name]
    directory: Word | None = None
    for key, arg in _getopt(list(cmd.argv[1:]), _WRAPPER_VALUES[name], _WRAPPER_LONGS[name], permute=False):
        if key == letter:
            directory = arg
    return directory


def named(
    commands: Iterable[Command], cwd: Path, home: Path | None = None, env: Mapping[str, str | None] | None = None
) -> list[Found]:
    """(path, why, follow) for every file of the text's commands that a program runs, paths
    absolute (relative ones against every directory a `cd` of the text, a wrapper's `-C` or
    make's may have led to). A file that cannot be told from the text (a word with an expansion,
    a directory known only at run time: `cd -`, `popd`, `find -execdir`) is kept as its text,
    prefixed with `?` (it cannot be bound). `env`: the variables the command starts with (the
    principal's stored ones and the call's, or a session shell's; None: a value known only at
    run time): the files its code-loading variables name (MAKEFILES, NODE_OPTIONS, RUBYOPT,
    BASH_ENV, PYTHONSTARTUP) are found too. `follow`: how `bind()` reads the file for the files
    it loads in turn (make's `include`, a script's `source`)."""
    commands = list(commands)
    # a loading variable the text itself sets or names (other than MAKEFILES=, read below) has a
    # value known only at run time: `export NODE_OPTIONS=...; node app.js`, `read RUBYOPT`
    words = [w.value for c in commands for w in c.argv] + [
        f"{a.name}={a.value.value}" for c in commands for a in c.assignments
    ]
    env = {**(env or {}), **{n: None for n in LOADER_VARIABLES if n != "MAKEFILES" and any(n in w for w in words)}}
    cwds = [cwd]
    lost = ""  # why the directory a later command runs in is known only at run time
    out: dict[str, str] = {}
    follows: dict[str, Follow] = {}
    chain: list[Path] | str | None = None  # a wrapper's directory for the commands it starts
    here: list[Path] | str = cwds
    # make reads the makefiles MAKEFILES names before its own: however the text sets it
    # (`MAKEFILES=x make`, `export MAKEFILES=x`, `env MAKEFILES=x make`)
    makefiles_var = [a.value for c in commands for a in c.assignments if a.name == "MAKEFILES"]
    makefiles_var += [
        Word(w.value.split("=", 1)[1], w.expansions, w.raw)
        for c in commands for w in c.argv[1:] if w.value.startswith(("MAKEFILES=", "MAKEFILES+="))
    ]  # fmt: skip

    def add(word: Word, why: str, bases: list[Path] | str | None = None, follow: Follow | None = None) -> None:
        if not word.literal:
            out.setdefault(f"?{word.raw or word.value}", why)
            return
        bases = here if bases is None else bases
        if isinstance(bases, str) and not word.value.startswith("/"):
            out.setdefault(f"?{word.value}", f"{why}, in a directory known only at run time: {bases}")
            return
        for base in ["/"] if isinstance(bases, str) else bases:
            path = _join(base, word.value)
            out.setdefault(path, why)
            if follow is not None:
                follows.setdefault(path, follow)

    def from_env(name: str, what: str) -> str | None:
        """The value of a code-loading variable the command starts with; one known only at run
        time cannot be bound (an entry saying so)."""
        if name in env and env[name] is None:
            out.setdefault(f"?${name}", f"{what}: set in the session's shell to a value known only at run time")
        return env.get(name)

    def add_read(
        cmd: Command, word: Word, why: str, bases: list[Path] | str | None = None, follow: Follow | None = None
    ) -> None:
        """`word` as a file the program reads, `-` and /dev/stdin being its standard input."""
        if not (word.literal and word.value in STDIN_NAMES):
            add(word, why, bases, follow)
            return
        source = _stdin_source(cmd)
        if isinstance(source, Word):
            # the shell opens it, where it is (what it loads is relative to where the program runs)
            add(source, f"{why} (on its standard input)", lost or cwds, follow)
        elif isinstance(source, str):
            out.setdefault(f"?{os.path.basename(cmd.program)} {source}", why)

    def moved(bases: list[Path] | str, directory: Word, what: str) -> list[Path] | str:
        """The directories `bases` lead to after a change into `directory` (each relative to
        them, resolved by the kernel: `sub/..` through a link is its target's parent)."""
        if not directory.literal:
            return f"{what} {directory.raw or directory.value}"
        if isinstance(bases, str):
            return bases if not directory.value.startswith("/") else [Path(_join("/", directory.value))]
        return list(dict.fromkeys(Path(_join(b, directory.value)) for b in bases))

    for cmd in commands:
        if not cmd.argv:
            continue
        program = cmd.program
        name = os.path.basename(program)
        if cmd.wrapper is None:
            chain = None
        here = lost or cwds
        if chain is not None:
            here = chain
        if name in ("cd", "pushd", "popd"):
            target = next((w for w in cmd.argv[1:] if not w.value.startswith(("-", "+")) or w.value == "-"), None)
            if name == "popd" or (name == "pushd" and (target is None or target.value.startswith(("+", "-")))):
                lost = lost or f"{name} goes to a directory of the stack (DIRSTACK can be assigned)"
            elif target is not None and target.value == "-":
                lost = lost or f"{name} - goes to $OLDPWD (which the text can assign)"
            elif target is None and home is not None:
                cwds = [*cwds, home]
            elif target is not None and target.literal:
                logical = [Path(os.path.normpath(os.path.join(str(c), target.value))) for c in cwds]
                physical = [Path(_join(c, target.value)) for c in cwds]  # cd -P, set -P
                cwds = [*cwds, *logical, *physical]
            else:
                lost = lost or f"{name} {target.raw if target is not None else ''}".strip()
            cwds = list(dict.fromkeys(cwds))
            if len(cwds) > MAX_CWDS:
                lost = lost or f"more than {MAX_CWDS} directories the text may cd to"
            continue
        wrapped = _wrapper_directory(cmd)
        if isinstance(wrapped, str):
            chain = wrapped
        elif wrapped is not None:
            chain = moved(here, wrapped, f"{name}'s directory")
        if "/" in program:
            add(cmd.argv[0], "the program itself", None, Follow.shell(here, shebang=True))
        family = _interpreter(program)
        if family is not None:
            run = _script(cmd, family)
            bases = here if run.directory is None else moved(here, run.directory, f"{name} -C's directory")
            if run.unknown:
                out.setdefault(f"?{name} {run.unknown}", f"{name}'s script")
            shell = {"shell": Follow.shell(bases), "python": Follow.python(), "node": Follow.node()}.get(family)
            for word in _env_preloads(family, from_env(_ENV_OPTIONS.get(family, ""), f"{name}'s options")):
                add(word, f"a file {_ENV_OPTIONS[family]} makes {name} load", bases)
            if family == "shell" and name != "busybox" and (bash_env := from_env("BASH_ENV", "bash's startup file")):
                add(Word(bash_env), "the file BASH_ENV makes bash read first", bases, shell)
            interactive = family == "python" and run.files == [Word("-")] and run.module is None
            if interactive and (startup := from_env("PYTHONSTARTUP", "python's startup file")):
                add(Word(startup), "the file PYTHONSTARTUP makes python read first", bases)
            for word in run.files:
                add_read(cmd, word, f"{name}'s script", bases, shell)
            if run.module is not None:
                if not run.module.literal or not all(p.isidentifier() for p in run.module.value.split(".")):
                    add(Word(run.module.value, (Expansion.PARAMETER,), run.module.raw), f"{name} -m's module")
                elif isinstance(bases, str):
                    out.setdefault(f"?{run.module.value}", f"{name} -m's module, in a directory known only at run time")
                else:  # looked for as python does, from the cwd: its package's __init__, the module, a __main__
                    first, *rest = run.module.value.split(".")
                    for base in bases:
                        look = Follow(
                            "python-lookup", (str(base),), top=str(base), rest=tuple(rest), leaves=("__main__",)
                        )
                        out.setdefault(_join(base, first), f"{name} -m {run.module.value}")
                        follows.setdefault(_join(base, first), look)
        elif name in ("make", "gmake"):
            files, dirs, incdirs = _make(cmd)
            bases = here
            for d in dirs:  # each -C is relative to the one before
                bases = moved(bases, d, "make -C's directory")
            makeflags = [v for v in (from_env(n, "make's options") for n in ("MAKEFLAGS", "GNUMAKEFLAGS")) if v]
            evals = [f for f in makeflags if _makeflags_eval(f)]
            if evals:
                out.setdefault(f"?MAKEFLAGS={evals[0]}", "make --eval in MAKEFLAGS: what it includes is not told")
            included = [*incdirs, *(i for f in makeflags for i in _makeflags_includes(f))]
            follow = Follow.make(bases, included)
            env_makefiles = from_env("MAKEFILES", "a makefile MAKEFILES names")
            searched = [*makefiles_var, *([Word(env_makefiles)] if env_makefiles else [])]
            searched += [Word(v) for f in makeflags for v in _makeflags_makefiles(f)]
            for value in searched:  # searched for as make searches an include
                for part in value.value.split():
                    follow.include(Word(part, value.expansions, value.raw), "a makefile MAKEFILES names", out, follows)
            for word in files:
                add_read(cmd, word, "make's makefile", bases, follow)
            if not files:
                for base in [] if isinstance(bases, str) else bases:
                    for candidate in MAKEFILES:
                        add(Word(candidate), "make's makefile", [base], follow)
                        if os.path.lexists(os.path.join(base, candidate)):
                            break  # make reads the first that exists: the ones before it bound as absent
                if isinstance(bases, str):
                    add(Word("Makefile"), "make's makefile", bases, follow)
        elif name == "patch":
            patches, pdirs = _patches(cmd)
            pbases = here
            for d in pdirs:  # patch -d changes there first: -i is read from there
                pbases = moved(pbases, d, "patch -d's directory")
            for word in patches:
                add_read(cmd, word, "patch's patch", pbases)
        elif name == "git":
            patches, gdirs = _git_patches(cmd)
            gbases = here
            for d in gdirs:  # each -C is relative to the one before
                gbases = moved(gbases, d, "git -C's directory")
            for word in patches:
                add_read(cmd, word, "git's patch", gbases)
    return [Found(path, why, follows.get(path)) for path, why in out.items()]


def _root_of(path: str, roots: tuple[Path, ...]) -> Path | None:
    """The deepest root `path` lies in (lexically)."""
    best: Path | None = None
    for root in roots:
        r = str(root)
        if (path == r or path.startswith(r.rstrip("/") + "/")) and (best is None or len(r) > len(str(best))):
            best = root
    return best


def _read(path: str, why: str, root: Path, keep: bool = False) -> tuple[BoundFile, bytes | None]:
    """`path` read beneath `root` (never leaving it, whatever links lie on the way), hashed; with
    `keep`, its content too (None past MAX_SCAN bytes)."""
    # the path as named, beneath the root: not relpath, which would fold `link/..` lexically where
    # the kernel goes to the link target's parent
    top_text = str(root).rstrip("/") + "/"
    relative = path[len(top_text) :] if path.startswith(top_text) else "."
    try:
        top = open_absolute(str(root))
    except OSError as exc:
        return BoundFile(path, why, error=f"its root {root} cannot be opened: {exc.strerror or exc}"), None
    try:
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        fd = openat2(top.fd, relative, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return BoundFile(path, why), None
        if exc.errno == errno.EXDEV:
            return BoundFile(path, why, error=f"a link on the way leads out of the root {root}"), None
        return BoundFile(path, why, error=exc.strerror or str(exc)), None
    finally:
        os.close(top.fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return BoundFile(path, why, error="not a regular file"), None
        if st.st_size > MAX_BYTES:
            return BoundFile(path, why, error=f"{st.st_size} bytes: larger than {MAX_BYTES} to bind"), None
        digest = hashlib.sha256()
        head = b""
        kept: bytearray | None = bytearray() if keep else None
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_BYTES:
                return BoundFile(path, why, error=f"grew past {MAX_BYTES} bytes while read"), None
            digest.update(chunk)
            if len(head) < HEAD_CHARS * 4:
                head += chunk[: HEAD_CHARS * 4 - len(head)]
            if kept is not None:
                kept = kept + chunk if len(kept) + len(chunk) <= MAX_SCAN else None
        bound = BoundFile(path, why, digest.hexdigest(), size, head=head.decode("utf-8", "replace")[:HEAD_CHARS])
        return bound, None if kept is None else bytes(kept)
    except OSError as exc:
        return BoundFile(path, why, error=exc.strerror or str(exc)), None
    finally:
        os.close(fd)


def bind(found: Iterable[Found | tuple[str, str]], roots: tuple[Path, ...]) -> tuple[BoundFile, ...]:
    """Read each file of `found` that lies in one of `roots` as the sandbox's account would, and
    then the files each loads (its `follow`: make's includes, a script's sourced files), as
    bound when read. Files outside every root (a system program) are not the workspace's: not
    bound. An included name make searches for in several directories is bound in each until the
    first that exists (the ones before it bound as absent, so planting one voids the approval)."""
    queue: deque[list[Found]] = deque([Found(*f)] for f in found)
    out: dict[str, BoundFile] = {}
    too_many = (BoundFile(f"more than {MAX_FILES} files", "the command", error=f"more than {MAX_FILES} files to bind"),)
    looked = 0  # lookups and notices
    try:
        with identity.acting_as_sandbox():
            while queue:
                for f in queue.popleft():  # alternatives: up to the first that exists
                    if f.path.startswith("!"):  # what cannot be bound, told: voids nothing
                        key = f"{f.path}\0{f.why}"
                        looked += 1
                        if key not in out and looked <= MAX_LOOKUPS:
                            out[key] = BoundFile(f.path[1:], f.why, kind="notice")
                        continue
                    lookup = f.follow is not None and f.follow.kind.endswith("-lookup")
                    key = f"{f.path}\0lookup" if lookup else f.path
                    if key in out:
                        if lookup or out[key].sha256 is not None or out[key].error:
                            break
                        continue
                    root = None if f.path.startswith("?") else _root_of(f.path, roots)
                    if root is None and not f.path.startswith("?"):
                        continue  # outside every root: not the workspace's (make looks on)
                    if lookup and root is not None and f.follow is not None:
                        looked += 1
                        if looked > MAX_LOOKUPS:
                            return (BoundFile(f"more than {MAX_LOOKUPS} modules", "the command",
                                              error=f"more than {MAX_LOOKUPS} module lookups to bind"),)  # fmt: skip
                        out[key], then = _lookup(f, root)
                        queue.extend([t] for t in then)
                        break
                    if sum(1 for b in out.values() if b.kind == "file") >= MAX_FILES:
                        return too_many
                    if root is None:
                        out[f.path] = BoundFile(f.path[1:], f.why, error=UNFIXED)
                        break
                    bound, content = _read(f.path, f.why, root, keep=f.follow is not None)
                    out[f.path] = bound
                    if bound.sha256 is not None and f.follow is not None:
                        if content is None:
                            queue.append([Found(f"?{f.path}: what it loads", f"larger than {MAX_SCAN} bytes to read")])
                        else:
                            queue.extend(f.follow.loads(content, f.path))
                    if bound.sha256 is not None or bound.error:
                        break
    except identity.ActAsUnavailable as exc:
        return tuple(
            BoundFile(Found(*f).path.lstrip("?"), Found(*f).why, error=f"cannot read as the sandbox's account: {exc}")
            for f in found
        )
    return tuple(out.values())


# --- where an interpreter looks for a module -----------------------------------------------------

_PY_CODE = (".py", ".pyc", ".so")


def _listing(directory: str, root: Path) -> dict[str, bool] | None:
    """The entries of `directory` (name -> is a directory), listed beneath `root` (never leaving
    it), as the caller's identity may; None when it is not there (or not a directory)."""
    top_text = str(root).rstrip("/") + "/"
    relative = directory[len(top_text) :] if directory.startswith(top_text) else "."
    try:
        top = open_absolute(str(root))
    except OSError:
        return None
    try:
        fd = openat2(
            top.fd, relative, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
        )
    except OSError:
        return None
    finally:
        os.close(top.fd)
    try:
        with os.scandir(fd) as it:
            return {e.name: e.is_dir() for e in it}
    except OSError:
        return None
    finally:
        os.close(fd)


def _python_module(directory: str, name: str, root: Path) -> tuple[str, str, str | None, str | None]:
    """What `import name` finds in `directory` (python's FileFinder: a package's `__init__`,
    then an extension module, the source, the compiled file): (the state bound, what is shown,
    the file it loads or None, the package directory it makes or None). The state covers every
    file python could take for the module there, and the compiled copies in `__pycache__` with
    their content (a `.pyc` whose recorded source time and size match runs in place of the source)."""
    entries = _listing(directory, root)
    if entries is None:
        return "no directory", "", None, None
    own = sorted(n for n in entries if n == name or (n.startswith(name + ".") and n.endswith(_PY_CODE)))
    state: dict[str, Any] = {"entries": own}
    winner: str | None = None
    package: str | None = None
    inits: list[str] = []
    if entries.get(name):  # a directory: a package (with an __init__), else a namespace portion
        inside = _listing(f"{directory}/{name}", root) or {}
        inits = sorted(n for n in inside if n.startswith("__init__.") and n.endswith(_PY_CODE))
        state["init"] = inits
        package = f"{directory}/{name}"
        winner = next((f"{package}/{n}" for n in _by_loader(inits)), None)
    if winner is None:
        files = [n for n in own if n != name]
        winner = next((f"{directory}/{n}" for n in _by_loader(files)), None)
        if winner is not None:
            package = None
    if winner is not None and winner.endswith(".py"):
        cache_dir = f"{os.path.dirname(winner)}/__pycache__"
        stem = os.path.basename(winner)[: -len(".py")]
        cached = _listing(cache_dir, root) or {}
        state["pycache"] = {
            n: (_read(f"{cache_dir}/{n}", "", root)[0].sha256 or "")
            for n in sorted(cached)
            if n.startswith(stem + ".") and n.endswith(".pyc")
        }
    shown = os.path.relpath(winner, directory) if winner else ("a namespace package" if package else "")
    if state.get("pycache"):
        shown += f" (and __pycache__/{', '.join(state['pycache'])})"
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
    return digest, shown, winner, package


def _by_loader(names: list[str]) -> list[str]:
    """`names` in the order python's FileFinder tries them: extension modules, source, compiled."""
    order = {".so": 0, ".py": 1, ".pyc": 2}
    return sorted(names, key=lambda n: (order[next(s for s in _PY_CODE if n.endswith(s))], n))


_NODE_EXTENSIONS = ("", ".js", ".cjs", ".mjs", ".json", ".node")


def _node_module(path: str, root: Path) -> tuple[str, str, str | None, str | None]:
    """What node's `require(path)` finds: the file, the file with an extension, then the
    directory's package.json `main`, its index: (state, shown, the file, a `main` to look for)."""
    parent, base = os.path.split(path)
    entries = _listing(parent, root) or {}
    own = sorted(n for n in entries if n == base or (n.startswith(base + ".") and n[len(base) :] in _NODE_EXTENSIONS))
    state: dict[str, Any] = {"entries": own}
    winner = next(
        (f"{parent}/{base}{e}" for e in _NODE_EXTENSIONS if f"{base}{e}" in entries and not entries[f"{base}{e}"]), None
    )
    main: str | None = None
    if winner is None and entries.get(base):
        inside = _listing(path, root) or {}
        index = sorted(
            n for n in inside if n == "package.json" or (n.startswith("index.") and n[5:] in _NODE_EXTENSIONS)
        )
        state["dir"] = index
        if "package.json" in inside:
            winner = f"{path}/package.json"
            bound, content = _read(winner, "", root, keep=True)
            state["package.json"] = bound.sha256
            try:
                found = json.loads(content or b"{}").get("main")
            except (ValueError, AttributeError):
                found = None
            if isinstance(found, str) and found:
                main = _join(path, found)
        if winner is None or main is None:
            index_file = next((f"{path}/index{e}" for e in _NODE_EXTENSIONS[1:] if f"index{e}" in inside), None)
            winner = index_file or winner
    shown = os.path.relpath(winner, parent) if winner else ""
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
    return digest, shown, winner, main


def _lookup(f: Found, root: Path) -> tuple[BoundFile, list[Found]]:
    """A lookup bound (what is there now), and what it leads to: the file found (followed for
    what it loads when it is source), a submodule below a package."""
    assert f.follow is not None
    look = f.follow
    then: list[Found] = []
    if look.kind == "python-lookup":
        directory, name = os.path.split(f.path)
        state, shown, winner, package = _python_module(directory, name, root)
        kind = "python-lookup"
        if winner is not None:
            module_package = package if package is not None else (directory if directory != look.top else None)
            follow = Follow.python(look.top, module_package, look.depth) if winner.endswith(".py") else None
            then.append(Found(winner, f.why, follow))
        if package is not None:  # a package (or a namespace): what is imported from it is looked for in it
            below = look.rest[:1] or look.leaves
            for sub in below:
                rest, leaves = (look.rest[1:], look.leaves) if look.rest else ((), ())
                nxt = Follow("python-lookup", (package,), depth=look.depth + 1, top=look.top, rest=rest, leaves=leaves)
                then.append(Found(f"{package}/{sub}", f.why, nxt))
    else:
        state, shown, winner, main = _node_module(f.path, root)
        kind = "node-lookup"
        if winner is not None:
            js = winner.endswith((".js", ".cjs", ".mjs")) or os.path.splitext(winner)[1] == ""
            then.append(Found(winner, f.why, Follow.node(look.depth) if js else None))
        if main is not None:
            then.append(Found(main, f.why, Follow("node-lookup", (), depth=look.depth + 1)))
    if look.depth >= MAX_DEPTH:
        then = [Found(f"?{f.path}", f"{f.why} (more than {MAX_DEPTH} levels of files loading files)")]
    return BoundFile(f.path, f.why, state, None, head=shown, kind=kind), then


def _node_modules_above(directory: str) -> bool:
    """Is there a node_modules in `directory` or above it (where node looks for a package)?"""
    here = directory
    while True:
        if os.path.isdir(os.path.join(here, "node_modules")):
            return True
        parent = os.path.dirname(here)
        if parent == here:
            return False
        here = parent


def changed(bound: tuple[BoundFile, ...], roots: tuple[Path, ...], base: Path | None = None) -> list[str]:
    """Each bound file whose content is not what was approved now (read again the same way), as
    `PATH changed after approval` (or `appeared`, `is gone`, `cannot be bound`); paths inside
    `base` are named relative to it."""
    if not bound:
        return []

    def shown(path: str) -> str:
        if base is not None and path.startswith(str(base).rstrip("/") + "/"):
            return os.path.relpath(path, base)
        return path

    files = [f for f in bound if f.kind == "file"]
    now = {f.path: f for f in bind([Found(f.path, f.why) for f in files if f.sha256 is not None or not f.error], roots)}
    out = []
    for was in bound:
        if was.kind == "notice":
            continue  # never bound: the supervisor was told
        if was.kind.endswith("-lookup"):
            if _looked_up_again(was, roots) != was.sha256:
                out.append(f"{shown(was.path)}: what {was.kind[: -len('-lookup')]} finds there changed after approval")
            continue
        if was.error:
            out.append(f"{shown(was.path)} cannot be bound ({was.error})")
            continue
        new = now.get(was.path)
        if new is None or new.state == was.state:
            continue
        if new.error:
            out.append(f"{shown(was.path)} cannot be read any more ({new.error})")
        elif was.sha256 is None:
            out.append(f"{shown(was.path)} appeared after approval")
        elif new.sha256 is None:
            out.append(f"{shown(was.path)} is gone after approval")
        else:
            out.append(f"{shown(was.path)} changed after approval")
    return out


def _looked_up_again(was: BoundFile, roots: tuple[Path, ...]) -> str | None:
    root = _root_of(was.path, roots)
    if root is None:
        return None
    try:
        with identity.acting_as_sandbox():
            if was.kind == "python-lookup":
                directory, name = os.path.split(was.path)
                return _python_module(directory, name, root)[0]
            return _node_module(was.path, root)[0]
    except identity.ActAsUnavailable:
        return None
