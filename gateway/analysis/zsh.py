"""Which zsh lines the gateway can decide: those zsh reads as bash does.

The gate decides shell text as bash reads it. A zsh session's line is decided that way only when
zsh would read it alike; otherwise it is refused with a reason that names the construct. The rule
is an allowlist, in two parts:

1. The syntax. mvdan/sh (shfmt, gateway/analysis/shfmt.py) parses the line twice, as bash and as
   zsh. Both must parse it, and the two trees must be equal once positions are set aside: a line
   zsh parses otherwise (`${(e)x}`, `$~x`, `=(cmd)`, `() { ... }`, `<1-5>`, `>!`, `&|`...) is
   refused, quoting the first place where they differ.
2. The meaning. Some lines parse alike and still mean something else to zsh. They are found in
   the (common) tree and refused:
   - a command zsh has and bash has not, or whose zsh meaning differs where it matters
     (`setopt`, `emulate`, `zmodload`, `autoload`, `print`, `noglob`, `repeat`, `hash`, `alias`,
     `set -A`, `set -o NAME` beyond a few, `typeset -T`...), also behind `builtin`/`command`/`exec`;
   - a name zsh gives a meaning bash does not, assigned or read anywhere (`path=(...)` is PATH,
     `fpath`, `module_path`, `functions[...]`, `options[...]`, `commands[...]`, `TMPPREFIX`,
     `NULLCMD`, `STTY`, a `*_functions` hook array...), including the names `read`, `getopts`,
     `printf -v`, `unset`, `typeset` and the like take, `for NAME`, and arithmetic;
   - a function zsh calls by its name on its own (`TRAP*`, `chpwd`, `precmd`, `preexec`,
     `periodic`, `zshexit`, `zshaddhistory`, `command_not_found_handler`, `zsh_directory_name`),
     or one named after a builtin, reserved word or precommand (the session's loop uses them);
   - `=cmd` and `~name` at the start of a word (zsh reads `~x` as the directory in `$x`), an
     unbraced parameter with a subscript or modifier (`$x[1]`, `$x:h`), a glob with `(...)`
     (zsh's qualifiers, such as `*(e:cmd:)`, which run code), a redirection with no command
     (zsh runs `$NULLCMD` or `$READNULLCMD` for it), and `coproc`.

What passes is then decided exactly as a bash line (the parsers, the policy, the path jail), and
runs in a zsh whose options keep the rest alike (gateway/executors/sessions.py, `_ZSH_LOOP`):
NO_EQUALS, NO_BARE_GLOB_QUAL, NO_ALIASES, SH_NULLCMD, SH_WORD_SPLIT, NO_MULTIOS and the like, with
its module path emptied and read-only, so no module (zsh/system, zsh/mapfile, zsh/zpty...) loads
after the loop starts.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from gateway.analysis import shfmt

REFUSED_COMMANDS: dict[str, str] = {
    # option and emulation changes: they change how the session's later lines read
    "setopt": "setopt changes zsh's options, and so how later lines read",
    "unsetopt": "unsetopt changes zsh's options, and so how later lines read",
    "emulate": "emulate changes zsh's options, and so how later lines read",
    # code that comes from elsewhere, or runs later
    "zmodload": "zmodload loads zsh modules (files, sockets, terminals as builtins)",
    "autoload": "autoload makes functions out of files on $fpath",
    "zcompile": "zcompile writes compiled functions that autoload runs",
    "sched": "sched runs a command later, undecided",
    "zpty": "zpty runs a command on a terminal of its own",
    "ztcp": "ztcp opens network connections",
    "zsocket": "zsocket opens sockets",
    "zftp": "zftp opens network connections",
    "zstyle": "zstyle is zsh's (zsh/zutil)",
    "zformat": "zformat is zsh's (zsh/zutil)",
    "zparseopts": "zparseopts sets arrays by name",
    "zregexparse": "zregexparse sets parameters by name",
    "zle": "zle is zsh's line editor",
    "bindkey": "bindkey is zsh's line editor",
    "vared": "vared edits a parameter by name",
    **{
        name: f"{name} is zsh's completion"
        for name in (
            "compctl",
            "compadd",
            "comparguments",
            "compcall",
            "compdescribe",
            "compfiles",
            "compgroups",
            "compquote",
            "compset",
            "comptags",
            "comptry",
            "compvalues",
        )
    },
    "noglob": "noglob turns filename generation off for its command: zsh passes the patterns themselves",
    "nocorrect": "nocorrect is zsh's precommand modifier",
    "-": "`-` is zsh's precommand modifier (the command's argv[0] begins with -)",
    "repeat": "repeat is zsh's loop (repeat N command)",
    "foreach": "foreach is zsh's loop",
    "end": "end closes zsh's foreach",
    "always": "always is zsh's block",
    # zsh builtins bash has not (bash would run a program of that name)
    "print": "print is zsh's builtin (print -v sets a parameter, print -s and -z feed the shell): use echo or printf",
    "pushln": "pushln is zsh's builtin (it feeds the shell's input)",
    "getln": "getln is zsh's builtin (it reads the shell's input stack)",
    "bye": "bye is zsh's builtin (exit)",
    "chdir": "chdir is zsh's cd",
    "whence": "whence is zsh's builtin",
    "where": "where is zsh's builtin",
    "which": "which is zsh's builtin there, not /usr/bin/which",
    "r": "r re-runs a command from zsh's history",
    "fc": "fc re-runs commands from the shell's history",
    "history": "history is the shell's history (fc)",
    "rehash": "rehash rebuilds zsh's command table",
    "unhash": "unhash changes zsh's command, alias and named-directory tables",
    "hash": "hash sets which file a command name runs, and `hash -d` names directories for ~name",
    "functions": "functions is zsh's typeset -f",
    "unfunction": "unfunction is zsh's",
    "float": "float is zsh's typeset -E",
    "integer": "integer is zsh's typeset -i",
    "private": "private is zsh's (zsh/param/private)",
    "limit": "limit is zsh's (zsh/rlimits)",
    "unlimit": "unlimit is zsh's (zsh/rlimits)",
    "ulimit": "ulimit is a zsh module's here (zsh/rlimits)",
    "log": "log is zsh's (zsh/watch)",
    "ttyctl": "ttyctl is zsh's",
    "echotc": "echotc is zsh's (zsh/termcap)",
    "echoti": "echoti is zsh's (zsh/terminfo)",
    "enable": "enable turns builtins, reserved words and aliases on",
    "disable": "disable turns builtins, reserved words and aliases off",
    "alias": "zsh expands aliases (even global `alias -g` and suffix `alias -s` ones) in later lines",
    "unalias": "unalias changes zsh's alias tables",
    "pushd": "pushd is zsh's directory stack (~1, cd +1)",
    "popd": "popd is zsh's directory stack",
    "dirs": "dirs is zsh's directory stack",
    "eval": "eval's text would be read by zsh, unchecked",
    "trap": "trap's text would be read by zsh, and zsh runs an EXIT trap set in a function when it returns",
    "source": "source runs a file as zsh code",
    ".": "`.` runs a file as zsh code",
    "coproc": "coproc is zsh's own there (coproc command, no name)",
    "let": "let is arithmetic on names: write (( ... ))",
    "getopts": "getopts sets parameters by name",
    "mapfile": "mapfile is zsh's module parameter there, not bash's builtin",
    "readarray": "readarray is bash's",
}
"""Commands a zsh line may not run, each with why (bash would read it otherwise, or zsh gives it a
power the gate cannot see). Matched also behind `builtin`, `command` and `exec`."""

PRECOMMANDS = frozenset({"builtin", "command", "exec", "nocorrect", "noglob", "-"})
"""Words before a command that leave the command to the word after them (and their options)."""

SHARED_SPECIALS = frozenset({
    "!", "#", "$", "*", "-", "0", "?", "@", "_", "HOME", "IFS", "LANG", "LINENO", "OPTARG", "OPTIND", "PATH",
    "PPID", "PS1", "PS2", "PS3", "PS4", "RANDOM", "SECONDS", "SHLVL", "TERM", "UID", "EUID", "GID", "EGID",
    "COLUMNS", "LINES", "CDPATH", "HISTSIZE", "HISTCMD",
})  # fmt: skip
"""zsh's special parameters that bash has too, with the same effect (the bash analysis decides
them as it does for bash). Any other special of zsh (`zsh -fc` lists them in `$parameters`) is
refused: a test pins this against the real zsh."""

ZSH_NAMES = frozenset({
    # zsh's special parameters bash has not (or not with that effect)
    "ARGC", "FIGNORE", "FPATH", "FUNCNEST", "HISTCHARS", "KEYBOARD_HACK", "MAILPATH", "MANPATH", "MODULE_PATH",
    "NULLCMD", "PROMPT", "PROMPT2", "PROMPT3", "PROMPT4", "PSVAR", "READNULLCMD", "SAVEHIST", "SPROMPT",
    "TRY_BLOCK_ERROR", "TRY_BLOCK_INTERRUPT", "TTYIDLE", "USERNAME", "WORDCHARS", "ZSH_EVAL_CONTEXT", "ZSH_SUBSHELL",
    "argv", "cdpath", "fignore", "fpath", "histchars", "mailpath", "manpath", "module_path", "path", "pipestatus",
    "prompt", "psvar", "status", "zsh_eval_context",
    # zsh/parameter's (autoloaded): tables of the shell itself, writable
    "aliases", "builtins", "commands", "dirstack", "dis_aliases", "dis_builtins", "dis_functions",
    "dis_functions_source", "dis_galiases", "dis_patchars", "dis_reswords", "dis_saliases", "funcfiletrace",
    "funcsourcetrace", "funcstack", "functions", "functions_source", "functrace", "galiases", "history",
    "historywords", "jobdirs", "jobstates", "jobtexts", "modules", "nameddirs", "options", "parameters",
    "patchars", "reswords", "saliases", "userdirs", "usergroups",
    # other modules' (autoloadable, or loaded by name)
    "WATCH", "watch", "keymaps", "widgets", "termcap", "terminfo", "zsh_scheduled_events", "mapfile",
    "sysparams", "errnos", "EPOCHSECONDS", "EPOCHREALTIME", "epochtime", "langinfo",
    # parameters zsh reads that act (PARAMETERS USED BY THE SHELL)
    "TMPPREFIX", "TMPSUFFIX", "STTY", "ZDOTDIR", "PERIOD", "TMOUT", "LOGCHECK", "MAILCHECK", "MAIL",
    "REPORTTIME", "REPORTMEMORY", "TIMEFMT", "DIRSTACKSIZE", "HISTFILE", "HISTORY_IGNORE", "KEYTIMEOUT",
    "LISTMAX", "POSTEDIT", "PROMPT_EOL_MARK", "RPROMPT", "RPROMPT2", "RPS1", "RPS2", "CORRECT_IGNORE",
    "CORRECT_IGNORE_FILE", "BAUD", "FCEDIT", "ZBEEP", "zle_bracketed_paste", "zle_highlight", "ENV",
    "ARGV0",  # exported, the argv[0] zsh gives every program it runs (git-push for git...)
})  # fmt: skip
"""Names zsh gives a meaning bash does not give them: assigning one (or reading it) is refused."""

HOOK_FUNCTIONS = frozenset({
    "chpwd", "precmd", "preexec", "periodic", "zshexit", "zshaddhistory", "command_not_found_handler",
    "zsh_directory_name",
})  # fmt: skip
"""Functions zsh runs by name on its own (TRAP* too, and the `*_functions` arrays' entries)."""

ZSH_BUILTINS_AND_WORDS = frozenset({
    "builtin", "command", "exec", "noglob", "nocorrect", "-", "eval", "read", "printf", "cd", "trap", "unset",
    "typeset", "declare", "local", "export", "readonly", "set", "return", "exit", "break", "continue", "echo",
    "test", "[", "true", "false", ":", "kill", "wait", "shift", "source", ".", "type", "pwd", "jobs", "fg", "bg",
    "disown", "umask", "times", "suspend", "logout", "getopts", "let", "if", "then", "else", "elif", "fi", "for",
    "while", "until", "do", "done", "case", "esac", "select", "function", "time", "coproc", "repeat", "foreach",
    "end", "always", "float", "integer",
})  # fmt: skip
"""Names a function may not take in a zsh session: zsh lets a function shadow even `builtin`."""

NAME_TAKERS = frozenset({"read", "unset", "export", "readonly", "local", "typeset", "declare", "printf", "vared"})
"""Commands whose arguments may be names of parameters: each identifier in them is checked."""

DECL_OPTIONS = re.compile(r"^[-+][aAirxg]+$")
"""typeset/declare/local/export/readonly options zsh and bash read alike (zsh's -T ties, -m
matches names by pattern, -f and -h and -H are its own: refused)."""

SET_LETTERS = re.compile(r"^(-[eu]+|\+[euxv]+)$")
SET_NAMES = frozenset({"errexit", "nounset", "pipefail"})
"""`set` options zsh and bash read alike; other letters differ (zsh's -F is noglob, -B no beep,
-k interactive comments...), `-A` sets an array, other `-o` names change how lines read. Tracing
(`-x`, `-v`, xtrace, verbose) is refused too: it would print the loop's own lines, and with them
the nonce of its end marker, which a command could then print to seem finished while it runs."""

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MODIFIER = re.compile(r"^(?::[A-Za-z&]|\[)")
"""What zsh reads after an unbraced parameter: `$x:h` (a modifier), `$x[1]` (a subscript)."""

POSITION_KEYS = frozenset({"Offset", "Line", "Col"})


class Refused(Exception):
    """The line is not read alike: the reason names the construct."""


def refusal(text: str, path: str | None = None) -> str | None:
    """None when zsh reads `text` as bash does (it is then decided as bash text), or why not."""
    bash = shfmt.run(text, path, lang="bash")
    zsh = shfmt.run(text, path, lang="zsh")
    if zsh["status"] != "ok":
        return f"zsh's parse of the line cannot be checked ({zsh['status']}): {zsh.get('error', '')}"
    if bash["status"] != "ok":
        return f"bash does not read the line as zsh does: {bash.get('error', '')}"
    try:
        differs = _first_difference(bash["tree"], zsh["tree"])
        if differs is not None:
            start, end = differs
            shown = text[start:end] if 0 <= start < end <= len(text) else text
            raise Refused(
                f"zsh reads `{_short(shown)}` otherwise than bash does, and the gateway decides lines as bash "
                "reads them"
            )
        _Checker(text).visit(zsh["tree"])
    except Refused as exc:
        return str(exc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        return f"zsh's syntax tree has an unexpected shape: {type(exc).__name__}: {exc}"
    return None


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_position(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and set(value) <= POSITION_KEYS


def _span(node: Any) -> tuple[int, int] | None:
    if isinstance(node, dict) and _is_position(node.get("Pos")) and _is_position(node.get("End")):
        return int(node["Pos"]["Offset"]), int(node["End"]["Offset"])
    return None


def _first_difference(
    a: Any, b: Any, where: tuple[int, int] | None = None, in_word: bool = False
) -> tuple[int, int] | None:
    """Where the two trees first differ (positions aside): the span of the word that holds the
    difference, else of the smallest node that does; None when they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        word = "Parts" in b and "Type" not in b
        here = where if in_word else (_span(b) or where)
        keys = [k for k in dict.fromkeys([*a, *b]) if not (_is_position(a.get(k)) or _is_position(b.get(k)))]
        for k in keys:
            if k not in a or k not in b:
                return here or (0, 0)
            found = _first_difference(a[k], b[k], here, in_word or word)
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for x, y in zip(a, b, strict=False):
            found = _first_difference(x, y, where, in_word)
            if found is not None:
                return found
        if len(a) != len(b):
            return where or (0, 0)
        return None
    return None if a == b else (where or (0, 0))


def _literal(word: Any) -> str | None:
    """A word's value when it is all literal text (quotes removed), else None."""
    if not isinstance(word, dict):
        return None
    out = []
    for part in word.get("Parts") or []:
        kind = part.get("Type")
        if kind == "Lit":
            out.append(_unescape(part.get("Value", "")))
        elif kind == "SglQuoted" and not part.get("Dollar"):
            out.append(part.get("Value", ""))
        elif kind == "DblQuoted" and all(p.get("Type") == "Lit" for p in part.get("Parts") or []):
            out.append("".join(re.sub(r"\\([$`\"\\])", r"\1", p.get("Value", "")) for p in part.get("Parts") or []))
        else:
            return None
    return "".join(out)


def _unescape(raw: str) -> str:
    return re.sub(r"\\(.)", r"\1", raw.replace("\\\n", ""), flags=re.S)


def _unquoted_chars(raw: str) -> list[tuple[str, bool]]:
    """A Lit's characters, each with whether a backslash quotes it."""
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(raw):
        if raw[i] == "\\" and i + 1 < len(raw):
            out.append((raw[i + 1], True))
            i += 2
        else:
            out.append((raw[i], False))
            i += 1
    return out


READABLE = frozenset(
    {"ZSH_VERSION", "ZSH_PATCHLEVEL", "ZSH_NAME", "ZSH_SUBSHELL", "status", "pipestatus", "argv", "ARGC"}
)
"""zsh's own names a line may read (not set): its version, the last statuses, the arguments."""


def _name_refusal(name: str, how: str) -> str | None:
    if name in SHARED_SPECIALS or (how == "the parameter" and name in READABLE):
        return None
    if name in ZSH_NAMES or name.startswith(("ZSH_", "ZLE_")):
        return f"{how} `{name}`: zsh gives that name a meaning bash does not (a special parameter of zsh's)"
    if name.endswith("_functions"):
        return f"{how} `{name}`: zsh runs the functions an array of that name lists, on its own"
    return None


def _function_refusal(name: str) -> str | None:
    if name.startswith("TRAP") or name in HOOK_FUNCTIONS:
        return f"a function named `{name}`: zsh runs it by that name on its own (a trap or a hook)"
    if name in ZSH_BUILTINS_AND_WORDS or name in REFUSED_COMMANDS:
        return f"a function named `{name}`: in zsh it would shadow the builtin or reserved word the session relies on"
    return None


class _Checker:
    """Walks zsh's tree (equal to bash's) for what zsh means otherwise."""

    def __init__(self, text: str) -> None:
        self.text = text

    def visit(self, node: Any, arith: bool = False) -> None:
        if isinstance(node, list):
            for item in node:
                self.visit(item, arith)
            return
        if not isinstance(node, dict):
            return
        kind = node.get("Type")
        if kind in ("ArithmExp", "ArithmCmd", "LetClause"):
            arith = True
        if kind == "CallExpr":
            self.call(node)
        elif kind == "DeclClause":
            self.decl(node)
        elif kind == "FuncDecl":
            self.refuse(_function_refusal(_unescape(str((node.get("Name") or {}).get("Value", "")))))
        elif kind == "ForClause":
            loop = node.get("Loop") or {}
            if loop.get("Type") == "WordIter":
                self.refuse(_name_refusal(str((loop.get("Name") or {}).get("Value", "")), "a for loop over"))
        elif kind == "ExtGlob":
            raise Refused(
                f"`{_short(self.src(node))}`: zsh reads `(...)` after a glob as glob qualifiers (which run "
                "code) or a group, bash as an extended glob"
            )
        elif kind == "CoprocClause":
            raise Refused(REFUSED_COMMANDS["coproc"])
        elif kind == "ParamExp":
            name = str((node.get("Param") or {}).get("Value", ""))
            self.refuse(_name_refusal(name, "the parameter"))
            word = (node.get("Exp") or {}).get("Word") or {}
            for part in word.get("Parts") or []:
                if part.get("Type") == "Lit" and ("{", False) in _unquoted_chars(str(part.get("Value", ""))):
                    raise Refused(
                        f"`{_short(self.src(node))}`: zsh expands braces in the word of ${{x:-word}} (two words "
                        "`a b` of {a,b}), bash does not"
                    )
        elif kind == "Lit" and arith:
            for name in IDENT.findall(str(node.get("Value", ""))):
                self.refuse(_name_refusal(name, "arithmetic on"))
        elif "Parts" in node and kind is None:  # a word
            self.word(node)
        elif kind == "DblQuoted":
            self.modifiers(node.get("Parts") or [])
        if isinstance(node.get("N"), dict) and "Op" in node:  # a redirection: {NAME}> sets NAME
            number = str(node["N"].get("Value", ""))
            self.refuse(_name_refusal(number.strip("{}"), "a descriptor kept in") if number.startswith("{") else None)
            if not number.startswith("{") and len(number) != 1:
                raise Refused(
                    f"`{_short(self.src(node))}`: zsh names only descriptors 0-9 before a redirection; it reads "
                    f"`{number}` as an argument of the command"
                )
        if "Stmts" in node or kind == "File":
            for stmt in node.get("Stmts") or []:
                if stmt.get("Cmd") is None and stmt.get("Redirs"):
                    raise Refused(
                        f"`{_short(self.src(stmt))}`: a redirection with no command runs $NULLCMD or "
                        "$READNULLCMD in zsh"
                    )
        for value in node.values():
            if isinstance(value, dict | list) and not _is_position(value):
                self.visit(value, arith)

    def refuse(self, reason: str | None) -> None:
        if reason is not None:
            raise Refused(reason)

    def src(self, node: Any) -> str:
        span = _span(node)
        return self.text[span[0] : span[1]] if span else ""

    def word(self, word: dict[str, Any]) -> None:
        parts = word.get("Parts") or []
        self.modifiers(parts)
        first = parts[0] if parts else None
        if not (isinstance(first, dict) and first.get("Type") == "Lit"):
            return
        chars = _unquoted_chars(str(first.get("Value", "")))
        for i, (c, quoted) in enumerate(chars):
            starts = i == 0 or (chars[i - 1][0] in "{," and not chars[i - 1][1])
            if quoted or not starts:
                continue
            nxt = chars[i + 1][0] if i + 1 < len(chars) else ""
            if c == "=" and nxt and nxt not in " ,}":
                raise Refused(
                    f"`{_short(self.src(word))}`: zsh reads a word beginning with = as the path of that command (=cmd)"
                )
            if c == "~" and nxt and nxt not in "/,}":
                raise Refused(
                    f"`{_short(self.src(word))}`: zsh reads ~NAME as a named directory (any parameter holding "
                    "a path), bash as a user's home"
                )

    def modifiers(self, parts: list[Any]) -> None:
        for here, after in itertools.pairwise(parts):
            short = here.get("Type") == "ParamExp" and here.get("Short") and after.get("Type") == "Lit"
            if short and MODIFIER.match(str(after.get("Value", ""))):
                shown = self.src(here) + str(after.get("Value", ""))[:8]
                raise Refused(
                    f"`{_short(shown)}`: zsh reads what follows an unbraced parameter as a modifier or "
                    "subscript (write ${...})"
                )

    def assignment(self, assign: dict[str, Any], how: str) -> None:
        name = (assign.get("Name") or {}).get("Value")
        if name:
            self.refuse(_name_refusal(str(name), how))
        value = assign.get("Value")
        if not (isinstance(value, dict) and value.get("Parts")):
            return
        first = value["Parts"][0]
        if first.get("Type") != "Lit":
            return
        chars = _unquoted_chars(str(first.get("Value", "")))
        for i, (c, quoted) in enumerate(chars):
            if c not in "~=" or quoted or not (i == 0 or chars[i - 1] == (":", False)):
                continue
            nxt = chars[i + 1][0] if i + 1 < len(chars) else ""
            if (c == "=" and nxt) or (c == "~" and nxt and nxt not in "/:"):
                raise Refused(
                    f"`{_short(self.src(assign))}`: zsh expands {c} in an assignment's value otherwise than bash"
                )

    def call(self, node: dict[str, Any]) -> None:
        for assign in node.get("Assigns") or []:
            self.assignment(assign, "an assignment to")
        args = node.get("Args") or []
        values = [_literal(a) for a in args]
        i = 0
        while i < len(values):  # the command, behind builtin / command / exec and their options
            name = values[i]
            if name is None:
                return  # a computed name: the bash analysis refuses or decides it
            why = REFUSED_COMMANDS.get(name)
            if why is not None:
                raise Refused(f"`{name}`: {why}")
            if name not in PRECOMMANDS:
                break
            i += 1
            while i < len(values) and (values[i] or "").startswith("-") and values[i] != "-":
                i += 2 if values[i] == "-a" and name == "exec" else 1
        if i >= len(values):
            return
        name, rest = values[i] or "", values[i + 1 :]
        if name == "set":
            self.set_options(rest)
        elif name == "shift" and any(v is None or not v.isdigit() for v in rest):
            raise Refused(
                "`shift` with other than a literal count: zsh shifts the arrays it names (`shift path` is PATH) "
                "and reads the count as arithmetic"
            )
        elif name == "cd":
            operands = [v for v in rest if v is None or not v.startswith("-") or v == "-"]
            if len(operands) > 1 or any(v is not None and re.fullmatch(r"[+-]\d+", v) for v in operands):
                raise Refused(
                    "`cd` with two operands (zsh replaces the first in $PWD by the second) or +N/-N (zsh's "
                    "directory stack)"
                )
        if name in NAME_TAKERS:
            if name in ("typeset", "declare", "local", "export", "readonly", "unset"):
                self.decl_options(name, rest)
            for value in rest:
                for ident in IDENT.findall(value or ""):
                    self.refuse(_name_refusal(ident, f"`{name}` of"))

    def decl(self, node: dict[str, Any]) -> None:
        variant = str((node.get("Variant") or {}).get("Value", ""))
        options = []
        for arg in node.get("Args") or []:
            if arg.get("Naked") and arg.get("Value") is not None:
                value = _literal(arg["Value"])
                if value is None:
                    raise Refused(f"`{variant}` with a computed word: zsh and bash may read it otherwise")
                options.append(value)
                for ident in IDENT.findall(value):
                    self.refuse(_name_refusal(ident, f"`{variant}` of"))
            else:
                self.assignment(arg, f"`{variant}` of")
        self.decl_options(variant, options)

    def decl_options(self, name: str, words: Sequence[str | None]) -> None:
        for value in words:
            if value is None or value == "--":
                if value == "--":
                    return
                continue
            if value.startswith(("-", "+")) and not DECL_OPTIONS.match(value):
                raise Refused(
                    f"`{name} {value}`: zsh's options of {name} differ from bash's (-T ties, -m matches names, "
                    "-f, -h, -H)"
                )

    def set_options(self, words: list[str | None]) -> None:
        i = 0
        while i < len(words):
            value = words[i]
            if value is None or value == "--" or not value.startswith(("-", "+")):
                return
            if value == "-o" and i + 1 < len(words) and words[i + 1] in ("xtrace", "verbose"):
                raise Refused(
                    f"`set -o {words[i + 1]}`: tracing prints the session loop's own lines, with the nonce of its "
                    "end marker"
                )
            if value in ("-o", "+o"):
                if i + 1 >= len(words) or words[i + 1] not in SET_NAMES:
                    raise Refused(
                        f"`set {value} {words[i + 1] if i + 1 < len(words) else ''}`: zsh's option names change "
                        f"how later lines read (only {', '.join(sorted(SET_NAMES))} read alike)"
                    )
                i += 2
                continue
            if value.startswith("-") and any(c in value for c in "xv"):
                raise Refused(
                    f"`set {value}`: tracing prints the session loop's own lines, with the nonce of its end marker"
                )
            if not SET_LETTERS.match(value):
                raise Refused(
                    f"`set {value}`: zsh reads set's option letters otherwise than bash (-A sets an array, -F "
                    "turns globbing off...)"
                )
            i += 1
