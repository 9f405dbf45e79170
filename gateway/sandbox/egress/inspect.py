"""What the first bytes of a connection say about where it goes: the TLS server name (SNI) of a
ClientHello, the Host of an HTTP request. Read with OpenSSL (Python's ssl, fed through memory)
and h11, never by a parser of ours; both bounded in size."""

from __future__ import annotations

import re
import ssl
import threading
from dataclasses import dataclass
from typing import Literal

import h11

MAX_HEAD = 16 * 1024
"""Bytes read at most to find a ClientHello's server name or an HTTP request's head."""
_METHOD = re.compile(rb"^[A-Za-z]+ ")
_HTTP_START = re.compile(rb"^[\x00-\x20]*[A-Za-z]")
_HTTP_LIKE = re.compile(rb"^[\x00-\x20]*[!-~]+[\x00-\x20]+[!-~]*[\x00-\x20]*HTTP/", re.IGNORECASE)
"""A first line that reads as a request line to a lenient server (tabs, leading spaces, any
case): treated as HTTP and checked as such, never waved through as another protocol."""


@dataclass(frozen=True)
class Opening:
    kind: Literal["tls", "http", "other", "incomplete"]
    name: str | None = None
    """The SNI (tls) or the Host header without its port (http); None when it has none."""
    port: int | None = None
    """The port an HTTP Host header names, if any."""
    target: str | None = None
    """An HTTP request's target (the proxy's absolute-form URL or a CONNECT authority)."""
    method: str | None = None
    error: str | None = None


def classify(data: bytes) -> Opening:
    """The first bytes a client sent: TLS, HTTP, something else, or not enough yet."""
    stripped = data.lstrip(b"\r\n")
    if not stripped:
        return Opening("incomplete")
    if stripped[0] == 0x16:
        return _client_hello(stripped)
    if 0x14 <= stripped[0] <= 0x17 or stripped[0] & 0x80:  # another TLS record first, or an SSLv2 hello
        return Opening("tls", None, error="the first TLS record is not a ClientHello")
    lines = stripped.split(b"\n", 1)
    first_line = lines[0][:MAX_HEAD]
    if _METHOD.match(stripped[:16]) or (len(stripped) < 16 and stripped.isalpha()):
        if len(lines) == 2 and b"HTTP/" not in first_line.upper():
            return Opening("other")  # a whole first line that is no request line (SMTP's EHLO, say)
        return http_head(stripped)
    if _HTTP_LIKE.match(first_line):
        return Opening("http", error="a request line in a form the proxy does not read (tabs, spaces, case)")
    if b"\n" not in stripped and len(stripped) < MAX_HEAD and _HTTP_START.match(stripped):
        return Opening("incomplete")  # it may yet turn out to be a request line
    return Opening("other")


_lock = threading.Lock()
_names: dict[int, str | None] = {}


def _remember(sslobj: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> int | None:
    with _lock:
        _names[id(sslobj)] = name
    return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE  # it has told us: stop the handshake here


def _context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.sni_callback = _remember
    return ctx


_CONTEXT = _context()


def _client_hello(data: bytes) -> Opening:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = _CONTEXT.wrap_bio(incoming, outgoing, server_side=True)
    incoming.write(data[:MAX_HEAD])
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    except ssl.SSLError:
        pass
    with _lock:
        seen = id(obj) in _names
        name = _names.pop(id(obj), None)
    if seen:
        return Opening("tls", name.lower().rstrip(".") if name else None)
    if len(data) < MAX_HEAD and not _broken(obj):
        return Opening("incomplete")
    return Opening("tls", None, error="not a TLS ClientHello OpenSSL can read")


def _broken(obj: ssl.SSLObject) -> bool:
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        return False
    except ssl.SSLError:
        return True
    return True


def http_head(data: bytes) -> Opening:
    """An HTTP/1.x request head: method, target and Host. Incomplete until its blank line."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) >= MAX_HEAD:
            return Opening("http", error=f"no end of the request head in {MAX_HEAD} bytes")
        return Opening("incomplete")
    conn = h11.Connection(h11.SERVER)
    try:
        conn.receive_data(data[: end + 4])
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        return Opening("http", error=f"not an HTTP/1 request: {exc}")
    if not isinstance(event, h11.Request):
        return Opening("http", error="not an HTTP/1 request")
    hosts = [v.decode("latin-1") for k, v in event.headers if k == b"host"]
    target = event.target.decode("latin-1")
    method = event.method.decode("latin-1")
    if len(hosts) > 1:
        return Opening("http", target=target, method=method, error="the request has more than one Host")
    if not hosts:  # HTTP/1.0, or a CONNECT (its target names the host)
        return Opening("http", None, None, target, method)
    name, port = split_authority(hosts[0])
    return Opening("http", name, port, target, method)


def split_authority(authority: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]:port` -> (host lower case, port or None). Raises nothing:
    a bad port gives port -1 (never equal to a real one)."""
    authority = authority.strip()
    if authority.startswith("["):
        end = authority.find("]")
        host, rest = authority[1:end], authority[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    else:
        host, port_text = authority, ""
    port = (int(port_text) if port_text.isdigit() and 0 < int(port_text) < 65536 else -1) if port_text else None
    return host.lower().rstrip("."), port
