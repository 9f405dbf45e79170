"""Variables a text reads but nothing sets: empty, where the shell starts with an environment the
gateway builds.

A `run` call starts a new bash with the environment the gateway gives it (a fixed allowlist, the
sandbox's HOME and git settings, the variables the policy's `environment.allow` lets the env tool
store, and the call's `env`). A variable outside all of those, which bash does not set itself and
which the text never assigns, is unset when the text runs: `$V` is nothing and `"$V"` the empty
word. CI scripts are full of them (`--features $TOKIO_STABLE_FEATURES`, `git reset --hard
"${TAG_NAME}"`); read as unknown, each could be any option or path, and is refused.

Reading them as empty is sound only where nothing in the text can assign them, so a text is
left as it is (`resolve` returns its commands unchanged) when it holds anything that can assign
a name the analysis does not see written out: a builtin that takes a variable name (`read`,
`printf -v`, `declare`/`export`/`local`, `mapfile`, `getopts`, `eval`, `source`...), and any
arithmetic context (`$((...))`, `((...))`, `let`, `[[ a -eq b ]]`, an array subscript, `${x:off}`),
where a value built at run time names the variable (`v="T""AG=-5"; [[ $v -eq 0 ]]` sets TAG).
A name qualifies only if every place the text spells it is a plain `$NAME` or `${NAME}`.
Sessions, processes started earlier and an agent's hook inherit whatever came before: there the
caller does not ask for this, and a variable stays unknown.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import replace

from gateway.analysis.model import Command, Word

# Builtins (and wrappers that run them) that assign a variable named by a word, which may be
# built at run time; and those that run text the analysis does not see as commands.
ASSIGNING = frozenset(
    {
        "read", "mapfile", "readarray", "printf", "declare", "typeset", "local", "export", "readonly",
        "getopts", "let", "unset", "select", "coproc", "wait", "eval", "source", ".", "enable",
        "builtin", "command", "exec", "trap", "alias", "shopt", "fc", "bind", "complete", "compgen",
        "history", "caller", "hash",
    }
)  # fmt: skip
# Variables bash sets or changes itself (bash(1), "Shell Variables"), and `_`.
SHELL_SET = frozenset(
    {
        "_", "BASH", "BASHOPTS", "BASHPID", "BASH_ALIASES", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0",
        "BASH_CMDS", "BASH_COMMAND", "BASH_COMPAT", "BASH_ENV", "BASH_EXECUTION_STRING", "BASH_LINENO",
        "BASH_LOADABLES_PATH", "BASH_MONOSECONDS", "BASH_REMATCH", "BASH_SOURCE", "BASH_SUBSHELL",
        "BASH_TRAPSIG", "BASH_VERSINFO",
        "BASH_VERSION", "BASH_XTRACEFD", "CDPATH", "CHILD_MAX", "COLUMNS", "COMP_CWORD", "COMP_KEY",
        "COMP_LINE", "COMP_POINT", "COMP_TYPE", "COMP_WORDBREAKS", "COMP_WORDS", "COMPREPLY", "COPROC",
        "DIRSTACK", "EMACS", "ENV", "EPOCHREALTIME", "EPOCHSECONDS", "EUID", "EXECIGNORE", "FCEDIT",
        "FIGNORE", "FUNCNAME", "FUNCNEST", "GLOBIGNORE", "GROUPS", "HISTCMD", "HISTCONTROL", "HISTFILE",
        "HISTFILESIZE", "HISTIGNORE", "HISTSIZE", "HISTTIMEFORMAT", "HOME", "HOSTFILE", "HOSTNAME",
        "HOSTTYPE", "IFS", "IGNOREEOF", "INPUTRC", "INSIDE_EMACS", "LANG", "LINENO", "LINES", "MACHTYPE",
        "MAIL", "MAILCHECK", "MAILPATH", "MAPFILE", "OLDPWD", "OPTARG", "OPTERR", "OPTIND", "OSTYPE",
        "PATH", "PIPESTATUS", "POSIXLY_CORRECT", "PPID", "PROMPT_COMMAND", "PROMPT_DIRTRIM", "PS0", "PS1",
        "PS2", "PS3", "PS4", "PWD", "RANDOM", "READLINE_ARGUMENT", "READLINE_LINE", "READLINE_MARK",
        "READLINE_POINT", "REPLY", "SECONDS", "SHELL", "SHELLOPTS", "SHLVL", "SRANDOM", "TIMEFORMAT",
        "TMOUT", "TMPDIR", "UID",
    }
)  # fmt: skip
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_IDENTIFIER = re.compile(_NAME)
_REFERENCE = re.compile(r"\$(?:\{(" + _NAME + r")\}|(" + _NAME + "))")
# arithmetic contexts and every `${...}` but a plain `${NAME}`: offsets, subscripts, defaults
# (`${V:=x}` assigns), indirection (`${!V}`)
_ARITHMETIC = re.compile(r"\(\(|\$\[|\[\[|[A-Za-z0-9_}\]]\[|\$\{(?!" + _NAME + r"\})")
# the same names anywhere in the text, in case one runs where the analysis sees no command (`.`
# is left to the commands: `./x` and `git add .` would match it)
_WORDS = re.compile(r"(?<![A-Za-z0-9_.-])(" + "|".join(sorted(ASSIGNING - {"."})) + r")(?![A-Za-z0-9_-])")


def resolve(text: str, commands: tuple[Command, ...], may_be_set: Callable[[str], bool]) -> tuple[Command, ...]:
    """`commands` with every argument word made only of text and references to variables that
    are surely unset read as what bash makes of it then (nothing, or a literal word).
    `may_be_set(name)`: could the environment the shell starts with hold `name`?"""
    names = unset_names(text, commands, may_be_set)
    if not names:
        return commands
    # a wrapper's words were split into its options and the command it runs when the text was
    # analysed: a word that vanishes there would move where that command starts
    wrappers = {c.wrapper for c in commands if c.wrapper}
    out: list[Command] = []
    for cmd in commands:
        argv: list[Word] = list(cmd.argv[:1])
        changed = False
        for w in cmd.argv[1:]:
            words = _expand(w, names) if not w.literal else None
            if words is None:
                argv.append(w)
                continue
            if not words and posixpath.basename(cmd.program) in wrappers:
                return commands
            argv.extend(words)
            changed = True
        out.append(replace(cmd, argv=tuple(argv)) if changed else cmd)
    return tuple(out)


def unset_names(text: str, commands: tuple[Command, ...], may_be_set: Callable[[str], bool]) -> frozenset[str]:
    """The names `text` reads that are surely unset when it runs (empty: none, or the text holds
    something that could assign a name unseen)."""
    if _ARITHMETIC.search(text) or _WORDS.search(text):
        return frozenset()
    for cmd in commands:
        if cmd.argv and (not cmd.argv[0].literal or cmd.program in ASSIGNING):
            return frozenset()
    referenced = {m.group(1) or m.group(2) for m in _REFERENCE.finditer(text)}
    spelled: dict[str, int] = {}
    for m in _IDENTIFIER.finditer(text):
        spelled[m.group()] = spelled.get(m.group(), 0) + 1
    plain: dict[str, int] = {}
    for m in _REFERENCE.finditer(text):
        name = m.group(1) or m.group(2)
        plain[name] = plain.get(name, 0) + 1
    return frozenset(
        n for n in referenced if n not in SHELL_SET and not may_be_set(n) and spelled.get(n, 0) == plain.get(n, 0)
    )


def _expand(w: Word, names: frozenset[str]) -> list[Word] | None:
    """What bash makes of the word when every name in `names` is unset: no word or one literal
    word; None where the word holds anything else known only at run time (or a glob, a brace, a
    tilde), or no such reference at all."""
    raw = w.raw
    out: list[str] = []
    quoted = False
    used = False
    i, n = 0, len(raw)
    state = ""  # "" unquoted, "'" or '"'
    while i < n:
        c = raw[i]
        if state == "'":
            if c == "'":
                state = ""
            else:
                out.append(c)
            i += 1
            continue
        if c == "$":
            m = _REFERENCE.match(raw, i)
            if m is None or (m.group(1) or m.group(2)) not in names:
                return None
            used = True
            i = m.end()
            continue
        if c == "`":
            return None
        if state == '"':
            if c == '"':
                state = ""
            elif c == "\\" and i + 1 < n and raw[i + 1] in '$`"\\\n':
                if raw[i + 1] != "\n":
                    out.append(raw[i + 1])
                i += 1
            else:
                out.append(c)
            i += 1
            continue
        if c == "\\":
            if i + 1 >= n:
                return None
            if raw[i + 1] != "\n":
                out.append(raw[i + 1])
                quoted = True
            i += 2
            continue
        if c in "'\"":
            state = c
            quoted = True
            i += 1
            continue
        if c in "*?[]{}~" or c.isspace():
            return None  # a glob, a brace, or a tilde (bash expands one after `=` or `:` too: `X=~`)
        out.append(c)
        i += 1
    if state or not used:
        return None
    value = "".join(out)
    if not value and not quoted:
        return []  # an unquoted reference to an unset variable, alone: no word at all
    return [Word(value, (), raw)]
