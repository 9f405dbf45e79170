"""Running the MCP server: over stdio (the client spawns the gateway) or streamable HTTP.

Both write a `server_started` record, and on shutdown (end of input, SIGINT, SIGTERM) stop
taking calls, give running calls `grace_s`, cancel what is left (killing its commands), write a
`server_stopped` record and close the gateway: sessions die, durable processes stay for the
next start to adopt.

HTTP: every request needs a bearer token from the tokens file; a missing or unknown token is
answered 401 before any tool runs, and recorded (`auth_refused`, aggregated per peer). The server
binds to loopback unless `allow_remote` is given; then it warns, and Host/Origin checking still
applies. Connections, deadlines and body sizes are limited by the front (`front.py`).
"""

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import uvicorn
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyHttpUrl
from sse_starlette.sse import AppStatus

from gateway.audit import AuditUnavailable
from gateway.audit.sink import AuditSink
from gateway.log import log
from gateway.pipeline import Gateway
from gateway.server.app import GatewayServer
from gateway.server.console import Console, ConsoleConfig
from gateway.server.console.fleet import fleet_of
from gateway.server.front import (
    ASGIApp,
    BodyCap,
    ConnectionGuard,
    GuardedH11,
    RefusalLog,
    ThrottledFilter,
    ThrottledLog,
    cancel_on_leave,
    quiet_resource_errors,
    refusal_recorder,
)
from gateway.server.limits import FrontLimits
from gateway.server.metrics import PATH as METRICS_PATH
from gateway.server.metrics import MetricsEndpoint
from gateway.server.specs import SPECS, Spec
from gateway.tokens import TokenStore
from gateway.upstream.pins import PinStore, store_dir

SCOPE = "gateway"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PolicyTokens(TokenVerifier):
    """Bearer tokens from the tokens file, for principals the current policy still defines."""

    def __init__(self, store: TokenStore, gateway: Gateway) -> None:
        self.store = store
        self.gateway = gateway

    async def verify_token(self, token: str) -> AccessToken | None:
        entry = self.store.lookup(token)
        if entry is None or entry.principal not in self.gateway.policy.grants:
            return None
        return AccessToken(token=token, client_id=entry.principal, scopes=[SCOPE], subject=entry.id)


def _record(audit: AuditSink, event: str, **fields: Any) -> bool:
    try:
        audit.append(event, **fields)
        return True
    except AuditUnavailable as exc:
        log.error("audit_unavailable", record=event, error=str(exc))
        return False


def finish(server: GatewayServer, grace_s: float, how: str) -> None:
    """Shutdown's last steps: cancel what is left, record it, close the gateway."""
    why = "its client closed stdio (end of input)" if how == "end of input" else f"the gateway is shutting down ({how})"
    outcome = server.shutdown(grace_s, why)
    _record(server.gw.audit, "server_stopped", data={"how": how, **outcome})
    server.gw.close()


# --- stdio ---------------------------------------------------------------------------------------
def serve_stdio(server: GatewayServer, grace_s: float = 10.0) -> int:
    if not _record(server.gw.audit, "server_started", principal=server.principal, data={"transport": "stdio"}):
        return 2
    loop = asyncio.new_event_loop()
    how = loop.run_until_complete(_stdio(server, grace_s))
    finish(server, grace_s, how)
    if how != "end of input":
        # a signal: the SDK's reader thread may sit in a blocking read of stdin, which nothing
        # can interrupt, and interpreter exit would wait for it. Everything is recorded: leave.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    loop.close()
    return 0


