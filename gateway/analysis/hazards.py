"""Constructs the analyser models but refuses, because they hide or change what would run.

Each check takes the complete list of commands (wrappers already unwrapped) and raises
`Unmodelled` with a stable code. The lists below are the contract documented in
docs/analysis.md; change both together.
"""

from __future__ import annotations

import os
import re
import unicodedata
from functools import lru_cache

from gateway.analysis.model import Assignment, Command, Expansion, Flag, RedirectMode, Word
from gateway.analysis.primary import Unmodelled, Walk
from gateway.analysis.words import numeric_only

# Builtins that run text as code, or change how later names resolve.
FORBIDDEN_BUILTINS: dict[str, str] = {
    "eval": "eval runs a string as shell code, which cannot be checked",
    "source": "source runs a file as shell code, which cannot be checked",
    ".": "'.' runs a file as shell code, which cannot be checked",
    "alias": "aliases change what a command name runs",
    "trap": "trap runs a string as shell code later, which cannot be checked",
    "enable": "enable loads or disables builtins, changing what a command name runs",
    "fc": "fc re-runs commands from history, which cannot be checked",
    "bind": "bind -x runs a string as shell code on a key, which cannot be checked",
}
# Options that make a builtin run a string as a command: {builtin: option letters}
_COMMAND_OPTIONS = {"mapfile": "C", "readarray": "C", "compgen": "CFW", "complete": "CFW", "jobs": "x"}
# Builtins with an option that assigns a variable, binds a name or runs code, and the letters of
# their options that take a value. bash reads a builtin's options after expansion, up to its
# first operand or `--`, so a word known only at run time there (`printf "$x" /tmp` with
# x=-vPATH) may be any of them; after the first operand no word is an option.
_RISKY_OPTIONS: dict[str, str] = {
    "printf": "v",
    "wait": "p",
    "hash": "pt",
    "set": "o",
    "compgen": "ACFGPSWXo",
    "complete": "ACFGPSWXo",
    "jobs": "",
    "mapfile": "CcdnOsu",
    "readarray": "CcdnOsu",
}
# Characters an unquoted $((...)) result can hold: the shell splits it at IFS like any other
# expansion, so IFS may not hold them (docs/analysis.md, "Numbers").
_NUMBER_CHARACTERS = frozenset("0123456789-")
_UNKNOWN = Word("", (Expansion.PARAMETER,), "")  # an assigned value known only at run time
# fmt: off
# Words tree-sitter may leave as a command name when it misreads `time { ...; }` and the like.
RESERVED_WORDS = frozenset({
    "{", "}", "!", "if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while",
    "until", "do", "done", "function", "in", "[[", "]]",
})
BASH_BUILTINS = frozenset({
    "alias", "bg", "bind", "break", "builtin", "caller", "cd", "command", "compgen", "complete",
    "compopt", "continue", "declare", "dirs", "disown", "echo", "enable", "eval", "exec", "exit",
    "export", "false", "fc", "fg", "getopts", "hash", "help", "history", "jobs", "kill", "let",
    "local", "logout", "mapfile", "popd", "printf", "pushd", "pwd", "read", "readarray",
    "readonly", "return", "set", "shift", "shopt", "source", "suspend", "test", "times", "trap",
    "true", "type", "typeset", "ulimit", "umask", "unalias", "unset", "wait", ".", ":", "[",
})
# fmt: on

