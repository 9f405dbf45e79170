"""The gateway's side of a sandbox's network: its resolver and its proxy, on one event loop.

A sandbox whose policy is a mapping has a network namespace of its own with only a loopback
interface. The sockets in it (netns.py) are served here, outside the sandbox:

- **the resolver** answers a name the policy allows or asks about with an address of its own
  (127.100.x.y, remembered per sandbox) and refuses every other name (REFUSED, recorded); it
  answers no other record type, and never asks a real server, so a lookup carries nothing out;
- **the listeners** take every TCP connection to those addresses on every port a pattern can
  reach: the address names the host, the port is the one connected to; the proxy decides
  `host:port` (deny, ask, allow, or refused when unlisted), reads the client's first bytes (a
  TLS ClientHello must name the same host by SNI, an HTTP request by Host), resolves the host
  on the gateway's side, refuses loopback, private and link-local addresses unless the policy
  names that address, records the decision durably, and only then connects and relays;
- **the HTTP proxy** (HTTP_PROXY, HTTPS_PROXY) takes CONNECT and absolute-form requests and
  decides them the same way, for programs that honour the variables.

Every connection is recorded under the call that made it (`egress_connection`: host, port,
decision, rule, bytes each way, duration, how it ended), each refused lookup too
(`egress_dns_refused`). An `ask` holds the connection and asks a supervisor through the
gateway's approvals; an answer holds for the sandbox's life (approve once) or the principal's
session. Caps: connections open at once per sandbox, bytes per sandbox; one sandbox's flood
waits on its own semaphore, never on another's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from dnslib import QTYPE, RCODE, RR, A, DNSRecord  # type: ignore[import-untyped]

from gateway import fdwait
from gateway.sandbox.egress import broker, inspect
from gateway.sandbox.egress.netns import Sockets
from gateway.sandbox.egress.rules import Egress, checked_host

FAKE_NET = ipaddress.ip_network("127.100.0.0/16")
MAX_NAMES = 4096
"""Names one sandbox may have resolved: a flood of lookups cannot grow the table without end."""
MAX_ASKS = 4
"""Hosts one sandbox may have waiting for a supervisor at once; more are refused at once."""
MAX_SHOWN = 10
"""Refusals a call's result lists (the audit log has them all)."""
MAX_RECORDED_REFUSALS = 200
"""Refused lookups recorded one by one per sandbox; beyond this, counted in the summary."""
FIRST_BYTES_WAIT = 0.3
"""Seconds a connection may stay silent before the proxy connects anyway (protocols where the
server speaks first, such as ssh). The client's first bytes are still checked whenever they come."""
HEAD_TIMEOUT = 15.0
RESOLVED_FOR = 60.0
WEB_PORTS = (443, 80)
CONNECT_TIMEOUT = 15.0
CHUNK = 1024 * 1024
_BLOCKED = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32",
        "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
    )
)  # fmt: skip
"""Loopback, private, carrier-grade NAT, link-local, multicast and reserved: a name that
resolves there reaches the host itself or its network, not the internet."""


def blocked(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in _BLOCKED if net.version == ip.version)


class Hooks(Protocol):
    """What the proxy needs from the gateway (given by the pipeline, through the sandbox's profile)."""

    principal: str

    def current_call(self) -> str | None:
        """The call being handled on this thread (the one starting the sandbox)."""

    def record(self, event: str, call_id: str | None, principal: str, data: dict[str, Any]) -> None:
        """Append to the audit log, durably. Raises when it cannot: then nothing connects."""

    def ask(
        self, call_id: str | None, principal: str, host: str, port: int, command: str, cancel: threading.Event
    ) -> tuple[bool, str, str]:
        """Ask a supervisor whether `host:port` may be reached: (granted, by, how). Blocks until
        answered, timed out, or `cancel` is set (the sandbox ended: the question is withdrawn)."""


@dataclass
class Owner:
    principal: str
    call_id: str | None
    command: str


