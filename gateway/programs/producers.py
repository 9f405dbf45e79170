"""Paths known only at run time, from programs that only list what lies under a starting point.

`grep -c TODO $(find lib -name '*.rb')` names its files at run time, but every one is printed by
`find lib`, so it lies under `lib`. The jail checks the starting points instead of the unknown
words (with the access the words need: a read, or a write for `rm $(find build -name '*.o')`),
and the sandbox bounds what the words turn out to be. That last part matters: a listed name can
be a symlink, and an unquoted substitution is split and globbed, so the words are *not* proved
to lie under the starting points; they are proved to come from a listing of them, and the
sandbox, which shows nothing but the roots, holds the rest (docs/analysis.md, "Paths known only
at run time").

A producer substitution is one `$(...)` making the whole word, whose text is one pipeline of:
- `find START... EXPR` with tests only (`-name`, `-path`, `-type`, `-maxdepth`, `-newer`...,
  `-print`, `-prune`, the operators; no action that runs, deletes or writes, no `-L`/`-H`);
- `ls [options] [PATH...]` (names relative to the cwd, or to each PATH with `-d`);
- `git ls-files [options] [PATH...]` and `git diff --name-only [REV...]` (relative to the cwd);
- then only filters that pick lines: `grep`/`egrep`/`fgrep` with a pattern and no file,
  `sort`, `uniq`, `head`, `tail`, each reading only its input.
Anything else, or anything not literal, is not a producer: the word stays known only at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gateway.analysis import Context, Expansion, RedirectMode, Word, analyze
from gateway.analysis.words import arithmetic_end

_FIND_TESTS_WITH_VALUE = frozenset({
    "-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex", "-type", "-xtype",
    "-maxdepth", "-mindepth", "-newer", "-anewer", "-cnewer", "-mtime", "-mmin", "-atime", "-amin", "-ctime",
    "-cmin", "-size", "-perm", "-user", "-group", "-uid", "-gid", "-links", "-inum", "-samefile", "-regextype",
})  # fmt: skip
_FIND_TESTS = frozenset({
    "-empty", "-readable", "-writable", "-executable", "-nouser", "-nogroup", "-true", "-false", "-print",
    "-prune", "-not", "!", "-a", "-and", "-o", "-or", "(", ")", "-depth", "-mount", "-xdev", "-noleaf",
    "-daystart", "-quit",
})  # fmt: skip
_FILTERS = frozenset({"grep", "egrep", "fgrep", "sort", "uniq", "head", "tail"})
_FILTER_VALUE_OPTIONS = {
    "grep": {"-e", "-m", "--max-count", "-A", "-B", "-C"},
    "egrep": {"-e", "-m", "-A", "-B", "-C"},
    "fgrep": {"-e", "-m", "-A", "-B", "-C"},
    "sort": {"-k", "-t", "--key", "--field-separator"},
    "uniq": {"-f", "-s", "-w"},
    "head": {"-n", "-c"},
    "tail": {"-n", "-c"},
}
_NO_FILE_OPTIONS = frozenset({"-f", "--file", "-o", "--output", "-T", "--temporary-directory", "--compress-program",
                              "--files0-from", "-r", "-R", "--recursive", "--follow", "-F"})  # fmt: skip


def starting_points(word: Word) -> list[str] | None:
    """The directories (as written, relative to the cwd) under which every path of `word` is
    listed, when `word` is a producer substitution; None when it is not one. Unquoted, its
    output is split into words, each a listed path; quoted (`"$(ls -t out/*.txt | head -1)"`),
    it is one word, the lines joined by newlines, so a starting point with a `..` is refused:
    joined, a later line's `..` would climb out of the first line's directory."""
    raw = word.raw
    if set(word.expansions) != {Expansion.COMMAND_SUBSTITUTION}:
        return None
    quoted = raw.startswith('"$(') and raw.endswith(')"')
    if not (raw.startswith("$(") and raw.endswith(")")) and not quoted:
        return None
    inner = raw[3:-2] if quoted else raw[2:-1]
    if "$(" in inner or "`" in inner:
        return None  # one substitution, not nested ones
    analysis = analyze(inner)
    if analysis.denial is not None or not analysis.commands:
        return None
    commands = analysis.commands
    if any(c.redirects or c.assignments or not c.argv or any(not _plain(w, k) for k, w in enumerate(c.argv))
           for c in commands):  # fmt: skip
        return None
    if any(c.context != (Context.PIPELINE,) for c in commands) and len(commands) > 1:
        return None  # one pipeline: `ls; cat f` is not a listing
    first, rest = commands[0], commands[1:]
    if any(not w.literal for c in rest for w in c.argv):
        return None  # a filter's words are literal (a glob there is no file it lists)
    if not all(_is_filter(c.program, [w.value for w in c.argv[1:]]) for c in rest):
        return None
    starts = _listed_under(first.program, [w.value for w in first.argv[1:]])
    if starts is not None and quoted and any(".." in s.split("/") for s in starts):
        return None
    return starts


def _plain(w: Word, k: int) -> bool:
    """A literal word, or (not the program) a glob, which the jail expands: `ls -t out/*.txt`."""
    return w.literal or (k > 0 and set(w.expansions) == {Expansion.GLOB})


def _listed_under(program: str, args: list[str]) -> list[str] | None:
    if program == "find":
        return _find(args)
    if program == "ls":
        paths = [a for a in args if not a.startswith("-")]
        return [".", *paths]  # `ls DIR` prints names relative to the cwd's view (no DIR/ prefix)
    if program == "git" and args[:1] == ["ls-files"]:
        rest = args[1:]
        if any(a.startswith("--with-tree") or a in ("-x", "-X", "--exclude-from") for a in rest):
            return None
        pathspecs = [a for a in rest if not a.startswith("-")]
        if any(a.startswith(":") for a in pathspecs):
            return None  # pathspec magic: `:/` lists the whole repository, as ../ paths
        # it prints paths relative to the cwd, climbing only for a pathspec that does
        # (`git ls-files ..`): that pathspec's directory, up to its first wildcard, is a start
        climbing = [a for a in pathspecs if a.startswith("/") or ".." in a.split("/")]
        return [".", *(_literal_directory(a) for a in climbing)]
    if program == "git" and args[:1] == ["diff"] and "--name-only" in args:
        if any(a.startswith(("--output", "--ext-diff", "--textconv", "--no-index")) for a in args):
            return None
        return ["."]
    return None


def _literal_directory(pathspec: str) -> str:
    magic = re.search(r"[*?[]", pathspec)
    if magic is None:
        return pathspec
    return pathspec[: magic.start()].rpartition("/")[0] or "."


def _find(args: list[str]) -> list[str] | None:
    starts: list[str] = []
    i = 0
    while i < len(args) and not args[i].startswith("-") and args[i] not in ("!", "(", ")"):
        starts.append(args[i])
        i += 1
    expr = args[i:]
    k = 0
    while k < len(expr):
        token = expr[k]
        if token in _FIND_TESTS_WITH_VALUE:
            k += 2
            continue
        if token in _FIND_TESTS:
            k += 1
            continue
        return None  # an action, -L/-H style following, or anything unknown
    return starts or ["."]


def _is_filter(program: str, args: list[str]) -> bool:
    if program not in _FILTERS:
        return False
    takes_value = _FILTER_VALUE_OPTIONS.get(program, set())
    operands: list[str] = []
    k = 0
    ended = False
    while k < len(args):
        a = args[k]
        if not ended and a == "--":
            ended = True
        elif not ended and a.startswith("-") and a != "-":
            name = a.split("=", 1)[0]
            if name in _NO_FILE_OPTIONS or any(name.startswith(o) for o in ("--files0", "--compress")):
                return False
            if a in takes_value:
                k += 1
        else:
            operands.append(a)
        k += 1
    allowed = 1 if program in ("grep", "egrep", "fgrep") and not any(a.startswith("-e") for a in args) else 0
    return len(operands) <= allowed  # a pattern for grep; no file for any of them


# --- names made at run time: `build/stamp-$(date +%s)` ---------------------------------------


@dataclass(frozen=True)
class NamedEntry:
    """A path word whose run-time parts are names: a literal directory, then components each
    made of literal text and the output of programs that never print `/` (`date +%s`,
    `git rev-parse --short HEAD`, `$((...))`). Whatever they print, the path lies under
    `directory` (docs/analysis.md, "Names made at run time")."""

    directory: str
    """The literal directory it lies under, as written ("." for the cwd)."""
    components: tuple[re.Pattern[str], ...]
    """What each later component can be (each one a single name: never `/`, `.` or `..`)."""
    dash_first: bool
    """Could the word start with `-` (then a program may take it for an option)?"""


@dataclass(frozen=True)
class _Output:
    """What a name producer can print."""

    chars: frozenset[str]  # every character it can print
    dash_first: bool  # it can start with `-`
    empty: bool = True  # it may print nothing (it failed)


_DIGITS = frozenset("0123456789")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DATE_CONVERSIONS = {  # date +FORMAT conversions that print numbers, whatever the locale
    **{c: (_DIGITS | {" "}, False) for c in "mdHMSjIUVWuwqeklNCyg"},
    **{c: (_DIGITS | {" ", "-"}, True) for c in "sYG"},  # negative before 1970 (with -d)
    "F": (_DIGITS | {" ", "+", "-"}, True),
    "T": (_DIGITS | {" ", ":"}, False),
    "R": (_DIGITS | {" ", ":"}, False),
    "z": (_DIGITS | {":", "+", "-"}, True),
}
_DATE_TEXT = {"n": "\n", "t": "\t", "%": "%"}
_DATE_CONVERSION = re.compile(r"%([-_0^#]*)([0-9]*)(:{0,3})([A-Za-z%])")


@lru_cache(maxsize=1024)
def named_entry(word: Word) -> NamedEntry | None:
    """`word` as a NamedEntry, or None when it is not one: its run-time parts are only quoted
    `$(...)` of name producers (a pipeline whose last command is `date +FORMAT` of numeric
    conversions, `git rev-parse --short|--verify REV`, `wc -l` reading its input, `nproc`,
    `id -u|-g`, `uname -m|-s`, `arch`) and `$((...))`, after a literal directory and with no `.`
    or `..` component after the first of them."""
    if word.literal or not set(word.expansions) <= {Expansion.COMMAND_SUBSTITUTION, Expansion.ARITHMETIC}:
        return None
    parts = _lex(word.raw)
    if parts is None or "".join(text for text, _ in parts) != word.value:
        return None  # not read as the analyser read it: not taken apart
    components: list[list[tuple[str, _Output | None]]] = [[]]
    for text, kind in parts:
        if kind is None:
            pieces = text.split("/")
            components[-1].append((pieces[0], None))
            components.extend([[(piece, None)] for piece in pieces[1:]])
            continue
        output = _arithmetic_output() if kind == "arithmetic" else _producer_output(text[2:-1])
        if output is None:
            return None
        components[-1].append((text, output))
    first = next((i for i, c in enumerate(components) if any(o is not None for _, o in c)), -1)
    if first < 0:
        return None
    directory = "/".join("".join(t for t, _ in c) for c in components[:first])
    if components[0] == [("", None)] and first > 0:
        directory = "/" + directory.lstrip("/")  # an absolute path
    patterns: list[re.Pattern[str]] = []
    for c in components[first:]:
        literal = "".join(t for t, o in c if o is None)
        if literal in (".", ".."):
            return None  # `x/$(date)/../y`, or a `.` or `..` made when the programs print nothing
        patterns.append(re.compile("".join(re.escape(t) if o is None else _class(o.chars) for t, o in c), re.DOTALL))
    dash = _dash_first(components[0]) if first == 0 else word.value.startswith("-")
    return NamedEntry(directory or ".", tuple(patterns), dash)


def _class(chars: frozenset[str]) -> str:
    return "[" + "".join(re.escape(c) for c in sorted(chars)) + "]*"


def _dash_first(component: list[tuple[str, _Output | None]]) -> bool:
    for text, output in component:
        if output is None:
            if text:
                return text.startswith("-")
            continue
        if output.dash_first:
            return True
        if not output.empty:
            return False
    return False


def _lex(raw: str) -> list[tuple[str, str | None]] | None:
    """The word as written, as (text, kind) parts: literal text (quote-removed; kind None), a
    double-quoted `$(...)` ("substitution", as written) or `$((...))` ("arithmetic"). None for
    anything else: another expansion, an unquoted substitution (split at run time), a glob, a
    tilde, `$'...'`."""
    out: list[tuple[str, str | None]] = []
    literal: list[str] = []
    quoted = False
    k, n = 0, len(raw)

    def flush() -> None:
        if literal:
            out.append(("".join(literal), None))
            literal.clear()

    while k < n:
        c = raw[k]
        if c == '"':
            quoted = not quoted
            k += 1
        elif c == "'" and not quoted:
            end = raw.find("'", k + 1)
            if end < 0:
                return None
            literal.append(raw[k + 1 : end])
            k = end + 1
        elif c == "\\":
            if k + 1 >= n:
                return None
            nxt = raw[k + 1]
            if quoted and nxt not in '$`"\\':
                literal.append(c)
            literal.append(nxt)
            k += 2
        elif raw.startswith("$((", k):
            end = arithmetic_end(raw, k)
            if end < 0:
                return None
            flush()
            out.append((raw[k:end], "arithmetic"))
            k = end
        elif raw.startswith("$(", k):
            end = _substitution_end(raw, k + 2)
            if end < 0 or not quoted:
                return None  # unquoted, its output is split into words
            flush()
            out.append((raw[k:end], "substitution"))
            k = end
        elif c in "$`" or (not quoted and (c in "*?[{}" or (c == "~" and k == 0))):
            return None
        else:
            literal.append(c)
            k += 1
    if quoted:
        return None
    flush()
    return out


def _substitution_end(raw: str, k: int) -> int:
    """The index after the `)` closing a `$(` whose text starts at `k`, or -1 (the analyser
    checks the text again: a wrong guess is only a word that is not a NamedEntry)."""
    depth = 0
    n = len(raw)
    while k < n:
        c = raw[k]
        if c == "\\":
            k += 2
            continue
        if c == "'":
            end = raw.find("'", k + 1)
            if end < 0:
                return -1
            k = end + 1
            continue
        if c == '"':
            k += 1
            while k < n and raw[k] != '"':
                k += 2 if raw[k] == "\\" else 1
            k += 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return k + 1
            depth -= 1
        k += 1
    return -1


def _arithmetic_output() -> _Output:
    return _Output(_DIGITS | {"-"}, True, empty=False)


def _producer_output(text: str) -> _Output | None:
    """What the pipeline `text` can print, when its last command is a name producer."""
    if "$(" in text or "`" in text:
        return None
    analysis = analyze(text, second_opinion_enabled=False)  # the whole text had its second opinion
    commands = analysis.commands
    if analysis.denial is not None or not commands:
        return None
    if len(commands) > 1 and any(c.context != (Context.PIPELINE,) for c in commands):
        return None  # a pipeline prints what its last command prints; `a; b` prints both
    last = commands[-1]
    if last.assignments or any(r.mode not in (RedirectMode.READ, RedirectMode.HEREDOC, RedirectMode.HERESTRING)
                               for r in last.redirects):  # fmt: skip
        return None  # `date 2>&1` prints date's errors, which name files
    if not last.argv or any(not w.literal for w in last.argv):
        return None
    args = [w.value for w in last.argv[1:]]
    return _NAME_PRODUCERS.get(last.program, _none)(args)


def _none(args: list[str]) -> _Output | None:
    return None


def _date(args: list[str]) -> _Output | None:
    formats = [a for a in args if a.startswith("+")]
    rest = [a for a in args if not a.startswith("+")]
    other_date = any(a.startswith(("-d", "--date")) for a in rest)  # else now: no negative year
    k = 0
    while k < len(rest):
        a = rest[k]
        if a in ("-u", "--utc", "--universal"):
            k += 1
        elif a in ("-d", "--date"):
            k += 2
        elif a.startswith(("--date=", "-d")):
            k += 1
        else:
            return None  # -I and -R print letters and the zone; -r reads a file; -s sets the clock
    if len(formats) != 1 or k > len(rest):
        return None
    text = formats[0][1:]
    chars: set[str] = set()
    dash: bool | None = None  # can it start with `-`: decided by the first item that prints
    numeric = False
    pos = 0
    for m in [*_DATE_CONVERSION.finditer(text), None]:
        literal = text[pos : m.start() if m else len(text)]
        if "%" in literal:
            return None
        chars |= set(literal)
        if dash is None and literal:
            dash = literal.startswith("-")
        if m is None:
            break
        pos = m.end()
        flags, width, colons, conversion = m.groups()
        if conversion in _DATE_TEXT and not (flags or width or colons):
            chars.add(_DATE_TEXT[conversion])
            dash = False if dash is None else dash
            continue
        found = _DATE_CONVERSIONS.get(conversion)
        if found is None or (colons and conversion != "z"):
            return None  # letters (%a %b %Z %c %x...) depend on the locale or the zone; %D prints `/`
        numeric = True
        chars |= found[0] | ({" ", "-"} if flags else set())
        dash = ((found[1] and other_date) or "-" in flags) if dash is None else dash
    if not numeric or "/" in chars:
        return None  # no number: `date +..` prints `..`
    return _Output(frozenset(chars), bool(dash))


def _git(args: list[str]) -> _Output | None:
    if args[:1] != ["rev-parse"]:
        return None
    options = [a for a in args[1:] if a.startswith("-")]
    revisions = [a for a in args[1:] if not a.startswith("-")]
    verify = any(a == "--verify" or a == "--short" or a.startswith("--short=") for a in options)
    allowed = all(a in ("--verify", "--short", "-q", "--quiet") or re.fullmatch(r"--short=[0-9]+", a) for a in options)
    if not (verify and allowed and len(revisions) == 1):
        return None  # without --verify, rev-parse prints a word it cannot resolve as it is written
    return _Output(frozenset("0123456789abcdef"), False)


def _wc(args: list[str]) -> _Output | None:
    if not args or any(a not in ("-l", "-c", "-w", "-m", "-L", "--lines", "--bytes", "--words", "--chars",
                                 "--max-line-length") for a in args):  # fmt: skip
        return None  # with a file operand it prints the file's name
    return _Output(_DIGITS | {" "}, False)


def _nproc(args: list[str]) -> _Output | None:
    return _Output(_DIGITS, False) if args in ([], ["--all"]) else None


def _id(args: list[str]) -> _Output | None:
    numeric = args and all(a in ("-u", "-g", "-G", "-r", "-ur", "-gr") for a in args)  # not -n: names
    return _Output(_DIGITS | {" "}, False) if numeric else None


def _uname(args: list[str]) -> _Output | None:
    ok = args and all(a in ("-m", "-s", "--machine", "--kernel-name") for a in args)
    return _Output(_NAME_CHARS | {" "}, False) if ok else None


def _arch(args: list[str]) -> _Output | None:
    return _Output(_NAME_CHARS, False) if not args else None


_NAME_PRODUCERS = {
    "date": _date,
    "git": _git,
    "wc": _wc,
    "nproc": _nproc,
    "id": _id,
    "uname": _uname,
    "arch": _arch,
}


def pipe(word: Word) -> bool:
    """Is `word` exactly one process substitution (`<(sort a)`, `>(gzip > f)`)? bash passes
    /dev/fd/N, a pipe from or to a command the analysis reports and the policy decides on its
    own: no file, so nothing for the jail to check (docs/analysis.md)."""
    raw = word.raw
    return set(word.expansions) == {Expansion.PROCESS_SUBSTITUTION} and raw[:2] in ("<(", ">(") and raw.endswith(")")