# Variables that change which program bash runs for a name, or make bash run code of its own.
# Program-level variables (PAGER, GIT_SSH_COMMAND...) are the policy's allowed-env list.
PROTECTED_VARIABLES = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS0",
        "PS1",
        "PS2",
        "PS3",
        "PS4",
        "PROMPT_COMMAND",
        "BASH_LOADABLES_PATH",
        "EXECIGNORE",
        "CDPATH",
        "HISTFILE",
        "BASH_XTRACEFD",
        "BASH_COMPAT",
        "POSIXLY_CORRECT",
        "GLOBIGNORE",
        "INPUTRC",
        "HOME",  # what ~ and a bare cd mean; the gateway sets it
        "BASH_CMDS",  # BASH_CMDS[ls]=/x binds a command name to a program, like hash -p
        "BASH_ALIASES",  # BASH_ALIASES[ls]=... defines an alias
    }
)
# LC_*/LANG: in GBK, BIG5 or GB18030 a backslash byte can end a multibyte character, so bash in
# such a locale splits text the analyser (reading UTF-8) saw as one quoted word.
PROTECTED_PREFIXES = ("LD_", "BASH_FUNC_", "LC_")

# Builtins that evaluate a literal word as arithmetic or as a variable name with a subscript,
# where `a[$(cmd)]` runs cmd.
_SUBSCRIPT_EVALUATORS = frozenset(
    {
        "let",
        "declare",
        "typeset",
        "local",
        "export",
        "readonly",
        "unset",
        "read",
        "printf",
        "mapfile",
        "readarray",
        "test",
        "[",
        "[[",
        "((",
        "getopts",
        "wait",
    }
)
_DECLARATIONS = frozenset({"declare", "typeset", "local", "export", "readonly"})

BASH_KEYWORDS_AND_BUILTINS = RESERVED_WORDS | BASH_BUILTINS | {"time", "coproc", "command_not_found_handle"}
STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@lru_cache(maxsize=4096)
def is_program_name(name: str) -> bool:
    """Does `name` name a builtin, keyword or a program on the standard PATH?"""
    if name in BASH_KEYWORDS_AND_BUILTINS or "/" in name:
        return True
    return any(os.access(os.path.join(d, name), os.X_OK) for d in STANDARD_PATH)


def check(commands: list[Command], walk: Walk) -> None:
    for name in walk.functions:
        if is_program_name(name):
            raise Unmodelled(
                "function_shadows_program",
                f"function '{name}' would shadow the program or builtin of that name",
                name,
            )
    for name in walk.loop_variables:
        _check_variable(name, "loop variable")
    for name in walk.expansion_assignments:
        _check_variable(name, "${NAME:=...}")
    for text in walk.arithmetic_texts:
        for name in _IDENTIFIER.findall(text):
            _check_variable(name, "arithmetic")
    for cmd in commands:
        for a in cmd.assignments:
            _check_assignment(a)
        if not cmd.argv:
            continue
        head = cmd.argv[0]
        if not head.literal:
            raise Unmodelled(
                "dynamic_command_name",
                f"the command name '{head.raw or head.value}' is not a literal word, so what it "
                "runs is only known at run time",
                head.raw or head.value,
            )
        program = head.value
        if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in program):
            raise Unmodelled(
                "invalid_character",
                f"command name {program!r} holds a control or invisible character",
                program,
            )
        if program in RESERVED_WORDS and not (Flag.BUILTIN in cmd.flags and program == "[["):
            raise Unmodelled(
                "reserved_word_as_command",
                f"'{program}' stands where a command name should be: the parser could not model this "
                "construct (e.g. `time` or `coproc` before a compound command)",
                program,
            )
        if program in FORBIDDEN_BUILTINS:
            raise Unmodelled("forbidden_builtin", f"{program}: {FORBIDDEN_BUILTINS[program]}", program)
        if program == "hash" and any(w.value.startswith("-") and "p" in w.value for w in cmd.argv[1:]):
            raise Unmodelled("forbidden_builtin", "hash -p binds a command name to another program", "hash -p")
        if program in _RISKY_OPTIONS:
            _check_option_words(cmd)
        letters = _COMMAND_OPTIONS.get(program, "")
        if letters and any(w.value.startswith("-") and set(w.value[1:]) & set(letters) for w in cmd.argv[1:]):
            raise Unmodelled("forbidden_builtin", f"{program} -{letters[0]} runs a string as a command", program)
        if program == "set" and _set_exports(cmd.argv[1:]):
            raise Unmodelled(
                "forbidden_builtin",
                "set -a / -k export assignments behind the policy's back (GIT_CONFIG_*=... would reach git)",
                "set",
            )
        if program in _SUBSCRIPT_EVALUATORS:
            _check_subscripts(cmd)
        _check_arithmetic(cmd)
        if program in _DECLARATIONS:
            for w in cmd.argv[1:]:
                if "=" in w.value and not w.value.startswith("-"):
                    _check_stash(Word(w.value.split("=", 1)[1], w.expansions, w.raw), program)
        if program in ("read", "mapfile", "readarray"):
            for r in cmd.redirects:
                if r.mode in (RedirectMode.HERESTRING, RedirectMode.HEREDOC) and r.target is not None:
                    _check_stash(r.target, f"{program} input")
        _check_variable_targets(cmd)


