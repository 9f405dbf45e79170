"""Read a command's argv through its program's model: which word is an option, a path read or
written, a pattern, a script, a program to run.

The reading fails closed. It is `refused` (so no allow or ask rule relying on the model matches)
when a word cannot be placed: an option the model does not list, a long-option prefix that is
ambiguous, an option value that takes no value, a word known only at run time where it could
be an option, a script known only at run time or one the script parser cannot read, a glob
where the shell would turn it into file names the model would take for a pattern. Code the
gateway cannot check (sort --compress-program, sed's `e`, awk's system()) is listed in `runs`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gateway.analysis import Command, Expansion, Word
from gateway.analysis.words import numeric_only, unquoted_expansion
from gateway.programs import awk, jq, producers, sed
from gateway.programs.schema import Kind, Option, ProgramModel

_OPERATORS = frozenset({"(", ")", "!", ",", "-not", "-a", "-and", "-o", "-or"})
_PATH_EXPANSIONS = frozenset({Expansion.GLOB, Expansion.TILDE})


@dataclass(frozen=True, slots=True)
class Role:
    """What one word (or the value attached to an option word) is to the program."""

    index: int
    kind: str  # a Kind value, "option", "operand_assignment" or "end_of_options"
    text: str


@dataclass(frozen=True)
class Reading:
    """A command read through its model."""

    model: str
    roles: tuple[Role, ...] = ()
    reads: tuple[Word, ...] = ()
    writes: tuple[Word, ...] = ()
    runs: tuple[str, ...] = ()
    """Why the command runs code the gateway cannot check (empty: it does not)."""
    refused: str = ""
    """Why the model cannot read the command (empty: it can)."""
    operands: tuple[int, ...] = ()
    """argv indices of the operands (not options, not option values)."""
    could_be: tuple[str, ...] = ()
    """The options a run-time word read as an operand could have been (issue 13, class 2): the
    rule's forbidden options are checked against them too."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model}
        if self.refused:
            out["refused"] = self.refused
        groups: dict[str, list[str]] = {}
        for r in self.roles:
            key = {"option": "options", "pattern": "patterns", "script": "scripts", "program": "programs",
                   "other": "values"}.get(r.kind)  # fmt: skip
            if key:
                groups.setdefault(key, []).append(r.text)
        out["options"] = groups.get("options", [])
        out["read"] = [w.value for w in self.reads]
        out["write"] = [w.value for w in self.writes]
        out["patterns"] = groups.get("patterns", [])
        out["scripts"] = groups.get("scripts", [])
        for key in ("values", "programs"):
            if key in groups:
                out[key] = groups[key]
        if self.runs:
            out["runs_code"] = list(self.runs)
        if self.could_be:
            out["could_be_options"] = list(self.could_be)
        return out


class _Refused(Exception):
    pass


def could_be_option(w: Word, model: ProgramModel | None = None) -> bool:
    """Could the word, known only at run time, be (or be split into) an option? Only a word
    that starts with a literal character other than `-` cannot (`x$y`); a leading expansion can
    be anything. A producer's listing (`$(find lib)`, programs/producers.py) can too, since it is
    split at blanks (a directory named `x --file=` gives the word `--file=...`), but where
    every option of the program only reads (`model.only_reads`: grep, head, cat...) the sandbox
    bounds what such an option reads, as it bounds the listing's paths (docs/analysis.md)."""
    if w.literal:
        return w.value.startswith("-")
    if set(w.expansions) <= _PATH_EXPANSIONS:
        return w.value.startswith("-")  # a glob: the path jail refuses a match that would be an option
    if numeric_only(w.raw):
        # a number (`$((n+1))`, `$!`): where it starts the word it may be negative, `-` and
        # digits, an option only to a program that takes digit options (head -5); to others an
        # error. Never split: IFS may hold no digit or `-` (analysis/hazards.py).
        leading = w.value[:1] == "$" or w.raw[:2] == '"$'
        return w.value[:1] == "-" or (leading and (model is None or _digit_options(model)))
    if model is not None and model.only_reads and producers.starting_points(w) is not None:
        return False
    if (entry := producers.named_entry(w)) is not None:
        return entry.dash_first  # `build/stamp-$(date +%s)`: one word, starting as written
    # the value is quote-removed: a leading character other than these is literal, unless the
    # shell may split the word (`x$V` with V=' --output=F')
    return not w.value or w.value[:1] in "$`-{" or may_split(w)


