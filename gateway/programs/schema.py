"""The format of a program model (`gateway/programs/<program>.yaml`), as pydantic models.

A model says what a program does with each word of its argv: which options exist and whether
they take a value, what that value is (a path read or written, a pattern, a script, a program to
run...), and what the operands are. The permissions stage reads a command through its model
(argv.py) when a rule names the program and writes no `path_args`: the path jail then checks
exactly the words the program opens, and a rule never matches a use that runs code the gateway
cannot check. Models are data for an admin to review; each carries examples, checked at load.

Models are frozen and forbid unknown keys, like the policy format (gateway/policy/schema.py).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Kind(StrEnum):
    """What a word is to the program."""

    READ = "read"
    """A path the program opens for reading (or lists, or stats)."""
    WRITE = "write"
    """A path the program creates, truncates, changes or deletes."""
    PATTERN = "pattern"
    """Text matched against data (a regular expression, a glob for names): never opened."""
    SCRIPT = "script"
    """Program text in the model's `language` (a sed script, an awk program): parsed, and what it
    reads, writes and runs is taken from it."""
    SCRIPT_FILE = "script_file"
    """A file holding program text: a read, and code the gateway cannot see (it may change between
    the check and the run), so a use of it runs code."""
    PROGRAM = "program"
    """A program the program starts: runs code."""
    COMMAND = "command"
    """find's -exec: the words up to `;` or `+` are a command, which the analyser reports as a
    command of its own and the policy decides like any other. Nothing here."""
    OTHER = "other"
    """A number, a name, a format, a field separator: no file, no code."""


class Option(_Model):
    """One option of the program, with every spelling."""

    names: list[str] = Field(min_length=1)
    """Spellings: `-e` (a short option, clusters like `-ne`), `--regexp` (long: `--regexp=X`,
    `--regexp X` and unique prefixes like `--reg`), or for find-style grammars `-name` (a
    single-dash word, exact)."""
    value: Kind | list[Kind] | None = None
    """What the option's value is; a list for options taking several words (find's `-fprintf
    FILE FORMAT`). Unset: the option takes no value."""
    optional: StrictBool = False
    """The value is optional, so it can only be attached: `-i.bak`, `--color=auto`."""
    runs_code: str = ""
    """Set (to why) when using the option runs code the gateway cannot check."""
    lists_files: StrictBool = False
    """The value (a file read) names more files, which the program reads too (`--files0-from`):
    they are known only at run time, so the jail refuses them unless the rule accepts unknown
    paths."""
    unsupported: str = ""
    """Set (to why) when the model cannot follow what the option does: a command using it is
    not read, so no rule relying on the model matches it."""
    writes_operands: StrictBool = False
    """With this option the operands are written too (sed -i, find -delete)."""
    backup_suffix: StrictBool = False
    """The value is a backup suffix (sed -i.bak): each written operand is also written under its
    name plus the suffix, or, where the suffix holds a `*`, the suffix with `*` made the file's
    name (in the file's directory when the suffix has no `/`)."""
    replaces_first: StrictBool = False
    """With this option the first operand is no longer the pattern or script (grep -e, sed -e,
    awk -f): it is like the others."""
    first_operand: Kind | None = None
    """With this option the first operand is of this kind (jq -f: the first operand is the file
    holding the program, not the program)."""
    writes_unknown: str = ""
    """Set (to what) when the option writes files named only at run time (tar -x: the archive's
    members): a write the jail refuses unless the rule accepts unknown paths."""
    extracts: StrictBool = False
    """With this option the program extracts an archive's members (tar -x): it writes under its
    extraction directory (the cwd, or the value of a `directory` option), which the jail checks
    as a write; what lies below, the sandbox bounds (docs/policy.md, "Archives")."""
    lists_only: StrictBool = False
    """With this option a program that extracts by default only lists, tests or prints (unzip -l,
    -t, -p): it writes no member."""
    directory: StrictBool = False
    """The value is the directory the program works in from here on (tar -C DIR, unzip -d DIR): the
    operands after it are relative to it (tar), and the members are extracted under it."""
    reads_unknown: str = ""
    """Set (to what) when the option makes the program read files named only at run time (zip -@:
    names on its input): a read the jail refuses unless the rule accepts unknown paths."""
    value_list: StrictBool = False
    """infozip grammar: the value is a list, every following word up to the next option, a lone
    `@` or the end (zip -x PATTERN...); attached (`-xPAT`), one value."""
    rest_operands: Kind | None = None
    """With this option the operands after the first are of this kind (zip -d: entry patterns
    inside the archive, not files)."""
    remote_colon: StrictBool = False
    """A value holding `:` before any `/` names a file on another host, which the program reaches
    by running rsh or ssh (tar -f HOST:FILE): code the gateway cannot check."""
    ends_options: StrictBool = False
    """The option ends the options like `--` (git's --end-of-options)."""
    separate_only: StrictBool = False
    """The value is always the next word, never attached (git rev-parse --resolve-git-dir): a
    word that could be the option, with no word after it, cannot give it a value."""
    note: str = ""
    """For the reviewer: what the option does, where it matters."""

    @field_validator("names")
    @classmethod
    def _spellings(cls, names: list[str]) -> list[str]:
        for n in names:
            if not re.fullmatch(r"-[A-Za-z0-9@?]|--[A-Za-z0-9][A-Za-z0-9-]*|-[A-Za-z][A-Za-z0-9_-]+", n):
                raise ValueError(f"{n!r} is not an option spelling (-x, --long, or -long for find-style)")
        return names

    @model_validator(mode="after")
    def _optional_needs_value(self) -> Option:
        if self.optional and (self.value is None or isinstance(self.value, list)):
            raise ValueError("optional: true needs a single value kind")
        return self

    @property
    def kinds(self) -> tuple[Kind, ...]:
        if self.value is None:
            return ()
        return tuple(self.value) if isinstance(self.value, list) else (self.value,)


class Operands(_Model):
    """What the operands (the words that are not options or option values) are."""

    first: Kind | None = None
    """The first operand's kind, unless an option with `replaces_first` is given (grep: the
    pattern; sed: the script; awk: the program). Unset: like the rest."""
    rest: Kind = Kind.READ
    """Every other operand (for find: the starting points)."""
    assignments: StrictBool = False
    """Operands written NAME=VALUE are variable assignments, not files (awk)."""
    printed: StrictBool = False
    """The operands are text the program prints (printf's format and arguments): an unquoted glob
    there gives it file names to print, which is what such a glob is for (its listing is a read,
    jailed), not a pattern turned into file names by mistake."""


class Subcommand(_Model):
    """What one subcommand (`git log`) does with the words after its name: a grammar of its own."""

    includes: list[str] = []
    """Subcommands whose options this one takes too (git log takes git diff's)."""
    options: list[Option] = []
    operands: Operands = Operands()
    permutes: StrictBool = True
    digit_options: StrictBool = False
    """`-NUM` is an option (git log -5)."""
    complete: StrictBool = False
    """Every option the real subcommand accepts is listed (so a run-time word that could be an
    option can only be one of these: see `ProgramModel.complete`)."""
    note: str = ""


class Example(_Model):
    """A command and what the model must read in it: checked when the models load."""

    command: str = Field(min_length=1)
    read: list[str] = []
    """Exactly the paths read (as written)."""
    write: list[str] = []
    """Exactly the paths written."""
    patterns: list[str] = []
    """Words taken as patterns (checked to be among them)."""
    scripts: list[str] = []
    """Words taken as scripts."""
    runs_code: StrictBool = False
    """The command runs code the gateway cannot check."""
    refused: StrictBool = False
    """The model cannot read the command (an unknown option, a script it cannot parse...)."""


class ProgramModel(_Model):
    """One program, as its data file describes it."""

    program: str = Field(pattern=r"^[a-z0-9][a-z0-9_.+-]*$")
    """The name; the file is `<program>.yaml`."""
    names: list[str] = []
    """Other names the same model applies to (egrep, fgrep for grep). The program is always one."""
    summary: str = Field(min_length=1)
    sources: list[str] = Field(min_length=1)
    """Where the facts come from (the man page, `--help` of the version tested, a Fig spec);
    the authority is the real program, under tests/programs/test_strace.py."""
    grammar: Literal["getopt", "find", "words", "infozip", "unzip"] = "getopt"
    """How argv is read. `getopt`: GNU getopt_long with permutation (options anywhere before
    `--`, short clusters, long options by unique prefix). `find`: leading options, starting
    points, then an expression of `primaries`. `words`: every word is a value (a pid, a signal, a
    column name): the program opens no file its words name and runs nothing (ps, kill).
    `infozip`: Info-ZIP zip 3.0's own parser (fileio.c get_option): options anywhere before `--`,
    short options of one or two characters (a two-character one wins: `-TT` is not `-T -T`), a
    trailing `-` negates, value lists (`-x A B`). `unzip`: UnZip 6.0's: options only before the
    archive, a `-` in a cluster negates; after the archive, only `-d DIR` (the first) and `-x`
    (starting the exclude list) are options, every other word a member pattern."""
    extracts: StrictBool = False
    """The program extracts an archive's members unless an option says it only lists (unzip)."""
    bundled_first: StrictBool = False
    """getopt: a first word without a dash is a bundle of short options (tar xzf F), which the
    model does not read: refused (write the options with a dash)."""
    permutes: StrictBool = True
    """getopt: options may follow operands (GNU's default). False: the first operand ends the
    options, and every word after it is an operand (awk: `awk '{print}' -v f` reads a file
    named `-v`)."""
    digit_options: StrictBool = False
    """`-NUM` is an option (grep -5, head -20)."""
    language: Literal["sed", "awk", "jq"] | None = None
    """The script language of `script` words."""
    long_prefixes: StrictBool = True
    """getopt: a long option may be abbreviated to a unique prefix (GNU getopt_long). False: only
    the full spelling (git's revision options); a prefix is then an unknown option, refused."""
    complete: StrictBool = False
    """Every option the real program accepts is listed, checked against its --help. Only then can
    a run-time word in an option's place (a quoted `"$V"`, one word) be taken as an operand: it
    could only become one of the listed options, so if none of them writes, runs code, reads a
    file it names or is forbidden by the rule, the command is read as if it were an operand
    (issue 13, class 2)."""
    options: list[Option] = []
    """Options; for a program with `subcommands`, the global ones before the subcommand."""
    primaries: list[Option] = []
    """find-style grammars: the expression's tests and actions."""
    operands: Operands = Operands()
    subcommands: dict[str, Subcommand] = {}
    """Programs with subcommands (git): the first operand after the global options names one of
    these, and the words after it are read with its grammar; an unlisted subcommand is refused.
    A name may be listed as `a|b` for aliases."""
    examples: list[Example] = Field(min_length=1)

    def subcommand(self, name: str) -> ProgramModel | None:
        """The model of `name`'s grammar, as a program of its own (None: not listed)."""
        return _subcommands(self).get(name)

    @property
    def only_reads(self) -> bool:
        """Does every option and operand at most read (no writes, scripts, programs, nothing
        refused)? An option injected into such a program can only make it read more."""
        quiet = (Kind.READ, Kind.PATTERN, Kind.OTHER)
        for o in (*self.options, *self.primaries):
            if o.runs_code or o.unsupported or o.writes_operands or any(k not in quiet for k in o.kinds):
                return False
        return self.operands.rest in quiet and self.operands.first in (None, *quiet)

    @model_validator(mode="after")
    def _consistent(self) -> ProgramModel:
        seen: set[str] = set()
        for o in (*self.options, *self.primaries):
            for n in o.names:
                if n in seen:
                    raise ValueError(f"option {n!r} is listed twice")
                seen.add(n)
                if self.grammar in ("getopt", "unzip") and not re.fullmatch(r"-[A-Za-z0-9]|--[A-Za-z0-9-]+", n):
                    raise ValueError(f"option {n!r}: a {self.grammar} program has -x or --long options only")
                if self.grammar == "infozip" and not re.fullmatch(r"-[A-Za-z0-9@?]{1,2}|--[A-Za-z0-9-]+", n):
                    raise ValueError(f"option {n!r}: an infozip program has -x, -xy or --long options only")
        kinds = {k for o in (*self.options, *self.primaries) for k in o.kinds}
        kinds |= {self.operands.rest} | ({self.operands.first} if self.operands.first else set())
        if Kind.SCRIPT in kinds and self.language is None:
            raise ValueError("a script value or operand needs `language`")
        for key, sub in self.subcommands.items():
            options = _options_of(self, key)
            kinds |= {k for o in options for k in o.kinds} | {sub.operands.rest}
            names = [n for o in options for n in o.names]
            if len(names) != len(set(names)):
                raise ValueError(
                    f"a subcommand lists an option twice: {sorted(n for n in names if names.count(n) > 1)}"
                )
        if self.primaries and self.grammar != "find":
            raise ValueError("primaries are for grammar: find")
        return self


_SUBS: dict[int, tuple[ProgramModel, dict[str, ProgramModel]]] = {}


def _subcommands(model: ProgramModel) -> dict[str, ProgramModel]:
    """Each subcommand as a ProgramModel (built once per model object)."""
    found = _SUBS.get(id(model))
    if found is not None and found[0] is model:
        return found[1]
    out: dict[str, ProgramModel] = {}
    for names, sub in model.subcommands.items():
        one = model.model_copy(
            update={
                "program": f"{model.program} {names.split('|')[0]}",
                "options": _options_of(model, names),
                "operands": sub.operands,
                "permutes": sub.permutes,
                "digit_options": sub.digit_options,
                "complete": sub.complete,
                "subcommands": {},
            }
        )
        for n in names.split("|"):
            out[n] = one
    _SUBS[id(model)] = (model, out)
    return out


def _options_of(model: ProgramModel, key: str, seen: tuple[str, ...] = ()) -> list[Option]:
    """A subcommand's options, those of the subcommands it `includes` first."""
    by_name = {n: k for k in model.subcommands for n in k.split("|")}
    sub = model.subcommands[key]
    out: list[Option] = []
    for inc in sub.includes:
        if inc not in by_name or inc in seen:
            raise ValueError(f"subcommand {key!r} includes {inc!r}, which is not a subcommand listed before it")
        out += _options_of(model, by_name[inc], (*seen, key))
    return out + list(sub.options)
