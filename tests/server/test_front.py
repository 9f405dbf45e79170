"""The HTTP front under attack, against a real `gateway serve --http` on loopback: half-open
connections, floods of token-less requests, oversized bodies, descriptor exhaustion, answers
nobody reads, and the 10 MiB files write the docs promise.

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

import h11
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from gateway.audit import verify
from gateway.server.front import SILENT_GRACE_S
from tests.conftest import PATIENCE_S, eventually
from tests.server.conftest import HttpGateway, audit_records, envelope_of

HALF_OPEN = 3000
ANSWERED_WITHIN_S = PATIENCE_S  # the old code never answers; a loaded machine may take seconds


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
            assert eventually(lambda: flood.answered.get(401, 0) > 0)  # the flood is under way
            t0 = time.monotonic()
            result = asyncio.run(call(small_server.url, token, "run", {"command": "echo through"}, ANSWERED_WITHIN_S))
            print(f"answered in {time.monotonic() - t0:.2f} s; flood {flood.answered}")
            assert eventually(lambda: flood.answered.get(401, 0) > 50), flood.answered  # served too, not ignored
        assert envelope(result)["stdout"] == "through\n"
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
    with Flood(small_server.port) as flood:  # a few hundred refusals, however long they take here
        assert eventually(lambda: flood.answered.get(401, 0) > 300), flood.answered
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
            "params": {"name": "run", "arguments": {"command": "sleep 500; echo finished"}}}  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request_bytes(port, {**auth, **session}, json.dumps(call).encode()))
        deadline = time.monotonic() + 30
        while not any(r["event"] == "decision" for r in audit_records(small_server.audit)):
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.1)
        time.sleep(1)  # the command is running; now the client dies without a word
    # the old server answers when the role's 60 s timeout ends the command, to nobody
    results = eventually(lambda: [r for r in audit_records(small_server.audit) if r["event"] == "result"])
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
            result = asyncio.run(call(server.url, token, "run", {"command": "echo through"}))
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


# --- answers nobody reads (red team F1, authenticated form) ---------------------------------------
LINES = 9000
READ_ARGS = {"action": "read", "path": "big.txt", "limit": LINES}
"""A files read near the tool's limit (1 MiB): its answer is about 2 MiB (text and structured)."""


def big_file(ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"line {i:07d} {'x' * 100}\n" for i in range(LINES)))


def legacy_session(server: HttpGateway, token: str) -> dict[str, str]:
    """The headers of a new legacy-era MCP session: initialize, then the initialized notification."""
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
             "capabilities": {}, "clientInfo": {"name": "hog", "version": "1"}}}  # fmt: skip
    auth = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    with httpx2.Client(headers=auth, timeout=30) as h:
        r = h.post(server.url, json=hello)
        assert r.status_code == 200, r.text
        session = {"Authorization": f"Bearer {token}", "Mcp-Session-Id": r.headers["mcp-session-id"],
                   "Mcp-Protocol-Version": "2025-11-25"}  # fmt: skip
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert h.post(server.url, json=note, headers=session).status_code == 202
    return session