def _set_exports(args: tuple[Word, ...]) -> bool:
    """Does `set ARGS` turn on allexport (-a, -o allexport) or keyword (-k, -o keyword)?
    Options end at `--` or the first operand (`set -- -a` sets positional parameters)."""
    i = 0
    while i < len(args):
        v = args[i].value
        if v == "--" or v[:1] not in "-+" or v in ("-", "+"):
            return False
        if "o" in v[1:]:  # -o NAME, +o NAME, and o anywhere in a cluster (`set -oe allexport`)
            value = args[i + 1] if i + 1 < len(args) else None
            if value is not None and (not value.literal or value.value in ("allexport", "keyword")):
                return True
            i += 2
            continue
        if v[0] == "-" and set(v[1:]) & {"a", "k"}:
            return True
        i += 1
    return False


def _option_words(args: tuple[Word, ...], with_value: str, anywhere: bool = False) -> tuple[list[Word], int]:
    """A builtin's option words (with the values they take) and the index of its first operand:
    options end at `--` or at the first word that is not one (bash's builtins do not permute). A
    letter of `with_value` takes the next word when it ends its cluster, or with `anywhere`
    wherever it stands in it (`set -oe pipefail`)."""
    i = 0
    out: list[Word] = []
    while i < len(args):
        w = args[i]
        v = w.value
        if w.literal and v == "--":
            return out, i + 1
        if w.literal and (v[:1] not in "-+" or v in ("-", "+")):
            return out, i
        out.append(w)
        takes = set(v[1:]) & set(with_value) if anywhere else v[-1] in with_value
        if w.literal and takes and i + 1 < len(args):
            out.append(args[i + 1])  # the option's value
            i += 1
        i += 1
    return out, i


def _could_be_option(w: Word) -> bool:
    """Could a word known only at run time be an option to a builtin? Only one whose value
    starts with a literal character other than `-` or `+` cannot (`x$y`: split or not, the first
    word starts with `x`, and a builtin's options end there). A glob is the jail's: it refuses a
    match that would be an option (docs/analysis.md, "Words the gate expands itself")."""
    if set(w.expansions) <= {Expansion.GLOB, Expansion.TILDE} or numeric_only(w.raw):
        return False  # a number (`wait $!`) is at most `-` and digits: none of the options
    return not w.value or w.value[0] in "$`{-+\"'"


def _takes_value(w: Word, program: str) -> bool:
    letters = _RISKY_OPTIONS[program]
    v = w.value
    return bool(set(v[1:]) & set(letters)) if program == "set" else v[-1:] in letters and len(v) > 1