@dataclass
class _Attachment:
    egress: Egress
    hooks: Hooks
    owner: Owner
    sockets: Sockets
    names: dict[str, str] = field(default_factory=dict)
    """Address given -> name."""
    addresses: dict[str, str] = field(default_factory=dict)
    granted: dict[tuple[str, int], bool] = field(default_factory=dict)
    resolved: dict[str, tuple[float, list[str]]] = field(default_factory=dict)
    """Host -> (when, addresses): a sandbox's connections to a name go where its first went, for
    RESOLVED_FOR seconds (one lookup per name, and no rebinding within it)."""
    asking: dict[tuple[str, int], asyncio.Future[tuple[bool, str, str]]] = field(default_factory=dict)
    transport: asyncio.DatagramTransport | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    open: set[socket.socket] = field(default_factory=set)
    """Every socket of its connections (the sandbox's side and the far side): shut down when it ends."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards `moved` (the relay threads count it)."""
    slots: asyncio.Semaphore | None = None
    moved: int = 0
    connections: int = 0
    refused_lookups: int = 0
    refused_connections: int = 0
    over_cap: bool = False
    closed: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when the sandbox ends: its questions to supervisors are withdrawn."""
    refusals: list[str] = field(default_factory=list)
    """What was refused and why, the first MAX_SHOWN of it: told to the agent with the call's result."""

    def address_for(self, name: str) -> str | None:
        if name in self.addresses:
            return self.addresses[name]
        if len(self.addresses) >= MAX_NAMES:
            return None
        address = str(FAKE_NET[len(self.addresses) + 1])
        self.addresses[name] = address
        self.names[address] = name
        return address


class Attachment:
    """A sandbox's network, served while it runs: `close()` when it has ended."""

    def __init__(self, service: EgressService, inner: _Attachment) -> None:
        self._service = service
        self._inner = inner

    def follow(self, command: str) -> None:
        """Connections from now on belong to the call this thread handles, running `command`
        (a session's next command)."""
        current = self._inner.hooks.current_call() or self._inner.owner.call_id
        self._inner.owner = Owner(self._inner.owner.principal, current, command)

    def close(self) -> dict[str, Any]:
        """Stop serving the sandbox's network; what it did, for the call's result."""
        self._service.detach(self._inner)
        inner = self._inner
        out: dict[str, Any] = {"connections": inner.connections, "bytes": inner.moved}
        if inner.refusals:
            out["refused"] = list(inner.refusals)
            more = inner.refused_connections + inner.refused_lookups - len(inner.refusals)
            if more > 0:
                out["refused_more"] = more
        return out


