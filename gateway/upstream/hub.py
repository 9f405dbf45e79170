"""The gateway's connections to its upstream MCP servers, one per upstream, on their own event loop.

A connection is made at first use (a call, a listing, `warm()` at the server's start) and kept:
a stdio server is started in the gateway's sandbox (its own roots, the policy's network
setting, its credentials from `env_from`) and lives until the gateway closes, the policy changes
the upstream, or it breaks a limit; an HTTP server is reached directly (no egress check yet: the
seam is `_http_headers`/`http_streams`, where the gateway's per-host egress check goes when it
exists). A connection that ended is made again at the next use.

Each listing of an upstream's tools goes through the pins (pins.py): what the agent is shown, and
what may be called, is only a tool whose definition is its pin.

Callers are the gateway's worker threads: `offer`, `call`, `agent_tools` submit work to the
loop and wait for it, bounded by the upstream's timeouts and the call's cancel event.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation, RequestParamsMeta

from gateway import sandbox
from gateway.audit.sink import AuditSink
from gateway.executors.shell import sandbox_pipe, scrubbed_env
from gateway.executors.spawner import SPAWNER
from gateway.log import log
from gateway.policy.compile import CompiledPolicy
from gateway.policy.layers import resolve_roots
from gateway.policy.upstreams import SEPARATOR, Upstream
from gateway.sandbox import identity, reaper
from gateway.sandbox.egress import Egress
from gateway.stages import upstream_rules as rules
from gateway.upstream.pins import PinError, PinStore, definition, fingerprint, store_dir
from gateway.upstream.transport import Limits, Watch, http_streams, stdio_streams

T = TypeVar("T")

LIST_FRESH_S = 2.0
"""An agent's tools/list lists an upstream again when its listing is older than this."""
RELIST_S = 60.0
"""Every connection lists its tools again this often (a server that changes a definition
without saying so is noticed within this time)."""
RELIST_MIN_S = 1.0
"""A server's `list_changed` notifications make it listed again at most this often."""
MAX_TOOLS = 10_000
MAX_PAGES = 100
STOP_GRACE_S = 2.0
CPU_SECONDS = 10**9
"""A server lives long: RLIMIT_CPU would end it after this much CPU time, i.e. never."""


class Unavailable(Exception):
    """The upstream cannot be reached or started (the message says why)."""


