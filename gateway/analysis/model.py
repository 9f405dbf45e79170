"""What the analyser reports: immutable values, serialisable to JSON.

An `Analysis` is either a complete list of every `Command` that the shell text would run, or a
`Denial` naming the construct that could not be modelled. Never both, never a partial list.

Shapes (outermost first)::

    Analysis
      text, commands: tuple[Command, ...], denial: Denial | None, second_opinion: SecondOpinion
    Command
      argv: tuple[Word, ...]            argv[0] is the program, quote-removed
      assignments: tuple[Assignment]    FOO=1 prefixes (and env's NAME=VALUE operands)
      redirects: tuple[Redirect]
      context: tuple[Context, ...]      where it sits: pipeline, list, subshell, $(...), wrapper...
      flags: tuple[str, ...]            facts a policy should see (privilege, dynamic_args...)
    Word
      value                             quote-removed text; expansions are kept as written
      expansions                        why the runtime value is unknown (empty = literal)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Expansion(StrEnum):
    """A reason a word's runtime value is not what its text says."""

    PARAMETER = "parameter"  # $x, ${x}, ${x:-...}, $1, $@
    COMMAND_SUBSTITUTION = "command_substitution"  # $(...)
    ARITHMETIC = "arithmetic"  # $((...)), $[...]
    PROCESS_SUBSTITUTION = "process_substitution"  # <(...), >(...): becomes /dev/fd/N
    GLOB = "glob"  # unquoted * ? [ or an extglob pattern
    TILDE = "tilde"  # unquoted ~ at the start of a word (or after = / : in assignments)
    BRACE = "brace"  # {a,b}, {1..3}
    TRANSLATION = "translation"  # $"..." (locale translation)
    PLACEHOLDER = "placeholder"  # {} in find -exec / xargs -I: replaced at run time


class Context(StrEnum):
    """Where a command sits. A command's context tuple lists these outermost first."""

    PIPELINE = "pipeline"
    AND = "and"  # a && b
    OR = "or"  # a || b
    SEQUENCE = "sequence"  # a ; b, or a newline
    BACKGROUND = "background"  # a &
    NEGATED = "negated"  # ! a
    SUBSHELL = "subshell"  # ( a )
    GROUP = "group"  # { a; }
    FUNCTION = "function"  # f() { a; }: runs only if called
    LOOP = "loop"  # for / while / until / select body or condition
    IF = "if"  # if / elif / else condition or body
    CASE = "case"  # case ... esac item body
    COMMAND_SUBSTITUTION = "command_substitution"  # $( a )
    PROCESS_SUBSTITUTION_IN = "process_substitution_in"  # <( a )
    PROCESS_SUBSTITUTION_OUT = "process_substitution_out"  # >( a )
    ARITHMETIC = "arithmetic"  # (( ... )), $(( ... ))
    HEREDOC = "heredoc"  # a substitution inside an unquoted here-document body
    WRAPPER = "wrapper"  # run by a wrapper program (env, sudo, xargs, find -exec, bash -c ...)


class RedirectMode(StrEnum):
    READ = "read"  # <
    WRITE = "write"  # >, >|, &>
    APPEND = "append"  # >>, &>>
    DUP = "dup"  # >&N, <&N
    CLOSE = "close"  # >&-, <&-
    HEREDOC = "heredoc"  # << and <<-
    HERESTRING = "herestring"  # <<<


class Flag(StrEnum):
    """Facts about a command that a policy will want to weigh."""

    PRIVILEGE = "privilege"  # run through sudo / doas
    DYNAMIC_ARGS = "dynamic_args"  # more arguments arrive at run time (xargs, find -exec ... +)
    BUILTIN = "builtin"  # a shell keyword or builtin, not a program on disk
    SHELL_SCRIPT = "shell_script"  # bash -c '<script>': the script's commands follow as commands


@dataclass(frozen=True, slots=True)
class Word:
    """One shell word after quote removal.

    `value` is what the shell passes when `expansions` is empty. When it is not, `value` keeps
    the expansions as written (`$HOME/x`, `*.py`), quote-removed around them.
    """

    value: str
    expansions: tuple[Expansion, ...] = ()
    raw: str = ""  # the source text of the word

    @property
    def literal(self) -> bool:
        return not self.expansions

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "literal": self.literal}
        if self.expansions:
            out["expansions"] = [e.value for e in self.expansions]
        return out


@dataclass(frozen=True, slots=True)
class Assignment:
    """`NAME=VALUE` (or `NAME+=VALUE`) before a command, on its own, or given to env."""

    name: str
    value: Word
    append: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value.to_json(), "append": self.append}