class EgressService:
    """One event loop on a thread of its own serving every sandbox's network."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._asks = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="egress-ask")
        self._io = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="egress-io")
        self._thread = threading.Thread(target=self._run, name="egress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def attach(self, sockets: Sockets, egress: Egress, hooks: Hooks, owner: Owner) -> Attachment:
        inner = _Attachment(egress, hooks, owner, sockets)
        future = asyncio.run_coroutine_threadsafe(self._start(inner), self._loop)
        try:
            future.result(timeout=30)
        except BaseException:
            sockets.close()
            raise
        return Attachment(self, inner)

    def detach(self, inner: _Attachment) -> None:
        if inner.closed:
            return
        future = asyncio.run_coroutine_threadsafe(self._stop(inner), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=30)

    # --- setup ---------------------------------------------------------------------------
    async def _start(self, att: _Attachment) -> None:
        att.slots = asyncio.Semaphore(att.egress.max_connections)
        transport, _ = await self._loop.create_datagram_endpoint(lambda: _Resolver(self, att), sock=att.sockets.dns)
        att.transport = transport
        for listener in att.sockets.listeners.values():
            self._spawn(att, self._accept(att, listener, transparent=True))
        self._spawn(att, self._accept(att, att.sockets.proxy, transparent=False))

    def _spawn(self, att: _Attachment, coroutine: Any) -> None:
        task = self._loop.create_task(coroutine)
        att.tasks.add(task)
        task.add_done_callback(att.tasks.discard)

    async def _accept(self, att: _Attachment, listener: socket.socket, transparent: bool) -> None:
        while True:
            try:
                conn, _ = await self._loop.sock_accept(listener)
            except OSError:
                return  # the listener was closed: the sandbox ended
            conn.setblocking(False)
            att.open.add(conn)
            self._spawn(att, self._serve(att, _Conn(self._loop, conn), transparent))

    async def _stop(self, att: _Attachment) -> None:
        att.closed = True
        att.cancel.set()  # questions still waiting for a supervisor are withdrawn
        if att.transport is not None:
            att.transport.close()
        for sock in list(att.open):  # relays in threads see their sockets end
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for task in list(att.tasks):
            task.cancel()
        if att.tasks:
            await asyncio.wait(att.tasks, timeout=5)
        att.sockets.close()
        for sock in list(att.open):
            with contextlib.suppress(OSError):
                sock.close()
        att.open.clear()
        if att.refused_lookups or att.over_cap or att.refused_connections:
            data = {
                "connections": att.connections,
                "refused_connections": att.refused_connections,
                "refused_lookups": att.refused_lookups,
                "unrecorded_lookups": max(0, att.refused_lookups - MAX_RECORDED_REFUSALS),
                "unrecorded_refusals": max(0, att.refused_connections - MAX_RECORDED_REFUSALS),
                "bytes": att.moved,
                **({"over_byte_cap": True} if att.over_cap else {}),
            }
            await self._record(att, "egress_summary", data, quiet=True)

    async def _serve(self, att: _Attachment, conn: _Conn, transparent: bool) -> None:
        try:
            await self._connection(att, transparent, conn)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # fail closed: the connection ends, and it is said why
            with contextlib.suppress(Exception):
                await self._record(att, "egress_error", {"error": f"{type(exc).__name__}: {exc}"}, quiet=True)
        finally:
            att.open.discard(conn.sock)
            conn.close()

    # --- records -------------------------------------------------------------------------
    async def _record(self, att: _Attachment, event: str, data: dict[str, Any], quiet: bool = False) -> bool:
        owner = att.owner
        try:
            await self._loop.run_in_executor(self._io, att.hooks.record, event, owner.call_id, owner.principal, data)
        except Exception:
            if not quiet:
                return False
        return True

    # --- one connection ------------------------------------------------------------------
    async def _connection(self, att: _Attachment, transparent: bool, conn: _Conn) -> None:
        started = time.monotonic()
        sock = conn.sock
        port = 0
        assert att.slots is not None
        if att.slots.locked():
            why = f"more than {att.egress.max_connections} connections at once (sandbox.network.max_connections)"
            await self._refuse(att, None, sock.getsockname()[1], "transparent" if transparent else "proxy", None, why)
            return
        async with att.slots:
            att.connections += 1
            opened = b""
            host: str | None
            via = "transparent" if transparent else "proxy"
            if transparent:
                address, port = sock.getsockname()[:2]
                host = att.names.get(address)
                if host is None:
                    await self._refuse(
                        att, None, port, via, None, f"{address} is no address the sandbox's resolver gave"
                    )
                    return
            else:
                head = await conn.read_head()
                opening = inspect.http_head(head) if head else inspect.Opening("http", error="no request")
                if opening.error or opening.method is None or opening.target is None:
                    await conn.say(400, opening.error or "not a proxy request")
                    await self._refuse(att, None, 0, via, None, f"a bad proxy request: {opening.error}")
                    return
                if opening.method == "CONNECT":
                    host, cport = inspect.split_authority(opening.target)
                    if cport is None or cport < 0:
                        await conn.say(400, "CONNECT needs host:port")
                        await self._refuse(att, host, 0, via, None, "a CONNECT without a port")
                        return
                    port = cport
                else:
                    target = _absolute(opening.target)
                    if target is None:
                        await conn.say(400, "expected an absolute http:// URL")
                        await self._refuse(att, None, 0, via, None, "a proxy request that is not an absolute http URL")
                        return
                    host, port = target
                    if opening.name is not None and (opening.name != host or (opening.port or 80) != port):
                        await conn.say(403, "the Host header names another host than the URL")
                        await self._refuse(att, host, port, via, None, f"Host {opening.name} differs from the URL's")
                        return
                    opened, conn.pending = _origin_form(head) + conn.pending, b""
                named = checked_host(host or "")
                if named is None:
                    await conn.say(400, "not a host name (letters, digits, '-', '_' and dots) or an address")
                    await self._refuse(att, None, port, via, None, f"{(host or '')[:100]!r} is not a host name")
                    return
                host = named
            decision = att.egress.decide(host, port)
            how = "policy"
            if decision.verdict == "ask":
                granted, by, answered = await self._ask(att, host, port)
                how = f"{answered} by {by}"
                if not granted:
                    if not transparent:
                        await conn.say(403, f"{host}:{port}: not approved ({answered})")
                    await self._refuse(att, host, port, via, decision.rule, f"asked; {answered} by {by}", "ask")
                    return
            elif decision.verdict == "deny":
                if not transparent:
                    await conn.say(403, decision.why)
                await self._refuse(att, host, port, via, decision.rule, decision.why, "deny")
                return
            if not transparent and not opened:
                await conn.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            # the client's first bytes, when it sends them before the server speaks
            if not opened:
                opened = await _first_bytes(conn)
            if opened:
                problem = _mismatch(inspect.classify(opened), host, port)
                if problem:
                    await self._refuse(att, host, port, via, decision.rule, problem, "allow")
                    return
            intercept = att.egress.intercept_for(host, port)
            if intercept is not None and opened[:1] != b"\x16":
                why = f"{host} is intercepted (its requests are read): it takes TLS from the first byte"
                await self._refuse(att, host, port, via, decision.rule, why, "allow")
                return
            leaked = _placeholder_in(att.egress, opened, host, port) if intercept is None else None
            if leaked:
                await self._leak(att, host, port, via, leaked)
                return
            addresses = await self._addresses(att, host, port)
            if isinstance(addresses, str):
                if not transparent and opened[:1] != b"\x16" and opened:
                    await conn.say(403, addresses)
                await self._refuse(att, host, port, via, decision.rule, addresses, decision.verdict)
                return
            record = {"host": host, "port": port, "via": via, "decision": "allow", "rule": decision.rule,
                      "approved": how if decision.verdict == "ask" else None, "address": addresses[0],
                      "command": att.owner.command[:200]}  # fmt: skip
            if not await self._record(att, "egress_allowed", record):
                await self._refuse(att, host, port, via, decision.rule, "the decision could not be recorded", "allow")
                return
            if intercept is not None:
                await self._brokered(att, conn, opened, host, addresses[0], port, via, decision.rule, started)
                return
            far = socket.socket(socket.AF_INET6 if ":" in addresses[0] else socket.AF_INET, socket.SOCK_STREAM)
            far.setblocking(False)
            att.open.add(far)
            sent = [0, 0]
            ended = "cut: the sandbox ended"
            try:
                try:
                    await asyncio.wait_for(self._loop.sock_connect(far, (addresses[0], port)), CONNECT_TIMEOUT)
                except (TimeoutError, OSError) as exc:
                    ended = f"connect failed: {exc}"
                    return
                if opened:
                    await self._loop.sock_sendall(far, opened)
                    sent[0] += len(opened)
                    with att.lock:
                        att.moved += len(opened)
                ended = await self._relay(att, conn.sock, far, sent, bool(opened), host, port)
            finally:
                att.open.discard(far)
                with contextlib.suppress(OSError):
                    far.close()
                # recorded however it ends, the sandbox's end (a cancellation) included
                await asyncio.shield(self._ended(att, host, port, via, decision.rule, started, sent[0], sent[1], ended))

    async def _relay(
        self, att: _Attachment, near: socket.socket, far: socket.socket, sent: list[int], checked: bool, host: str,
        port: int,
    ) -> str:  # fmt: skip
        """Copy both ways, a thread each (the loop is not in the data's path), until both sides
        are done. The client's first bytes, if they had not come before the far side was
        connected (a silent start), are checked as they come. How it ended."""
        done: asyncio.Future[None] = self._loop.create_future()
        left = [2]
        why: list[str] = []

        def finished() -> None:
            left[0] -= 1
            if left[0] == 0 and not done.done():
                done.set_result(None)

        def pump(src: socket.socket, dst: socket.socket, index: int, check: bool) -> None:
            try:
                _pump(att, src, dst, index, check, sent, why, host, port)
            finally:
                self._loop.call_soon_threadsafe(finished)

        for s in (near, far):
            s.setblocking(True)
        threading.Thread(target=pump, args=(near, far, 0, not checked), name="egress-up", daemon=True).start()
        threading.Thread(target=pump, args=(far, near, 1, False), name="egress-down", daemon=True).start()
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            for s in (near, far):  # the sandbox ended: the threads see their sockets end
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            await done
            raise
        if why:
            return f"cut: {why[0]}"
        return "closed"

    async def _brokered(
        self, att: _Attachment, conn: _Conn, opened: bytes, host: str, address: str, port: int, via: str,
        rule: str | None, started: float,
    ) -> None:  # fmt: skip
        """An intercepted host: TLS terminated with the gateway's CA, each request read, its
        rules applied, secrets put in, forwarded over the gateway's own TLS connection."""
        intercept = att.egress.intercept_for(host, port)
        assert intercept is not None
        count = [0, 0]
        ended = "cut: the sandbox ended"
        exchange: broker.Exchange | None = None
        closing: list[asyncio.StreamWriter] = []
        try:
            reader, writer = await asyncio.open_connection(sock=conn.detach())
            closing.append(writer)
            exchange = await broker.serve(
                reader, writer, opened, host, address, port, intercept, att.egress.secrets,
                att.egress.secrets_for(host, port), count,
            )  # fmt: skip
            ended = f"refused: {exchange.refused}" if exchange.refused else "closed"
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            ended = f"failed: {type(exc).__name__}: {exc}"
        finally:
            for w in closing:
                w.close()
            with att.lock:
                att.moved += count[0] + count[1]
            extra: dict[str, Any] = {"intercepted": True}
            if exchange is not None:
                extra["requests"] = exchange.requests
                if exchange.injected:  # which secrets were put in, never their values
                    extra["brokered"] = sorted(exchange.injected)
            await asyncio.shield(self._ended(att, host, port, via, rule, started, count[0], count[1], ended, extra))
            if exchange is not None and exchange.refused and exchange.refused.startswith("attempted leak of "):
                await asyncio.shield(
                    self._leak(att, host, port, via, exchange.refused.removeprefix("attempted leak of "))
                )

    async def _leak(self, att: _Attachment, host: str, port: int, via: str, secret: str) -> None:
        """A secret's placeholder sent where the secret is not for: refused, and said so."""
        _tell(att, f"{host}:{port}: the placeholder of {secret} is not sent there (an attempted leak, recorded)")
        await self._record(
            att, "egress_leak_attempt",
            {"host": host, "port": port, "via": via, "placeholder_of": secret, "command": att.owner.command[:200]},
            quiet=True,
        )  # fmt: skip

    async def _ask(self, att: _Attachment, host: str, port: int) -> tuple[bool, str, str]:
        key = (host, port)
        if att.granted.get(key):
            return True, "an earlier answer", "approved for this call"
        pending = att.asking.get(key)
        if pending is None:
            if len(att.asking) >= MAX_ASKS:
                return False, "the gateway", f"refused: {MAX_ASKS} hosts of this sandbox already wait for a supervisor"
            owner = att.owner
            pending = asyncio.ensure_future(
                self._loop.run_in_executor(
                    self._asks, att.hooks.ask, owner.call_id, owner.principal, host, port, owner.command, att.cancel
                )
            )
            att.asking[key] = pending
        try:
            granted, by, how = await asyncio.shield(pending)
        except Exception as exc:
            return False, "nobody", f"the approval failed: {exc}"
        finally:
            if pending.done():
                att.asking.pop(key, None)
        if granted:
            att.granted[key] = True
        return granted, by, how

    async def _addresses(self, att: _Attachment, host: str, port: int) -> list[str] | str:
        """Where `host` really is, as the gateway's resolver says: the addresses the policy lets
        the sandbox reach (or why none)."""
        try:
            if ipaddress.ip_address(host):
                found = [host]
        except ValueError:
            cached = att.resolved.get(host)
            if cached is not None and time.monotonic() - cached[0] < RESOLVED_FOR:
                found = cached[1]
            else:
                try:
                    infos = await asyncio.wait_for(
                        self._loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), CONNECT_TIMEOUT
                    )
                except (TimeoutError, OSError) as exc:
                    return f"{host} does not resolve: {exc}"
                found = list(dict.fromkeys(str(info[4][0]) for info in infos))
                att.resolved[host] = (time.monotonic(), found)
        usable = [a for a in found if not blocked(a) or att.egress.listed_address(a)]
        if not usable:
            listed = ", ".join(found)
            return f"{host} resolves to {listed}: loopback, private or link-local, which the policy does not list"
        return usable

    async def _refuse(
        self, att: _Attachment, host: str | None, port: int, via: str, rule: str | None, why: str, verdict: str = "deny"
    ) -> None:
        att.refused_connections += 1
        _tell(att, f"{host or '?'}:{port}: {why}")
        if att.refused_connections > MAX_RECORDED_REFUSALS:
            return  # counted: the summary at the sandbox's end says how many more
        await self._record(
            att, "egress_connection",
            {"host": host, "port": port, "via": via, "decision": "deny", "rule": rule, "ended": "refused", "why": why,
             "policy_verdict": verdict, "command": att.owner.command[:200]},
            quiet=True,
        )  # fmt: skip

    async def _ended(
        self, att: _Attachment, host: str, port: int, via: str, rule: str | None, started: float, up: int, down: int,
        ended: str, extra: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        await self._record(
            att, "egress_connection",
            {"host": host, "port": port, "via": via, "decision": "allow", "rule": rule, "bytes_out": up,
             "bytes_in": down, "duration_ms": round((time.monotonic() - started) * 1000), "ended": ended,
             **(extra or {})},
            quiet=True,
        )  # fmt: skip

    def refused_lookup(self, att: _Attachment, name: str, qtype: str, why: str = "") -> None:
        att.refused_lookups += 1
        why = why or "the network policy names no host it could reach"
        _tell(att, f"lookup of {name[:100]!r} refused: {why}")
        if att.refused_lookups <= MAX_RECORDED_REFUSALS:
            decision = att.egress.decide(name, 443)
            task = self._loop.create_task(
                self._record(
                    att,
                    "egress_dns_refused",
                    {"name": name[:255], "type": qtype, "rule": decision.rule, "why": why},
                    True,
                )
            )
            att.tasks.add(task)
            task.add_done_callback(att.tasks.discard)


class _Resolver(asyncio.DatagramProtocol):
    def __init__(self, service: EgressService, att: _Attachment) -> None:
        self.service = service
        self.att = att
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = DNSRecord.parse(data)
        except Exception:
            return  # not a DNS message: nothing to answer
        if query.header.qr or len(query.questions) != 1:
            return
        reply = query.reply()
        question = query.q
        raw = str(question.qname)
        name = checked_host(raw)
        qtype = QTYPE.get(question.qtype, str(question.qtype))
        if name is None:
            reply.header.rcode = RCODE.REFUSED
            self.service.refused_lookup(self.att, raw.rstrip(".").lower(), str(qtype), "not a host name")
        elif not self.att.egress.resolvable(name):
            reply.header.rcode = RCODE.REFUSED
            self.service.refused_lookup(self.att, name, str(qtype))
        elif question.qtype == QTYPE.A:
            address = self.att.address_for(name)
            if address is None:
                reply.header.rcode = RCODE.REFUSED
                self.service.refused_lookup(self.att, name, "A (too many names)")
            else:
                reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=60))
        # any other type of an answerable name: no records (NOERROR, empty); nothing is asked upstream
        if self.transport is not None:
            self.transport.sendto(reply.pack(), addr)


