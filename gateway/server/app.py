"""The MCP server: every tool of the surface as an MCP tool, in front of one `Gateway`.

A tool call becomes a pydantic call model (`gateway/calls.py`) for the caller's principal and
is handled by `Gateway.handle` on a worker thread, so the event loop stays free while commands
run. Results are the gateway's envelope, once, as JSON text after a summary line, with `isError`
when the call was denied or failed, so a denial is a tool result an agent can read (code, rule,
justification), never a protocol error.

The principal comes from the bearer token over HTTP (`get_access_token()`), or is fixed when the
server is built (stdio, in-memory). The agent never names it.

Approvals (`approvals.py`): an `ask` goes to the supervisor channel; the call returns `pending`
after `pending_after_s` and `await_call` fetches its result. Rules that opt in to client
approval, and `ask_user`, use elicitation through SDK resolvers (both protocol eras), which run
before the call's body; the policy is consulted first, so nobody is asked about a call the
policy denies anyway.
"""

import asyncio
import contextlib
import contextvars
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import AcceptedElicitation, Context, Elicit, ElicitationResult, Resolve
from mcp.types import CallToolResult, ImageContent, TextContent
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, ValidationError, create_model

from gateway import tools
from gateway.approval import CLIENT_SESSION, Answer, ApprovalRequest, visible
from gateway.audit import AuditUnavailable, origin
from gateway.calls import AskUserCall, ProcessCall, RunCall, UpstreamCall
from gateway.log import log
from gateway.pipeline import Gateway, error, evaluate, new_call_id, raw_arguments, tool_decision
from gateway.policy.schema import Tool
from gateway.policy.upstreams import SEPARATOR
from gateway.server.approvals import (
    NO_CHANNEL,
    Attestation,
    McpApprover,
    Ticket,
    client_may_answer,
    has_client_rules,
    serving,
)
from gateway.server.specs import BY_NAME, SPECS, AwaitCall, Spec
from gateway.stages.pathjail import PathRefused
from gateway.tools import upstream as upstream_tools
from gateway.upstream.hub import split_name

INSTRUCTIONS = (
    "agent-gateway: shell and file tools behind a security policy. Every call is decided by the "
    "policy and recorded in an audit log. A denied call returns isError with a code, the rule and "
    "its justification: follow the justification instead of retrying. A call that needs a "
    "supervisor returns status `pending`: call `await_call` with its call_id."
)
PENDING_AFTER_S = 5.0
MAX_IN_FLIGHT = 256
MAX_IN_FLIGHT_PER_PRINCIPAL = 64  # one principal cannot take every slot (e.g. parking asks)
KEEP_FINISHED_S = 3600.0
KEEP_FINISHED_MAX = 1024
KEEP_FINISHED_BYTES = 64 << 20
"""A pending call's result stays for `await_call` to answer again for an hour, within these
bounds (the oldest go first)."""
WORKER_IDLE_S = 60.0
_SESSION_KEY = "agent-gateway.client_session"
UPSTREAM_ROUTE = "_agw__upstream"
"""The one registered tool every upstream tool's call is routed to (never listed; called by
this name, it is an unknown upstream `_agw`, denied like any)."""
_CALLED: ContextVar[str | None] = ContextVar("upstream_called", default=None)
_FAILED = ("denied", "error", "timeout")


class ClientApproval(BaseModel):
    """The form a client answers for a rule that opted in to client approval."""

    approve: bool = Field(description="Run this exact command?")


class NotAsked(ClientApproval):
    """A resolver's answer when nobody was asked (the policy did not need it, or no form support)."""


class UserAnswer(BaseModel):
    answer: str = ""


class NoUserChannel(UserAnswer):
    """ask_user: nobody was asked (`answer` says why)."""


