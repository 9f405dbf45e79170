"""The path jail: every path a command touches must lie inside the principal's roots.

Paths come from the deciding rules (`path_args`, `path_options`, or where a rule writes neither,
the program's model: gateway/programs/), from redirects (`>`/`>>` are
writes, `<` a read) and from the cwd. Each is made absolute against the cwd, `~` is what the
shell that runs the command takes it for (`Homes`: in the gateway's sandbox the policy's `home`,
which is the sandbox's HOME; under an agent's hook the agent's HOME and this host's accounts),
and symlinks and `..` are resolved (`real_path`: like `os.path.realpath`, which also resolves the existing
parent of a path that does not exist yet). Roots are compared by path components
(`/srv/ws2` is not inside `/srv/ws`). A write must be inside a write root and outside every
protected path; a read inside a read or write root.

`cd DIR` moves the cwd of the commands after it. Subshells and `||` make where it ends up
uncertain, so a relative path after a `cd` is checked against every directory the text may be
in: the original cwd and each `cd` target. A glob is expanded now, within a budget (globs.py),
and each match checked (an unmatched glob is the literal word, as in bash); any other value
known only at run time is refused unless the deciding rule sets `accept_unknown_paths` (never
for redirect targets).

Globs in any word, not only in path arguments: each directory a glob lists is a read, jailed
like any other; a match that would reach the program as an option (a file named
`--compress-program=bash` matched by `sort *`) is refused unless `--` comes first; and a glob
that could match such a name is refused after a command of the same text that writes, since
what it matches then is only known at run time (write `./*`, or put `--` first).

This check is advisory: a path can change between check and use. The sandbox, which binds only
the write roots writable, is the barrier that holds.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import stat
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from gateway import programs
from gateway.analysis import Command, Expansion, RedirectMode, Word
from gateway.decision import Decision, Reason, Verdict
from gateway.policy.compile import CompiledPolicy, Grant
from gateway.policy.schema import PathArgs
from gateway.programs import producers
from gateway.sandbox import masks, plan
from gateway.stages import decision_cache, globs
from gateway.stages.permissions import Match, attached_value, option_values

STAGE = "pathjail"
# Devices every command may use, whatever the roots.
ALWAYS = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/zero", "/dev/urandom"})
_CHANGES_DIR = frozenset({"cd", "pushd"})
# option names whose value the audit redacts in a command line (gateway/audit/records.py)
SECRET_NAME = re.compile(r"password|passwd|token|secret|api[-_]?key|credential|auth", re.IGNORECASE)


class PathRefused(Exception):
    """A path outside the roots (or protected, or in /proc): `code` is the jail's reason code."""

    def __init__(self, code: str, message: str, details: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or {}


_Refused = PathRefused


@dataclass(frozen=True)
class Homes:
    """What `~`, `~NAME` and a bare `cd` mean to the shell that will run the command: one
    meaning per place a command runs. Without one in force (`shell_homes`), the gateway's
    sandbox: `~` is the policy's `home` (the sandbox's HOME), `~NAME` is refused."""

    home: str | None
    """`~`, `~/...` and a bare `cd`; None: refused."""
    users: bool = False
    """`~NAME` is NAME's home in this host's account database (the agent's own shell); else it
    is refused as a value known only at run time."""
    whose: str = "the policy's home"
    """For messages: where `home` comes from."""


_homes: ContextVar[Homes | None] = ContextVar("shell_homes", default=None)


@contextlib.contextmanager
def shell_homes(homes: Homes | None) -> Iterator[None]:
    """Decide with `homes` (None: the sandbox's, from the policy) on this thread."""
    token = _homes.set(homes)
    try:
        yield
    finally:
        _homes.reset(token)


def _current_homes(policy: CompiledPolicy) -> Homes:
    return _homes.get() or Homes(str(policy.home) if policy.home is not None else None)


_LOGIN = re.compile(r"~[A-Za-z_][A-Za-z0-9_.-]*")


_PROC = "/proc"
PROC_READABLE = frozenset({
    "/proc/cpuinfo", "/proc/meminfo", "/proc/version", "/proc/uptime", "/proc/loadavg", "/proc/stat",
    "/proc/filesystems", "/proc/self/status", "/proc/self/stat", "/proc/self/limits", "/proc/self/cgroup",
})  # fmt: skip
"""The part of /proc a command may read, each exactly as written (no `.`, `..` or link in between,
never resolved by the gateway): the machine's counters, and the command's own process as the
sandbox's /proc shows it (its own PID namespace: `self` is the command, never the gateway). Never
a write, never a directory listing, nothing that passes through a per-process link (`cwd`,
`root`, `fd/N`, `exe`) or names another process (`/proc/1/...`)."""
MAX_LINKS = 40
RACE_RETRIES = 8
"""How often a resolution is tried again when the tree changes under it (a link that lstat saw
is gone by readlink). A path that never holds still is refused: nothing is decided on it."""


def _changing(path: str) -> PathRefused:
    return _Refused(
        "path_changed",
        f"{path} kept changing while it was resolved (a concurrent rename or link swap): refused, "
        "nothing was done; retry",
        {"path": path},
    )


def settled_realpath(path: str) -> str:
    """`os.path.realpath` without its two faults: it raises when a link it saw is renamed away
    before it reads it, and it follows any number of links, recursing once per link (a chain of
    a few thousand raised RecursionError; long link texts made each call cost the agent's choice
    of CPU). Resolved here like the kernel does: a component renamed mid-way is looked at again
    (then PathRefused `path_changed`); past MAX_LINKS links the rest is left unresolved, as
    realpath leaves a loop (opening it then fails with ELOOP)."""
    return _resolve_links(path if path.startswith("/") else os.path.abspath(path), for_command=False)


def real_path(path: str) -> str:
    """`os.path.realpath` for a command's path, refusing any path that is, or passes through,
    `/proc` (`/dev/fd`, `/dev/stdout` and friends are links into it). Resolved here, `/proc/self`
    is the gateway's own process, not the sandboxed command's: `/proc/self/fd/N` would name
    whatever the gateway has open at N. Devices in ALWAYS are taken as they are written."""
    if os.path.normpath(path) in ALWAYS:
        return os.path.normpath(path)
    if path in PROC_READABLE:  # as written: the sandbox's /proc resolves it, never the gateway's
        return path
    return _resolve_links(path, for_command=True)


def _resolve_links(path: str, for_command: bool) -> str:
    """The real path of the absolute `path`: at most MAX_LINKS links, a component that changes
    under it tried again at most RACE_RETRIES times; a missing component and what follows are
    taken literally. `for_command` (real_path): refuse to go through /proc, and refuse a path of
    too many links; else such a path is returned with its rest unresolved."""
    obs = decision_cache.current() if for_command else None  # a decision being made records what it read
    todo = [p for p in path.split("/") if p][::-1]
    cur = "/"
    links = races = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        if for_command and (nxt == _PROC or nxt.startswith(_PROC + "/")):
            raise _Refused(
                "proc_path",
                f"{path} is, or leads into, /proc: resolved by the gateway it would name the gateway's "
                f"own process, not the command's (a command may read {', '.join(sorted(PROC_READABLE))}, "
                "written so)",
                {"path": path},
            )
        try:
            st = os.lstat(nxt)
        except OSError:
            if obs is not None:
                obs.component(nxt, decision_cache.MISSING)
            cur = nxt  # missing: the rest is taken literally, like realpath
            continue
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                if for_command:
                    raise _Refused("symlink_loop", f"{path}: too many symbolic links", {"path": path})
                return os.path.join(nxt, *reversed(todo))  # as realpath leaves a loop: opening it is ELOOP
            try:
                target = os.readlink(nxt)
            except OSError:  # renamed or replaced since the lstat: look at that name again
                races += 1
                if obs is not None:
                    obs.unknowable()
                if races > RACE_RETRIES:
                    raise _changing(path) from None
                links -= 1
                todo.append(name)
                continue
            if obs is not None:
                obs.component(nxt, "link:" + target)
            if target.startswith("/"):
                cur = "/"
            todo.extend([p for p in target.split("/") if p][::-1])
        else:
            if obs is not None:
                obs.component(nxt, decision_cache.PLAIN)
            cur = nxt
    return cur


def inside(path: str, root: Path) -> bool:
    r = str(root)
    return path == r or os.path.commonpath([path, r]) == r


MAX_RECORDED_PATHS = 100
"""How many jailed paths of each kind the decision record lists (it always gives the counts)."""


def check(
    policy: CompiledPolicy,
    grant: Grant,
    cwd: Path,
    commands: tuple[Command, ...],
    matches: list[list[Match]],
    sandboxed: bool = False,
) -> Decision:
    """The jail's decision on `commands` run in `cwd`. `sandboxed`: they run in the gateway's
    sandbox, which masks every deny_read match under the roots; otherwise (an agent's hook runs
    the command itself) a search that reads a tree whole is refused where the tree holds one."""
    checked: dict[str, list[str]] = {"read": [], "write": []}
    budget = globs.Budget()
    try:
        cwds = [Path(real_path(str(cwd)))]
        _check_path(str(cwds[0]), "read", grant, "cwd")
        wrote = False  # an earlier command of the text writes: globs after it see files made since
        for cmd, found in zip(commands, matches, strict=True):
            unknown_ok = any(m.rule.accept_unknown_paths for m in found)
            reads, writes, redirected = _paths_of(cmd, found)
            who = cmd.program if cmd.argv else ("for" if cmd.words else "redirect")
            for listed in _glob_reads(policy, cmd, cwds, unknown_ok, wrote, budget):
                real = real_path(listed)  # `..` and links resolved, as for every path
                _check_path(real, "read", grant, f"{who} (a glob lists it)")
                checked["read"].append(real)
            mine: list[str] = []  # this command's reads
            for access, words in (("read", reads), ("write", writes)):
                for word in words:
                    if (entry := producers.named_entry(word)) is not None:  # `build/stamp-$(date +%s)`
                        if access == "read" and not sandboxed and grant.deny_read is not None:
                            raise _Refused(
                                "deny_read_unchecked",
                                f"{who}: {word.raw or word.value} names a file by names made at run time, which "
                                "could be one the policy's deny_read denies, and no sandbox masks it here: name it",
                                {"path": word.raw or word.value},
                            )
                        checked[access] += _check_named(entry, cwds, access, grant, who)
                        continue
                    for p in _resolve(policy, word, cwds, unknown_ok and word not in redirected, budget, grant, who):
                        _check_path(p, access, grant, who, command=True)
                        checked[access].append(p)
                        if access == "read":
                            mine.append(p)
            if grant.deny_read is not None and cmd.argv and os.path.basename(cmd.program) == "git":
                _git_blobs([w.value for w in cmd.argv[1:]], cwds, grant, who)  # no sandbox masks git's objects
            if not sandboxed and grant.deny_read is not None:
                _recursive_secrets(cmd, mine, cwds, grant, who)
            wrote = wrote or bool(writes)
            if cmd.argv and cmd.program in _CHANGES_DIR:
                cwds = _after_cd(policy, cmd, cwds)
                for target in cwds:  # a shell session keeps its cwd: a cd out of the jail is refused
                    _check_path(str(target), "read", grant, cmd.program)
    except _Refused as r:
        return Decision(Verdict.DENY, None, (Reason(STAGE, r.code, r.message, None, r.details),))
    except globs.TooCostly as exc:
        message = f"{exc}: name the files, or narrow the pattern (the work a glob costs is bounded)"
        return Decision(Verdict.DENY, None, (Reason(STAGE, "glob_too_costly", message, None, {}),))
    except masks.TooManyToSearch as exc:
        message = f"{exc}: search narrower directories"
        return Decision(Verdict.DENY, None, (Reason(STAGE, "deny_read_unchecked", message, None, {}),))
    if not checked["read"] and not checked["write"]:
        return Decision(Verdict.ALLOW, None, ())
    n = len(checked["read"]) + len(checked["write"])
    # the jailed paths, for the decision record: counts, and the first of each kind
    details: dict[str, object] = {k: v[:MAX_RECORDED_PATHS] for k, v in checked.items()}
    if any(len(v) > MAX_RECORDED_PATHS for v in checked.values()):
        details["counts"] = {k: len(v) for k, v in checked.items()}
    return Decision(
        Verdict.ALLOW, None, (Reason(STAGE, "paths_checked", f"{n} path(s) inside the roots", None, details),)
    )


def _glob_reads(
    policy: CompiledPolicy, cmd: Command, cwds: list[Path], unknown_ok: bool, wrote: bool, budget: globs.Budget
) -> list[str]:
    """The directories the globs of `cmd` list (each a read), after refusing a match that would
    be an option. Every argument and redirect target with a glob counts, whatever the rule."""
    out: list[str] = []
    words = [(k, w) for k, w in enumerate(cmd.argv) if k > 0 and Expansion.GLOB in w.expansions]
    words += [(-1, r.target) for r in cmd.redirects if r.target is not None and Expansion.GLOB in r.target.expansions]
    # a `for` list: its matches reach the body's commands through the loop variable, as options too
    words += [(0, w) for w in cmd.words if Expansion.GLOB in w.expansions]
    name = cmd.program if cmd.argv else "a for loop"
    operands_from = programs.never_options_from(cmd)  # echo's words, printf's arguments after the format
    for k, word in words:
        value, kinds = _tilde(policy, word)
        options_end = any(w.value == "--" and w.literal for w in cmd.argv[1:k]) if k > 0 else k < 0
        options_end = options_end or (k > 0 and operands_from is not None and k >= operands_from)
        if kinds - {Expansion.GLOB}:
            if unknown_ok:
                continue  # the rule accepts values known only at run time: the sandbox holds
            raise _Refused(
                "unknown_path",
                f"the glob {word.raw or value!r} lists a directory only known at run time, so it cannot be checked",
                {"path": word.raw or value},
            )
        if (
            not options_end
            and wrote
            and not value.startswith(("/", "."))
            and value[:1] != "~"
            and globs.has_magic(value[:1])
        ):
            raise _Refused(
                "glob_after_write",
                f"{name}: the glob {value!r} is expanded after an earlier command of this text writes, "
                "so it may match a file named like an option: write './' before it, or put '--' first",
                {"glob": value},
            )
        if (obs := decision_cache.current()) is not None:
            obs.unknowable()  # a directory's listing: not kept
        for cwd in cwds:
            expanded = globs.expand(value, str(cwd), budget)
            out.extend(expanded.listed)
            if options_end or not expanded.paths or expanded.words == [value]:
                continue
            option = next((w for w in expanded.words if w.startswith("-")), None)
            if option is not None:
                raise _Refused(
                    "glob_matches_option",
                    f"{name}: the glob {value!r} matches {option!r}, which a program would read as an "
                    "option: write './' before the glob, or put '--' first",
                    {"glob": value, "match": option},
                )
    return out


def _check_named(entry: producers.NamedEntry, cwds: list[Path], access: str, grant: Grant, who: str) -> list[str]:
    """A path made of a literal directory and names printed at run time (producers.NamedEntry):
    the directory is checked with the word's access; for a write, no name may spell `.git`, and
    no protected path below the directory may be one the names could spell (`x-$(date +%s)`
    beside `.git` is fine: date prints no `.`). What the names turn out to be (an existing
    symlink, say), the sandbox bounds, as for a producer's listing."""
    out: list[str] = []
    for cwd in cwds:
        directory = real_path(entry.directory if entry.directory.startswith("/") else str(cwd / entry.directory))
        _check_path(directory, access, grant, who)
        out.append(directory)
        if access != "write":
            continue
        spelled = next((p.pattern for p in entry.components if p.fullmatch(".git")), None)
        if spelled is not None:
            raise _Refused(
                "protected_path",
                f"{who}: a name made at run time under {directory} could be .git, written only by git",
                {"path": directory, "access": access},
            )
        for protected in grant.protected:
            if not inside(str(protected), Path(directory)) or str(protected) == directory:
                continue
            parts = protected.relative_to(directory).parts
            if len(entry.components) >= len(parts) and all(
                pattern.fullmatch(part) for pattern, part in zip(entry.components, parts, strict=False)
            ):
                raise _Refused(
                    "protected_path",
                    f"{who}: a name made at run time under {directory} could be {protected}, which is protected",
                    {"path": str(protected), "access": access},
                )
    return out


def _tilde(policy: CompiledPolicy, word: Word) -> tuple[str, set[Expansion]]:
    """`word`'s value with a leading `~` or `~NAME` replaced as the running shell would
    (`Homes`), and its remaining expansions. A tilde prefix this cannot settle (`~+`, `~-`,
    `~NAME` where accounts are not looked up, a prefix written with quotes) stays an expansion:
    the path is then refused as known only at run time."""
    value = word.value
    kinds = set(word.expansions)
    if Expansion.TILDE not in kinds or not value.startswith("~"):
        return value, kinds
    head, slash, rest = value.partition("/")
    raw = word.raw or value
    if not (raw == head or raw.startswith(head + "/")):
        return value, kinds  # quoted or escaped inside the prefix: not for this check to guess
    homes = _current_homes(policy)
    if head == "~":
        if homes.home is None:
            raise _Refused("tilde_without_home", f"'{value}': {homes.whose} is not set: ~ is unknown", {"path": value})
        home = homes.home
    elif homes.users and _LOGIN.fullmatch(head):
        if (obs := decision_cache.current()) is not None:
            obs.unknowable()  # the account database is not watched: such a decision is not kept
        try:
            home = pwd.getpwnam(head[1:]).pw_dir
        except KeyError:
            raise _Refused(
                "tilde_user", f"'{value}': there is no account {head[1:]!r} on this host", {"path": value}
            ) from None
    else:
        return value, kinds
    if not home.startswith("/"):
        raise _Refused("tilde_without_home", f"'{value}': {head} is {home!r}, not an absolute path", {"path": value})
    kinds.discard(Expansion.TILDE)
    return home.rstrip("/") + (slash + rest if slash else "") if home != "/" else "/" + rest, kinds


def _paths_of(cmd: Command, found: list[Match]) -> tuple[list[Word], list[Word], list[Word]]:
    reads: list[Word] = []
    writes: list[Word] = []
    argv = cmd.argv
    if argv and argv[0].value.startswith("./") and found:  # a rule's `./NAME`: the program file is read
        reads.append(argv[0])
    for m in found:
        if m.reading is not None:  # the program's model says which words are paths (gateway/programs/)
            reads += m.reading.reads
            writes += m.reading.writes
            continue
        spec = m.rule.path_args or PathArgs()
        pos = list(m.positional)
        if spec.read == "all":
            reads += [argv[k] for k in pos]
        elif spec.read == "all_but_last":
            reads += [argv[k] for k in pos[:-1]]
        elif spec.read == "all_but_first":
            reads += [argv[k] for k in pos[1:]]
        elif spec.read == "first" and pos:
            reads.append(argv[pos[0]])
        if spec.write == "all":
            writes += [argv[k] for k in pos]
        elif spec.write == "last" and pos:
            writes.append(argv[pos[-1]])
        start = 2 if m.rule.subcommands is not None else 1
        listed: set[int] = set()
        for names, out in ((m.rule.path_options.read, reads), (m.rule.path_options.write, writes)):
            for k in option_values(cmd, start, names):
                w = argv[k]
                if k not in pos:
                    listed.add(k)  # an attached value: -oFILE, --output=FILE
                    out.append(Word(attached_value(w.value, names), w.expansions, w.raw))
                else:
                    out.append(w)
        if spec.read != "none" or spec.write == "all":
            # The rule takes every positional word for a path, knowing no option's value: `--opt
            # FILE` has FILE jailed as a positional, so `--opt=FILE` (and `-oFILE` holding a `/`)
            # has it jailed too, in case the option reads (git blame --contents=F, diff
            # --from-file=F, du --files0-from=F, file -mF): a value that is no path is jailed
            # harmlessly inside the cwd.
            out = writes if spec.write == "all" else reads
            # with only the first word a path (a script: python, node), the words after it are
            # the script's, not options of the program's that could name files
            end = pos[0] if spec.read == "first" and spec.write == "none" and pos else len(argv)
            for k, value in _attached(argv, start, listed):
                if k < end:
                    out.append(Word(value, argv[k].expansions, argv[k].raw))
    redirected: list[Word] = []
    for r in cmd.redirects:
        if r.target is None:
            continue
        if r.mode in (RedirectMode.WRITE, RedirectMode.APPEND):
            writes.append(r.target)
            redirected.append(r.target)
        elif r.mode is RedirectMode.READ:
            reads.append(r.target)
            redirected.append(r.target)
    return reads, writes, redirected


def _plain_name(value: str) -> bool:
    """A value that can only name an entry of the cwd (no `/`, not `.`, `..` or `~...`)."""
    return "/" not in value and value[:1] not in (".", "~")


def _attached(argv: tuple[Word, ...], start: int, skip: set[int]) -> list[tuple[int, str]]:
    """The values attached to option words before `--` (not those in `skip`): `--name=VALUE`
    (but for a secret-looking name, `--password=VALUE`, only a VALUE that is more than a name
    in the cwd: the jail's record of the path would carry the secret past the audit's
    redaction, and such a name lies inside the cwd),
    and for `-xVALUE` where VALUE holds a `/` and more (a cluster of flags has none; `cut -d/`
    has a delimiter) the value after the first letter, and the rest from the first `/`
    (`-ab/etc/x` could be `-a -b/etc/x`)."""
    out: list[tuple[int, str]] = []
    for k in range(start, len(argv)):
        v = argv[k].value
        if v == "--":
            break
        if k in skip or not v.startswith("-") or v == "-":
            continue
        if v.startswith("--"):
            name, eq, value = v[2:].partition("=")
            if eq and name and not (SECRET_NAME.search(name) and _plain_name(value)):
                out.append((k, value))
        elif "/" in v[2:] and len(v) > 3:  # not a one-character value: cut -d/ (a file `/` is no file)
            out.append((k, v[2:]))
            slash = v.index("/", 2)
            if slash > 2 and v[1:slash].isalnum():
                out.append((k, v[slash:]))
    return out


def _resolve(
    policy: CompiledPolicy,
    word: Word,
    cwds: list[Path],
    unknown_ok: bool,
    budget: globs.Budget | None = None,
    grant: Grant | None = None,
    who: str = "",
) -> list[str]:
    """The real paths `word` may name. With `grant`, a path the grant's deny_read patterns
    deny as written (`.env`, a link to a file of another name) is refused before its links are
    followed, as well as after (`_check_path`)."""
    if producers.pipe(word):
        return []  # `<(sort a)`: a pipe from a command decided on its own, no file
    value, kinds = _tilde(policy, word)
    starts = producers.starting_points(word)
    if starts is not None:  # `$(find lib -name '*.rb')`: what it lists lies under lib (producers.py)
        listed: list[str] = []
        for cwd in cwds:
            for s in starts:  # a glob start (`$(ls -t out/*.txt)`): each match, as the jail checks globs
                found = globs.expand(s, str(cwd), budget or globs.Budget()).paths if globs.has_magic(s) else []
                listed += [real_path(f) for f in found] or [real_path(s if s.startswith("/") else str(cwd / s))]
        return listed
    if kinds - {Expansion.GLOB}:
        if unknown_ok:
            return []  # the rule accepts values known only at run time: the sandbox holds
        raise _Refused(
            "unknown_path",
            f"path {word.raw or value!r} is only known at run time, so it cannot be checked",
            {"path": word.raw or value},
        )
    out: list[str] = []
    for cwd in cwds:
        if Expansion.GLOB in kinds:
            if (obs := decision_cache.current()) is not None:
                obs.unknowable()  # a directory's listing: not kept
            candidates = globs.expand(value, str(cwd), budget or globs.Budget()).paths
        else:
            candidates = [value if value.startswith("/") else str(cwd / value)]
        if grant is not None and grant.deny_read is not None:
            for c in candidates:
                _check_denied_name(os.path.normpath(c), grant, who)
        out.extend(real_path(c) for c in candidates)
    return out


def _check_denied_name(path: str, grant: Grant, who: str) -> None:
    """Refuse a path whose name as written a deny_read pattern denies (`cat .env` where `.env`
    is a link to `config/prod.env`: the real path alone would not say it)."""
    assert grant.deny_read is not None
    if not any(inside(path, r) for r in (*grant.read_roots, *grant.write_roots)):
        return  # outside the roots: refused as such, by where it leads (`_check_path`)
    pattern = grant.deny_read.match(path)
    if pattern is not None:
        raise _Refused(
            "deny_read",
            f"{who}: {path} matches the policy's deny_read pattern {pattern!r}: it is never read or written "
            "(a secret: ask the user for what you need from it)",
            {"path": path, "pattern": pattern},
        )


def check_path(path: str, access: str, grant: Grant, who: str = "files") -> None:
    """Raise PathRefused unless the real, absolute `path` may be read or written (`access`)."""
    _check_path(path, access, grant, who)


def _check_path(path: str, access: str, grant: Grant, who: str, command: bool = False) -> None:
    """`command`: a command's path, which its own shell resolves (in the sandbox, its own /proc:
    PROC_READABLE); else the gateway opens it itself (the files tool), and no /proc path is its to open."""
    if path in ALWAYS:
        return
    details: dict[str, object] = {"path": path, "access": access}
    if command and access == "read" and path in PROC_READABLE:
        return
    if path == _PROC or path.startswith(_PROC + "/"):
        readable = ", ".join(sorted(PROC_READABLE))
        what = f"of which a command may only read {readable}" if command else "which the jail never allows here"
        raise _Refused("proc_path", f"{who}: {path} is inside /proc, {what}", details)
    own_output = access == "read" and grant.outputs is not None and inside(path, grant.outputs)
    for p in grant.private:
        if inside(path, p) and not own_output:
            raise _Refused("gateway_private", f"{who}: {path} lies inside the gateway's own records ({p})", details)
    for p in grant.unseen:
        if inside(path, p) and not any(
            inside(path, r) and inside(str(r), p) for r in (*grant.read_roots, *grant.write_roots)
        ):
            raise _Refused(
                "hidden_by_sandbox",
                f"{who}: {path} is inside {p}, which the sandbox hides from every command although a root covers "
                "it: name it as a root in the policy to use it",
                details,
            )
    if access == "write":
        if not any(inside(path, r) for r in grant.write_roots):
            details["roots"] = [str(r) for r in grant.write_roots]
            raise _Refused(
                "outside_write_roots",
                f"{who}: write to {path} is outside the write roots {[str(r) for r in grant.write_roots]}",
                details,
            )
        for p in grant.protected:
            if inside(path, p):
                details["protected"] = str(p)
                raise _Refused("protected_path", f"{who}: {path} is protected ({p}) and never writable", details)
        if ".git" in Path(path).parts:
            # a repository's config and hooks run programs (core.fsmonitor, hooks), at any depth;
            # git itself changes its directory, through its own commands
            raise _Refused("protected_path", f"{who}: {path} is inside a .git directory, written only by git", details)
        _check_denied(path, access, grant, who, details)
        return
    if not any(inside(path, r) for r in (*grant.read_roots, *grant.write_roots)):
        roots = sorted({str(r) for r in (*grant.read_roots, *grant.write_roots)})
        details["roots"] = roots
        raise _Refused("outside_read_roots", f"{who}: read of {path} is outside the read roots {roots}", details)
    _check_denied(path, access, grant, who, details)


def _check_denied(path: str, access: str, grant: Grant, who: str, details: dict[str, object]) -> None:
    """A path inside the roots that the policy's deny_read patterns deny (any access), or its
    deny_write patterns (a write)."""
    if grant.deny_read is not None and (pattern := grant.deny_read.match(path)) is not None:
        details["pattern"] = pattern
        raise _Refused(
            "deny_read",
            f"{who}: {path} matches the policy's deny_read pattern {pattern!r}: it is never read or written "
            "(a secret: ask the user for what you need from it)",
            details,
        )
    if access == "write" and grant.deny_write is not None and (pattern := grant.deny_write.match(path)) is not None:
        details["pattern"] = pattern
        raise _Refused(
            "deny_write",
            f"{who}: {path} matches the policy's deny_write pattern {pattern!r}: it is never written",
            details,
        )


# Programs that read every file below a directory they are given (or the cwd, given none), and
# the options that make them (None: always): where no sandbox masks the deny_read matches, what
# they would read is looked at before they run. Programs that only list names (ls, find, du,
# tree) read no file's content; a program run by another (make's recipes) is the sandbox's.
_RECURSIVE: dict[str, tuple[frozenset[str] | None, bool]] = {
    # program: (options that make it read directories whole, reads the cwd when given no path)
    "grep": (frozenset({"-r", "-R", "--recursive", "--dereference-recursive", "--directories=recurse"}), True),
    "egrep": (frozenset({"-r", "-R", "--recursive", "--dereference-recursive", "--directories=recurse"}), True),
    "fgrep": (frozenset({"-r", "-R", "--recursive", "--dereference-recursive", "--directories=recurse"}), True),
    "rg": (None, True),
    "ag": (None, True),
    "ack": (None, True),
    "diff": (frozenset({"-r", "--recursive"}), False),
    "zip": (frozenset({"-r", "--recurse-paths", "-R", "--recurse-patterns"}), False),
    "tar": (None, False),
}
_GIT_WHOLE = frozenset({"-A", "--all", "-a", "-u", "--update", "--include-untracked"})


def _recursive_secrets(cmd: Command, reads: list[str], cwds: list[Path], grant: Grant, who: str) -> None:
    """Refuse `cmd` when it reads a directory whole (a recursive grep, rg, git grep, an
    archive) and a deny_read pattern denies something below it."""
    if not cmd.argv:
        return
    program = os.path.basename(cmd.program)
    words = [w.value for w in cmd.argv[1:]]
    if program == "git":
        sub = next((w for w in words if not w.startswith("-")), "")
        if sub not in ("grep", "add", "stash", "commit"):
            return
        trees = [p for p in reads if os.path.isdir(p)]  # `git add src`, `git grep x -- src`
        if sub == "grep" and not reads:
            trees += [str(c) for c in cwds]
        if any(w in _GIT_WHOLE for w in words):  # the whole work tree, wherever it starts
            trees += [str(r) for r in (*grant.write_roots, *grant.read_roots) if any(inside(str(c), r) for c in cwds)]
    else:
        spec = _RECURSIVE.get(program)
        if spec is None:
            return
        options, implicit = spec
        recurses = options is None or any(_uses(w, o) for w in words for o in options)
        if not recurses and not (program in ("grep", "egrep", "fgrep") and _directories_recurse(words)):
            return
        trees = [p for p in reads if os.path.isdir(p)]
        if implicit and not reads:
            trees += [str(c) for c in cwds]
    if not trees:
        return
    if (obs := decision_cache.current()) is not None:
        obs.unknowable()  # what lies below a tree: a decision on it is not kept
    roots = [str(r) for r in (*grant.read_roots, *grant.write_roots)]
    for tree in dict.fromkeys(trees):
        found = masks.find([tree], grant.deny_read, plan.unseen(roots))
        if found:
            hit = found[0]
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise _Refused(
                "deny_read",
                f"{who} reads every file below {tree}, and {hit.path}{more} matches the policy's deny_read pattern "
                f"{hit.pattern!r}: search the directories that hold no secret, or name the files",
                {"path": hit.path, "pattern": hit.pattern, "tree": tree},
            )


def _git_blobs(words: list[str], cwds: list[Path], grant: Grant, who: str) -> None:
    """Refuse `git show REV:PATH` (and `:PATH`, the index) where PATH is denied: git reads it
    from its objects, which no mask covers. (A secret committed to the repository is still in
    its history for `git log -p` and the like: keep secrets out of commits.)"""
    assert grant.deny_read is not None
    for w in words:
        if w.startswith("-") or ":" not in w:
            continue
        path = w.split(":", 1)[1]
        if not path:
            continue
        for base in cwds:  # `./x` is relative to the cwd, anything else to the top of the work tree
            where = os.path.normpath(os.path.join(str(base), path))
            pattern = grant.deny_read.match(where) or grant.deny_read.match("/" + path.lstrip("/"))
            if pattern is not None:
                raise _Refused(
                    "deny_read",
                    f"{who}: {w} names a file the policy's deny_read pattern {pattern!r} denies, read from git's "
                    "objects: it is never read",
                    {"path": path, "pattern": pattern},
                )


def _uses(word: str, option: str) -> bool:
    """Does the option word `word` use `option` (`-rn` uses -r; `--recur` --recursive)?"""
    if word == "--" or not word.startswith("-"):
        return False
    if option.startswith("--"):
        name, _, value = option.partition("=")
        given, eq, got = word.partition("=")
        if not given.startswith("--") or len(given) < 3 or not name.startswith(given):
            return False
        return not value or (bool(eq) and got == value)
    return not word.startswith("--") and option[1] in word[1:]


def _directories_recurse(words: list[str]) -> bool:
    """grep's `-d recurse` (`-drecurse`, `--directories recurse`)."""
    for k, w in enumerate(words):
        if w in ("-d", "--directories", "--directorie", "--director", "--directo", "--direct", "--direc", "--dire"):
            if k + 1 < len(words) and words[k + 1] == "recurse":
                return True
        elif w.startswith("-d") and not w.startswith("--") and w[2:] == "recurse":
            return True
    return False


def _after_cd(policy: CompiledPolicy, cmd: Command, cwds: list[Path]) -> list[Path]:
    args = [w for w in cmd.argv[1:] if not w.value.startswith("-") or w.value == "-"]
    if not args:
        homes = _current_homes(policy)
        if homes.home is None or not homes.home.startswith("/"):
            raise _Refused(
                "cd_without_target", f"{cmd.program} without a directory goes to $HOME: {homes.whose} is not set", {}
            )
        targets = [real_path(homes.home)]
    elif args[0].value == "-":
        raise _Refused("cd_without_target", f"{cmd.program} - goes to a directory only known at run time", {})
    else:
        targets = _resolve(policy, args[0], cwds, False)
    out = list(cwds)
    for t in targets:
        if Path(t) not in out:
            out.append(Path(t))
    return out
