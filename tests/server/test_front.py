"""The HTTP front under attack, against a real `gateway serve --http` on loopback: half-open
connections, floods of token-less requests, oversized bodies, descriptor exhaustion, and the
10 MiB files write the docs promise.

Every flood is bounded (a few thousand sockets, seconds) and stays on 127.0.0.1. The server runs
with the common default of 1,024 descriptors, as under systemd, and this process raises its own
soft limit to fit what it opens."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from gateway.audit import verify
from tests.server.conftest import HttpGateway, audit_records, envelope_of

HALF_OPEN = 3000
ANSWERED_WITHIN_S = 5.0  # generous: the call takes well under a second; the old code never answers


def envelope(r: CallToolResult) -> dict[str, Any]:
    return envelope_of(r)


def room_for(sockets: int) -> None:
    """Raise this process's soft descriptor limit to fit `sockets` more, or skip."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = len(os.listdir("/proc/self/fd")) + sockets + 256
    if soft >= want:
        return
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"needs {want} descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def call(url: str, token: str, name: str, args: dict[str, Any], within: float = 120) -> CallToolResult:
    async def go() -> CallToolResult:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=within) as h,
            Client(streamable_http_client(url, http_client=h)) as c,
        ):
            return await c.call_tool(name, args)

    return await asyncio.wait_for(go(), within)


def request_bytes(port: int, headers: dict[str, str], body: bytes = b"", method: str = "POST") -> bytes:
    head = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", "Connection": "close", **headers}  # fmt: skip
    if body and "Transfer-Encoding" not in head:
        head.setdefault("Content-Length", str(len(body)))
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return f"{method} /mcp HTTP/1.1\r\n{lines}\r\n".encode() + body


def exchange(port: int, raw: bytes, timeout: float = 30) -> tuple[int, bytes]:
    """Send `raw` on a new connection; the status and body of the answer (read to EOF)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):  # the server may answer and close before all is sent
            s.sendall(raw)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]) if head else 0, body


def half_open(port: int, n: int) -> list[socket.socket]:
    """`n` connections, each having sent part of a request's headers (and nothing more)."""
    held = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Ty".encode())
        except OSError:
            pass  # refused, reset, or the backlog is full: the socket still counts against us
        held.append(s)
    return held