def pipelined_reads(port: int, session: dict[str, str], n: int) -> bytes:
    """`n` files reads of big.txt in a row on one kept-alive connection (answered one by one)."""
    calls = []
    for i in range(n):
        call = {"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                "params": {"name": "files", "arguments": READ_ARGS}}  # fmt: skip
        calls.append(request_bytes(port, {**session, "Connection": "keep-alive"}, json.dumps(call).encode()))
    return b"".join(calls)


def tiny_window(port: int, rcvbuf: int = 1024) -> socket.socket:
    """A connection whose receive buffer is fixed (set before connect, so the window it announces
    stays small), by default as small as the kernel allows."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s: socket.socket) -> bool:
    """Whether the server ended this connection (reset or FIN), without reading from it."""
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != 1  # 1: TCP_ESTABLISHED


def unsent(server: HttpGateway, s: socket.socket) -> int:
    """Bytes the server's kernel holds for `s`, sent but not yet taken (/proc/net/tcp tx_queue)."""
    ours, theirs = f"{server.port:04X}", f"{s.getsockname()[1]:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(f":{ours}") and f[2].endswith(f":{theirs}"):
            return int(f[4].split(":")[0], 16)
    return 0


def hog(server: HttpGateway, session: dict[str, str]) -> socket.socket:
    """A connection holding a session's token that pipelines six 2 MiB answers and reads none.
    Returns once the first answer is computed and more than 1 MiB of it sits in the server's
    kernel: then the rest of it waits in the server for a reader (the kernel takes about 1.6 MiB
    through a closed window; if it took more, the next answers would fill it)."""
    before = sum(r["event"] == "result" for r in audit_records(server.audit))
    s = tiny_window(server.port)
    s.sendall(pipelined_reads(server.port, session, 6))
    deadline = time.monotonic() + 60
    while sum(r["event"] == "result" for r in audit_records(server.audit)) == before or unsent(server, s) < 1 << 20:
        assert time.monotonic() < deadline, "the server never answered"
        time.sleep(0.1)
    return s


def test_an_answer_nobody_reads_does_not_hold_its_connection(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    """Red team F1, authenticated form: a client with a valid token that pipelines requests with
    large answers and never reads held its connection forever (uvicorn's send waits for the
    client to drain, with no deadline). Now the connection is closed once its answer has made
    no progress for --write-timeout."""
    big_file(ws)
    deadlines = ("--header-timeout", "2", "--body-timeout", "2", "--write-timeout", "2")
    server = HttpGateway(tmp_path, policy_file, ws, extra=deadlines)
    try:
        token = server.token("agent")
        with hog(server, legacy_session(server, token)) as s:
            deadline = time.monotonic() + 30  # fifteen times the longest deadline; the old server: forever
            while not closed_by_server(s) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert closed_by_server(s), "the server still holds the connection"
        result = asyncio.run(call(server.url, token, "run", {"command": "echo after"}))
        assert envelope(result)["stdout"] == "after\n"
    finally:
        server.stop()
    assert "http_answer_not_read" in server.stderr.read_text()
    assert verify(server.audit).ok


def test_connections_with_answers_nobody_reads_do_not_lock_a_client_out(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    """Red team F1, authenticated form: with the caps full of connections whose answers nobody
    reads (each in a request, so never evicted, and never timed out), a client was refused. Now
    a connection stuck writing is the first to give its place."""
    big_file(ws)
    caps = ("--max-connections", "4", "--max-connections-per-peer", "4")
    server = HttpGateway(tmp_path, policy_file, ws, extra=caps)
    hogs: list[socket.socket] = []
    try:
        token = server.token("agent")
        session = legacy_session(server, token)
        for _ in range(4):
            hogs.append(hog(server, session))
        time.sleep(SILENT_GRACE_S + 0.5)  # unread for over a second: not a client's answer on its way
        try:
            result = asyncio.run(call(server.url, token, "run", {"command": "echo through"}))
        except Exception as exc:  # the old server closes the client's connections at once
            while isinstance(exc, ExceptionGroup):
                exc = exc.exceptions[0]
            pytest.fail(f"the client was locked out: {type(exc).__name__}: {exc}")
        assert envelope(result)["stdout"] == "through\n"
    finally:
        for s in hogs:
            s.close()
        server.stop()
    assert verify(server.audit).ok


def read_answers(s: socket.socket, n: int, per_second: int) -> list[dict[str, Any]]:
    """Read `n` answers from `s` at about `per_second` bytes a second; their JSON-RPC messages."""
    parser = h11.Connection(h11.CLIENT)  # it only parses: the requests went out as raw bytes
    out: list[dict[str, Any]] = []
    taken = 0
    for _ in range(n):
        parser.send(h11.Request(method="POST", target="/mcp", headers=[("Host", "x"), ("Content-Length", "0")]))
        parser.send(h11.EndOfMessage())
        body: list[bytes] = []
        while True:
            event = parser.next_event()
            if event is h11.NEED_DATA:
                chunk = s.recv(65536)
                assert chunk, "the server closed the connection"
                parser.receive_data(chunk)
                taken += len(chunk)
                if taken >= per_second // 4:  # a quarter second's worth, then a quarter second's rest
                    time.sleep(0.25)
                    taken = 0
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
        lines = [line[6:] for line in b"".join(body).decode().splitlines() if line.startswith("data: ")]
        out.extend(json.loads(line) for line in lines if line)
        parser.start_next_cycle()
    return out


def test_a_slow_reader_of_big_answers_is_not_cut_while_it_keeps_reading(
    tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    """The write deadline is on no progress, not on total time: a client taking three 2 MiB
    answers at 512 KiB/s needs about four times the deadline (most of it with the server's
    transport paused), and gets them whole. Its receive buffer is fixed at 256 KiB, so the
    answers wait in the server rather than in its kernel. (Not the 1 KiB of the hogs: a window
    under the loopback's 64 KiB segment is only reopened by the sender's zero-window probes,
    whose backoff on a busy machine can outlast any short deadline.)"""
    big_file(ws)
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--write-timeout", "3"))
    try:
        session = legacy_session(server, server.token("agent"))
        with tiny_window(server.port, 256 << 10) as s:
            s.sendall(pipelined_reads(server.port, session, 3))
            got = read_answers(s, 3, 512 << 10)
        assert [m["id"] for m in got] == [100, 101, 102]
        for m in got:
            assert envelope_of(m["result"])["status"] == "ok", m
            assert envelope_of(m["result"])["content"].count("\n") == LINES
    finally:
        server.stop()
    assert "http_answer_not_read" not in server.stderr.read_text()
    assert verify(server.audit).ok