class UpstreamFailure(Exception):
    """A call that reached no result: `status` (error, timeout), `code`, `message`."""

    def __init__(self, status: str, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class HubHost(Protocol):
    """What the hub needs of the gateway it serves (gateway.pipeline.Gateway)."""

    audit: AuditSink
    state_dir: Path | None
    on_close: list[Callable[[], None]]

    @property
    def policy(self) -> CompiledPolicy: ...

    def private_dirs(self) -> tuple[Path, ...]: ...


@dataclass(frozen=True)
class Settings:
    """What one connection is made from. The policy in force is compared with it at each use:
    another value (the upstream edited, the workspace moved) closes the connection and makes a
    new one."""

    name: str
    upstream: Upstream
    read_roots: tuple[Path, ...]
    write_roots: tuple[Path, ...]
    network: bool
    """stdio: the sandbox reaches everything (the policy's `sandbox.network: true`)."""
    egress: Egress | None
    """stdio: the sandbox reaches the hosts of the policy's network (a mapping), through the
    gateway's resolver and proxy; HTTP: the hosts the gateway may connect to for it."""
    landlock: str
    etc: tuple[str, ...]

    @staticmethod
    def of(policy: CompiledPolicy, name: str) -> Settings | None:
        up = policy.policy.upstreams.get(name)
        if up is None:
            return None
        settings = policy.policy.sandbox
        # a stdio server's sandbox has the policy's network when it asks for one (`network`); an
        # HTTP server is reached only where the policy's network, as a mapping of hosts, allows
        everything = up.network and settings.network is True
        egress = policy.egress if (up.network or up.url is not None) else None
        return Settings(
            name, up, resolve_roots(up.read_roots, policy.workspace), resolve_roots(up.write_roots, policy.workspace),
            everything, egress, "required" if settings.require_landlock else "optional", tuple(settings.etc),
        )  # fmt: skip

    @property
    def limits(self) -> Limits:
        return Limits(max_message=4 * self.upstream.result_bytes, max_chatter=4 * self.upstream.result_bytes)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The credential values this upstream gets from the gateway's environment."""
        names = (*self.upstream.env_from, *self.upstream.headers_from.values())
        return tuple(v for v in (os.environ.get(n) for n in names) if v)


@dataclass(frozen=True)
class Offer:
    """Whether a tool may be called now: offered by its upstream, with its pinned definition."""

    ok: bool
    code: str = ""
    message: str = ""
    sha256: str | None = None


@dataclass
class _Spawned:
    proc: subprocess.Popen[bytes]
    launch: sandbox.Launch
    stdin: int
    stdout: int
    stderr: int


class Connection:
    """One upstream's connection, owned by the hub's loop (every method but the properties runs
    there)."""

    def __init__(self, hub: Hub, settings: Settings) -> None:
        self.hub = hub
        self.settings = settings
        self.listing: dict[str, dict[str, Any]] | None = None
        """Tool name -> its definition, as last listed."""
        self.hashes: dict[str, str] = {}
        """Tool name -> its definition's SHA-256, as last listed."""
        self.listed_at = 0.0
        self.verified = False
        """The last listing went through the pins (its records written)."""
        self.failure: str | None = None
        self.client: Client | None = None
        self.stderr_tail = bytearray()
        self._stop: asyncio.Event | None = None
        self._watch = Watch()
        self._lock: asyncio.Lock | None = None
        self._relisting: asyncio.Task[None] | None = None
        self._relist_due = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def up(self) -> bool:
        """Connected and listed (read from any thread: a stale answer only costs a trip to the loop)."""
        stop = self._stop
        return self.client is not None and stop is not None and not stop.is_set()

    def _stderr(self) -> str:
        """The last lines the server wrote on stderr (for the operator's log), credentials removed."""
        text = self.stderr_tail.decode("utf-8", "replace")
        for secret in self.settings.secrets:
            text = text.replace(secret, "[REDACTED]")
        return text[-2000:]

    # --- connecting -------------------------------------------------------------------------
    async def ensure(self) -> Client:
        """The live client, connected and listed (made now if need be). Raises Unavailable."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._closed:
                raise Unavailable("the gateway is closing its upstream connections")
            if self.client is not None and self._stop is not None and not self._stop.is_set():
                return self.client
            stop, up = asyncio.Event(), asyncio.Event()
            self._stop = stop
            self._task = asyncio.create_task(self._run(stop, up))
            wait_s = self.settings.upstream.connect_timeout_ms / 1000
            try:
                await asyncio.wait_for(up.wait(), wait_s)
            except TimeoutError:
                self.failure = f"it did not start and list its tools within {wait_s:g} s"
                stop.set()
            if self.client is None or stop.is_set():
                raise Unavailable(self.failure or "it closed the connection")
            return self.client

    async def _run(self, stop: asyncio.Event, up: asyncio.Event) -> None:
        watch = self._watch = Watch(on_end=lambda why: stop.set())
        self.failure = None
        try:
            async with Client(
                self._transport(watch, stop),
                cache=None,
                read_timeout_seconds=None,
                client_info=Implementation(name="agent-gateway", version="0.1.0"),
                message_handler=self._on_message,
            ) as client:
                await self._list(client)
                self.client = client
                up.set()
                relist = asyncio.create_task(self._every(stop))
                try:
                    await stop.wait()
                finally:
                    relist.cancel()
        except Exception as exc:  # a failed start or a broken connection: said at its next use
            self.failure = _describe(exc)
            log.warning("upstream_failed", upstream=self.name, error=self.failure, stderr=self._stderr())
        finally:
            if watch.cut_off:
                self.failure = f"cut off: {watch.reason}"
                log.warning("upstream_cut_off", upstream=self.name, why=watch.reason)
            elif watch.reason and not self._closed:
                self.failure = watch.reason
            self.client = None
            stop.set()
            up.set()

    @contextlib.asynccontextmanager
    async def _transport(self, watch: Watch, stop: asyncio.Event) -> AsyncIterator[tuple[Any, Any]]:
        up = self.settings.upstream
        if up.url is not None:
            headers = self._http_headers()
            async with http_streams(
                up.url, headers, self.settings.limits, watch, up.connect_timeout_ms / 1000, up.forward_identity
            ) as s:
                yield s
            return
        spawned = await asyncio.to_thread(SPAWNER.call, self._spawn)
        try:
            async with stdio_streams(
                spawned.stdin, spawned.stdout, spawned.stderr, self.settings.limits, watch, self.stderr_tail
            ) as streams:
                yield streams
        finally:
            await asyncio.to_thread(_stop_process, spawned)

    def _http_headers(self) -> dict[str, str]:
        """The HTTP upstream's headers, from the gateway's environment, once its host passed the
        policy's network (when that is a mapping of hosts: the same check a command's connection
        gets; a host under `ask` is refused, no call being there to ask about)."""
        url = self.settings.upstream.url
        egress = self.settings.egress
        if egress is not None and url is not None:
            parts = urllib.parse.urlsplit(url)
            host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
            decided = egress.decide(host, port)
            if decided.verdict != "allow":
                self.hub.record_network(self.name, host, port, decided.verdict, decided.rule, decided.why)
                raise Unavailable(f"the policy's network does not let the gateway reach {host}:{port}: {decided.why}")
        out = {}
        for header, variable in self.settings.upstream.headers_from.items():
            value = os.environ.get(variable)
            if value is None:
                raise Unavailable(f"headers_from: {variable} is not set in the gateway's environment")
            out[header] = value
        return out

    def _spawn(self) -> _Spawned:
        """Start the stdio server in its sandbox (on the spawner thread: it dies with the gateway)."""
        s, up = self.settings, self.settings.upstream
        assert up.command is not None
        env = {}
        for variable in up.env_from:
            value = os.environ.get(variable)
            if value is None:
                raise Unavailable(f"env_from: {variable} is not set in the gateway's environment")
            env[variable] = value
        profile = sandbox.Profile(
            principal=f"upstream-{s.name}",
            read_roots=s.read_roots,
            write_roots=s.write_roots,
            protected=(),
            private=(*self.hub.host.private_dirs(), Path(os.path.realpath(Path.home()))),
            quotas=sandbox.Quotas(
                memory_bytes=up.memory_bytes or 2 << 30,
                pids=up.pids or 512,
                cpu_seconds=CPU_SECONDS,
                file_bytes=1 << 30,
                open_files=1024,
                tmpfs_bytes=256 << 20,
            ),
            network=s.network,
            egress=s.egress,
            egress_hooks=_NetworkHooks(self.hub.host, s.name) if s.egress is not None else None,
            landlock="required" if s.landlock == "required" else "optional",
            etc=s.etc,
        )
        cwd = (*s.write_roots, *s.read_roots, Path(sandbox.HOME))[0]
        plan, launch = sandbox.start(profile, list(up.command), cwd, scrubbed_env(env))
        r_in, w_in = os.pipe()
        out, err = sandbox_pipe(), sandbox_pipe()
        try:
            identity.own(r_in)
            proc = subprocess.Popen(
                launch.argv, stdin=r_in, stdout=out[1], stderr=err[1], env=plan.env, cwd="/",
                start_new_session=True, close_fds=True, pass_fds=launch.pass_fds,
            )  # fmt: skip
        except BaseException:
            launch.abandon()
            for fd in (r_in, w_in, *out, *err):
                os.close(fd)
            raise
        launch.started()
        for fd in (r_in, out[1], err[1]):
            os.close(fd)
        return _Spawned(proc, launch, w_in, out[0], err[0])

    # --- listing ------------------------------------------------------------------------------
    async def _list(self, client: Client) -> None:
        found: dict[str, dict[str, Any]] = {}
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            for tool in page.tools:
                found[tool.name] = definition(tool.model_dump(mode="json", by_alias=True, exclude_none=True))
            if len(found) > MAX_TOOLS:
                raise Unavailable(f"it lists more than {MAX_TOOLS} tools")
            cursor = page.next_cursor
            if not cursor:
                break
        hashes = {name: fingerprint(defined) for name, defined in found.items()}
        try:
            await asyncio.to_thread(self.hub.observe, self.name, found)
            verified = True
        except Exception as exc:  # the pins or their records failed: nothing of this listing is callable
            self.failure = f"its tools could not be checked against their pins: {_describe(exc)}"
            log.error("upstream_pins_failed", upstream=self.name, error=self.failure)
            verified = False
        # the new listing replaces the old one at once, once checked: calls made meanwhile are
        # decided on the old one (whose tools the pins checked), never refused for the listing's sake
        if not verified:
            self.verified = False
        self.listing, self.hashes, self.listed_at = found, hashes, time.monotonic()
        self.verified = verified

    async def relist(self) -> None:
        """List the tools again (one listing at a time; a caller during one waits for it)."""
        if self._relisting is None or self._relisting.done():
            client = self.client
            if client is None:
                return
            self._relisting = asyncio.create_task(self._list(client))
        await asyncio.shield(self._relisting)

    async def _every(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(RELIST_S)
            with contextlib.suppress(Exception):
                await self.relist()

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            asyncio.get_running_loop().create_task(self._relist_quietly())

    async def _relist_quietly(self) -> None:
        """A server's `list_changed`: listed again, at most once a second however often it says so
        (the notifications that come meanwhile are one listing)."""
        if self._relist_due:
            return
        self._relist_due = True
        try:
            await asyncio.sleep(max(0.0, self.listed_at + RELIST_MIN_S - time.monotonic()))
            self._relist_due = False
            with contextlib.suppress(Exception):
                await self.relist()
        finally:
            self._relist_due = False

    async def fresh(self, within_s: float) -> None:
        """Connected, and listed within the last `within_s` seconds. Raises Unavailable."""
        await self.ensure()
        if time.monotonic() - self.listed_at > within_s:
            await self.relist()

    # --- calling ------------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The upstream's result (the protocol's JSON), the request carrying `meta` as its
        `_meta`. Raises UpstreamFailure."""
        up = self.settings.upstream
        try:
            client = await self.ensure()
        except Unavailable as exc:
            raise UpstreamFailure("error", "UPSTREAM_UNAVAILABLE", f"{self.name}: {exc}") from None
        stop, watch = self._stop, self._watch
        assert stop is not None
        task = asyncio.ensure_future(client.call_tool(tool, arguments, meta=cast(RequestParamsMeta, meta)))
        ended = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({task, ended}, timeout=up.timeout_ms / 1000, return_when="FIRST_COMPLETED")
        finally:
            ended.cancel()
            if not task.done():
                task.cancel()
        if task in done and not task.cancelled() and task.exception() is None:
            dumped: dict[str, Any] = task.result().model_dump(mode="json", by_alias=True, exclude_none=True)
            return dumped
        if watch.reason is not None:  # the connection ended under the call, whatever the call saw of it
            code = "UPSTREAM_CUT_OFF" if watch.cut_off else "UPSTREAM_UNAVAILABLE"
            raise UpstreamFailure("error", code, f"{self.name}: {'cut off: ' if watch.cut_off else ''}{watch.reason}")
        if task in done:
            failed = task.exception()
            if isinstance(failed, MCPError):
                raise UpstreamFailure("error", "UPSTREAM_ERROR", f"{self.name}.{tool}: {failed}")
            raise UpstreamFailure("error", "UPSTREAM_FAILED", f"{self.name}.{tool}: {_describe(failed or Exception())}")
        if not done:
            raise UpstreamFailure(
                "timeout", "UPSTREAM_TIMEOUT",
                f"{self.name}.{tool} did not answer within {up.timeout_ms} ms (timeout_ms): the call was cancelled",
            )  # fmt: skip
        raise UpstreamFailure("error", "UPSTREAM_UNAVAILABLE", f"{self.name}: {self.failure or 'the connection ended'}")

    async def close(self) -> None:
        self._closed = True
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), 10.0)