class Flood:
    """Threads sending complete token-less requests, each on a new connection, until stopped."""

    def __init__(self, port: int, threads: int = 4) -> None:
        self.port = port
        self.sent = 0
        self.answered: dict[int, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
        self._raw = request_bytes(port, {}, body)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, _ = exchange(self.port, self._raw, timeout=5)
            except OSError:
                status = 0
            with self._lock:
                self.sent += 1
                self.answered[status] = self.answered.get(status, 0) + 1

    def __enter__(self) -> Flood:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


@pytest.fixture
def small_server(tmp_path: Path, policy_file: Path, ws: Path) -> Iterator[HttpGateway]:
    """A server with the common default of 1,024 descriptors."""
    server = HttpGateway(tmp_path, policy_file, ws, nofile=1024)
    try:
        yield server
    finally:
        server.stop()
        assert verify(server.audit).ok


def refusal_records(server: HttpGateway) -> list[dict[str, Any]]:
    return [r for r in audit_records(server.audit) if r["event"] == "auth_refused"]


# --- floods before authentication ----------------------------------------------------------------
def test_half_open_connections_and_a_tokenless_flood_do_not_starve_a_client(small_server: HttpGateway) -> None:
    room_for(HALF_OPEN + 200)
    token = small_server.token("agent")
    held = half_open(small_server.port, HALF_OPEN)
    try:
        with Flood(small_server.port) as flood:
            time.sleep(0.5)  # the flood is under way
            t0 = time.monotonic()
            result = asyncio.run(call(small_server.url, token, "run", {"command": "echo through"}, ANSWERED_WITHIN_S))
            print(f"answered in {time.monotonic() - t0:.2f} s; flood {flood.answered}")
        assert envelope(result)["stdout"] == "through\n"
        assert flood.answered.get(401, 0) > 50  # the flood was served too: refused, not ignored
    finally:
        for s in held:
            s.close()


def test_a_connection_that_never_finishes_its_headers_is_closed(small_server: HttpGateway) -> None:
    (s,) = half_open(small_server.port, 1)
    s.settimeout(30)  # the deadline is 5 s; the old server never closes it
    with s, contextlib.suppress(ConnectionResetError):  # closed by the server: EOF or reset
        assert s.recv(100) == b""


def test_a_connection_that_never_finishes_its_body_is_closed(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--body-timeout", "3"))
    try:
        token = server.token("agent")
        raw = request_bytes(server.port, {"Authorization": f"Bearer {token}", "Content-Length": "1000"})
        got = send_part(server.port, raw + b'{"jsonrpc"')  # 10 of the 1,000 bytes it announced
    finally:
        server.stop()
    assert b" 200 " not in got.split(b"\r\n")[0]  # closed by the deadline; nothing ran
    assert verify(server.audit).ok


def send_part(port: int, raw: bytes) -> bytes:
    """Send `raw` and wait (up to 60 s; the old server waits forever) for the server to close."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(raw)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                got += chunk
    return got


def test_a_tokenless_flood_grows_the_audit_log_by_a_few_records(small_server: HttpGateway) -> None:
    before = len(audit_records(small_server.audit))
    started = time.monotonic()
    with Flood(small_server.port):
        time.sleep(3)
    elapsed = time.monotonic() - started
    small_server.stop()  # the counts still open are written at shutdown
    refused = [r for r in audit_records(small_server.audit)[before:] if r["event"] == "auth_refused"]
    counted = sum(r["data"].get("count", 1) for r in refused)
    assert counted > 200  # every refusal is accounted for...
    assert len(refused) <= 2 + elapsed  # ...in a few records: one in full, then counts per window
    first = refused[0]["data"]
    assert first["status"] == 401 and first["presented"] == "none" and first["peer"].startswith("127.0.0.1:")
    assert all(r["data"]["peer"] in ("127.0.0.1", first["peer"]) for r in refused)


def test_auth_refusals_are_recorded_in_full_per_kind_and_counted(small_server: HttpGateway) -> None:
    port = small_server.port
    for auth in ({}, {"Authorization": "Bearer agw_wrong"}, {}, {"Authorization": "Bearer agw_wrong"}, {}):
        assert exchange(port, request_bytes(port, auth, b"{}"))[0] == 401
    deadline = time.monotonic() + 30
    while len(refusal_records(small_server)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # the first of each kind is written off the answer's path
    full = refusal_records(small_server)
    assert sorted(r["data"]["presented"] for r in full) == ["none", "unknown bearer"]
    assert not any("count" in r["data"] for r in full)
    small_server.stop()
    counts = {r["data"]["presented"]: r["data"]["count"] for r in refusal_records(small_server) if "count" in r["data"]}
    assert counts == {"none": 2, "unknown bearer": 1}  # the rest, flushed at shutdown


def test_out_of_descriptors_the_server_stays_quiet_and_reachable(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    room_for(800)
    server = HttpGateway(tmp_path, policy_file, ws, nofile=256)
    try:
        token = server.token("agent")
        held = half_open(server.port, 600)  # more than the server has descriptors for
        try:
            time.sleep(3)  # the old server logged a traceback per failed accept meanwhile
            result = asyncio.run(call(server.url, token, "run", {"command": "echo still"}, ANSWERED_WITHIN_S))
        finally:
            for s in held:
                s.close()
        assert envelope(result)["stdout"] == "still\n", envelope(result)
    finally:
        server.stop()
    err = server.stderr.read_text()
    assert "Traceback" not in err and len(err.splitlines()) < 20, err[-3000:]


# --- sizes ---------------------------------------------------------------------------------------
def test_an_oversized_body_gets_413_before_anything_reads_it(small_server: HttpGateway) -> None:
    token = small_server.token("agent")
    for auth in ({"Authorization": f"Bearer {token}"}, {}):  # sizes first, even before the token
        raw = request_bytes(small_server.port, {**auth, "Content-Length": str(64 << 20)})
        status, body = exchange(small_server.port, raw + b'{"jsonrpc": "2.0"')  # announced, never sent
        assert status == 413, body
        assert b"67108864 bytes" in body and b"--max-body" in body
    assert refusal_records(small_server) == []  # a size refusal is not an auth refusal


def test_an_oversized_body_without_a_length_gets_413_before_it_is_parsed(small_server: HttpGateway) -> None:
    token = small_server.token("agent")
    chunk = b"[" * (1 << 20)  # not JSON: parsing it would answer 400, not 413
    raw = request_bytes(small_server.port, {"Authorization": f"Bearer {token}", "Transfer-Encoding": "chunked"})
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(17)) + b"0\r\n\r\n"
    assert exchange(small_server.port, raw + body)[0] == 413


def test_a_10_mib_write_over_http(small_server: HttpGateway, ws: Path) -> None:
    token = small_server.token("agent")
    data = os.urandom(10 << 20)  # the files tool's write limit: base64 makes it 13.3 MiB on the wire
    args = {"action": "write", "path": "big.bin", "content": base64.b64encode(data).decode(), "encoding": "base64"}
    result = asyncio.run(call(small_server.url, token, "files", args))
    assert envelope(result)["status"] == "ok", envelope(result)
    assert (ws / "big.bin").read_bytes() == data


# --- a client that leaves ------------------------------------------------------------------------
def test_a_legacy_client_that_disconnects_mid_call_has_its_command_killed(small_server: HttpGateway) -> None:
    """On the legacy wire the SDK does not cancel a call whose client vanished: its command
    would run to its timeout with nobody to answer. The front tells the SDK to cancel it."""
    token = small_server.token("agent")
    port = small_server.port
    auth = {"Authorization": f"Bearer {token}", "Connection": "keep-alive"}
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
             "capabilities": {}, "clientInfo": {"name": "leaver", "version": "1"}}}  # fmt: skip
    with httpx2.Client(headers={**auth, "Accept": "application/json, text/event-stream"}, timeout=30) as h:
        r = h.post(small_server.url, json=hello)
        session = {"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        h.post(small_server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "run", "arguments": {"command": "sleep 50; echo finished"}}}  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request_bytes(port, {**auth, **session}, json.dumps(call).encode()))
        deadline = time.monotonic() + 30
        while not any(r["event"] == "decision" for r in audit_records(small_server.audit)):
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.1)
        time.sleep(1)  # the command is running; now the client dies without a word
    deadline = time.monotonic() + 30  # the old server answers after 50 s, to nobody
    results: list[dict[str, Any]] = []
    while not results and time.monotonic() < deadline:
        time.sleep(0.2)
        results = [r for r in audit_records(small_server.audit) if r["event"] == "result"]
    assert results, "the call was not cancelled"
    assert results[0]["data"]["error"]["code"] == "CALL_CANCELLED"


def test_a_refused_request_ends_its_connection_even_with_its_body_unsent(small_server: HttpGateway) -> None:
    """Red team F2: a token-less POST announcing 100,000 bytes and sending one got its 401 at
    once, but the connection then waited for the rest of the body, holding a slot until the body
    deadline (30 s): enough of them fill the caps. A refusal now closes its connection."""
    raw = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{small_server.port}\r\nContent-Type: application/json\r\n"
           "Content-Length: 100000\r\n\r\nx").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", small_server.port), timeout=15) as s:
        s.sendall(raw)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):  # the old server keeps it open: recv times out at 15 s
                got += chunk
    assert got.startswith(b"HTTP/1.1 401") and b"connection: close" in got.lower()


def test_a_flood_of_fresh_silent_connections_does_not_lock_a_client_out(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    """Red team F3: connections younger than a second could not be evicted, so a flood that
    keeps replacing its connections with fresh ones filled the caps and a client was refused."""
    caps = ("--max-connections", "48", "--max-connections-per-peer", "48")
    server = HttpGateway(tmp_path, policy_file, ws, extra=caps)
    stop = threading.Event()

    def flood() -> None:
        held: list[tuple[float, socket.socket]] = []
        while not stop.is_set():
            now = time.monotonic()
            while held and now - held[0][0] > 0.5:  # only ever young ones
                held.pop(0)[1].close()
            while len(held) < 80:
                s = socket.socket()
                s.setblocking(False)
                with contextlib.suppress(OSError):
                    s.connect_ex(("127.0.0.1", server.port))
                held.append((time.monotonic(), s))
            time.sleep(0.02)
        for _, s in held:
            s.close()

    try:
        token = server.token("agent")
        flooder = threading.Thread(target=flood)
        flooder.start()
        try:
            time.sleep(1.0)  # the caps are full of fresh silent connections
            result = asyncio.run(call(server.url, token, "run", {"command": "echo through"}, 30))
        finally:
            stop.set()
            flooder.join()
        assert envelope(result)["stdout"] == "through\n"
    finally:
        server.stop()


def test_pipelined_refusals_to_a_client_that_never_reads_end_after_the_first(small_server: HttpGateway) -> None:
    """Red team F1, token-less form: thousands of pipelined GETs from a client with a tiny
    receive window that never reads kept the server writing 401s until its buffer filled, and
    the connection then held its slot with no deadline. The first refusal now closes it."""
    one = f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{small_server.port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.settimeout(15)
        s.connect(("127.0.0.1", small_server.port))
        with contextlib.suppress(OSError):  # the server may close before all is sent
            s.sendall(one * 2000)
        time.sleep(1)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):  # old server: answers keep coming, no end in 15 s
                got += chunk
    assert got.count(b"HTTP/1.1 401") == 1
