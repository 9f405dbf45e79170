"""`analyze(text)`: shell text in, every command that would run (or a denial) out.

Order of work, each step able to end in a denial:

1. screen     characters and length (screen.py)
2. primary    tree-sitter walk with a closed vocabulary (primary.py)
3. backticks  any backtick outside single quotes, comments and quoted here-documents
4. wrappers   unwrap env / sudo / xargs / find -exec / bash -c ... (wrappers.py), recursively
5. hazards    eval, source, shadowing functions, PATH changes ... (hazards.py)
6. second     bashlex in a worker must agree, or say where it is blind; where it cannot confirm,
              mvdan/sh (shfmt) must agree exactly (second_opinion.py, shfmt.py)

Any exception escaping a step is a denial with code `internal_error`: the analyser fails closed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

from gateway.analysis import hazards, primary, second_opinion, wrappers
from gateway.analysis.model import (
    Analysis,
    Command,
    Context,
    Denial,
    Expansion,
    OpinionStatus,
    SecondOpinion,
    Word,
)
from gateway.analysis.primary import Unmodelled, Walk
from gateway.analysis.screen import screen

MAX_SCRIPT_DEPTH = 4  # bash -c 'bash -c "..."' nesting
CACHE_SIZE = 4096

_SKIPPED = SecondOpinion(OpinionStatus.SKIPPED, "the primary analysis already denies")
_NOT_ASKED = SecondOpinion(OpinionStatus.SKIPPED, "second opinion not requested")
# worst first: the status reported for a text with several scripts (bash -c) is the worst one
_SEVERITY = [
    OpinionStatus.DISAGREED,
    OpinionStatus.FAILED,
    OpinionStatus.TIMEOUT,
    OpinionStatus.TOO_LARGE,
    OpinionStatus.UNPARSED,
    OpinionStatus.PARTIAL,
    OpinionStatus.SKIPPED,
    OpinionStatus.CONFIRMED_BY_SHFMT,
    OpinionStatus.AGREED,
]


@dataclass(frozen=True, slots=True)
class _Script:
    text: str
    walk: Walk


class _Cache:
    """Exact-text LRU cache of complete analyses (they are immutable)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[tuple[str, bool], Analysis] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: tuple[str, bool]) -> Analysis | None:
        with self._lock:
            found = self._data.get(key)
            if found is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: tuple[str, bool], value: Analysis) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


cache = _Cache(CACHE_SIZE)


def analyze(text: str, *, second_opinion_enabled: bool = True, use_cache: bool = True) -> Analysis:
    """Every command `text` would run, or a denial. Never raises."""
    key = (text, second_opinion_enabled)
    if use_cache:
        found = cache.get(key)
        if found is not None:
            return found
    try:
        result = _analyze(text, second_opinion_enabled, use_cache)
    except Exception as exc:  # fail closed: a bug in the analyser is a denial, not an allow
        result = Analysis(
            text,
            (),
            Denial("internal_error", f"the analyser failed: {type(exc).__name__}: {exc}"),
            _SKIPPED,
        )
    if use_cache and not result.second_opinion.unfinished:
        cache.put(key, result)
    return result


def _analyze(text: str, second: bool, use_cache: bool = True) -> Analysis:
    denial = screen(text)
    if denial is not None:
        return Analysis(text, (), denial, _SKIPPED)
    scripts: list[_Script] = []
    # bashlex starts on the text now and parses while the primary walks (it is the slower one)
    pending = second_opinion.default_worker().send(text) if second else None
    try:
        try:
            commands = _commands(text, scripts, depth=0)
        except Unmodelled as u:
            return Analysis(text, (), Denial(u.code, u.message, u.construct), _SKIPPED)
        if pending is None:
            return Analysis(text, tuple(commands), None, _NOT_ASKED)
        outer, *inner = scripts
        opinions = [second_opinion.judge(outer.text, outer.walk, pending=pending, use_cache=use_cache)]
        opinions += [second_opinion.judge(s.text, s.walk, use_cache=use_cache) for s in inner]  # bash -c
    finally:
        if pending is not None:
            pending.reply()  # frees the worker on every path (a no-op once read)
    worst = min(opinions, key=lambda v: _SEVERITY.index(v.opinion.status))
    if worst.opinion.status is OpinionStatus.DISAGREED:
        details = {
            "tree_sitter": [c.to_json()["argv"] for c in commands],
            "bashlex": worst.bashlex_view,
        }
        if worst.opinion.shfmt:
            details["shfmt"] = worst.shfmt_view
        return Analysis(
            text,
            (),
            Denial(
                "parser_disagreement",
                f"the shell parsers read this text differently: {worst.opinion.detail}",
                details=details,
            ),
            worst.opinion,
        )
    blind = tuple(sorted({b for v in opinions for b in v.opinion.blind_spots}))
    opinion = replace(worst.opinion, blind_spots=blind) if blind else worst.opinion
    return Analysis(text, tuple(commands), None, opinion)