@dataclass(frozen=True, slots=True)
class Redirect:
    """A redirection. `fd` is the descriptor redirected (None: the operator's default).

    `target` is the file (read/write/append), the descriptor (dup), the here-string, or the
    here-document body. `both` is set for `&>` / `&>>` (stdout and stderr).
    """

    mode: RedirectMode
    target: Word | None
    fd: int | None = None
    both: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "fd": self.fd,
            "both": self.both,
            "target": self.target.to_json() if self.target else None,
        }


@dataclass(frozen=True, slots=True)
class Command:
    """A program (or shell builtin) that the text would run."""

    argv: tuple[Word, ...]
    assignments: tuple[Assignment, ...] = ()
    redirects: tuple[Redirect, ...] = ()
    context: tuple[Context, ...] = ()
    flags: tuple[Flag, ...] = ()
    wrapper: str | None = None  # the wrapper that runs it (its argv[0]), if any
    words: tuple[Word, ...] = ()
    """Words the shell expands although no program receives them: a `for` loop's list (its
    globs list directories: the path jail checks them). Such a command has an empty argv."""

    @property
    def program(self) -> str:
        return self.argv[0].value

    @property
    def args(self) -> tuple[str, ...]:
        return tuple(w.value for w in self.argv[1:])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "argv": [w.value for w in self.argv],
            "words": [w.to_json() for w in self.argv],
            "context": [c.value for c in self.context],
        }
        if self.assignments:
            out["assignments"] = [a.to_json() for a in self.assignments]
        if self.redirects:
            out["redirects"] = [r.to_json() for r in self.redirects]
        if self.flags:
            out["flags"] = [f.value for f in self.flags]
        if self.wrapper:
            out["wrapper"] = self.wrapper
        if self.words:
            out["expanded_words"] = [w.to_json() for w in self.words]
        return out


@dataclass(frozen=True, slots=True)
class Denial:
    """Why the text is refused. `code` is stable (docs/analysis.md lists them all)."""

    code: str
    message: str
    construct: str = ""  # the offending source text or construct name
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.construct:
            out["construct"] = self.construct
        if self.details:
            out["details"] = self.details
        return out


class OpinionStatus(StrEnum):
    """How the second parser (bashlex) judged the text, and where it could not, mvdan/sh.

    AGREED and CONFIRMED_BY_SHFMT confirm the primary analysis. PARTIAL, UNPARSED, TIMEOUT,
    TOO_LARGE and FAILED (bashlex's statuses, kept where shfmt could not confirm either) leave it
    unconfirmed: the policy decides (default: ask). DISAGREED is a denial. SKIPPED: the primary
    already denied, so a second opinion could not make the answer stricter.
    """

    AGREED = "agreed"
    CONFIRMED_BY_SHFMT = "confirmed_by_shfmt"  # bashlex could not confirm; mvdan/sh read the same
    PARTIAL = "partial"  # agreed where it could see; blind to the listed constructs
    UNPARSED = "unparsed"  # bashlex raised (a construct it does not implement)
    TIMEOUT = "timeout"  # bashlex ran out of CPU or wall time (it can loop forever)
    TOO_LARGE = "too_large"  # longer than bashlex can parse within its CPU limit: not asked
    FAILED = "failed"  # the worker crashed or could not be started
    DISAGREED = "disagreed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class SecondOpinion:
    status: OpinionStatus
    detail: str = ""
    blind_spots: tuple[str, ...] = ()  # which constructs bashlex could not see
    shfmt: str = ""  # what mvdan/sh said where bashlex could not confirm ("" = not asked)

    @property
    def confirmed(self) -> bool:
        return self.status in (OpinionStatus.AGREED, OpinionStatus.CONFIRMED_BY_SHFMT)

    @property
    def unfinished(self) -> bool:
        """A parser crashed or ran out of time where its answer counted: asking again may end
        differently, so the answer is not kept (analysis and decision caches)."""
        if self.status in (OpinionStatus.TIMEOUT, OpinionStatus.FAILED):
            return True
        return not self.confirmed and self.shfmt in ("timeout", "failed")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status.value}
        if self.detail:
            out["detail"] = self.detail
        if self.blind_spots:
            out["blind_spots"] = list(self.blind_spots)
        if self.shfmt:
            out["shfmt"] = self.shfmt
        return out


@dataclass(frozen=True, slots=True)
class Analysis:
    """The analyser's answer for one shell text."""

    text: str
    commands: tuple[Command, ...]
    denial: Denial | None
    second_opinion: SecondOpinion

    @property
    def denied(self) -> bool:
        return self.denial is not None

    @property
    def programs(self) -> tuple[str, ...]:
        return tuple(c.program for c in self.commands)

    def to_json(self) -> dict[str, Any]:
        return {
            "denied": self.denied,
            "denial": self.denial.to_json() if self.denial else None,
            "commands": [c.to_json() for c in self.commands],
            "second_opinion": self.second_opinion.to_json(),
        }
