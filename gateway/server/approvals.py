"""Who answers, for calls that come over MCP.

`ask` decisions are a supervisor's control. `McpApprover` sends them to the supervisor channel
(the approvals queue or the gateway's terminal) and tells the waiting MCP call, which then
returns `pending` to the agent instead of hanging (`await_call` gets the result later).

Only where every rule that asks opts in (`approval: client`) may the agent's own MCP client
answer, through an elicitation form asked before the call runs. That answer comes from the
client, which may answer by itself, so it is recorded as `client-attested`, and it binds to the
exact principal, tool, command and policy it was asked about.

`ask_user` questions are the agent asking its own user: only the client can answer them
(elicitation). Without a client that supports forms the answer is NO_USER_CHANNEL.

The MCP side hands each call's context to the handling thread as a `Ticket` (`serving`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway.approval import CANCEL_POLL_S, Answer, Approval, ApprovalRequest, Approver, Question
from gateway.cancellation import Cancel, cancelled
from gateway.policy.compile import CompiledPolicy

NO_CHANNEL = Answer(None, "nobody", "no-channel", "your MCP client does not support elicitation (forms)")


@dataclass(frozen=True)
class Attestation:
    """The client's answer to "run this?", and what it was asked about."""

    approved: bool
    principal: str
    tool: str
    command: str
    cwd: str
    env: dict[str, str]
    policy_sha256: str


@dataclass
class Ticket:
    """One MCP call as its handling thread sees it."""

    principal: str
    cancel: Cancel = field(default_factory=Cancel)
    waiting: bool = False  # True while a supervisor is asked
    on_pending: Callable[[ApprovalRequest, float], None] | None = None
    attestation: Attestation | None = None
    user_answer: Answer | None = None  # ask_user: the client's answer (NO_CHANNEL: it cannot answer)
    client_session: str | None = None
    """The MCP connection the call came in (approval.CLIENT_SESSION): what "approve for the
    session" binds to. None where the protocol has none (2026-07-28's single exchanges)."""


_local = threading.local()


@contextmanager
def serving(ticket: Ticket) -> Iterator[None]:
    _local.ticket = ticket
    try:
        yield
    finally:
        _local.ticket = None


def current_ticket() -> Ticket | None:
    ticket: Ticket | None = getattr(_local, "ticket", None)
    return ticket


def _real(path: str) -> str:
    return os.path.realpath(path)


def client_may_answer(policy: CompiledPolicy, asking: tuple[str | None, ...]) -> bool:
    """True when every rule that asks opted in to client approval (none may be missing)."""
    if not asking:
        return False
    for rule_id in asking:
        rule = policy.rules.get(rule_id) if rule_id else None
        if rule is None or rule.approval != "client":
            return False
    return True


def has_client_rules(policy: CompiledPolicy) -> bool:
    return any(rule.approval == "client" for rule in policy.rules.values())


class McpApprover:
    """The gateway's approver when serving MCP: client attestations where the policy allows
    them, the supervisor channel for everything else."""

    def __init__(self, supervisor: Approver, policy: Callable[[], CompiledPolicy]) -> None:
        self.supervisor = supervisor
        self.policy = policy
        self.state_dir = getattr(supervisor, "state_dir", None)  # the queue's directory: hidden, like the gateway's
        self._serial = threading.Lock() if getattr(supervisor, "one_at_a_time", False) else None

    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
        ticket = current_ticket()
        att = ticket.attestation if ticket else None
        if att is not None and self._holds(att, request):
            how = "client-attested"
            return Approval(att.approved, f"client of {request.principal}", request.digest, how)
        if ticket is not None and ticket.on_pending is not None:
            ticket.on_pending(request, timeout)
        if ticket is not None:
            ticket.waiting = True  # from now on the server may withdraw it (shutdown)
        try:
            if self._serial is None:
                return self.supervisor.decide(request, timeout)
            # one terminal: one question at a time; the turn is waited for within the same timeout,
            # and no longer than the call lives
            deadline = time.monotonic() + timeout
            while not self._serial.acquire(timeout=min(CANCEL_POLL_S, max(0.0, deadline - time.monotonic()))):
                if cancelled() or time.monotonic() >= deadline:
                    return None
            try:
                return self.supervisor.decide(request, max(0.0, deadline - time.monotonic()))
            finally:
                self._serial.release()
        finally:
            if ticket is not None:
                ticket.waiting = False

    def _holds(self, att: Attestation, request: ApprovalRequest) -> bool:
        asked = (att.principal, att.tool, att.command, _real(att.cwd), att.env, att.policy_sha256)
        now = (request.principal, request.tool, request.command, _real(request.cwd), request.env, request.policy_sha256)
        return asked == now and client_may_answer(self.policy(), request.asking)

    def user_channel_closed(self) -> Answer | None:
        """Why nobody can answer this call's ask_user question (None: the client answered).
        Known before the call runs: the form is asked by the SDK's resolver, first."""
        ticket = current_ticket()
        if ticket is None or ticket.user_answer is None:
            return NO_CHANNEL
        return ticket.user_answer if ticket.user_answer.how == "no-channel" else None

    def ask_user(self, question: Question, timeout: float) -> Answer | None:
        ticket = current_ticket()
        if ticket is None or ticket.user_answer is None:
            return NO_CHANNEL
        return ticket.user_answer