def _check_option_words(cmd: Command) -> None:
    """A word known only at run time where a builtin with a risky option reads its options:
    `printf "$x" /tmp` assigns PATH when x is -vPATH, `set "$x"` turns on allexport."""
    program = cmd.program
    args = cmd.argv[1:]
    letters = _RISKY_OPTIONS[program]
    words, _ = _option_words(args, letters, anywhere=program == "set")
    for k, w in enumerate(words):
        value = k > 0 and words[k - 1].literal and _takes_value(words[k - 1], program)
        if w.literal or value or not _could_be_option(w):
            continue  # a value's own check is its option's (printf -v NAME, set -o NAME)
        raise Unmodelled(
            "dynamic_builtin_option",
            f"{program}: '{w.raw or w.value}' is known only at run time and stands where {program} reads its "
            f"options, some of which assign variables or run code: put '--' before it",
            w.raw or w.value,
        )


def _check_assignment(a: Assignment) -> None:
    _check_variable(a.name.split("[", 1)[0], "assignment", a.value)
    _check_stash(a.value, f"assignment to {a.name}")


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CODE_MARKERS = ("$(", "`", "${")


def _check_arithmetic(cmd: Command) -> None:
    """Arithmetic assigns with =, +=, ++ ... (`((PATH=5))`, `let PATH=5`, `$((PATH=5))`): any
    protected name in an arithmetic word is refused."""
    for w in cmd.argv:
        if Expansion.ARITHMETIC in w.expansions:
            for name in _IDENTIFIER.findall(w.value):
                _check_variable(name, "arithmetic")


def _check_stash(value: Word, how: str) -> None:
    """A literal value that holds `$(...)`, a backtick or `${` is code kept for later: bash runs
    it when the value is evaluated as arithmetic (`a[$(cmd)]`), as a prompt or by name. Code read
    from files at run time is the sandbox's to contain; code written into the text is refused."""
    if value.literal and any(m in value.value for m in _CODE_MARKERS):
        raise Unmodelled(
            "stashed_code",
            f"{how}: the literal value {value.value[:60]!r} holds a substitution that bash could run "
            "later; if it is meant as text, avoid $( ` and ${ in it",
            value.value[:80],
        )


def _check_variable(name: str, how: str, value: Word | None = _UNKNOWN) -> None:
    """`value` is what `how` assigns: a Word, None for nothing (`unset`, `local NAME`), or by
    default a value known only at run time."""
    if name == "IFS" and value is not None and not (value.literal and not set(value.value) & _NUMBER_CHARACTERS):
        raise Unmodelled(
            "protected_variable",
            f"{how} to IFS is refused unless its value is written literally and holds no digit or '-': the "
            "gate takes an unquoted $((...)) for one number, which IFS must not split (restore IFS with `unset IFS`)",
            name,
        )
    if name in PROTECTED_VARIABLES or name.startswith(PROTECTED_PREFIXES):
        raise Unmodelled(
            "protected_variable",
            f"{how} to {name} is refused: it changes which program the shell runs or makes the "
            "shell run code of its own",
            name,
        )


def _check_subscripts(cmd: Command) -> None:
    for w in cmd.argv[1:]:
        v = w.value
        if w.literal and "=(" in v and any(s in v for s in ("$(", "`", "${")):
            # declare -a 'a=($(cmd))': the quoted text is parsed again as a compound assignment
            raise Unmodelled(
                "subscript_substitution",
                f"{cmd.program}: '{v}' is a quoted compound assignment holding a substitution, which bash would run",
                v,
            )
        bracket = v.find("[")
        if bracket >= 0 and any(s in v[bracket:] for s in ("$(", "`", "${")):
            raise Unmodelled(
                "subscript_substitution",
                f"{cmd.program}: '{v}' holds a substitution in a subscript, which bash would run "
                "when it evaluates the name",
                v,
            )


def _names_of(words: tuple[Word, ...], who: str) -> list[str]:
    names = []
    for w in words:
        if not w.literal and "=" not in w.value.split("$", 1)[0]:
            raise Unmodelled(
                "dynamic_variable_name",
                f"{who}: variable name '{w.raw}' is not a literal word",
                w.raw,
            )
        names.append(w.value.split("=", 1)[0].split("+", 1)[0].split("[", 1)[0])
    return names


