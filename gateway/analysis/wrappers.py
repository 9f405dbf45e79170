"""Programs that run another program, and how to find the one they run.

`unwrap(command)` returns the commands a wrapper would start (its inner program, and that
program's inner program, and so on), or a `ShellScript` for `bash -c '<literal>'` whose text the
analyser must analyse in turn. Each wrapper's options are parsed from a table of the options it
takes; an option not in the table is a denial (`unknown_wrapper_option`), because guessing
whether it takes an argument could shift which word we take for the inner program.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field, replace

from gateway.analysis.model import Assignment, Command, Context, Expansion, Flag, Word
from gateway.analysis.primary import Unmodelled
from gateway.analysis.words import numeric_only, unquoted_expansion

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class Options:
    """What a wrapper accepts before its inner command."""

    short_flags: str = ""
    short_with_arg: str = ""
    short_optional_arg: str = ""  # only attached: -i{} / -e
    long_flags: frozenset[str] = frozenset()
    long_with_arg: frozenset[str] = frozenset()
    long_optional_arg: frozenset[str] = frozenset()  # only as --opt=value
    numeric_short: bool = False  # nice -10
    denied: dict[str, str] = field(default_factory=dict)  # option -> why it is refused
    dash_is_option: bool = False  # a lone `-` is an option (env - means env -i), not the program


@dataclass(frozen=True, slots=True)
class ShellScript:
    """`bash -c SCRIPT`: the script must be analysed as shell text of its own."""

    shell: Command
    script: str


ENV = Options(
    dash_is_option=True,
    short_flags="i0v",
    short_with_arg="ua",
    long_flags=frozenset({"--ignore-environment", "--null", "--debug", "--list-signal-handling"}),
    long_with_arg=frozenset({"--unset", "--argv0"}),
    long_optional_arg=frozenset({"--block-signal", "--default-signal", "--ignore-signal"}),
    denied={
        "-S": "env -S splits a string into a command line; write the command out instead",
        "--split-string": "env --split-string splits a string into a command line; write the command out instead",
        "-C": "env -C DIR runs the command in DIR, where its paths mean something else than where they are checked; "
        "cd DIR first",
        "--chdir": "env --chdir runs the command in another directory, where its paths mean something else than where "
        "they are checked; cd DIR first",
    },
)
NICE = Options(short_with_arg="n", long_with_arg=frozenset({"--adjustment"}), numeric_short=True)
NOHUP = Options()
TIMEOUT = Options(
    short_flags="vp",
    short_with_arg="ks",
    long_flags=frozenset({"--preserve-status", "--foreground", "--verbose"}),
    long_with_arg=frozenset({"--kill-after", "--signal"}),
)
STDBUF = Options(short_with_arg="ioe", long_with_arg=frozenset({"--input", "--output", "--error"}))
TIME_BIN = Options(
    short_flags="apqvV",
    short_with_arg="fo",
    long_flags=frozenset({"--append", "--portability", "--quiet", "--verbose"}),
    long_with_arg=frozenset({"--format", "--output"}),
)
COMMAND = Options(short_flags="pvV")
EXEC = Options(short_flags="cl", short_with_arg="a")
SETSID = Options(short_flags="cfw", long_flags=frozenset({"--ctty", "--fork", "--wait"}))
XARGS = Options(
    short_flags="0rtpxo",
    short_with_arg="adEILnPs",
    short_optional_arg="eil",
    long_flags=frozenset(
        {
            "--null",
            "--no-run-if-empty",
            "--verbose",
            "--interactive",
            "--exit",
            "--open-tty",
            "--show-limits",
        }
    ),
    long_with_arg=frozenset(
        {
            "--arg-file",
            "--delimiter",
            "--max-args",
            "--max-procs",
            "--max-chars",
            "--process-slot-var",
        }
    ),
    long_optional_arg=frozenset({"--eof", "--replace", "--max-lines"}),
)
SUDO = Options(
    short_flags="AbEHiKklnPSsVve",
    short_with_arg="CDghpRrtTUu",
    long_flags=frozenset(
        {
            "--askpass",
            "--background",
            "--bell",
            "--edit",
            "--set-home",
            "--login",
            "--remove-timestamp",
            "--reset-timestamp",
            "--list",
            "--non-interactive",
            "--preserve-groups",
            "--stdin",
            "--shell",
            "--validate",
            "--version",
            "--help",
        }
    ),
    long_with_arg=frozenset(
        {
            "--close-from",
            "--chdir",
            "--group",
            "--host",
            "--prompt",
            "--chroot",
            "--role",
            "--type",
            "--command-timeout",
            "--other-user",
            "--user",
        }
    ),
    long_optional_arg=frozenset({"--preserve-env"}),
)
DOAS = Options(short_flags="nsL", short_with_arg="uC")

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "rbash", "ash", "yash", "posh"})
# bash / sh options that take the next word as their argument
_SHELL_LONG_WITH_ARG = frozenset({"--rcfile", "--init-file"})
_SHELL_SHORT_WITH_ARG = "oO"


def basename(program: str) -> str:
    return posixpath.basename(program) if "/" in program else program


def _option_words(argv: tuple[Word, ...], start: int, spec: Options, who: str) -> int:
    """Index of the first operand after `who`'s options (from `start`)."""
    i = start
    while i < len(argv):
        w = argv[i]
        v = w.value
        if not w.literal and (v.startswith("-") or v.startswith("$")):
            raise Unmodelled("dynamic_wrapper_argument", f"{who}: option '{w.raw or v}' is not a literal word", v)
        if v == "--":
            return i + 1
        if v == "-" and spec.dash_is_option:
            i += 1  # env - is env -i
            continue
        if not v.startswith("-") or v == "-":
            return i
        if v in spec.denied or v.split("=", 1)[0] in spec.denied:
            raise Unmodelled("unsupported_wrapper_option", f"{who} {v}: {spec.denied[v.split('=', 1)[0]]}", v)
        if v.startswith("--"):
            name = v.split("=", 1)[0]
            if name in spec.long_flags and "=" not in v:
                i += 1
            elif name in spec.long_with_arg:
                if "=" not in v:
                    _value_word(argv, i + 1, who, v)
                i += 1 if "=" in v else 2
            elif name in spec.long_optional_arg:
                i += 1
            else:
                raise Unmodelled("unknown_wrapper_option", f"{who}: unknown option '{v}'", v)
            continue
        if spec.numeric_short and v[1:].isdigit():
            i += 1
            continue
        # a cluster of short options: -abc, -n5, -uNAME
        j = 1
        consumed_next = False
        while j < len(v):
            c = v[j]
            if "-" + c in spec.denied:
                raise Unmodelled("unsupported_wrapper_option", f"{who} -{c}: {spec.denied['-' + c]}", v)
            if c in spec.short_with_arg:
                consumed_next = j == len(v) - 1
                break
            if c in spec.short_optional_arg:
                break
            if c not in spec.short_flags:
                raise Unmodelled("unknown_wrapper_option", f"{who}: unknown option '-{c}' in '{v}'", v)
            j += 1
        if consumed_next:
            _value_word(argv, i + 1, who, v)
        i += 2 if consumed_next else 1
    return i


