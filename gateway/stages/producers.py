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

from gateway.analysis import Expansion, Word, analyze

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
    listed, when `word` is a producer substitution; None when it is not one."""
    raw = word.raw
    if set(word.expansions) != {Expansion.COMMAND_SUBSTITUTION} or not (raw.startswith("$(") and raw.endswith(")")):
        return None
    inner = raw[2:-1]
    if "$(" in inner or "`" in inner:
        return None  # one substitution, not nested ones
    analysis = analyze(inner)
    if analysis.denial is not None or not analysis.commands:
        return None
    commands = analysis.commands
    if any(c.redirects or c.assignments or not c.argv or any(not w.literal for w in c.argv) for c in commands):
        return None
    first, rest = commands[0], commands[1:]
    if not all(_is_filter(c.program, [w.value for w in c.argv[1:]]) for c in rest):
        return None
    return _listed_under(first.program, [w.value for w in first.argv[1:]])


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
        return ["."]
    if program == "git" and args[:1] == ["diff"] and "--name-only" in args:
        if any(a.startswith(("--output", "--ext-diff", "--textconv", "--no-index")) for a in args):
            return None
        return ["."]
    return None


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