def _check_variable_targets(cmd: Command) -> None:
    """Variables a builtin assigns: declare/export/... operands, unset, read, printf -v..."""
    program = cmd.program
    args = cmd.argv[1:]
    if program in _DECLARATIONS or program == "unset":
        options = [w for w in args if w.value.startswith(("-", "+"))]
        if program in _DECLARATIONS and any("n" in w.value[1:] for w in options):
            raise Unmodelled(
                "forbidden_builtin",
                f"{program} -n makes a name reference, which can assign any variable",
                program,
            )
        operands = tuple(w for w in args if not w.value.startswith(("-", "+")))
        for name, w in zip(_names_of(operands, program), operands, strict=True):
            if program == "unset" or "=" not in w.value:
                _check_variable(name, program, None)  # unset, or declared without a value
            else:
                _check_variable(name, program, Word(w.value.split("=", 1)[1], w.expansions, w.raw))
    elif program == "read":
        operands = _operands_after_options(args, "adinNptu")
        for name in _names_of(operands + _option_arguments(args, "a", "adinNptu"), "read"):
            _check_variable(name, "read")
    elif program in ("mapfile", "readarray"):
        operands = _operands_after_options(args, "dnOsuC c")
        for name in _names_of(operands, program):
            _check_variable(name, program)
    elif program == "printf":
        options, _ = _option_words(args, "v")  # -v only before the format: after it, an argument
        for i, w in enumerate(options):
            if w.value == "-v" and i + 1 < len(options):
                targets: tuple[Word, ...] = (options[i + 1],)
            elif w.value.startswith("-v") and len(w.value) > 2:  # printf -vNAME
                targets = (Word(w.value[2:], w.expansions, w.raw),)
            else:
                continue
            for name in _names_of(targets, "printf -v"):
                _check_variable(name, "printf -v")
    elif program == "getopts":
        operands = args[1:] if args and args[0].value == "--" else args
        if len(operands) >= 2:
            for name in _names_of((operands[1],), "getopts"):
                _check_variable(name, "getopts")
    elif program == "wait":
        for name in _names_of(_option_arguments(args, "p", "p"), "wait -p"):
            _check_variable(name, "wait -p")
    elif program == "xargs":
        option = "--process-slot-var"
        for i, w in enumerate(args):
            if w.value.startswith(option + "="):
                target: tuple[Word, ...] = (Word(w.value.split("=", 1)[1], w.expansions, w.raw),)
            elif w.value == option and i + 1 < len(args):
                target = (args[i + 1],)
            else:
                continue
            for name in _names_of(target, f"{program} {option}"):
                _check_variable(name, f"{program} {option}")


def _option_arguments(args: tuple[Word, ...], letter: str, with_arg: str) -> tuple[Word, ...]:
    """The arguments given to short option `letter` in any spelling: `-a NAME`, `-aNAME`,
    `-raNAME`, `-ra NAME`. `with_arg` lists the letters that take an argument."""
    out: list[Word] = []
    i = 0
    while i < len(args):
        v = args[i].value
        if v == "--" or not v.startswith("-") or v == "-":
            break
        for j in range(1, len(v)):
            if v[j] in with_arg:
                rest = v[j + 1 :]
                if v[j] == letter:
                    if rest:
                        out.append(Word(rest, args[i].expansions, args[i].raw))
                    elif i + 1 < len(args):
                        out.append(args[i + 1])
                if not rest:
                    i += 1  # the next word was this option's argument
                break
        i += 1
    return tuple(out)


def _operands_after_options(args: tuple[Word, ...], with_arg: str) -> tuple[Word, ...]:
    i = 0
    while i < len(args):
        v = args[i].value
        if v == "--":
            return args[i + 1 :]
        if not v.startswith("-") or v == "-":
            break
        last = v[-1]
        i += 2 if last in with_arg and len(v) == 2 else 1
    return args[i:]