def _value_word(argv: tuple[Word, ...], k: int, who: str, option: str) -> None:
    """The word at `k` is the value of `option`: one word, whatever it holds, unless the shell may
    split it into several (an unquoted `$V`, `$(...)`, backquote, or a brace expansion left
    unexpanded), which would move where the command it runs starts: `nice -n $V echo hi` with
    V='1 sh -c id' runs sh."""
    if k >= len(argv):
        return
    w = argv[k]
    if w.literal or numeric_only(w.raw):
        return  # a number is never split (analysis/hazards.py: IFS holds no digit or `-`)
    if Expansion.BRACE in w.expansions or unquoted_expansion(w.raw):
        raise Unmodelled(
            "dynamic_wrapper_argument",
            f"{who}: the value of {option}, '{w.raw or w.value}', is unquoted and known only at run time: the "
            'shell may split it into more words, moving where the command starts: quote it ("$V")',
            w.value,
        )


def _short_options_used(argv: tuple[Word, ...], start: int, end: int) -> set[str]:
    used: set[str] = set()
    for w in argv[start:end]:
        v = w.value
        if v.startswith("--"):
            used.add(v.split("=", 1)[0])
        elif v.startswith("-"):
            used.update("-" + c for c in v[1:])
    return used


def _inner(
    outer: Command,
    argv: tuple[Word, ...],
    assigns: tuple[Assignment, ...] = (),
    flags: tuple[Flag, ...] = (),
) -> Command:
    wrapper = basename(outer.program)
    merged = tuple(sorted({*outer.flags, *flags} - {Flag.BUILTIN, Flag.SHELL_SCRIPT}))
    if Flag.PRIVILEGE in outer.flags and Flag.PRIVILEGE not in merged:
        merged = (*merged, Flag.PRIVILEGE)
    return Command(
        argv=argv,
        assignments=outer.assignments + assigns,
        redirects=(),
        context=(*outer.context, Context.WRAPPER),
        flags=tuple(sorted(set(merged))),
        wrapper=wrapper,
    )


