"""`register_tools()`: the gateway's gated tools on someone else's MCP server (seed 003's API).

An existing MCP server built with the official SDK gains the tools of any profile without
running `gateway serve`: each tool call still becomes a gateway call handled by
`Gateway.handle` (the same decision, sandbox, approvals and audit record as through `gateway
serve`), and the server's own tools stay as they are.

    from mcp.server import MCPServer
    from gateway.server.register import register_tools

    server = MCPServer("my-tools")                      # or a low-level mcp.server.lowlevel.Server

    @server.tool()
    def add(a: int, b: int) -> int: ...

    gated = register_tools(server, gateway, principal="agent", profile="terminal-interface")
    server.run("stdio")
    ...
    gated.shutdown(grace_s=5)                           # stop, withdraw waiting approvals, kill leftovers

`gateway` is a `gateway.pipeline.Gateway` (its policy, audit log, approver and state directory:
docs/serve.md shows how `gateway serve` builds one). `principal` is who every call made through
this server is, as the policy names principals; or a function returning the principal of the
current request (e.g. from the server's own authentication), None refusing the call
(UNAUTHENTICATED). The agent never names it.

Seed 003's own form takes no arguments:

    from gateway.server.register import register_tools

    gated = register_tools()          # the terminal-interface tools, on this module's own server
    gated.mcp.run("stdio")

It builds what `gateway serve --profile terminal-interface` builds with its defaults (run from
the directory holding `policies/`): the profile's shipped policy layer, the audit log in
`audit/` signed with the default keys, the approvals queue and state directory, the policy's
only principal, and an `MCPServer` of its own. A second call returns the same registration.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.lowlevel import Server
from mcp.types import CallToolRequestParams, CallToolResult, ListToolsResult, PaginatedRequestParams, TextContent

from gateway import approval_queue
from gateway.audit import open_signed
from gateway.defaults import DEFAULT_AUDIT_KEYS, DEFAULT_PROCESS_DIR, DEFAULT_STATE_DIR, DEFAULT_TOKENS
from gateway.log import log
from gateway.pipeline import Gateway
from gateway.policy.loader import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.policy.selftest import load_checked
from gateway.server.app import PENDING_AFTER_S, GatewayServer
from gateway.server.profiles import GATEWAY, specs_for
from gateway.server.serve import policy_for
from gateway.server.specs import Spec

Principal = str | Callable[[], str | None]


class GatewayTools(GatewayServer):
    """The gated tools as registered on another server: a `GatewayServer` whose caller is the
    `principal` given to `register_tools` (its `shutdown` and `drain` stop its calls)."""

    def __init__(self, gateway: Gateway, principal: Principal, specs: Sequence[Spec], **kw: Any) -> None:
        self._principal_of = principal
        super().__init__(gateway, principal if isinstance(principal, str) else "-", specs=specs, **kw)

    def caller(self) -> str | None:
        """The principal of the current request; None (the call is refused UNAUTHENTICATED, with
        its envelope) when the function fails or answers anything but a name: a raise reached the
        SDK as a bare "Error executing tool" and broke the server's own tools/list."""
        who = self._principal_of
        if isinstance(who, str):
            return who
        try:
            found = who()
        except Exception as exc:
            log.warning("principal_function_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        return found if isinstance(found, str) and found else None


def register_tools(
    server: MCPServer[Any] | Server[Any] | None = None,
    gateway: Gateway | None = None,
    *,
    principal: Principal | None = None,
    profile: str | list[str] | None = None,
    pending_after_s: float = PENDING_AFTER_S,
) -> GatewayTools:
    """Register the tools of `profile` (`gateway`, the default; `os`, `terminal-interface`, ...:
    docs/tools.md) on `server`, an `MCPServer` (the SDK's high-level server, FastMCP's successor)
    or a low-level `Server`. Returns the registration, whose `shutdown(grace_s)` ends its calls.

    A tool name the server already has is refused (ValueError), so no call meant for the server's
    own tool reaches the gateway, nor the reverse. A principal whose policy denies a tool's
    family does not see it listed; the server's own tools are listed as before.

    With no server, gateway and principal (seed 003's `register_tools()`): the tools of
    `profile` (default `terminal-interface`) on this module's own server, over a gateway built as
    `gateway serve` builds it by default (`default_registration`)."""
    if server is None and gateway is None and principal is None:
        return default_registration(profile or SEED_PROFILE, pending_after_s)
    if server is None or gateway is None or principal is None:
        raise TypeError(
            "register_tools: give the server, the gateway and the principal, or none of them (seed 003's "
            "register_tools(): this module's own server and gateway)"
        )
    specs = specs_for(profile or GATEWAY)
    if isinstance(server, MCPServer):
        taken = sorted(s.name for s in specs if server._tool_manager.get_tool(s.name) is not None)
        if taken:
            raise ValueError(f"register_tools: {server.name} already has tools named {', '.join(taken)}")
        return GatewayTools(gateway, principal, specs, mcp=server, pending_after_s=pending_after_s)
    if isinstance(server, Server):
        gated = GatewayTools(gateway, principal, specs, pending_after_s=pending_after_s, name=f"{server.name}-gated")
        _wrap_lowlevel(server, gated)
        return gated
    raise TypeError(f"register_tools: expected an mcp MCPServer or low-level Server, not {type(server).__name__}")


SEED_PROFILE = "terminal-interface"
_DEFAULT: dict[str, GatewayTools] = {}
_DEFAULT_LOCK = threading.Lock()


def default_registration(
    profile: str | list[str] = SEED_PROFILE, pending_after_s: float = PENDING_AFTER_S
) -> GatewayTools:
    """The registration `register_tools()` makes: built once per profile, then the same one. Its
    server is `.mcp` (run it: `register_tools().mcp.run("stdio")`). Raises PolicyError,
    AuditUnavailable or OSError, each naming what is wrong, when the defaults cannot be set up."""
    key = profile if isinstance(profile, str) else ",".join(profile)
    with _DEFAULT_LOCK:
        if key not in _DEFAULT:
            specs = specs_for(profile)
            policy_file, _ = policy_for(key)
            first = load_checked(policy_file)
            audit = open_signed(Path("audit"), Path(DEFAULT_AUDIT_KEYS), redact=first.policy.audit.redact)

            def record(kind: str, data: dict[str, Any]) -> None:  # policy loads and rejections, as serve records them
                audit.append(kind, data=data)

            holder = PolicyHolder(policy_file, None, on_event=record)
            policy = holder.current()
            if len(policy.grants) != 1:
                names = ", ".join(sorted(policy.grants))
                raise PolicyError(f"{policy_file}: register_tools() needs a policy of one principal (it has {names})")
            principal = next(iter(policy.grants))
            writes = tuple({r for g in policy.grants.values() for r in g.write_roots})
            try:
                approver = approval_queue.QueueApprover(Path(DEFAULT_STATE_DIR), writes)
            except approval_queue.QueueError as exc:
                raise PolicyError(str(exc)) from None
            gateway = Gateway(
                holder.current, audit, approver, hidden=(Path(DEFAULT_TOKENS).parent, Path(DEFAULT_AUDIT_KEYS)),
                state_dir=Path(DEFAULT_PROCESS_DIR),
            )  # fmt: skip
            unsafe = gateway.unsafe_setup(policy, principal)
            if unsafe:
                gateway.close()
                raise PolicyError(unsafe)
            server: MCPServer[Any] = MCPServer("agent-gateway")
            _DEFAULT[key] = GatewayTools(gateway, principal, specs, mcp=server, pending_after_s=pending_after_s)
        return _DEFAULT[key]


def _wrap_lowlevel(server: Server[Any], gated: GatewayTools) -> None:
    """Put the gated tools in front of a low-level server's tools/list and tools/call handlers:
    listing adds them (to the first page), a call of one of their names goes to the gateway's
    server (its resolvers, approvals and audit), any other to the server's own handler."""
    own_list = server.get_request_handler("tools/list")
    own_call = server.get_request_handler("tools/call")
    inner = gated.mcp

    async def list_tools(ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        got = await own_list.handler(ctx, params) if own_list is not None else None
        theirs = ListToolsResult.model_validate(got if got is not None else {"tools": []}, from_attributes=True)
        taken = sorted(t.name for t in theirs.tools if t.name in gated.specs)
        if taken:  # a collision is refused at every listing: neither side's tool could be called reliably
            raise ValueError(f"register_tools: {server.name} lists tools named {', '.join(taken)}, as the gateway does")
        if params is not None and params.cursor is not None:
            return theirs
        who = gated.caller()
        shown = gated.visible_tools(who) if who else set()
        ours = [t for t in await inner.list_tools() if t.name in shown]
        return theirs.model_copy(update={"tools": [*theirs.tools, *ours]})

    async def call_tool(ctx: Any, params: CallToolRequestParams) -> Any:
        if params.name in gated.specs:
            return await inner._handle_call_tool(ctx, params)
        if own_call is None:
            return CallToolResult(content=[TextContent(type="text", text=f"no tool {params.name}")], is_error=True)
        return await own_call.handler(ctx, params)

    server.add_request_handler("tools/list", PaginatedRequestParams, list_tools)
    server.add_request_handler("tools/call", CallToolRequestParams, call_tool)


__all__ = ["GatewayTools", "default_registration", "register_tools"]