def may_split(w: Word) -> bool:
    """Could the shell make several words of `w`, the later ones options? An unquoted `$V`,
    `$(...)` or backquote is split at blanks (`-n $V` with V='1 --output=F' is `-n 1
    --output=F`), and a brace expansion the analyser left unexpanded (`{"$V",--output=F}`, not
    plain: braces.py) makes one word per element. Quoted ones (`"$V"`, `x"$(cmd)"`) are one
    word. Red team 13."""
    if w.literal:
        return False
    if Expansion.BRACE in w.expansions:
        return True
    if numeric_only(w.raw):
        return False  # a number: IFS may hold no digit or `-` (analysis/hazards.py)
    return unquoted_expansion(w.raw)


def _digit_options(model: ProgramModel) -> bool:
    return model.digit_options or any(len(n) == 2 and n[1].isdigit() for o in model.options for n in o.names)


class _Reader:
    def __init__(self, model: ProgramModel, argv: tuple[Word, ...], injection: bool = True) -> None:
        self.model = model
        self.top = model
        self.argv = argv
        self.injection = injection
        self.injected: tuple[int, ProgramModel] | None = None  # a run-time word read as an operand
        self.subcommand = not model.subcommands
        self.ended_by_option = False
        self.first_kind: Kind | None = None  # an option's say on the first operand (jq -f)
        self.roles: list[Role] = []
        self.reads: list[Word] = []
        self.writes: list[Word] = []
        self.runs: list[str] = []
        self.operands: list[int] = []
        self.scripts: list[tuple[int, Word]] = []
        self.first_replaced = False
        self.writes_operands = False
        self.backup: list[Word] = []  # backup suffixes (sed -i.bak)
        self.directory = ""  # the directory a `directory` option moved to (tar -C DIR), "" for none
        self.directories: list[str] = []  # every one of them, in order
        self.operand_directory: dict[int, str] = {}  # an operand's directory, where one applies
        self.extracting = model.extracts
        self.cwd_members = False  # do members land in the cwd too (an operand before the first -C)
        self.lists_only = False
        self.rest_kind: Kind | None = None  # an option's say on the operands after the first (zip -d)
        self._use(model)

    def _use(self, model: ProgramModel) -> None:
        self.model = model
        self.short: dict[str, Option] = {}
        self.long: dict[str, Option] = {}
        self.leading: dict[str, Option] = {}  # find: the options before the starting points
        self.primary: dict[str, Option] = {n: o for o in model.primaries for n in o.names}
        for o in model.options:
            for n in o.names:
                if model.grammar == "find":
                    self.leading[n] = o
                elif n.startswith("--"):
                    self.long[n[2:]] = o
                else:
                    self.short[n[1:]] = o  # one character; two for the infozip grammar (-TT)

    # --- the grammars ------------------------------------------------------------------------
    def getopt(self) -> None:
        argv = self.argv
        i, ended = 1, False
        if self.model.bundled_first and len(argv) > 1 and not argv[1].value.startswith("-"):
            i = self._old_style()
        while i < len(argv):
            w = argv[i]
            v = w.value
            if not self.subcommand and (ended or v == "-" or not could_be_option(w, self.model)):
                i, ended = self._enter_subcommand(i), False
                continue
            if ended or v == "-" or not could_be_option(w, self.model):
                self._operand(i)
                ended = ended or not self.model.permutes  # awk: the first operand ends the options
                i += 1
                continue
            if not v.startswith("-") and self._injectable(i):
                self.injected = (i, self.model)
                self.operands.append(i)
                ended = ended or not self.model.permutes
                i += 1
                continue
            if not v.startswith("-"):
                raise _Refused(
                    f"{w.raw or v} is known only at run time and could be an option to {self.model.program}: "
                    f"put '--' before it{_ALSO.get(self.top.program, '')}, or write it literally"
                )
            if v == "--":
                self.roles.append(Role(i, "end_of_options", v))
                ended = True
                i += 1
                continue
            if may_split(w):
                raise _Refused(
                    f"{w.raw or v} holds an unquoted value known only at run time, which the shell may split into "
                    f'more words, options to {self.model.program}: quote it ("$V")'
                )
            i = self._long(i) if v.startswith("--") else self._short(i)
            if self.ended_by_option:
                ended, self.ended_by_option = True, False

    def _old_style(self) -> int:
        """tar's old option style (`tar czf out.tgz src`): the first word is a cluster of short
        options without a dash, and each that takes a value takes the next unused word, in order."""
        bundle = self.argv[1]
        if not bundle.literal or not bundle.value:
            raise _Refused(
                f"{self.model.program}: the first word {bundle.raw or bundle.value!r} is known only at run time and "
                "would be read as options"
            )
        nxt = 2
        for c in bundle.value:
            opt = self.short.get(c)
            if opt is None:
                raise _Refused(f"{self.model.program}: {c!r} (in {bundle.value!r}) is not an option (in its model)")
            self.roles.append(Role(1, "option", "-" + c))
            self._effects(opt)
            if opt.kinds and not opt.optional:
                nxt = self._values(nxt, opt.kinds, opt, "-" + c)
        return nxt

    def _enter_subcommand(self, i: int) -> int:
        """The first operand after a program's global options names its subcommand (git)."""
        w = self.argv[i]
        sub = self.model.subcommand(w.value) if w.literal else None
        if sub is None:
            raise _Refused(
                f"{w.raw or w.value} is not a subcommand {self.model.program}'s model knows "
                f"(gateway/programs/{self.model.program}.yaml)"
            )
        self.roles.append(Role(i, "subcommand", w.value))
        self.subcommand = True
        self._use(sub)
        return i + 1

    def _injectable(self, i: int) -> bool:
        """May the run-time word at `i`, which could be an option, be read as an operand and
        every option it could be checked in turn (read())? Only one such word, quoted (so one
        word: never split, never a glob), in a program whose every option the model lists."""
        w = self.argv[i]
        raw = w.raw
        one_word = len(raw) >= 2 and raw[0] == raw[-1] == '"' and not set(raw[1:-1]) & set('"\\@')
        if not (self.injection and self.injected is None and one_word and self.model.complete):
            return False
        return not any(o.runs_code or o.unsupported or o.writes_operands for o in self.model.options)

    def _long(self, i: int) -> int:
        w = self.argv[i]
        name, eq, attached = w.value[2:].partition("=")
        opt = self.long.get(name)
        if opt is None:
            found = (
                {id(o): (n, o) for n, o in self.long.items() if n.startswith(name)}
                if name and self.model.long_prefixes
                else {}
            )
            if len(found) != 1:
                known = "ambiguous" if found else "not an option of"
                raise _Refused(f"--{name} is {known} {self.model.program} (in its model, gateway/programs/)")
            name, opt = next(iter(found.values()))
        self.roles.append(Role(i, "option", f"--{name}"))
        self._effects(opt)
        if opt.ends_options:
            self.ended_by_option = True
            return i + 1
        kinds = opt.kinds
        if not kinds:
            if eq:
                raise _Refused(f"{self.model.program}: --{name} takes no value")
            return i + 1
        if eq:
            if opt.separate_only or len(kinds) > 1:
                raise _Refused(f"{self.model.program}: --{name} takes its value as the next word, not after '='")
            self._value(i, kinds[0], Word(attached, w.expansions, w.raw), opt)
            return i + 1
        if opt.optional:
            return i + 1
        return self._values(i + 1, kinds, opt, f"--{name}")

    def _short(self, i: int) -> int:
        w = self.argv[i]
        v = w.value
        j = 1
        while j < len(v):
            c = v[j]
            if c.isdigit() and self.model.digit_options:
                k = j
                while k < len(v) and v[k].isdigit():
                    k += 1
                self.roles.append(Role(i, "option", "-" + v[j:k]))
                j = k
                continue
            opt = self.short.get(c)
            if opt is None:
                raise _Refused(
                    f"-{c} (in {v!r}) is not an option of {self.model.program} (in its model, gateway/programs/)"
                )
            self.roles.append(Role(i, "option", "-" + c))
            self._effects(opt)
            kinds = opt.kinds
            if kinds:
                rest = v[j + 1 :]
                if rest:
                    if opt.separate_only or len(kinds) > 1:
                        raise _Refused(f"{self.model.program}: -{c} takes its value as the next word")
                    self._value(i, kinds[0], Word(rest, w.expansions, w.raw), opt)
                    return i + 1
                if opt.optional:
                    return i + 1
                return self._values(i + 1, kinds, opt, f"-{c}")
            j += 1
        return i + 1

    def _values(self, i: int, kinds: tuple[Kind, ...], opt: Option, name: str = "") -> int:
        for kind in kinds:
            if i >= len(self.argv):
                return i  # the program refuses a missing value; nothing runs
            if may_split(self.argv[i]):
                w = self.argv[i]
                raise _Refused(
                    f"{w.raw or w.value}, the value of {name or opt.names[0]}, is known only at run time and "
                    f"unquoted: the shell may split it into more words, options to {self.model.program}: "
                    'quote it ("$V")'
                )
            self._value(i, kind, self.argv[i], opt)
            i += 1
        return i

    def find(self) -> None:
        argv = self.argv
        i = 1
        while i < len(argv) and argv[i].literal and argv[i].value in self.leading:  # -H -L -P -D -O
            opt = self.leading[argv[i].value]
            self.roles.append(Role(i, "option", argv[i].value))
            self._effects(opt)
            i = self._values(i + 1, opt.kinds, opt, argv[i].value)
        while i < len(argv):
            w = argv[i]
            if w.literal and (w.value.startswith("-") or w.value in _OPERATORS):
                break
            if could_be_option(w, self.model):
                raise _Refused(f"find: {w.raw or w.value} is known only at run time and could be an expression")
            self.operands.append(i)
            i += 1
        while i < len(argv):
            w = argv[i]
            if not w.literal:
                raise _Refused(f"find: {w.raw or w.value} is known only at run time and could be an action")
            if w.value in _OPERATORS:
                self.roles.append(Role(i, "option", w.value))
                i += 1
                continue
            primary = self.primary.get(w.value)
            if primary is None:
                raise _Refused(f"find: {w.value} is not a test or action find's model knows (gateway/programs/)")
            self.roles.append(Role(i, "option", w.value))
            self._effects(primary)
            if primary.kinds == (Kind.COMMAND,):
                j = i + 1
                while j < len(argv) and not (
                    argv[j].value == ";" or (argv[j].value == "+" and j > i + 1 and argv[j - 1].value == "{}")
                ):
                    self.roles.append(Role(j, Kind.COMMAND.value, argv[j].value))
                    j += 1
                i = j + 1
                continue
            i = self._values(i + 1, primary.kinds, primary, w.value)

    def infozip(self) -> None:
        """Info-ZIP zip 3.0's parser (fileio.c get_option), for the options its model lists."""
        argv = self.argv
        i, ended = 1, False
        while i < len(argv):
            w = argv[i]
            v = w.value
            if ended or v == "-" or not could_be_option(w, self.model):
                self._operand(i)
                i += 1
                continue
            if not v.startswith("-"):
                raise _Refused(
                    f"{w.raw or v} is known only at run time and could be an option to {self.model.program}: "
                    "put '--' before it, or write it literally"
                )
            if may_split(w):
                raise _Refused(f"{w.raw or v} holds an unquoted value known only at run time: quote it")
            if v == "--":
                self.roles.append(Role(i, "end_of_options", v))
                ended = True
                i += 1
                continue
            i = self._zip_long(i) if v.startswith("--") else self._zip_short(i)

    def _zip_short(self, i: int) -> int:
        v = self.argv[i].value
        j = 1
        while j < len(v):
            pair, one = v[j : j + 2], v[j]
            name = pair if len(pair) == 2 and pair in self.short else one  # a two-character option wins
            opt = self.short.get(name)
            if opt is None:
                raise _Refused(f"-{name} (in {v!r}) is not an option of {self.model.program} (in its model)")
            self.roles.append(Role(i, "option", "-" + name))
            self._effects(opt)
            j += len(name)
            if not opt.kinds:
                if v[j : j + 1] == "-":
                    j += 1  # a trailing - negates
                continue
            rest = v[j:].removeprefix("=")
            if rest:
                self._value(i, opt.kinds[0], Word(rest, self.argv[i].expansions, self.argv[i].raw), opt)
                return i + 1
            return self._zip_values(i + 1, opt, "-" + name)
        return i + 1

    def _zip_long(self, i: int) -> int:
        w = self.argv[i]
        name, eq, attached = w.value[2:].partition("=")
        name = name.removesuffix("-") if name.endswith("-") and name[:-1] in self.long else name  # negated
        opt = self.long.get(name)
        if opt is None:
            found = {id(o): (n, o) for n, o in self.long.items() if n.startswith(name)} if name else {}
            if len(found) != 1:
                raise _Refused(f"--{name} is {'ambiguous' if found else 'not an option of'} {self.model.program}")
            name, opt = next(iter(found.values()))
        self.roles.append(Role(i, "option", f"--{name}"))
        self._effects(opt)
        if not opt.kinds:
            if eq:
                raise _Refused(f"{self.model.program}: --{name} takes no value")
            return i + 1
        if eq:
            self._value(i, opt.kinds[0], Word(attached, w.expansions, w.raw), opt)
            return i + 1
        if opt.optional:
            return i + 1
        return self._zip_values(i + 1, opt, f"--{name}")

    def _zip_values(self, i: int, opt: Option, name: str) -> int:
        if not opt.value_list:
            return self._values(i, opt.kinds, opt, name)
        while i < len(self.argv):  # a list: up to the next option, a lone @, or the end
            w = self.argv[i]
            if w.literal and w.value == "@":
                return i + 1
            if could_be_option(w, self.model):
                if w.literal or w.value.startswith("-"):
                    return i  # the next option
                raise _Refused(f"{w.raw or w.value}, in the list of {name}, is known only at run time: it could end it")
            i = self._values(i, opt.kinds, opt, name)
        return i

    def unzip(self) -> None:
        """UnZip 6.0's parser (unzip.c uz_opts, then its -d/-x scan of the words after the
        archive), for the options its model lists."""
        argv = self.argv
        i = 1
        if len(argv) > 1 and argv[1].literal and argv[1].value.startswith("-Z"):
            raise _Refused(f"{self.model.program} -Z: ZipInfo mode is not modelled: use unzip -l")
        while i < len(argv):  # options: only before the archive
            w = argv[i]
            if not could_be_option(w, self.model):
                break
            if not w.literal or may_split(w):
                raise _Refused(f"{w.raw or w.value} is known only at run time where {self.model.program} reads options")
            v = w.value
            j, i = 1, i + 1
            while j < len(v):
                c = v[j]
                j += 1
                if c == "-":
                    continue  # negates the next option
                opt = self.short.get(c)
                if opt is None:
                    raise _Refused(f"-{c} (in {v!r}) is not an option of {self.model.program} (in its model)")
                self.roles.append(Role(i - 1, "option", "-" + c))
                self._effects(opt)
                if opt.kinds:  # -d DIR, -P PASSWORD: the rest of the word, or the next one
                    if v[j:]:
                        self._value(i - 1, opt.kinds[0], Word(v[j:], w.expansions, w.raw), opt)
                    elif i < len(argv):
                        self._value(i, opt.kinds[0], argv[i], opt)
                        i += 1
                    break
        if i >= len(argv):
            return
        self._operand(i)  # the archive
        excluding = False
        k = i + 1
        while k < len(argv):
            w = argv[k]
            if not w.literal and (w.value[:1] in "$`{-" or may_split(w)):
                raise _Refused(f"{w.raw or w.value} is known only at run time and could be -d DIR or -x to unzip")
            opt = self.short.get("d")
            if w.value.startswith("-d") and opt is not None and not self.directories:
                self.roles.append(Role(k, "option", "-d"))
                if w.value[2:]:
                    self._value(k, opt.kinds[0], Word(w.value[2:], w.expansions, w.raw), opt)
                elif k + 1 < len(argv):
                    k += 1
                    self._value(k, opt.kinds[0], argv[k], opt)
            elif w.value == "-x" and not excluding:
                self.roles.append(Role(k, "option", "-x"))
                excluding = True
            else:
                self.roles.append(Role(k, Kind.PATTERN.value, w.value))  # a member, matched inside the archive
            k += 1

    # --- what words are ----------------------------------------------------------------------
    def _operand(self, i: int) -> None:
        self.operands.append(i)
        if self.directory:
            w = self.argv[i]
            if not w.literal:
                raise _Refused(
                    f"{self.model.program}: {w.raw or w.value} is known only at run time and relative to "
                    f"{self.directory} (the shell expands it in the cwd): name it from the cwd instead"
                )
            self.operand_directory[i] = self.directory

    def _effects(self, opt: Option) -> None:
        if opt.unsupported:
            raise _Refused(f"{self.model.program} {opt.names[0]}: {opt.unsupported}")
        if opt.runs_code:
            self.runs.append(opt.runs_code)
        if opt.writes_operands:
            self.writes_operands = True
        if opt.replaces_first:
            self.first_replaced = True
        if opt.first_operand is not None:
            self.first_kind = opt.first_operand
        if opt.writes_unknown:
            self.writes.append(Word(opt.writes_unknown, (Expansion.PARAMETER,), opt.writes_unknown))
        if opt.reads_unknown:
            self.reads.append(Word(opt.reads_unknown, (Expansion.PARAMETER,), opt.reads_unknown))
        self.extracting = self.extracting or opt.extracts
        self.lists_only = self.lists_only or opt.lists_only
        if opt.rest_operands is not None:
            self.rest_kind = opt.rest_operands

    def _value(self, i: int, kind: Kind, w: Word, opt: Option | None) -> None:
        self.roles.append(Role(i, kind.value, w.value))
        if opt is not None and opt.directory:
            if not w.literal:
                raise _Refused(f"{self.model.program} {opt.names[0]}: the directory {w.raw or w.value} is known only "
                               "at run time")  # fmt: skip
            self.directory = w.value if w.value.startswith("/") or not self.directory else f"{self.directory}/{w.value}"
            self.directories.append(self.directory)
            self.cwd_members = self.cwd_members or bool(self.operands)  # tar x F -C D: F went to the cwd
            w = Word(self.directory, w.expansions, w.raw)
        if opt is not None and opt.remote_colon and ":" in w.value.split("/", 1)[0]:
            self.runs.append(f"{w.value!r} names a file on another host, which {self.model.program} reaches by rsh")
        if opt is not None and opt.backup_suffix:
            self.backup.append(w)
        if kind is Kind.READ:
            self.reads.append(w)
            if opt is not None and opt.lists_files:
                named = f"the files named in {w.value}"
                self.reads.append(Word(named, (Expansion.PARAMETER,), named))  # known only at run time
        elif kind is Kind.WRITE:
            self.writes.append(w)
        elif kind is Kind.SCRIPT_FILE:
            self.reads.append(w)
            self.runs.append(f"the script in {w.value} cannot be checked (it may change before it runs)")
        elif kind is Kind.PROGRAM:
            self.runs.append(f"it runs the program {w.value!r}")
        elif kind is Kind.SCRIPT:
            if not w.literal:
                raise _Refused(f"the {self.model.language} script {w.raw or w.value} is known only at run time")
            self.scripts.append((i, w))
        elif (
            kind in (Kind.PATTERN, Kind.OTHER)
            and Expansion.GLOB in w.expansions
            and w is self.argv[i]
            and not (opt is None and self.model.operands.printed)
        ):
            raise _Refused(
                f"the unquoted glob {w.value!r} would be expanded by the shell into file names, which "
                f"{self.model.program} would take as a {kind.value} and files: quote it"
            )

    def finish(self) -> Reading:
        model = self.model
        ops = list(self.operands)
        first_kind = self.first_kind or model.operands.first
        if first_kind is not None and not self.first_replaced and ops:
            first = ops.pop(0)
            self._value(first, first_kind, self.argv[first], None)
        for k in ops:
            w = self.argv[k]
            if model.operands.assignments and w.literal and _is_assignment(w.value):
                self.roles.append(Role(k, "operand_assignment", w.value))
                continue
            if k in self.operand_directory:  # tar -C DIR FILE: FILE is DIR/FILE
                w = Word(os.path.join(self.operand_directory[k], w.value), w.expansions, w.raw)
            rest = self.rest_kind if self.rest_kind is not None and k != self.operands[0] else model.operands.rest
            self._value(k, rest, w, None)
            if self.writes_operands and model.operands.rest is Kind.READ:
                self.writes.append(w)
                self.writes.extend(_backups(w, self.backup))
        self._scripts()
        if self.extracting and not self.lists_only:
            # the members are written under the extraction directory (and with -C, each one given):
            # the jail checks it as a write, the sandbox bounds what lies below
            cwd = not self.directories or (self.cwd_members and self.top.grammar != "unzip")
            written = {w.value for w in self.writes if w.literal}
            for d in dict.fromkeys([*(["."] if cwd else []), *self.directories]):
                if d not in written:
                    self.writes.append(Word(d))
        return Reading(
            model.program,
            tuple(sorted(self.roles, key=lambda r: r.index)),
            tuple(self.reads),
            tuple(self.writes),
            tuple(self.runs),
            "",
            tuple(self.operands),
        )

    def _scripts(self) -> None:
        if not self.scripts:
            return
        text = "\n".join(w.value for _, w in self.scripts)  # sed joins -e fragments with newlines
        analyse = {"sed": sed.analyse, "awk": awk.analyse, "jq": jq.analyse}[self.model.language or "sed"]
        facts = analyse(text)
        if facts.error:
            raise _Refused(f"{self.model.program}: {facts.error}")
        self.runs.extend(facts.runs)
        self.reads.extend(facts.reads)
        self.writes.extend(facts.writes)