def _env_assignments(argv: tuple[Word, ...], start: int) -> tuple[int, tuple[Assignment, ...]]:
    assigns: list[Assignment] = []
    i = start
    while i < len(argv) and "=" in argv[i].value and not argv[i].value.startswith("="):
        name, _, value = argv[i].value.partition("=")
        if not argv[i].literal and not set(name) <= NAME_CHARS:
            raise Unmodelled(
                "dynamic_wrapper_argument",
                f"env: assignment '{argv[i].raw}' has a non-literal name",
                argv[i].value,
            )
        kinds = argv[i].expansions
        assigns.append(Assignment(name, Word(value, kinds, argv[i].raw)))
        i += 1
    return i, tuple(assigns)


_PREFIX_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")


def _prefix_assignments(argv: tuple[Word, ...], start: int) -> tuple[int, tuple[Assignment, ...]]:
    """Bash's assignment prefixes from `start`: words that begin, as written, with an unquoted
    identifier and `=` (or `+=`)."""
    assigns: list[Assignment] = []
    i = start
    while i < len(argv) and (m := _PREFIX_ASSIGNMENT.match(argv[i].raw)):
        value = argv[i].value.split("=", 1)[1]
        raw_value = argv[i].raw[m.end() :]
        assigns.append(Assignment(m.group(1), Word(value, argv[i].expansions, raw_value), append=bool(m.group(2))))
        i += 1
    return i, tuple(assigns)


def unwrap(cmd: Command) -> list[Command | ShellScript]:
    """What `cmd` runs if it is a wrapper: usually one command, several for find's -exec
    actions, a `ShellScript` for `bash -c`; empty if it is not a wrapper or runs nothing."""
    if not cmd.argv or not cmd.argv[0].literal:
        return []
    if basename(cmd.program) == "find":
        return list(find_all(cmd))
    one = _unwrap_one(cmd)
    return [] if one is None else [one]