async def _stdio(server: GatewayServer, grace_s: float) -> str:
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(server.mcp.run_stdio_async())
    stopped = asyncio.Event()
    why = ["end of input"]

    def stop(name: str) -> None:
        why[0] = name
        server.accepting = False
        stopped.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig.name)
    signalled = asyncio.create_task(stopped.wait())
    await asyncio.wait([task, signalled], return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        # a signal: running calls get the grace, and their replies are written, while the SDK
        # still serves; then it goes (cancelling cannot interrupt its blocking read of stdin, so
        # do not wait for it)
        await server.drain(grace_s, f"the gateway is shutting down ({why[0]})")
        task.cancel()
    signalled.cancel()
    return why[0]


# --- HTTP ----------------------------------------------------------------------------------------
def http_app(
    server: GatewayServer,
    host: str,
    port: int,
    refusals: RefusalLog,
    limits: FrontLimits | None = None,
    console: Console | None = None,
    metrics: MetricsEndpoint | None = None,
) -> ASGIApp:
    """The streamable HTTP app (`/mcp`), the web console (`/console/`) and `/metrics`: sizes
    checked first (`BodyCap`), then the SDK's app, the console or the metrics, whose refused
    requests are reported to `refusals` (see `front.py`)."""
    limits = limits or FrontLimits()
    hosts = allowed_hosts(host, port)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts],
    )
    inner = server.mcp.streamable_http_app(
        transport_security=security, host=host, max_request_body_size=limits.max_body_bytes
    )
    mcp_app = cancel_on_leave(inner)
    if console is None and metrics is None:
        return BodyCap(refusal_recorder(mcp_app, refusals), limits.max_body_bytes)

    async def routed(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        if console is not None and scope.get("type") == "http" and (path == "/console" or path.startswith("/console/")):
            await console(scope, receive, send)
        elif metrics is not None and scope.get("type") == "http" and path == METRICS_PATH:
            await metrics(scope, receive, send)
        else:
            await mcp_app(scope, receive, send)

    return BodyCap(refusal_recorder(routed, refusals), limits.max_body_bytes)


def allowed_hosts(host: str, port: int) -> list[str]:
    """The `Host` values this server answers to (anything else may be a DNS-rebinding page)."""
    names = [host] if host != "localhost" else ["localhost", "127.0.0.1"]
    return [f"{h}:{port}" if ":" not in h else f"[{h}]:{port}" for h in names]


def make_console(gateway: Gateway, store: TokenStore, host: str, port: int, limits: FrontLimits) -> Console:
    """The web console of this server (`/console/`), answering through the approvals queue of
    its approver (if it has one). Its event streams are capped well under the front's connection
    caps, so open streams never take every place a client needs."""
    audit = gateway.audit
    cap = max(1, min(8, limits.max_connections // 4, limits.max_connections_per_peer // 2))
    return Console(
        ConsoleConfig(
            tokens=store,
            audit=audit,
            policy=lambda: gateway.policy,
            state_dir=getattr(gateway.approver, "state_dir", None),
            hosts=tuple(allowed_hosts(host, port)),
            max_streams=cap,
            verify_key=audit.key.public if audit.key is not None else None,
            checkpoint=audit.checkpoint,
            pins=PinStore(store_dir(gateway.state_dir)) if gateway.state_dir is not None else None,
            fleet=fleet_of(audit, port),
        )
    )


class _Uvicorn(uvicorn.Server):
    """uvicorn, telling the gateway to stop taking calls as soon as a signal arrives, and giving
    running calls the grace (their replies sent) before it closes connections."""

    gateway_server: GatewayServer | None = None
    console: Console | None = None
    grace_s: float = 10.0

    async def shutdown(self, sockets: Any = None) -> None:
        if self.console is not None:
            self.console.stop()  # its event streams end now: they wait for nothing
        if self.gateway_server is not None:
            await self.gateway_server.drain(self.grace_s)
        AppStatus.should_exit = True  # now the SDK's open SSE streams may end
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.gateway_server is not None:
            self.gateway_server.accepting = False
        super().handle_exit(sig, frame)


def auth_settings(host: str, port: int) -> AuthSettings:
    """Bearer tokens from our own file, and no OAuth. Without a `resource_server_url` the SDK
    publishes no protected-resource metadata (`/.well-known/oauth-protected-resource/mcp`) and
    its 401 carries no `resource_metadata`: a client holding a wrong token is told so, instead of
    being sent to discover an authorization server that does not exist (the issuer URL is
    required by the settings but published nowhere)."""
    shown = f"[{host}]" if ":" in host else host
    return AuthSettings(
        issuer_url=AnyHttpUrl(f"http://{shown}:{port}"),
        resource_server_url=None,
        required_scopes=[SCOPE],
    )


def listen_socket(host: str, port: int, allow_remote: bool) -> socket.socket:
    """The server's socket, bound now: a start that cannot have its port fails before it
    changes anything (no token issued, no `server_started`). Raises OSError or ValueError with
    what to do."""
    if not is_loopback(host) and not allow_remote:
        raise ValueError(
            f"refusing to bind {host}: only loopback by default. Anyone who can reach it "
            "and holds a token runs commands here; pass --allow-remote to bind it anyway."
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host == "localhost":
        family = socket.AF_INET
        host = "127.0.0.1"
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and the
    # accepted ones inherit it; with proto 0 every small answer waited for a delayed ACK (40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock


def serve_http(
    gateway: Gateway,
    store: TokenStore,
    host: str,
    port: int,
    *,
    grace_s: float = 10.0,
    allow_remote: bool = False,
    ready: Callable[[str], None] | None = None,
    limits: FrontLimits | None = None,
    sock: socket.socket | None = None,
    specs: Sequence[Spec] = SPECS,
) -> int:
    """Serve until a signal. `sock`: the socket `listen_socket` bound (else it is bound here,
    before anything is recorded)."""
    if not is_loopback(host):
        if not allow_remote:
            print(
                f"gateway serve: refusing to bind {host}: only loopback by default. Anyone who can reach it "
                "and holds a token runs commands here; pass --allow-remote to bind it anyway.",
                file=sys.stderr,
            )
            return 2
        print(
            f"gateway serve: WARNING: listening on {host}, reachable from other machines. Tokens travel in "
            "clear text over plain HTTP: put TLS in front of it.",
            file=sys.stderr,
        )
    limits, backlog, lowered = (limits or FrontLimits()).within_descriptors()
    if lowered:
        print(f"gateway serve: {lowered}", file=sys.stderr)
    if sock is None:
        try:
            sock = listen_socket(host, port, allow_remote)
        except (OSError, ValueError) as exc:
            print(f"gateway serve: {exc}", file=sys.stderr)
            return 2
    port = sock.getsockname()[1]  # port 0 asked for any free one: the one bound from here on
    server = GatewayServer(
        gateway, token_verifier=PolicyTokens(store, gateway), auth=auth_settings(host, port), specs=specs
    )
    if not _record(gateway.audit, "server_started", data={"transport": "http", "host": host, "port": port}):
        return 2
    throttle = ThrottledLog()
    refusals = RefusalLog(gateway.audit, window_s=limits.refusal_window_s)
    quiet = ThrottledFilter()
    logging.getLogger("uvicorn.error").addFilter(quiet)  # a bad request or an app error: once per interval
    console = make_console(gateway, store, host, port, limits)
    scrape = MetricsEndpoint(
        store, tuple(allowed_hosts(host, port)), getattr(gateway.approver, "state_dir", None), server.in_flight
    )
    config = uvicorn.Config(
        http_app(server, host, port, refusals, limits, console, scrape),
        host=host,
        port=port,
        http=GuardedH11.bind(ConnectionGuard(limits, throttle)),
        backlog=backlog,
        log_level="warning",
        timeout_graceful_shutdown=int(max(1, grace_s)),
        lifespan="on",
    )
    # sse-starlette ends every SSE stream the moment a signal arrives, which would drop the reply
    # of a call finishing within the grace: the streams end after `drain` instead
    AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]
    runner = _Uvicorn(config)
    runner.gateway_server = server
    runner.console = console
    runner.grace_s = grace_s
    original = runner.startup

    async def startup(sockets: Any = None) -> None:
        quiet_resource_errors(asyncio.get_running_loop(), throttle)
        console.start()
        await original(sockets)
        if ready is not None and runner.started:
            ready(f"http://{'[' + host + ']' if ':' in host else host}:{port}/mcp")

    runner.startup = startup  # type: ignore[method-assign]
    # uvicorn handles SIGINT/SIGTERM while it serves, then raises the signal again: with these
    # handlers in place that second delivery is a no-op, so the shutdown below always runs
    got: list[str] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: got.append(signal.Signals(signum).name))
    try:
        runner.run(sockets=[sock])
    finally:
        refusals.close()  # the counts still open, before the server_stopped record
        logging.getLogger("uvicorn.error").removeFilter(quiet)
    finish(server, grace_s, got[0] if got else "stopped")
    return 0 if runner.started else 2