def _is_assignment(value: str) -> bool:
    name, eq, _ = value.partition("=")
    return bool(eq) and name.isidentifier() and name.isascii()


def _backups(w: Word, suffixes: list[Word]) -> list[Word]:
    out: list[Word] = []
    for s in suffixes:
        if not s.literal or not w.literal:
            out.append(Word(w.value + s.value, (Expansion.PARAMETER,), w.raw))  # unknown: the jail refuses it
            continue
        if "*" in s.value:
            name = s.value.replace("*", os.path.basename(w.value))
        else:
            name = os.path.basename(w.value) + s.value
        # in the file's directory (GNU sed), and for good measure relative to the cwd
        out.append(Word(os.path.join(os.path.dirname(w.value), name)))
        out.append(Word(name))
    return out


_ALSO = {
    "git": " (git: --end-of-options where -- would make it a path; git reset takes neither before a revision in "
    'git 2.39: give the revision a literal start, "refs/tags/$TAG")'
}


def read(model: ProgramModel, cmd: Command) -> Reading:
    """`cmd` read through `model` (never raises: an unreadable command is `refused`)."""
    reading, injected = _read(model, cmd.argv, True)
    if injected is None or reading.refused:
        return reading
    return _with_alternatives(model, cmd.argv, reading, *injected)