def _placeholder_in(egress: Egress, data: bytes, host: str, port: int) -> str | None:
    """A secret whose placeholder `data` (a connection's readable first bytes) carries to a host
    it is not for."""
    usable = egress.secrets_for(host, port)
    for s in egress.secrets:
        if s.name not in usable and s.placeholder.encode() in data:
            return s.name
    return None


def _tell(att: _Attachment, what: str) -> None:
    if len(att.refusals) < MAX_SHOWN and what not in att.refusals:
        att.refusals.append(what)


class _Conn:
    """A connection from the sandbox, read by the event loop until it is decided (then relayed
    by threads, or handed to the broker as streams)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.pending = b""
        self._detached = False

    async def recv(self, timeout: float) -> bytes:
        """What the client sent next (b"" at its end); raises TimeoutError."""
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return await asyncio.wait_for(self.loop.sock_recv(self.sock, inspect.MAX_HEAD), timeout)

    async def read_head(self) -> bytes:
        """An HTTP request head, up to its blank line (b"" if none comes within HEAD_TIMEOUT or
        MAX_HEAD bytes); what follows it stays pending."""
        data = b""
        deadline = time.monotonic() + HEAD_TIMEOUT
        while b"\r\n\r\n" not in data:
            if len(data) > inspect.MAX_HEAD:
                return b""
            try:
                chunk = await self.recv(max(0.0, deadline - time.monotonic()))
            except (TimeoutError, OSError):
                return b""
            if not chunk:
                return b""
            data += chunk
        end = data.index(b"\r\n\r\n") + 4
        self.pending = data[end:]
        return data[:end]

    async def send(self, data: bytes) -> None:
        await asyncio.wait_for(self.loop.sock_sendall(self.sock, data), HEAD_TIMEOUT)

    async def say(self, status: int, why: str) -> None:
        """An HTTP answer of the proxy's own (a refusal), as far as the client takes it."""
        reason = {400: "Bad Request", 403: "Forbidden"}.get(status, "Error")
        body = f"agent-gateway: {why}\n".encode(errors="replace")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                "X-Proxy-Error: blocked-by-policy\r\nConnection: close\r\n\r\n")  # fmt: skip
        with contextlib.suppress(Exception):
            await self.send(head.encode() + body)

    def detach(self) -> socket.socket:
        """The socket, for streams of its own (the broker); this object no longer closes it."""
        self._detached = True
        return self.sock

    def close(self) -> None:
        if not self._detached:
            with contextlib.suppress(OSError):
                self.sock.close()