@dataclass
class _Flight:
    """One call on its worker thread, as the server tracks it."""

    principal: str
    tool: str
    ticket: Ticket
    loop: asyncio.AbstractEventLoop
    changed: asyncio.Event
    started: float = field(default_factory=time.monotonic)
    call_id: str | None = None
    request: ApprovalRequest | None = None  # set while a supervisor is asked
    expires: float | None = None
    result: dict[str, Any] | None = None
    finished: float | None = None
    size: int = 0  # the result's JSON bytes, for the bound on kept results

    def poke(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self.loop.call_soon_threadsafe(self.changed.set)


class Workers:
    """The threads calls run on: one per call in flight, as many as there are, kept for the
    next call when it ends instead of started anew (a new thread is started only when none is
    idle; an idle one ends after `idle_s`). A call never waits for a thread, and each runs in a
    fresh context; per-thread state is the callee's to set and reset (`serving`, `handling`)."""

    def __init__(self, idle_s: float = WORKER_IDLE_S) -> None:
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job that no submitted job has claimed yet

    def submit(self, job: Any) -> None:
        with self._lock:
            claimed = self._idle > 0
            if claimed:
                self._idle -= 1
        self._jobs.put(job)
        if not claimed:
            threading.Thread(target=self._loop, name="call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # an unclaimed waiter may leave (this one, or one as good)
                        self._idle -= 1
                        return
                continue  # every waiter is claimed: a job is on its way to one of us
            try:
                contextvars.Context().run(job)
            except Exception as exc:  # work() answers every call itself; this thread stays usable
                log.error("call_worker_failed", error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._idle += 1


class GatewayServer:
    """An `MCPServer` whose tools are the gateway's. One per listening endpoint; several may
    share one `Gateway` (and so the principals' sessions, processes and env)."""

    def __init__(
        self,
        gateway: Gateway,
        principal: str | None = None,
        *,
        token_verifier: TokenVerifier | None = None,
        auth: AuthSettings | None = None,
        pending_after_s: float = PENDING_AFTER_S,
        max_in_flight: int = MAX_IN_FLIGHT,
        name: str = "agent-gateway",
        specs: Sequence[Spec] = SPECS,
        mcp: MCPServer[Any] | None = None,
    ) -> None:
        """`specs`: the tools served (`gateway/server/profiles/`: `gateway serve --profile`);
        the gateway's own by default. Every one is an adapter over `gateway.handle`. `mcp`:
        register them on this existing server, beside its own tools, instead of a new one
        (`gateway/server/register.py`)."""
        if principal is None and token_verifier is None:
            raise ValueError("a server needs a fixed principal (stdio) or a token verifier (HTTP)")
        self.gw = gateway
        if not isinstance(gateway.approver, McpApprover):
            gateway.approver = McpApprover(gateway.approver, lambda: gateway.policy)
        self.principal = principal
        self.pending_after_s = pending_after_s
        self.max_in_flight = max_in_flight
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._per_principal: dict[str, int] = {}
        self._lock = threading.Lock()
        self._flights: dict[int, _Flight] = {}
        self._by_call: dict[str, _Flight] = {}
        self.accepting = True
        self._answering = 0  # tool handlers that have not yet returned their reply to the SDK
        self._drained: dict[str, int] | None = None
        self._workers = Workers()
        if mcp is not None:
            self.mcp: MCPServer[Any] = mcp
            mcp.middleware.extend([self._filter_listing, self._route_upstream])
        else:
            self.mcp = MCPServer(
                name,
                instructions=INSTRUCTIONS,
                token_verifier=token_verifier,
                auth=auth,
                middleware=[self._filter_listing, self._route_upstream],
                log_level="WARNING",  # the SDK configures logging; INFO would print every casbin enforce
            )
        self.specs: dict[str, Spec] = {}
        for spec in specs:
            if spec.name in self.specs:
                raise ValueError(f"two tools named {spec.name!r}: serve profiles whose tool names differ")
            if SEPARATOR in spec.name:
                raise ValueError(f"{spec.name!r}: `{SEPARATOR}` in a tool's name is for upstream tools (PREFIX__TOOL)")
            self.specs[spec.name] = spec
            self._register(spec)
        self._register_upstream_route()
        if gateway.policy.policy.upstreams:  # their connections start now, not at the agent's first call
            upstream_tools.hub(gateway).warm(gateway.policy)

    # --- who calls ---------------------------------------------------------------------------
    def caller(self) -> str | None:
        """The principal of the current request: the fixed one without auth (stdio, in memory),
        else the verified token's owner (None: no verified token, which the SDK refuses first)."""
        if self.mcp.settings.auth is None:
            return self.principal
        token = get_access_token()
        return token.client_id if token is not None else None

    def visible_tools(self, principal: str) -> set[str]:
        """The tools `principal` may ever use: a family the policy denies is not listed."""
        policy = self.gw.policy
        try:
            policy.grant(principal)
        except Exception:
            return set()
        out = set()
        for spec in self.specs.values():
            if spec.family is None or policy.tool_decision(principal, spec.family).value != "deny":
                out.add(spec.name)
        return out

    async def _filter_listing(self, ctx: Any, call_next: Any) -> Any:
        result = await call_next(ctx)
        if ctx.method == "tools/list" and isinstance(result, dict) and isinstance(result.get("tools"), list):
            principal = self.caller()
            shown = self.visible_tools(principal) if principal else set()
            # a tool that is not ours (a server register_tools added ours to) is its owner's to list
            listed = [
                t for t in result["tools"]
                if (t.get("name") in shown or t.get("name") not in self.specs) and t.get("name") != UPSTREAM_ROUTE
            ]  # fmt: skip
            policy = self.gw.policy
            if principal and policy.policy.upstreams and not (ctx.params or {}).get("cursor"):
                # the upstream tools this principal may call, each with its pinned definition
                listed += await asyncio.to_thread(upstream_tools.hub(self.gw).agent_tools, policy, principal)
            result = {**result, "tools": listed}
        return result

    async def _route_upstream(self, ctx: Any, call_next: Any) -> Any:
        """Every tools/call of a name shaped `PREFIX__TOOL` goes to the upstream family, listed or
        not, known or not: what is not allowed is decided a denial and recorded, never left to
        the SDK's "unknown tool". The name the agent called travels beside the request."""
        params = ctx.params
        if ctx.method == "tools/call" and isinstance(params, Mapping) and SEPARATOR in str(params.get("name", "")):
            token = _CALLED.set(str(params["name"]))
            try:
                return await call_next(replace(ctx, params={**params, "name": UPSTREAM_ROUTE}))
            finally:
                _CALLED.reset(token)
        return await call_next(ctx)

    def _register_upstream_route(self) -> None:
        async def upstream_fn(ctx: Context) -> CallToolResult:
            self._answering += 1  # (the event loop's thread only)
            try:
                return await self._upstream_call(ctx)
            finally:
                self._answering -= 1

        self.mcp.add_tool(upstream_fn, name=UPSTREAM_ROUTE, description="(the gateway's route to upstream tools)")

    async def _upstream_call(self, ctx: Context) -> CallToolResult:
        principal = self.caller()
        called = _CALLED.get() or UPSTREAM_ROUTE
        if principal is None:
            return _result(error(new_call_id(), "denied", "UNAUTHENTICATED", "no principal for this connection"))
        raw = _arguments(ctx)
        if not self.accepting:
            closing = error(new_call_id(), "error", "SHUTTING_DOWN", "the gateway is shutting down")
            return _result(await asyncio.to_thread(self._refused, principal, called, raw, closing))
        upstream, _, tool = called.partition(SEPARATOR)
        found = split_name(self.gw.policy, called)
        if found is not None:
            upstream, tool = found
        try:
            call = UpstreamCall(principal=principal, upstream=upstream, name=tool, arguments=raw)
        except (ValidationError, ValueError) as exc:
            return _result(await asyncio.to_thread(self._reject, principal, called, exc, raw))
        return _result(await self._run(principal, called, call, Ticket(principal)))

    # --- registration ------------------------------------------------------------------------
    def _register(self, spec: Spec) -> None:
        if spec.name == "await_call":

            async def await_fn(ctx: Context) -> CallToolResult:
                return await self._await_call(ctx)

            fn: Any = await_fn
        elif spec.resolver == "user":

            async def ask_fn(
                ctx: Context, user: Annotated[ElicitationResult[UserAnswer], Resolve(self._ask_user_form)]
            ) -> CallToolResult:
                return await self._call(ctx, spec, user=user)

            fn = ask_fn
        elif spec.resolver == "client":

            async def gated_fn(
                ctx: Context, client: Annotated[ElicitationResult[ClientApproval], Resolve(self._client_approval)]
            ) -> CallToolResult:
                return await self._call(ctx, spec, client=client)

            fn = gated_fn
        else:

            async def plain_fn(ctx: Context) -> CallToolResult:
                return await self._call(ctx, spec)

            fn = plain_fn
        self.mcp.add_tool(
            fn, name=spec.name, title=spec.title, description=spec.description, annotations=spec.annotations
        )
        registered = self.mcp._tool_manager.get_tool(spec.name)  # the schema comes from the call model
        assert registered is not None
        registered.parameters = spec.input_schema()

    # --- resolvers: they run before the body, and consult the policy before asking anyone -----
    async def _client_approval(self, ctx: Context) -> ClientApproval | Elicit[ClientApproval]:
        policy = self.gw.policy
        if not has_client_rules(policy):
            return NotAsked(approve=False)
        principal = self.caller()
        args = _arguments(ctx)
        spec = self.specs.get(str((ctx.request_context.params or {}).get("name", "")))
        if principal is None or spec is None or _smuggled(args):
            return NotAsked(approve=False)  # the body refuses the call
        try:
            call = spec.call(args, principal)  # what the body will run, whichever profile's names it came in
        except (ValidationError, ValueError):
            return NotAsked(approve=False)  # the body reports the invalid input
        if isinstance(call, RunCall):
            family = Tool.RUN
        elif isinstance(call, ProcessCall) and call.action == "start" and call.command is not None:
            family = Tool.PROCESSES
        else:
            return NotAsked(approve=False)
        command, env = call.command, dict(call.env)
        if command is None:
            return NotAsked(approve=False)
        try:
            cwd = self.gw.resolve_cwd(policy, call.cwd)
        except PathRefused:
            return NotAsked(approve=False)  # the body refuses the call
        result = await asyncio.to_thread(evaluate, policy, command, principal, cwd, env, family)
        d = result.decision
        if d.verdict.label != "ask" or not client_may_answer(policy, tuple(r.rule for r in d.reasons) or (None,)):
            return NotAsked(approve=False)
        if not _can_elicit(ctx):
            return NotAsked(approve=False)  # the supervisor channel answers instead
        why = "; ".join(r.message for r in d.reasons)
        shown_env = f"\nwith {visible(json.dumps(env))}" if env else ""
        question = f"The agent ({principal}) wants to run:\n\n{visible(command)}\n\nin {visible(str(cwd))}{shown_env}."
        return Elicit(f"{question}\nRule {d.rule}: {visible(why)}", ClientApproval)

    async def _ask_user_form(self, ctx: Context) -> UserAnswer | Elicit[BaseModel]:
        principal = self.caller()
        args = _arguments(ctx)
        spec = self.specs.get(str((ctx.request_context.params or {}).get("name", "")))
        if _smuggled(args) or spec is None:
            return NoUserChannel()  # the body refuses the call: ask nobody
        try:
            call = spec.call(args, principal or "-")
        except (ValidationError, ValueError):
            return NoUserChannel()  # the body reports the invalid input
        if not isinstance(call, AskUserCall):
            return NoUserChannel()
        verdict = tool_decision(self.gw.policy, principal, Tool.ASK_USER).verdict.label if principal else "deny"
        if verdict == "ask":  # a supervisor decides first, and a resolver runs before that: nobody asks
            return NoUserChannel(answer="the policy makes ask_user wait for a supervisor, which MCP cannot do first")
        if verdict != "allow":
            return NoUserChannel()  # never ask about a call the policy denies: the body records the denial
        if not _can_elicit(ctx):
            return NoUserChannel(answer=NO_CHANNEL.note)
        return Elicit(call.prompt, _answer_form(call))

    # --- the call ----------------------------------------------------------------------------
    async def _call(
        self,
        ctx: Context,
        spec: Spec,
        client: ElicitationResult[ClientApproval] | None = None,
        user: ElicitationResult[UserAnswer] | None = None,
    ) -> CallToolResult:
        self._answering += 1  # (the event loop's thread only)
        try:
            return await self._answer(ctx, spec, client, user)
        finally:
            self._answering -= 1

    async def _answer(
        self,
        ctx: Context,
        spec: Spec,
        client: ElicitationResult[ClientApproval] | None,
        user: ElicitationResult[UserAnswer] | None,
    ) -> CallToolResult:
        principal = self.caller()
        if principal is None:
            return _result(error(new_call_id(), "denied", "UNAUTHENTICATED", "no principal for this connection"))
        if not self.accepting:
            closing = error(new_call_id(), "error", "SHUTTING_DOWN", "the gateway is shutting down")
            return _result(await asyncio.to_thread(self._refused, principal, spec.name, _arguments(ctx), closing))
        raw = _arguments(ctx)
        came = _origin(ctx, spec.name)
        smuggled = _smuggled(raw)
        try:
            if smuggled:
                raise ValueError(f"{', '.join(smuggled)}: set by the gateway, not by the caller")
            call = spec.call(raw, principal)
        except (ValidationError, ValueError) as exc:
            rejected = self._reject(principal, spec.name, exc, raw, came)
            return _result(rejected, spec.replier(principal), spec.render)
        ticket = Ticket(principal, client_session=self._client_session(ctx))
        policy = self.gw.policy
        if client is not None and not (isinstance(client, AcceptedElicitation) and isinstance(client.data, NotAsked)):
            # what the client was shown: the command, in this directory, with this env, under this policy
            approved = isinstance(client, AcceptedElicitation) and bool(getattr(client.data, "approve", False))
            try:
                cwd = self.gw.resolve_cwd(policy, getattr(call, "cwd", None))
            except PathRefused:
                cwd = policy.workspace  # the body refuses the call; no attestation can hold for it
            ticket.attestation = Attestation(
                approved, principal, str(getattr(call, "tool", spec.name)), str(getattr(call, "command", None)),
                str(cwd), dict(getattr(call, "env", {})), policy.sha256,
            )  # fmt: skip
        if user is not None:
            ticket.user_answer = _user_answer(user, principal)
        out = await self._run(principal, spec.name, call, ticket, came)
        if spec.render is None:
            return _result(out, spec.replier(principal))
        # a rendered reply (seed 001's YAML, pure-Python emitter: about 1 s a megabyte) is made off
        # the event loop, which every other connection shares
        return await asyncio.to_thread(_result, out, spec.replier(principal), spec.render)

    def _client_session(self, ctx: Context) -> str | None:
        """A name for the MCP connection this request came on, made on its first call and kept
        in the connection's own state; when the connection closes, the approvals "for the
        session" given in it end (`Gateway.end_client_session`). A new connection is a new
        session, whatever its principal. None when the request has no connection of its own
        to keep one in: the 2026-07-28 protocol has no sessions (each request stands alone), so
        there an approval for the session approves the one call."""
        if ctx.session.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        connection = getattr(ctx.session, "_connection", None)  # mcp 2.3: the connection-scoped state
        state = getattr(connection, "state", None)
        stack = getattr(connection, "exit_stack", None)
        if connection is None or not isinstance(state, dict) or stack is None:
            return None
        name = state.get(_SESSION_KEY)
        if isinstance(name, str):
            return name
        mcp_id = getattr(connection, "session_id", None)
        name = f"mcp-{uuid.uuid4().hex[:16]}" + (f" (Mcp-Session-Id {mcp_id})" if mcp_id else "")
        state[_SESSION_KEY] = name
        gw = self.gw

        async def ended() -> None:  # off the event loop: it writes the audit log
            await asyncio.to_thread(gw.end_client_session, name)

        stack.push_async_callback(ended)
        return name

    def _reject(
        self, principal: str, tool: str, exc: Exception, raw: dict[str, Any] | None = None,
        came: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        if isinstance(exc, ValidationError):
            problems = [f"{'.'.join(str(p) for p in e['loc']) or '(call)'}: {e['msg']}" for e in exc.errors()]
        else:
            problems = [str(exc)]
        invalid = error(new_call_id(), "error", "INVALID_INPUT", "; ".join(problems))
        return self._refused(principal, tool, raw or {}, invalid, came=came)

    def _refused(
        self, principal: str, tool: str, raw: dict[str, Any], envelope: dict[str, Any], *, as_sent: bool = True,
        came: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Record a call refused before it reached the gateway (invalid arguments, too many
        calls in flight, shutting down): `rejected`, with the tool and the arguments as sent
        (text that may be a secret as its size and digest). Every call_id a client is given
        has a record."""
        try:
            self.gw.audit.append(
                "rejected", call_id=envelope["call_id"], principal=principal, tool=tool,
                arguments=raw_arguments(raw) if as_sent else raw,
                data={**envelope["error"], **({"origin": came} if came else {})},
            )  # fmt: skip
        except AuditUnavailable as audit_exc:
            envelope["error"]["message"] += f" (and it could not be recorded: {audit_exc})"
        return envelope

    async def _run(
        self, principal: str, tool: str, call: Any, ticket: Ticket, came: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        with self._lock:
            mine = self._per_principal.get(principal, 0)
            if mine >= min(MAX_IN_FLIGHT_PER_PRINCIPAL, self.max_in_flight):
                why = f"{principal} has {mine} calls in flight (pending approvals count); retry when some finish"
                busy: dict[str, Any] | None = error(new_call_id(), "error", "BUSY", why)
            elif not self._slots.acquire(blocking=False):
                why = f"the gateway has {self.max_in_flight} calls in flight; retry shortly"
                busy = error(new_call_id(), "error", "BUSY", why)
            else:
                busy = None
                self._per_principal[principal] = mine + 1
        if busy is not None:  # recorded off the event loop, as the call it refuses would have been
            refused, given = busy, tools.arguments(call)
            return await asyncio.to_thread(
                lambda: self._refused(principal, call.tool, given, refused, as_sent=False, came=came)
            )
        flight = _Flight(principal, tool, ticket, asyncio.get_running_loop(), asyncio.Event())

        def on_pending(request: ApprovalRequest, timeout: float) -> None:
            with self._lock:
                flight.call_id, flight.request, flight.expires = request.call_id, request, time.time() + timeout
                self._by_call[request.call_id] = flight
            flight.poke()

        ticket.on_pending = on_pending

        def work() -> None:
            CLIENT_SESSION.set(ticket.client_session)  # this job's own context (Workers)
            try:
                with serving(ticket), origin.coming_from(came):
                    flight.result = self.gw.handle(call, cancel=ticket.cancel)
            except BaseException as exc:  # handle() already fails closed; this is the last net
                flight.result = error(new_call_id(), "denied", "INTERNAL_ERROR", f"{type(exc).__name__}: {exc}")
            finally:
                flight.size = _size(flight.result)
                flight.finished = time.monotonic()
                with self._lock:
                    self._flights.pop(id(flight), None)
                    self._per_principal[principal] -= 1
                self._slots.release()
                flight.poke()

        with self._lock:
            self._flights[id(flight)] = flight
        self._workers.submit(work)
        try:
            out = await self._wait(flight, self.pending_after_s)
        except BaseException:  # the client went away (cancelled): kill what the call runs
            if flight.request is None:
                ticket.cancel.set()
            raise
        if out.get("status") != "pending" and flight.call_id is not None:
            with self._lock:  # answered before it was reported pending: nothing to await
                self._by_call.pop(flight.call_id, None)
        return out

    async def _wait(self, flight: _Flight, pending_after: float) -> dict[str, Any]:
        """The call's result, or `pending` once a supervisor has been asked for `pending_after` s."""
        deadline: float | None = None
        while flight.result is None:
            flight.changed.clear()
            if flight.result is not None:
                break
            if flight.request is not None and deadline is None:
                deadline = time.monotonic() + pending_after
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(flight.changed.wait(), timeout)
            except TimeoutError:
                if flight.result is None:
                    return self._pending(flight)
        return flight.result

    def _pending(self, flight: _Flight) -> dict[str, Any]:
        request = flight.request
        assert request is not None and flight.call_id is not None
        left = int(max(0.0, (flight.expires or 0) - time.time()))
        return {
            "status": "pending",
            "call_id": flight.call_id,
            "approval": {
                "waiting_for": "supervisor",
                "rule": request.rule,
                "reason": request.reason,
                "expires_in_s": left,
            },
            "next": f'call await_call with {{"call_id": "{flight.call_id}"}} to wait for the answer and the result; '
            f"unanswered in {left} s means denied",
        }

    async def _await_call(self, ctx: Context) -> CallToolResult:
        principal = self.caller()
        if principal is None:
            return _result(error(new_call_id(), "denied", "UNAUTHENTICATED", "no principal for this connection"))
        try:
            args = AwaitCall.model_validate(_arguments(ctx))
        except ValidationError as exc:
            return _result(self._reject(principal, "await_call", exc))
        self._forget_old()
        with self._lock:
            flight = self._by_call.get(args.call_id)
        if flight is None or flight.principal != principal:  # another principal's call is nobody's business
            return _result(error(args.call_id, "error", "UNKNOWN_CALL", f"no pending call {args.call_id} of yours"))
        if flight.loop is not asyncio.get_running_loop():
            flight.loop, flight.changed = asyncio.get_running_loop(), asyncio.Event()  # a later connection waits
        out = await self._wait(flight, args.wait_ms / 1000)
        spec = self.specs.get(flight.tool)  # the result in the shape of the tool that was called
        # kept: a second await_call (a retry, a lost reply) answers the same
        if spec is None:
            return _result(out)
        if spec.render is None:
            return _result(out, spec.replier(principal))
        return await asyncio.to_thread(_result, out, spec.replier(principal), spec.render)

    def _forget_old(self) -> None:
        """Drop finished results older than KEEP_FINISHED_S, then the oldest beyond the bounds."""
        now = time.monotonic()
        with self._lock:
            done = sorted(
                ((f.finished, cid, f) for cid, f in self._by_call.items() if f.finished is not None),
                key=lambda t: t[0],
            )
            count, size = len(done), sum(f.size for _, _, f in done)
            for finished, cid, f in done:
                if now - finished <= KEEP_FINISHED_S and count <= KEEP_FINISHED_MAX and size <= KEEP_FINISHED_BYTES:
                    break
                del self._by_call[cid]
                count, size = count - 1, size - f.size

    # --- life ----------------------------------------------------------------------------------
    def in_flight(self) -> int:
        with self._lock:
            return len(self._flights)

    def withdraw_waiting(self, why: str) -> int:
        """Cancel the calls waiting for a supervisor: they cannot complete (the server is going,
        or their only client left), so their requests leave the queue now, recorded as
        `approval_withdrawn` with `why`, rather than waiting out the grace or being left in the
        queue by a server killed meanwhile. How many there were."""
        with self._lock:
            waiting = [f for f in self._flights.values() if f.ticket.waiting]
        for f in waiting:
            f.ticket.cancel.cancel(why)
        return len(waiting)

    async def drain(self, grace_s: float, why: str = "the gateway is shutting down") -> dict[str, int]:
        """Shutdown while the transport still runs: stop taking calls, withdraw the calls that
        wait for a supervisor, give running ones `grace_s`, cancel (kill) what is left, and let
        every reply (a cancelled call's too) be handed to the client before the transport goes.
        `cancelled` counts only the calls that were still running when the grace ran out,
        `withdrawn` the calls that were waiting for a supervisor."""
        self.accepting = False
        withdrawn = self.withdraw_waiting(why)
        deadline = time.monotonic() + grace_s
        while self.in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        cancelled = self._cancel_running()
        end = time.monotonic() + 10.0
        while self.in_flight() and time.monotonic() < end:
            await asyncio.sleep(0.05)
        end = time.monotonic() + 2.0
        while self._answering and time.monotonic() < end:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # the SDK's writer sends what the handlers returned
        self._drained = {"cancelled": cancelled, "withdrawn": withdrawn, "unfinished": self.in_flight()}
        return self._drained

    def shutdown(self, grace_s: float, why: str = "the gateway is shutting down") -> dict[str, int]:
        """Stop taking calls; withdraw the calls that wait for a supervisor; give running ones
        `grace_s`, then cancel (kill) what is left. After `drain`, only what is still running
        then (nothing, normally) is waited for again."""
        if self._drained is not None:
            grace_s = 0.0
        self.accepting = False
        withdrawn = self.withdraw_waiting(why) + (self._drained or {}).get("withdrawn", 0)
        deadline = time.monotonic() + grace_s
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.05)
        cancelled = self._cancel_running() + (self._drained or {}).get("cancelled", 0)
        end = time.monotonic() + 10.0
        while self.in_flight() and time.monotonic() < end:
            time.sleep(0.05)
        return {"cancelled": cancelled, "withdrawn": withdrawn, "unfinished": self.in_flight()}

    def _cancel_running(self) -> int:
        """Cancel (kill) every call still running; how many there were."""
        with self._lock:
            left = list(self._flights.values())
        for f in left:
            f.ticket.cancel.set()
        return len(left)


def _size(result: dict[str, Any] | None) -> int:
    """About how many bytes a kept result holds (its JSON)."""
    return len(json.dumps(result, default=str)) if result is not None else 0


def _smuggled(args: dict[str, Any]) -> list[str]:
    """Fields only the gateway sets, if the caller sent them."""
    return sorted(k for k in ("principal", "tool") if k in args)


def _arguments(ctx: Context) -> dict[str, Any]:
    params = ctx.request_context.params
    args = params.get("arguments") if isinstance(params, dict) else None
    return dict(args) if isinstance(args, dict) else {}


def _origin(ctx: Context, tool: str) -> dict[str, Any]:
    """How this call came (recorded with its decision: audit/origin.py)."""
    rc = ctx.request_context
    headers = ctx.headers
    meta = rc.meta if isinstance(rc.meta, dict) else None
    session = headers.get("mcp-session-id") if headers is not None else None
    return origin.described("http" if headers is not None else "stdio", tool, rc.request_id, session,
                            rc.protocol_version, meta)  # fmt: skip


def _can_elicit(ctx: Context) -> bool:
    caps = ctx.client_capabilities
    elicitation = caps.elicitation if caps is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _answer_form(call: AskUserCall) -> type[BaseModel]:
    """The elicitation form for an ask_user question, from its validation rules. The rules are
    shown to the client in the form's schema (`enum`, `minLength`, `maxLength`) but not enforced
    by the model the SDK parses the answer with: an answer outside them would otherwise end the
    call in an SDK error, with no envelope and no audit record. The gateway checks the answer
    itself (ask_user.invalid, pattern included) and answers INVALID_INPUT, recorded."""
    v = call.validation
    described: dict[str, Any] = {"description": call.prompt[:500]}
    shown: dict[str, Any] = {}
    if v is not None and v.allowed_values:
        shown["enum"] = list(v.allowed_values)
    elif v is not None:
        shown |= {k: val for k, val in (("minLength", v.min_length), ("maxLength", v.max_length)) if val is not None}
    if call.password:  # a secret: MCP's form schema has no format for one (its formats are email, uri,
        # date, date-time); JSON Schema's writeOnly says the value is sent and never shown back, and
        # the form's title says to hide what is typed
        shown |= {"writeOnly": True, "title": "Password (hidden input)"}
    if shown:
        described["json_schema_extra"] = shown
    if call.default is not None and not call.password:
        return create_model("Answer", answer=(str, Field(default=call.default, **described)))
    return create_model("Answer", answer=(str, Field(**described)))


def _user_answer(user: ElicitationResult[UserAnswer], principal: str) -> Answer:
    if isinstance(user, AcceptedElicitation):
        if isinstance(user.data, NoUserChannel):
            return Answer(None, "nobody", "no-channel", user.data.answer)
        return Answer(str(getattr(user.data, "answer", "")), f"client of {principal}", "elicitation")
    return Answer(None, f"client of {principal}", "elicitation")  # declined or cancelled


Reply = Callable[[dict[str, Any]], dict[str, Any]]


def _upstream_result(envelope: dict[str, Any], shown: dict[str, Any]) -> CallToolResult:
    """An upstream tool's result as the upstream gave it (redacted and checked: tools/upstream.py),
    the gateway's call_id in `_meta`, and the heuristic's notice first when there is one."""
    result = CallToolResult.model_validate(shown)
    content: list[Any] = list(result.content)
    if isinstance(envelope.get("notice"), str):
        content.insert(0, TextContent(type="text", text=envelope["notice"]))
    meta = {**(result.meta or {}), "agent-gateway/call_id": envelope.get("call_id")}
    if envelope.get("flags"):
        meta["agent-gateway/flags"] = envelope["flags"]
    return result.model_copy(update={"content": content, "meta": meta})


def _result(
    envelope: dict[str, Any], reply: Reply | None = None, render: Callable[[dict[str, Any]], str] | None = None
) -> CallToolResult:
    """The MCP result of an envelope: a summary line an agent can act on, then the envelope as
    JSON; images as image content; `isError` when the call was denied or failed.

    The envelope is sent once, as text, and not again as `structuredContent`: every client
    reads the text (some, Claude Code among them, read nothing else), while structured content
    is what a tool with an `outputSchema` owes, and the spec asks such a tool to repeat it as
    text anyway. Sending both doubled every reply (2.6 MB for one `seq 1 400000`).

    `reply`: a profile's tool answers in its seed's shape, as JSON text alone (no summary line),
    or as the text `render` makes of it (seed 001's YAML); `isError` still follows the gateway's
    status."""
    shown = envelope.get("upstream_result")
    if isinstance(shown, dict):
        return _upstream_result(envelope, shown)
    content: list[TextContent | ImageContent] = []
    image = envelope.get("image")
    if isinstance(image, dict) and isinstance(image.get("data"), str):
        envelope = {**envelope, "image": {"mime_type": image.get("mime_type"), "bytes": len(image["data"]) * 3 // 4}}
        content.append(ImageContent(type="image", data=image["data"], mime_type=str(image.get("mime_type"))))
    if reply is not None:  # a profile's tool: the seed's reply alone, as its clients parse it
        shaped = reply(envelope)
        text = render(shaped) if render is not None else json.dumps(shaped, ensure_ascii=False, default=str)
    else:
        text = _summary(envelope) + "\n" + json.dumps(envelope, ensure_ascii=False, default=str)
    content.insert(0, TextContent(type="text", text=text))
    failed = envelope.get("status") in _FAILED
    if failed:
        log.info("mcp_call_failed", call_id=envelope.get("call_id"), code=(envelope.get("error") or {}).get("code"))
    return CallToolResult(content=list(content), is_error=failed)


def _summary(envelope: dict[str, Any]) -> str:
    status = envelope.get("status", "?")
    err = envelope.get("error") or {}
    if status == "pending":
        return f"PENDING: a supervisor must approve this call ({envelope.get('call_id')}). {envelope.get('next', '')}"
    if status in _FAILED:
        rule = f" by rule {envelope['rule']}" if envelope.get("rule") else ""
        return f"{status.upper()} ({err.get('code', '?')}){rule}: {err.get('message', '')}"
    return f"{status.upper()}"


def tool_names() -> list[str]:
    return [s.name for s in SPECS]


__all__ = ["BY_NAME", "GatewayServer", "tool_names"]