def _read(
    model: ProgramModel, argv: tuple[Word, ...], injection: bool
) -> tuple[Reading, tuple[int, ProgramModel] | None]:
    reader = _Reader(model, argv, injection)
    try:
        if model.grammar == "find":
            reader.find()
        elif model.grammar == "words":
            reader.roles.extend(Role(k, Kind.OTHER.value, w.value) for k, w in enumerate(argv) if k)
        elif model.grammar == "infozip":
            reader.infozip()
        elif model.grammar == "unzip":
            reader.unzip()
        else:
            reader.getopt()
        return reader.finish(), reader.injected
    except _Refused as exc:
        return Reading(model.program, tuple(reader.roles), refused=str(exc)), None


def alternatives(sub: ProgramModel) -> list[tuple[str, Word]]:
    """What one quoted run-time word in an option's place could be, besides an operand: `--`,
    and each option of `sub` in each spelling, bare (a flag, or taking the next word as its
    value) and with a value attached that is known only at run time."""
    unknown = (Expansion.PARAMETER,)
    out: list[tuple[str, Word]] = [("--", Word("--"))]
    for o in sub.options:
        for n in o.names:
            out.append((n, Word(n)))
            if o.kinds and not o.separate_only:
                out.append((n, Word(n + ("=" if n.startswith("--") else "") + "$V", unknown, '"$V"')))
    return out