async def _first_bytes(conn: _Conn) -> bytes:
    """What the client sends first, read until it is recognisably TLS, HTTP or something else;
    empty when it stays silent (the server speaks first)."""
    data = b""
    start = time.monotonic()
    while True:
        # silent up to FIRST_BYTES_WAIT: the server speaks first; once it has begun, the whole
        # opening must come within HEAD_TIMEOUT (a client dribbling bytes holds no slot for long)
        left = start + (FIRST_BYTES_WAIT if not data else HEAD_TIMEOUT) - time.monotonic()
        if left <= 0:
            return data
        try:
            chunk = await conn.recv(left)
        except TimeoutError:
            return data
        if not chunk:
            return data
        data += chunk
        if inspect.classify(data).kind != "incomplete" or len(data) >= inspect.MAX_HEAD:
            return data


def _mismatch(opening: inspect.Opening, host: str, port: int) -> str | None:
    """Why the client's first bytes name another host than the one it resolved (None: they don't).
    On the web's ports (443, 80) they must be a TLS ClientHello or an HTTP request."""
    if opening.kind == "other" and port in WEB_PORTS:
        return f"port {port} takes TLS or HTTP only: the connection's first bytes are neither"
    if opening.kind == "tls":
        if opening.error:
            return f"the TLS ClientHello cannot be read ({opening.error})"
        if opening.name is None:
            return f"the TLS ClientHello names no server (SNI); it must name {host}"
        if opening.name != host:
            return f"the TLS server name {opening.name!r} differs from the resolved host {host!r}"
    if opening.kind == "http":
        if opening.error:
            return f"the HTTP request cannot be read ({opening.error})"
        if opening.name is None:
            return f"the HTTP request names no Host; it must name {host}"
        if opening.name != host:
            return f"the HTTP Host {opening.name!r} differs from the resolved host {host!r}"
        if opening.port is not None and opening.port != port:
            return f"the HTTP Host names port {opening.port}, the connection is to {port}"
        if opening.target is not None and not opening.target.startswith("/") and opening.target != "*":
            target = _absolute(opening.target)
            if target is None or target != (host, opening.port or port):
                return f"the request's target {opening.target[:100]!r} names another place than {host}"
    if opening.kind == "incomplete":
        return "the connection's first bytes were cut short"
    return None


