"""The byte streams of upstream connections, bounded: an upstream that floods is cut off.

- `stdio_streams`: a stdio server already started (in its sandbox: hub.py starts it) spoken to
  over its pipes, one JSON-RPC message a line. The SDK's own stdio client cannot be used: it
  spawns the program itself (no sandbox descriptors to pass) and buffers a line without bound.
- `http_streams`: the SDK's streamable HTTP client over an httpx client whose responses are
  counted as they arrive (`CappedTransport`): the SDK bounds one SSE event, not a JSON body.

Limits (`Limits`): one message (a line, an SSE event) at most `max_message` bytes; at most
`max_chatter` bytes received while no request is answered (one HTTP response at most that much).
Over either, the connection is cut: `Watch.cut(why)` says why, and the hub closes it (every call
waiting on it ends with that reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

CHUNK = 1 << 16
STDERR_TAIL = 8192


@dataclass(frozen=True)
class Limits:
    max_message: int
    """The largest single message (a stdio line, an SSE event, a JSON body)."""
    max_chatter: int
    """Bytes received without an answer to a request (stdio), or in one response (HTTP)."""


@dataclass
class Watch:
    """Why a connection ended (None: it has not), shared by a transport and its owner: `cut`
    when the upstream broke a limit, `end` when it went away by itself."""

    on_end: Callable[[str], None] = field(default=lambda why: None)
    reason: str | None = None
    cut_off: bool = False

    def cut(self, why: str) -> None:
        if self.reason is None:
            self.cut_off = True
        self.end(why)

    def end(self, why: str) -> None:
        if self.reason is None:
            self.reason = why
            self.on_end(why)


class Cut(Exception):
    """The upstream broke a limit; the connection is closed."""


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


def _answers(message: SessionMessage | Exception) -> bool:
    return isinstance(message, SessionMessage) and isinstance(
        message.message, types.JSONRPCResponse | types.JSONRPCError
    )


def _given(protocol: asyncio.StreamReaderProtocol) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: protocol


@contextlib.asynccontextmanager
async def stdio_streams(
    stdin: int, stdout: int, stderr: int, limits: Limits, watch: Watch, stderr_tail: bytearray
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's message streams over a started server's pipes (the descriptors are taken over:
    closed when the block ends). `stderr_tail` keeps the last bytes the server wrote there."""
    loop = asyncio.get_running_loop()
    out_reader = asyncio.StreamReader(limit=CHUNK)
    err_reader = asyncio.StreamReader(limit=CHUNK)
    transports: list[asyncio.BaseTransport] = []
    try:
        for fd, reader in ((stdout, out_reader), (stderr, err_reader)):
            protocol = asyncio.StreamReaderProtocol(reader)
            read_transport, _ = await loop.connect_read_pipe(_given(protocol), os.fdopen(fd, "rb", buffering=0))
            transports.append(read_transport)
        w_transport, w_protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(stdin, "wb", buffering=0)
        )
        transports.append(w_transport)
    except BaseException:
        for opened in transports:
            opened.close()
        for fd in (stdout, stderr, stdin)[len(transports) :]:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    writer = asyncio.StreamWriter(w_transport, w_protocol, None, loop)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_out() -> None:
        buf = bytearray()
        scanned = 0
        chatter = 0
        async with to_session:
            while True:
                chunk = await out_reader.read(CHUNK)
                if not chunk:
                    watch.end("the server closed its output (it exited)")
                    return
                chatter += len(chunk)
                buf += chunk
                while (end := buf.find(b"\n", scanned)) >= 0:
                    line = bytes(buf[:end])
                    del buf[: end + 1]
                    scanned = 0
                    if not line.strip():
                        continue
                    message = _parse(line)
                    if _answers(message):
                        chatter = len(buf)
                    try:
                        await to_session.send(message)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return
                scanned = len(buf)
                if len(buf) > limits.max_message:
                    watch.cut(f"it sent a message over {limits.max_message} bytes")
                    raise Cut(watch.reason)
                if chatter > limits.max_chatter:
                    watch.cut(f"it sent {chatter} bytes without answering (at most {limits.max_chatter})")
                    raise Cut(watch.reason)

    async def read_err() -> None:
        while True:
            chunk = await err_reader.read(CHUNK)
            if not chunk:
                return
            stderr_tail.extend(chunk)
            del stderr_tail[:-STDERR_TAIL]

    async def write_in() -> None:
        async with from_session:
            async for message in from_session:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                writer.write(data)
                await writer.drain()

    async def guarded(job: Callable[[], Any]) -> None:
        with contextlib.suppress(Cut, OSError, ConnectionError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            await job()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(guarded, read_out)
            tg.start_soon(guarded, read_err)
            tg.start_soon(guarded, write_in)
            try:
                yield read_stream, write_stream
            finally:
                tg.cancel_scope.cancel()
    finally:
        for opened in transports:
            opened.close()
        for stream in (read_stream, write_stream, to_session, from_session):
            stream.close()


class _Counted(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, cap: int, watch: Watch) -> None:
        self.inner, self.cap, self.watch = inner, cap, watch

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.cap:
                self.watch.cut(f"one of its responses went over {self.cap} bytes")
                raise httpx2.ReadError(str(self.watch.reason))
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


IDENTITY_META = {
    "agent-gateway/principal": "X-Agent-Gateway-Principal",
    "agent-gateway/call_id": "X-Agent-Gateway-Call-Id",
}
"""The `_meta` keys the gateway sets on a call it forwards (`forward_identity`), and the header
each is also sent as to an HTTP server."""


def identity_headers(body: bytes) -> dict[str, str]:
    """The identity headers for a request whose JSON-RPC body is `body`: from the `_meta` the
    gateway itself set on a tools/call (nothing for any other message)."""
    try:
        message = json.loads(body)
    except ValueError:
        return {}
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or message.get("method") != "tools/call":
        return {}
    return {header: value for key, header in IDENTITY_META.items() if isinstance(value := meta.get(key), str)}


class CappedTransport(httpx2.AsyncBaseTransport):
    """An httpx transport whose responses may carry at most `cap` bytes each; with `identity`,
    each forwarded call also names its principal and call id in headers (from its `_meta`)."""

    def __init__(self, cap: int, watch: Watch, identity: bool = False) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.cap, self.watch, self.identity = cap, watch, identity

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.identity:  # only ever the gateway's own values
            for name in IDENTITY_META.values():
                request.headers.pop(name, None)
            if request.method == "POST":
                request.headers.update(identity_headers(request.content))
        response = await self.inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.cap:
            await response.aclose()
            self.watch.cut(f"it announced a response of {declared} bytes (at most {self.cap})")
            raise httpx2.ReadError(str(self.watch.reason))
        return httpx2.Response(
            response.status_code, headers=response.headers, stream=_Counted(response.stream, self.cap, self.watch),
            extensions=response.extensions, request=request,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def http_streams(
    url: str, headers: dict[str, str], limits: Limits, watch: Watch, connect_s: float, identity: bool = False
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's streamable HTTP streams to `url`, every response counted (`identity`: calls
    name their principal in headers too)."""
    timeout = httpx2.Timeout(connect_s, read=300.0)
    transport = CappedTransport(limits.max_chatter, watch, identity)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, transport=transport) as client,
        streamable_http_client(url, http_client=client, max_sse_event_size=limits.max_message) as streams,
    ):
        yield streams