class _NetworkHooks:
    """What the resolver and proxy of a stdio server's sandbox use of the gateway (the egress
    `Hooks`): its connections recorded under `upstream:NAME`; a host under `ask` is refused,
    since no call is there to ask a supervisor about (a server connects on its own)."""

    def __init__(self, host: HubHost, name: str) -> None:
        self.host = host
        self.principal = f"upstream:{name}"

    def current_call(self) -> str | None:
        return None

    def record(self, event: str, call_id: str | None, principal: str, data: dict[str, Any]) -> None:
        self.host.audit.append(event, call_id=call_id, principal=principal, tool="network", data=data)

    def ask(
        self, call_id: str | None, principal: str, host: str, port: int, command: str, cancel: threading.Event
    ) -> tuple[bool, str, str]:
        return False, "nobody", "an upstream server's connection cannot be asked about: only allowed hosts"


def _stop_process(spawned: _Spawned) -> None:
    """Its input closed (the transport closed its pipes), give the server a moment, then end its
    whole sandbox (its process group; bwrap's PID namespace takes every descendant)."""
    proc = spawned.proc
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_GRACE_S)
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    reaper.poke()
    spawned.launch.finished()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, Unavailable | MCPError) else f"{type(exc).__name__}: {text}"


@dataclass
class Hub:
    """The upstream connections of one gateway (`hub_for`)."""

    host: HubHost
    pins: PinStore | None = None
    _connections: dict[str, Connection] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _settings_of: tuple[CompiledPolicy, dict[str, Settings | None]] | None = None

    def __post_init__(self) -> None:
        if self.host.state_dir is not None:
            self.pins = PinStore(store_dir(self.host.state_dir))

    # --- the loop -------------------------------------------------------------------------------
    def _submit(self, work: Coroutine[Any, Any, T]) -> Future[T]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="upstreams", daemon=True)
                self._thread.start()
                self._loop = loop
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(work, loop)

    @staticmethod
    def _wait(future: Future[T], timeout_s: float | None, cancel: threading.Event | None = None) -> T:
        """The future's result; cancelled when `cancel` is set (UpstreamFailure CALL_CANCELLED)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return future.result(0.05 if cancel is not None else timeout_s)
            except FutureTimeout:
                if cancel is not None and cancel.is_set():
                    future.cancel()
                    why = "the call was cancelled (its client went away)"
                    raise UpstreamFailure("error", "CALL_CANCELLED", why) from None
                if deadline is not None and time.monotonic() >= deadline:
                    future.cancel()
                    raise Unavailable("it did not answer in time") from None

    def _settings(self, policy: CompiledPolicy, name: str) -> Settings | None:
        """`Settings.of`, kept while the same policy is in force (it resolves every root)."""
        with self._lock:
            kept = self._settings_of
            if kept is None or kept[0] is not policy:
                kept = self._settings_of = (policy, {})
            if name not in kept[1]:
                kept[1][name] = Settings.of(policy, name)
            return kept[1][name]

    def connection(self, policy: CompiledPolicy, name: str) -> Connection | None:
        """The connection for `name` as the policy in force defines it (None: it defines none)."""
        settings = self._settings(policy, name)
        with self._lock:
            conn = self._connections.get(name)
            if conn is not None and conn.settings != settings:
                old, conn = conn, None
                del self._connections[name]
                self._loop_call(old.close())
            if conn is None and settings is not None:
                conn = self._connections[name] = Connection(self, settings)
        return conn

    def _loop_call(self, work: Coroutine[Any, Any, Any]) -> None:
        if self._loop is None:
            work.close()
            return
        asyncio.run_coroutine_threadsafe(work, self._loop)

    def record_network(self, name: str, host: str, port: int, verdict: str, rule: str | None, why: str) -> None:
        """Record the gateway's own refused connection to an HTTP upstream (as the proxy records
        a sandbox's: `egress_connection`, replayed like one)."""
        with contextlib.suppress(Exception):
            self.host.audit.append(
                "egress_connection", principal=f"upstream:{name}", tool="network",
                data={"host": host, "port": port, "decision": "deny", "policy_verdict": verdict, "rule": rule,
                      "why": why},
            )  # fmt: skip

    # --- what the gateway asks ------------------------------------------------------------------
    def observe(self, upstream: str, listing: dict[str, dict[str, Any]]) -> None:
        """A listing through the pins, recording what changed (raises when it cannot)."""
        if self.pins is None:
            raise PinError("the gateway has no state directory to keep the pins of upstream tools in")

        def record(event: str, data: dict[str, Any]) -> None:
            self.host.audit.append(event, tool="upstream", data=data)

        observed = self.pins.observe(upstream, listing, record)
        for drift in observed.drift:
            log.warning("upstream_drift", upstream=upstream, tool=drift.tool, kind=drift.kind)

    def offer(self, policy: CompiledPolicy, upstream: str, tool: str, cancel: threading.Event | None = None) -> Offer:
        """Whether `tool` of `upstream` may be called now (connecting first if need be)."""
        conn = self.connection(policy, upstream)
        if conn is None:
            return Offer(False, "unknown_upstream", f"no upstream {upstream!r}")
        if self.pins is None:
            return Offer(False, "no_state_dir", "upstream tools need the gateway's state directory (their pins)")
        if not conn.up:  # (connected: no need to ask the loop)
            try:
                self._wait(self._submit(conn.ensure()), conn.settings.upstream.connect_timeout_ms / 1000 + 5, cancel)
            except Unavailable as exc:
                return Offer(False, "upstream_unavailable", f"{upstream}: {exc}")
            except UpstreamFailure as exc:
                return Offer(False, "cancelled", exc.message)
        if not conn.verified:
            return Offer(False, "pins_unchecked", f"{upstream}: {conn.failure}")
        sha = conn.hashes.get(tool)
        if sha is None:
            return Offer(False, "not_offered", f"{upstream} offers no tool {tool!r}")
        try:
            pinned = self.pins.pinned_sha256(upstream, tool)
        except PinError as exc:
            return Offer(False, "pins_unreadable", str(exc))
        if pinned is None:
            return Offer(
                False, "not_pinned",
                f"{upstream}.{tool} is new since {upstream}'s tools were pinned (a renamed or added tool): it is "
                f"blocked until an admin or a supervisor accepts it (gateway upstream diff {upstream} {tool})",
                sha,
            )  # fmt: skip
        if pinned != sha:
            return Offer(
                False, "definition_changed",
                f"{upstream}.{tool} changed since it was pinned ({pinned[:12]} -> {sha[:12]}): it is blocked until an "
                f"admin or a supervisor accepts the new definition (gateway upstream diff {upstream} {tool})",
                sha,
            )  # fmt: skip
        return Offer(True, sha256=sha)

    def current_sha256(self, policy: CompiledPolicy, upstream: str, tool: str) -> str | None:
        """The definition `tool` has in the upstream's latest listing (None: not listed)."""
        conn = self.connection(policy, upstream)
        return conn.hashes.get(tool) if conn is not None else None

    def call(
        self, policy: CompiledPolicy, upstream: str, tool: str, arguments: dict[str, Any],
        cancel: threading.Event | None = None, meta: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Call the tool (`meta`: the request's `_meta`); its result as the protocol's JSON.
        Raises UpstreamFailure."""
        conn = self.connection(policy, upstream)
        if conn is None:
            raise UpstreamFailure("error", "UPSTREAM_UNAVAILABLE", f"no upstream {upstream!r}")
        try:
            return self._wait(self._submit(conn.call(tool, arguments, meta)), None, cancel)
        except Unavailable as exc:
            raise UpstreamFailure("error", "UPSTREAM_UNAVAILABLE", f"{upstream}: {exc}") from None

    def agent_tools(self, policy: CompiledPolicy, principal: str) -> list[dict[str, Any]]:
        """The upstream tools `principal` is shown, as MCP tools named `PREFIX__TOOL`: those its
        rules let it call (for some arguments), offered now with their pinned definition. An
        upstream that cannot be reached is left out (and logged)."""
        out: list[dict[str, Any]] = []
        if self.pins is None:
            return out
        self._forget_removed(policy)
        for name, up in policy.policy.upstreams.items():
            conn = self.connection(policy, name)
            if conn is None:
                continue
            try:
                self._wait(self._submit(conn.fresh(LIST_FRESH_S)), up.connect_timeout_ms / 1000 + 5)
            except (Unavailable, UpstreamFailure) as exc:
                log.warning("upstream_not_listed", upstream=name, error=str(exc))
                continue
            if not conn.verified:
                continue
            hashes = conn.hashes
            for tool, defined in sorted((conn.listing or {}).items()):
                if not rules.visible(policy, principal, name, tool):
                    continue
                with contextlib.suppress(PinError):
                    if self.pins.pinned_sha256(name, tool) == hashes.get(tool):
                        # no outputSchema: the gateway's own replies (pending, a denial) carry none of
                        # the upstream's structured content, and a client checks results against it
                        shown = {k: v for k, v in defined.items() if k != "outputSchema"}
                        shown["name"] = f"{up.prefix or name}{SEPARATOR}{tool}"
                        shown["description"] = f"[{name}] {defined.get('description', '')}".rstrip()
                        out.append(shown)
        return out

    def _forget_removed(self, policy: CompiledPolicy) -> None:
        """Close the connections of upstreams the policy in force no longer names."""
        with self._lock:
            gone = [n for n in self._connections if n not in policy.policy.upstreams]
            closing = [self._connections.pop(n) for n in gone]
        for conn in closing:
            self._loop_call(conn.close())

    def warm(self, policy: CompiledPolicy) -> None:
        """Start connecting to every upstream now, without waiting (a server's start)."""
        if self.pins is None:
            return
        for name in policy.policy.upstreams:
            conn = self.connection(policy, name)
            if conn is not None:
                self._submit(_quietly(conn.ensure()))

    def close(self) -> None:
        """End every connection (stdio servers are stopped) and the loop."""
        with self._lock:
            conns, self._connections = list(self._connections.values()), {}
            loop = self._loop
        if loop is None:
            with _HUBS_LOCK:
                if _HUBS.get(self.host) is self:
                    del _HUBS[self.host]
            return
        with _HUBS_LOCK:
            if _HUBS.get(self.host) is self:
                del _HUBS[self.host]  # the hub holds its host: the entry would keep both alive
        future = asyncio.run_coroutine_threadsafe(_close_all(conns), loop)
        with contextlib.suppress(Exception):
            future.result(30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)


async def _quietly(work: Coroutine[Any, Any, Any]) -> None:
    with contextlib.suppress(Exception):
        await work


async def _close_all(conns: list[Connection]) -> None:
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


_HUBS: weakref.WeakKeyDictionary[Any, Hub] = weakref.WeakKeyDictionary()
_HUBS_LOCK = threading.Lock()


def hub_for(host: HubHost) -> Hub:
    """The hub of `host` (made at first use; closed when the host closes)."""
    with _HUBS_LOCK:
        found = _HUBS.get(host)
        if found is None:
            found = _HUBS[host] = Hub(host)
            host.on_close.append(found.close)
        return found


def split_name(policy: CompiledPolicy, called: str) -> tuple[str, str] | None:
    """(upstream, tool) of a name the agent called (`PREFIX__TOOL`), or None when it is no
    upstream's shape. An unknown prefix is returned as it is (the call is then denied)."""
    prefix, sep, tool = called.partition(SEPARATOR)
    if not sep or not prefix or not tool:
        return None
    for name, up in policy.policy.upstreams.items():
        if (up.prefix or name) == prefix:
            return name, tool
    return prefix, tool
