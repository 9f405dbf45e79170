"""Approval: an `ask` decision waits for a supervisor. No answer in time means deny.

An `ApprovalRequest` carries what the supervisor must see (the exact command, cwd, env changes,
the rule and why it asks) and a digest binding any answer to this exact call: principal, tool,
command, cwd, env and the policy's hash. Shipped approvers:

- `DenyAll`: the default when nobody can answer;
- `CallbackApprover`: a function decides (for programs and tests);
- `TerminalApprover`: asks a supervisor at a TTY, with control and invisible characters shown as
  escapes, and waits at most the timeout;
- `approval_queue.QueueApprover`: a durable queue a supervisor answers with
  `gateway approvals ...` from another terminal.
"""

from __future__ import annotations

import hashlib
import json
import sys
import termios
import time
import unicodedata
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from gateway import fdwait
from gateway.cancellation import cancelled
from gateway.escaping import escaped as escaped
from gateway.escaping import shortened as shortened

if TYPE_CHECKING:
    from gateway.runfiles import BoundFile


CLIENT_SESSION: ContextVar[str | None] = ContextVar("agw_client_session", default=None)
"""The client session the call being handled came in: an MCP connection (gateway/server/app.py
names each one), a hook's agent session. Set by the face that took the call. An approval "for
the session" holds only for the principal it was given to, in this session, and ends with it
(`Gateway.end_client_session`); where it is None the call came in no session, and such an
answer approves that one call."""


@dataclass(frozen=True)
class ApprovalRequest:
    call_id: str
    principal: str
    tool: str
    command: str
    cwd: str
    env: dict[str, str]
    rule: str | None
    reason: str
    policy_sha256: str
    digest: str = field(default="")
    asking: tuple[str | None, ...] = ()
    """Every rule that asks about this call (None: a stage that asks without a rule). A client may
    answer only when each of them opts in (`approval: client`)."""
    inherited: dict[str, str] = field(default_factory=dict)
    """The principal's stored variables (the `env` tool) the command inherits under the policy in
    force; the call's own `env` overrides them. Bound by the digest too: a supervisor approves
    the environment the command runs with, not only the variables the call names."""

    files: tuple[BoundFile, ...] = ()
    """The files of the roots the command runs (a script, a makefile, a patch: gateway/runfiles.py),
    as the sandbox's account read them when it asked. Bound by the digest: an approval is of
    this content, and a file changed (or planted) before the command starts voids it."""

    @staticmethod
    def bind(call_id: str, principal: str, tool: str, command: str, cwd: str, env: dict[str, str],
             rule: str | None, reason: str, policy_sha256: str,
             asking: tuple[str | None, ...] = (),
             inherited: dict[str, str] | None = None,
             files: tuple[BoundFile, ...] = ()) -> ApprovalRequest:  # fmt: skip
        inherited = dict(inherited or {})
        parts: list[Any] = [principal, tool, command, cwd, sorted(env.items()), policy_sha256]
        if inherited:
            parts.append(sorted(inherited.items()))
        if files:
            parts.append([[f.path, *f.state] for f in files])
        body = json.dumps(parts, ensure_ascii=False)
        digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
        return ApprovalRequest(
            call_id, principal, tool, command, cwd, env, rule, reason, policy_sha256, digest, asking, inherited,
            tuple(files),
        )  # fmt: skip

    def effective_env(self) -> dict[str, str]:
        """The environment the command runs with (besides the sandbox's own): the inherited
        variables, overridden by the call's."""
        return {**self.inherited, **self.env}


@dataclass(frozen=True)
class Approval:
    approved: bool
    by: str
    digest: str
    how: str  # "deny-all", "callback", "tty", ...
    note: str = ""


class Approver(Protocol):
    """Answers an approval request within `timeout` seconds, or returns None (= deny).

    An approver that can also reach the human for the `ask_user` tool has a method
    `ask_user(question: Question, timeout: float) -> Answer | None` (None: no answer in time)."""

    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None: ...


@dataclass(frozen=True)
class Question:
    """What the agent asks its user (the ask_user tool)."""

    call_id: str
    principal: str
    prompt: str
    default: str | None
    password: bool
    hint: str  # what a valid answer looks like, from the validation rules


@dataclass(frozen=True)
class Answer:
    value: str | None  # None: the human cancelled
    by: str
    how: str
    note: str = ""  # how "no-channel": why nobody could be asked


class DenyAll:
    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
        return Approval(False, "nobody", request.digest, "deny-all", "no supervisor can answer")