def _pump(
    att: _Attachment, src: socket.socket, dst: socket.socket, index: int, check: bool, sent: list[int],
    why: list[str], host: str, port: int,
) -> None:  # fmt: skip
    """One direction of a relay, on a thread of its own: read into one buffer, write it on.
    `check`: the client's first bytes come now (a silent start) and must name `host`."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    pending = b""
    deadline = 0.0
    try:
        while True:
            # an opening begun must be whole within HEAD_TIMEOUT
            if check and pending and not fdwait.readable(src.fileno(), deadline - time.monotonic()):
                why.append("the connection's first bytes were cut short")
                break
            n = src.recv_into(buf)
            if n == 0:
                if check and pending:
                    why.append("the connection's first bytes were cut short")
                break
            chunk: bytes | memoryview = view[:n]
            if check:
                if not pending:
                    deadline = time.monotonic() + HEAD_TIMEOUT
                pending += bytes(chunk)
                if inspect.classify(pending).kind == "incomplete" and len(pending) < inspect.MAX_HEAD:
                    continue
                check = False
                problem = _mismatch(inspect.classify(pending), host, port)
                if problem:
                    why.append(problem)
                    break
                chunk, pending = pending, b""
            with att.lock:
                att.moved += len(chunk)
                over = att.moved > att.egress.max_bytes
            if over:
                att.over_cap = True
                why.append(f"the sandbox moved more than {att.egress.max_bytes} bytes (sandbox.network.max_bytes)")
                break
            dst.sendall(chunk)
            sent[index] += len(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # reset, or shut down because the sandbox ended
    finally:
        if why:  # cut: both ways end now
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def _origin_form(head: bytes) -> bytes:
    """A proxy request's head as the server expects it: `GET /path HTTP/1.1` (the absolute URL
    of the request line cut to its path)."""
    line, _, rest = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) == 3 and parts[1].lower().startswith(b"http://"):
        after = parts[1][7:]
        slash = after.find(b"/")
        parts[1] = after[slash:] if slash >= 0 else b"/"
    return b" ".join(parts) + b"\r\n" + rest


def _absolute(target: str) -> tuple[str, int] | None:
    if not target.lower().startswith("http://"):
        return None
    rest = target[7:]
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    if "@" in authority or not authority:
        return None
    host, port = inspect.split_authority(authority)
    if port is not None and port < 0:
        return None
    return host, port or 80


_service: EgressService | None = None
_service_lock = threading.Lock()


def service() -> EgressService:
    """The gateway's one egress loop, started on first use."""
    global _service
    with _service_lock:
        if _service is None:
            _service = EgressService()
        return _service