def _unwrap_one(cmd: Command) -> Command | ShellScript | None:
    name = basename(cmd.program)
    argv = cmd.argv

    if name == "env":
        i = _option_words(argv, 1, ENV, "env")
        i, assigns = _env_assignments(argv, i)
        return _inner(cmd, argv[i:], assigns) if i < len(argv) else None
    if name == "nice":
        i = _option_words(argv, 1, NICE, "nice")
        return _inner(cmd, argv[i:]) if i < len(argv) else None
    if name == "nohup":
        i = _option_words(argv, 1, NOHUP, "nohup")
        return _inner(cmd, argv[i:]) if i < len(argv) else None
    if name == "setsid":
        i = _option_words(argv, 1, SETSID, "setsid")
        return _inner(cmd, argv[i:]) if i < len(argv) else None
    if name == "timeout":
        i = _option_words(argv, 1, TIMEOUT, "timeout") + 1  # then the DURATION operand
        return _inner(cmd, argv[i:]) if i < len(argv) else None
    if name == "stdbuf":
        i = _option_words(argv, 1, STDBUF, "stdbuf")
        return _inner(cmd, argv[i:]) if i < len(argv) else None
    if name == "time":
        if cmd.argv[0].raw == "time" and cmd.wrapper is None:
            # the bash keyword (only unquoted, and never run by a wrapper): one -p, then --
            i = 2 if len(argv) > 1 and argv[1].literal and argv[1].value == "-p" else 1
            if i < len(argv) and argv[i].literal and argv[i].value == "--":
                i += 1
            # `time FOO=1 ls`: the keyword times a simple command, whose assignment prefixes
            # are assignments, not a program named FOO=1 (so `time PATH=/x ls` is a protected
            # variable, as without `time`)
            i, assigns = _prefix_assignments(argv, i)
            return _inner(cmd, argv[i:], assigns) if i < len(argv) else None
        i = _option_words(argv, 1, TIME_BIN, "time")  # the program: \time, 'time', /usr/bin/time ...
        return _inner(cmd, argv[i:]) if i < len(argv) else None
    if name in ("command", "exec", "builtin", "coproc") and cmd.argv[0].value == name:
        spec = {"command": COMMAND, "exec": EXEC, "builtin": Options(), "coproc": Options()}[name]
        i = _option_words(argv, 1, spec, name)
        if name == "command" and _short_options_used(argv, 1, i) & {"-v", "-V"}:
            return None  # command -v NAME only looks NAME up
        if name == "exec" and (
            "-l" in _short_options_used(argv, 1, i)
            or any(argv[k].value == "-a" and k + 1 < i and argv[k + 1].value.startswith("-") for k in range(1, i))
        ):
            raise Unmodelled(
                "shell_startup_files",
                "exec -l (or -a -NAME) starts a login shell, which runs startup files that cannot be checked",
                "exec",
            )
        return _inner(cmd, argv[i:]) if i < len(argv) else None
    if name == "busybox":
        return _inner(cmd, argv[1:]) if len(argv) > 1 else None
    if name in ("sudo", "doas"):
        spec = SUDO if name == "sudo" else DOAS
        i = _option_words(argv, 1, spec, name)
        i, assigns = _env_assignments(argv, i) if name == "sudo" else (i, ())
        if name == "sudo" and _short_options_used(argv, 1, i) & {"-e", "--edit"}:
            return None  # sudo -e FILE edits FILE as root: FILE is a path, not a program
        if i >= len(argv):
            if _short_options_used(argv, 1, i) & {"-s", "-i", "--shell", "--login"}:
                raise Unmodelled(
                    "shell_reads_stdin",
                    f"{name} -s/-i without a command opens a root shell that reads its commands from "
                    "standard input, which cannot be checked",
                    name,
                )
            return None
        return _inner(cmd, argv[i:], assigns, (Flag.PRIVILEGE,))
    if name == "xargs":
        return _xargs(cmd)
    if name in SHELLS:
        return _shell(cmd, name)
    return None


def _xargs(cmd: Command) -> Command:
    argv = cmd.argv
    i = _option_words(argv, 1, XARGS, "xargs")
    replace_str: str | None = None
    for w in argv[1:i]:
        v = w.value
        if v.startswith("--replace"):
            replace_str = v.split("=", 1)[1] if "=" in v else "{}"
        elif v.startswith("-i"):
            replace_str = v[2:] or "{}"
    for k in range(1, i):
        if argv[k].value == "-I" and k + 1 < i:
            replace_str = argv[k + 1].value
        elif argv[k].value.startswith("-I") and len(argv[k].value) > 2:
            replace_str = argv[k].value[2:]
    inner = argv[i:] or (Word("echo", (), ""),)  # xargs with no command runs echo
    if replace_str:
        inner = tuple(_placeholder(w, replace_str) for w in inner)
    return _inner(cmd, inner, flags=(Flag.DYNAMIC_ARGS,))


def _placeholder(w: Word, marker: str) -> Word:
    if marker in w.value:
        return Word(w.value, tuple(sorted({*w.expansions, Expansion.PLACEHOLDER})), w.raw)
    return w


_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


# find tests and options that take the next word as their argument (a value, never an action)
_FIND_WITH_ARG = frozenset(
    [
        "-name",
        "-iname",
        "-path",
        "-ipath",
        "-wholename",
        "-iwholename",
        "-regex",
        "-iregex",
        "-lname",
        "-ilname",
        "-newer",
        "-anewer",
        "-cnewer",
        "-type",
        "-xtype",
        "-user",
        "-group",
        "-uid",
        "-gid",
        "-perm",
        "-size",
        "-mtime",
        "-mmin",
        "-atime",
        "-amin",
        "-ctime",
        "-cmin",
        "-used",
        "-maxdepth",
        "-mindepth",
        "-inum",
        "-links",
        "-samefile",
        "-fstype",
        "-printf",
        "-fprint",
        "-fprint0",
        "-fls",
        "-regextype",
        "-context",
        "-files0-from",
    ]
)