class CallbackApprover:
    """Functions decide: `fn` approvals, `answer` ask_user questions (a string, None for no
    answer in time, or CANCEL)."""

    def __init__(
        self,
        fn: Callable[[ApprovalRequest], bool | None],
        who: str = "callback",
        answer: Callable[[Question], str | None] | None = None,
    ) -> None:
        self.fn = fn
        self.who = who
        self.answer = answer

    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
        answer = self.fn(request)
        return None if answer is None else Approval(bool(answer), self.who, request.digest, "callback")

    def ask_user(self, question: Question, timeout: float) -> Answer | None:
        if self.answer is None:
            return None
        value = self.answer(question)
        if value is None:
            return None
        return Answer(None if value is CANCEL else value, self.who, "callback")


CANCEL = "\0cancel"  # a CallbackApprover's answer function returns this to cancel


def visible(text: str) -> str:
    """`text` with control, bidi and invisible characters made visible as escapes."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n\n    ")
        elif ch == "\t" or (ch.isprintable() and unicodedata.category(ch) not in ("Cf", "Co", "Cn")):
            out.append(ch)
        else:
            out.append(f"\\u{{{ord(ch):04x}}}")
    return "".join(out)


CANCEL_POLL_S = 0.1
"""How often a wait for a human looks at the call's cancel event."""


def _answered(stream: TextIO, timeout: float) -> bool:
    """Wait until `stream` has input: False at the timeout, or as soon as the call is cancelled
    (the client left, the server stops: nobody waits for the answer any more)."""
    deadline = time.monotonic() + timeout
    while not cancelled():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if fdwait.readable(stream.fileno(), min(left, CANCEL_POLL_S)):
            return True
    return False


def _files_shown(request: ApprovalRequest) -> str:
    """The files the command runs, each with its digest and first lines (escaped), for a
    supervisor at a terminal; what changes in them before the command starts voids the answer."""
    out = []
    for f in request.files:
        out.append(f"  runs:    {visible(f.describe())} ({f.why})\n")
        for line in f.head.splitlines()[:20]:
            out.append(f"           | {escaped(line)}\n")
    return "".join(out)


class TerminalApprover:
    """Asks at a terminal: approve once (y), approve this exact call for the session (s), deny
    (n). Anything else, or no answer in time, denies."""

    one_at_a_time = True  # one terminal: concurrent calls must take turns

    def __init__(self, supervisor: str, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.supervisor = supervisor
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stderr

    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
        if not self.stdin.isatty():
            return None  # piped input is not a supervisor (an agent could pipe "y")
        w = self.stdout
        w.write(
            f"\n=== approval needed (call {request.call_id}, {request.principal}) ===\n"
            f"  command: {visible(request.command)}\n  cwd:     {visible(request.cwd)}\n"
            f"  env:     {visible(json.dumps(request.effective_env()))}\n  rule:    {request.rule}\n"
            f"  why:     {visible(request.reason)}\n"
            f"{_files_shown(request)}"
            f"Approve? y = once, s = this exact call for the rest of the session, N = deny "
            f"(denied in {int(timeout)} s) "
        )
        w.flush()
        if not _answered(self.stdin, timeout):
            return None
        answer = self.stdin.readline().strip().lower()
        if answer == "s":
            return Approval(True, self.supervisor, request.digest, "tty-session")
        return Approval(answer in ("y", "yes"), self.supervisor, request.digest, "tty")

    def ask_user(self, question: Question, timeout: float) -> Answer | None:
        """Ask at the terminal. Echo is off for a password. End of input cancels."""
        if not self.stdin.isatty():
            return None
        w = self.stdout
        default = f" [{visible(question.default)}]" if question.default and not question.password else ""
        hint = f" ({question.hint})" if question.hint else ""
        w.write(f"\n=== the agent asks ({question.principal}) ===\n  {visible(question.prompt)}{hint}{default}\n> ")
        w.flush()
        fd = self.stdin.fileno()
        saved = termios.tcgetattr(fd) if question.password else None
        try:
            if saved is not None:
                quiet = termios.tcgetattr(fd)
                quiet[3] &= ~termios.ECHO
                termios.tcsetattr(fd, termios.TCSANOW, quiet)
            if not _answered(self.stdin, timeout):
                return None
            line = self.stdin.readline()
        finally:
            if saved is not None:
                termios.tcsetattr(fd, termios.TCSANOW, saved)
                w.write("\n")
        if not line:
            return Answer(None, self.supervisor, "tty")
        return Answer(line.rstrip("\n"), self.supervisor, "tty")