def _commands(text: str, scripts: list[_Script], depth: int) -> list[Command]:
    if depth > MAX_SCRIPT_DEPTH:
        raise Unmodelled(
            "too_deeply_nested",
            f"shell scripts nested more than {MAX_SCRIPT_DEPTH} deep",
            text[:80],
        )
    walk = primary.walk(text)
    _check_backticks(text, walk)
    _check_continuations(text, walk)
    scripts.append(_Script(text, walk))
    out: list[Command] = []
    for cmd in walk.commands:
        _expand(cmd, out, scripts, depth)
    out = [_mark_arithmetic(c) for c in out]
    hazards.check(out, walk)
    return out


def _expand(cmd: Command, out: list[Command], scripts: list[_Script], depth: int) -> None:
    """Append `cmd` and everything it runs as a wrapper, depth first."""
    out.append(cmd)
    for inner in wrappers.unwrap(cmd):
        if isinstance(inner, wrappers.ShellScript):
            out[-1] = inner.shell
            prefix = (*cmd.context, Context.WRAPPER)
            shell_name = wrappers.basename(cmd.program)
            for sub in _commands(inner.script, scripts, depth + 1):
                out.append(replace(sub, context=prefix + sub.context, wrapper=sub.wrapper or shell_name))
        else:
            _expand(inner, out, scripts, depth)


def _inside(pos: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in spans)


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def _check_backticks(text: str, walk: Walk) -> None:
    start = text.find("`")
    if start < 0:
        return
    safe = sorted(walk.safe_spans)
    pos = start
    while pos >= 0:
        if not _inside(pos, safe):
            raise Unmodelled(
                "backtick_substitution",
                f"backtick at {_where(text, pos)}: backtick substitution is not supported, "
                "use $(...) (a literal backtick must be inside single quotes)",
                text[max(0, pos - 20) : pos + 20],
            )
        pos = text.find("`", pos + 1)


def _check_continuations(text: str, walk: Walk) -> None:
    """bash deletes backslash-newline before it splits words, so `r\\<newline>m` is `rm`;
    tree-sitter reads two words there. Refuse a continuation with no blank on either side."""
    pos = text.find("\\\n")
    while pos >= 0:
        run = pos
        while run > 0 and text[run - 1] == "\\":
            run -= 1
        escaped_backslash = (pos - run) % 2 == 1  # `\\<newline>`: a literal backslash, then a newline
        before = text[pos - 1] if pos > 0 else " "
        after = text[pos + 2] if pos + 2 < len(text) else " "
        joins = before not in " \t\n" and after not in " \t\n"
        if joins and not escaped_backslash and not _inside(pos, walk.safe_spans):
            raise Unmodelled(
                "line_continuation_in_word",
                f"a backslash-newline inside a word at {_where(text, pos)} joins two words into one; "
                "put a blank before the backslash",
                text[max(0, pos - 20) : pos + 20],
            )
        pos = text.find("\\\n", pos + 2)


_ARITHMETIC_TESTS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
_DECLARATIONS = frozenset({"declare", "typeset", "local", "export", "readonly"})


def _mark_arithmetic(cmd: Command) -> Command:
    """Mark words bash evaluates as arithmetic: such evaluation expands variables recursively,
    and `a[$(cmd)]` held in a variable runs cmd, so their value is never known at check time."""
    if not cmd.argv or not cmd.argv[0].literal:
        return cmd
    program = cmd.program
    argv = list(cmd.argv)
    marks: set[int] = set()
    if program in ("[", "[[", "test"):
        for i, w in enumerate(argv):
            if w.literal and w.value in _ARITHMETIC_TESTS:
                marks.update((i - 1, i + 1))
            elif w.literal and w.value == "-v":
                marks.add(i + 1)
    elif program == "let":
        marks.update(range(1, len(argv)))
    elif program in _DECLARATIONS and any(
        w.value.startswith("-") and "i" in w.value[1:] for w in argv[1:] if w.literal
    ):
        marks.update(i for i in range(1, len(argv)) if not argv[i].value.startswith("-"))
    marks = {i for i in marks if 0 < i < len(argv)}
    if not marks:
        return cmd
    for i in marks:
        w = argv[i]
        argv[i] = Word(w.value, tuple(sorted({*w.expansions, Expansion.ARITHMETIC})), w.raw)
    return replace(cmd, argv=tuple(argv))