def find_all(cmd: Command) -> list[Command]:
    """One inner command per -exec / -execdir / -ok / -okdir action.

    A non-literal word could expand to an action (`$x` = `-exec`) or end an -exec early (`$x` =
    `;`), which would turn the words after it into actions nobody checked; such texts are denied.
    """
    argv = cmd.argv
    out: list[Command] = []
    terminators = any(w.literal and w.value in (";", "+") for w in argv[1:])
    i = 1
    while i < len(argv):
        if not argv[i].literal and terminators and not (i > 1 and argv[i - 1].value in _FIND_WITH_ARG):
            raise Unmodelled(
                "dynamic_find_expression",
                f"find: '{argv[i].raw or argv[i].value}' is not a literal word and could expand to an "
                "action such as -exec; write it literally",
                argv[i].value,
            )
        if argv[i].value in _FIND_EXEC and argv[i].literal:
            j = i + 1
            while j < len(argv):
                v = argv[j].value
                if v == ";" or (v == "+" and j > i + 1 and argv[j - 1].value == "{}"):
                    break
                j += 1
            if j >= len(argv):
                raise Unmodelled(
                    "unterminated_find_exec",
                    f"find {argv[i].value} without a terminating ';' or '+'",
                    argv[i].value,
                )
            dynamic = [k for k in range(i + 1, j) if not argv[k].literal]
            if dynamic and any(argv[k].value in _FIND_EXEC for k in range(dynamic[0] + 1, j)):
                raise Unmodelled(
                    "dynamic_find_expression",
                    f"find: '{argv[dynamic[0]].raw}' could end {argv[i].value} early and start the next action",
                    argv[dynamic[0]].value,
                )
            inner = tuple(_placeholder(w, "{}") for w in argv[i + 1 : j])
            if not inner:
                raise Unmodelled(
                    "unterminated_find_exec",
                    f"find {argv[i].value} without a command",
                    argv[i].value,
                )
            flags = (Flag.DYNAMIC_ARGS,) if argv[j].value == "+" else ()
            out.append(_inner(cmd, inner, flags=flags))
            i = j + 1
        else:
            i += 1
    return out


def _shell(cmd: Command, name: str) -> ShellScript | None:
    argv = cmd.argv
    has_c = reads_stdin = False
    i = 1
    while i < len(argv):
        w = argv[i]
        v = w.value
        if not w.literal and (v.startswith("-") or v.startswith("+") or v.startswith("$")):
            raise Unmodelled(
                "dynamic_wrapper_argument",
                f"{name}: option '{w.raw or v}' is not a literal word",
                v,
            )
        if v in ("--", "-"):
            i += 1
            break
        if v.startswith("--"):
            if v.split("=", 1)[0] in ("--login", "--rcfile", "--init-file"):
                raise Unmodelled(
                    "shell_startup_files",
                    f"{name} {v}: the shell would run a startup file, which cannot be checked",
                    v,
                )
            i += 2 if v in _SHELL_LONG_WITH_ARG else 1
            continue
        if len(v) > 1 and v[0] in "-+":
            cluster = v[1:]
            if v[0] == "-" and set(cluster) & {"i", "l"}:
                raise Unmodelled(
                    "shell_startup_files",
                    f"{name} {v}: an interactive or login shell runs its startup files "
                    "(~/.bashrc, ~/.bash_profile), which cannot be checked; use {name} -c",
                    v,
                )
            has_c = has_c or "c" in cluster
            reads_stdin = reads_stdin or "s" in cluster
            i += 1 + sum(1 for c in cluster if c in _SHELL_SHORT_WITH_ARG)
            continue
        break
    if has_c:
        if i >= len(argv):
            raise Unmodelled("shell_without_script", f"{name} -c without a script", name)
        script = argv[i]
        if not script.literal:
            raise Unmodelled(
                "dynamic_shell_script",
                f"{name} -c with a script that is not a literal string ({script.raw}): it cannot be checked",
                script.raw,
            )
        return ShellScript(replace(cmd, flags=tuple(sorted({*cmd.flags, Flag.SHELL_SCRIPT}))), script.value)
    if reads_stdin or i >= len(argv):
        raise Unmodelled(
            "shell_reads_stdin",
            f"{name} would read its commands from standard input, which cannot be checked; "
            f"pass them with {name} -c '...' instead",
            name,
        )
    return None  # `bash script.sh`: runs a file; the policy decides on the program and its path