def _with_alternatives(
    model: ProgramModel, argv: tuple[Word, ...], reading: Reading, i: int, sub: ProgramModel
) -> Reading:
    """Issue 13, class 2: the run-time word at `i` was read as an operand; it could as well be
    any option of `sub` (the model is `complete`), so the command is read again with each, and
    what any reading opens is what the command may open. Any reading the model refuses, or that
    runs code, refuses the command."""
    w = argv[i]
    reads, writes = list(reading.reads), list(reading.writes)
    could_be: list[str] = []
    for name, alt in alternatives(sub):
        other, _ = _read(model, (*argv[:i], alt, *argv[i + 1 :]), False)
        why = other.refused or "; ".join(other.runs)
        if why:
            return Reading(
                reading.model, reading.roles,
                refused=f"{w.raw} is known only at run time and could be {alt.value}, and then: {why}; "
                f"put '--' before it{_ALSO.get(model.program, '')}",
            )  # fmt: skip
        could_be.append(name)
        reads += [x for x in other.reads if x not in reads]
        writes += [x for x in other.writes if x not in writes]
    return Reading(
        reading.model, reading.roles, tuple(reads), tuple(writes), reading.runs, "", reading.operands,
        tuple(dict.fromkeys(could_be)),
    )  # fmt: skip
