"""A *git write*: a call whose every program is git itself with a subcommand that runs no other
program, told from the analysis. Only for such a call does the sandbox leave `.git` writable
(gateway/sandbox/git.py says what stays read-only even then); the sandbox is told the answer as
a plain `git_write`, and never reads the parser's types.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.analysis.model import Command, RedirectMode

WRITE_SUBCOMMANDS = frozenset({
    "add", "am", "apply", "branch", "checkout", "cherry-pick", "clean", "commit", "diff", "gc", "init", "log",
    "merge", "mv", "notes", "rebase", "reset", "restore", "revert", "rm", "show", "stash", "status", "switch", "tag",
})  # fmt: skip
"""git subcommands that run no program but git (hooks, editors and pagers are switched off)."""

RUNS_PROGRAMS = frozenset({
    "-x", "--exec", "-i", "--interactive", "-s", "--strategy", "--template", "--separate-git-dir",
    "--upload-pack", "--receive-pack", "--exec-path", "--output", "--ext-diff", "--tool", "-t", "--extcmd",
})  # fmt: skip
"""Options that make one of those subcommands run another program or write outside .git."""

GIT_VARIABLES = frozenset({"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME",
                           "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE"})  # fmt: skip
INERT_BUILTINS = frozenset({"cd", "echo", "printf", "true", "false", ":", "pwd", "test", "[", "exit"})
"""Builtins that may sit beside git in a git write: they run nothing and write nothing."""


def is_git_write(commands: Iterable[Command]) -> bool:
    """True when every command is git with a write subcommand and nothing that runs a program."""
    seen_git = False
    for cmd in commands:
        if not cmd.argv or not all(w.literal for w in cmd.argv):
            return False
        if any(r.mode not in (RedirectMode.READ, RedirectMode.DUP) for r in cmd.redirects):
            return False
        if cmd.program in INERT_BUILTINS and not cmd.assignments:
            continue
        if cmd.program != "git" or cmd.wrapper is not None:
            return False
        if any(a.name not in GIT_VARIABLES for a in cmd.assignments):
            return False
        args = cmd.args
        if not args or args[0].startswith("-") or args[0] not in WRITE_SUBCOMMANDS:
            return False  # a global option (-c, -C, --git-dir...) or an unknown subcommand
        for arg in args[1:]:
            name = arg.split("=", 1)[0]
            if name in RUNS_PROGRAMS or name.startswith(("--exec", "--output", "--strategy", "--template")):
                return False
        seen_git = True
    return seen_git
