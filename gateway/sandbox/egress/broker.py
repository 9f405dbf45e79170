"""Credentials that never enter the sandbox: the gateway holds a secret, the sandbox sees a
placeholder, and for the hosts the secret is for the proxy terminates TLS (with a certificate
of the gateway's own CA, which only its sandboxes trust), puts the real value where the request
carries the placeholder, and records that it did (the secret's name, never its value).

An intercepted host also takes request rules: `read_only` (GET, HEAD and OPTIONS only), and
path patterns. A placeholder sent anywhere else (another host, in clear HTTP or through an
intercepted connection) is refused and recorded as an attempted leak. Requests are read and
written by h11, TLS by OpenSSL (Python's ssl over memory buffers); the CA and leaf certificates
are made with `cryptography`, in memory, per gateway process.
"""

from __future__ import annotations

import asyncio
import datetime
import fnmatch
import functools
import os
import secrets as _random
import ssl
import tempfile
import threading
from dataclasses import dataclass, field

import h11
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

READ_ONLY_METHODS = ("GET", "HEAD", "OPTIONS")
_REFUSAL_HEADERS = [("x-proxy-error", "blocked-by-policy"), ("connection", "close")]
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_SALT = _random.token_hex(12)
"""Placeholders differ per gateway process: one seen in an old transcript names nothing now."""


def placeholder(name: str) -> str:
    return f"agw-secret-{name.lower()}-{_SALT}"


@dataclass(frozen=True)
class Secret:
    name: str
    """The variable the sandbox sees (holding the placeholder) and the audit log names."""
    hosts: tuple[str, ...]
    """Host patterns (as written) the real value may be sent to."""
    value: str = field(repr=False, compare=False, hash=False)
    placeholder: str = ""


@dataclass(frozen=True)
class Intercept:
    host: str
    """A host pattern (as written); every host it names is terminated and read by the proxy."""
    read_only: bool = False
    paths: tuple[str, ...] = ()
    """Request paths allowed (fnmatch patterns, e.g. `/repos/our-org/*`); empty: any path."""


_CA_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


class _CA:
    """The gateway's own certificate authority, made once per process, its key never written."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agent-gateway sandbox CA")])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}

    def context_for(self, host: str) -> ssl.SSLContext:
        """A server context presenting a certificate for `host`, signed by this CA (HTTP/1.1 only)."""
        with self._lock:
            if host in self._contexts:
                return self._contexts[host]
            key = ec.generate_private_key(ec.SECP256R1())
            now = datetime.datetime.now(datetime.UTC)
            names = x509.SubjectAlternativeName([x509.DNSName(host), x509.DNSName(host + ".")])
            cert = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
                .issuer_name(self.cert.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=7))
                # the name and its absolute form (`host.`): a client may ask for either
                .add_extension(names, critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256())
            )
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.set_alpn_protocols(["http/1.1"])
            # the key goes through a private file the moment it takes to load it (ssl loads no key from memory)
            with tempfile.TemporaryDirectory() as tmp:
                os.chmod(tmp, 0o700)
                path = os.path.join(tmp, "leaf.pem")
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                    f.write(cert.public_bytes(serialization.Encoding.PEM))
                    f.write(
                        key.private_bytes(
                            serialization.Encoding.PEM,
                            serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption(),
                        )
                    )
                ctx.load_cert_chain(path)
            self._contexts[host] = ctx
            return ctx


@functools.lru_cache(maxsize=1)
def authority() -> _CA:
    return _CA()


def trust_bundle() -> bytes:
    """What the sandbox trusts when hosts are intercepted: the system's CAs and the gateway's."""
    try:
        with open(SYSTEM_BUNDLE, "rb") as f:
            system = f.read()
    except OSError:
        system = b""
    return system.rstrip(b"\n") + b"\n" + authority().pem


class Refused(Exception):
    """A request the broker will not forward (and why)."""


@dataclass
class Exchange:
    """What one intercepted connection did: for its record."""

    requests: int = 0
    injected: set[str] = field(default_factory=set)
    refused: str | None = None


def _leaks(text: bytes, allowed: set[str], every: tuple[Secret, ...]) -> str | None:
    for s in every:
        if s.name not in allowed and s.placeholder.encode() in text:
            return s.name
    return None


async def serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    opened: bytes,
    host: str,
    address: str,
    port: int,
    rule: Intercept,
    secrets: tuple[Secret, ...],
    usable: set[str],
    count: list[int],
    upstream_ctx: ssl.SSLContext | None = None,
) -> Exchange:
    """Terminate the client's TLS (its ClientHello is `opened`), read its requests one by one,
    check them against `rule`, put in the secrets `usable` for this host, refuse any other
    secret's placeholder, and forward each over a TLS connection of the gateway's own to
    `address:port` (verified for `host`). `count` gets bytes out and in."""
    ex = Exchange()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = authority().context_for(host).wrap_bio(incoming, outgoing, server_side=True)
    incoming.write(opened)

    async def flush() -> None:
        data = outgoing.read()
        if data:
            writer.write(data)
            await writer.drain()

    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            await flush()
            chunk = await reader.read(65536)
            if not chunk:
                return ex
            incoming.write(chunk)
    await flush()
    ctx = upstream_ctx or ssl.create_default_context()
    up_reader, up_writer = await asyncio.wait_for(
        asyncio.open_connection(address, port, ssl=ctx, server_hostname=host), 15
    )
    client = h11.Connection(h11.SERVER)
    upstream = h11.Connection(h11.CLIENT)

    async def to_client(data: bytes | None) -> None:
        if data:
            tls.write(data)
            count[1] += len(data)
            await flush()

    async def from_client() -> bytes:
        while True:
            try:
                return tls.read(65536)
            except ssl.SSLWantReadError:
                chunk = await reader.read(65536)
                if not chunk:
                    return b""
                incoming.write(chunk)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def refuse(why: str) -> None:
        ex.refused = why
        body = f"agent-gateway: {why}\n".encode()
        if client.our_state in (h11.SEND_RESPONSE, h11.IDLE):
            await to_client(
                client.send(
                    h11.Response(status_code=403, headers=_REFUSAL_HEADERS + [("content-length", str(len(body)))])
                )
            )
            await to_client(client.send(h11.Data(data=body)))
            await to_client(client.send(h11.EndOfMessage()))

    try:
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                data = await from_client()
                client.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                break
            if isinstance(event, h11.Request):
                method = event.method.decode("latin-1").upper()
                path = event.target.decode("latin-1")
                if rule.read_only and method not in READ_ONLY_METHODS:
                    await refuse(f"{host} is read-only here: {method} refused (GET, HEAD and OPTIONS only)")
                    break
                if rule.paths and not any(fnmatch.fnmatchcase(path.split("?", 1)[0], p) for p in rule.paths):
                    await refuse(f"{host}: the path {path[:100]!r} is not among the policy's paths for it")
                    break
                whole = event.target + b"".join(k + b":" + v for k, v in event.headers)
                leaked = _leaks(whole, usable, secrets)
                if leaked:
                    await refuse(f"the placeholder of {leaked} was sent to {host}, which it is not for")
                    ex.refused = f"attempted leak of {leaked}"
                    break
                headers = []
                for k, v in event.headers:
                    for s in secrets:
                        if s.name in usable and s.placeholder.encode() in v:
                            v = v.replace(s.placeholder.encode(), s.value.encode())
                            ex.injected.add(s.name)
                    headers.append((k, v))
                ex.requests += 1
                out = upstream.send(h11.Request(method=event.method, target=event.target, headers=headers))
            elif isinstance(event, h11.Data):
                leaked = _leaks(bytes(event.data), usable, secrets)
                if leaked:
                    ex.refused = f"attempted leak of {leaked}"
                    break
                out = upstream.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                out = upstream.send(h11.EndOfMessage())
            else:
                continue
            if out:
                up_writer.write(out)
                count[0] += len(out)
                await up_writer.drain()
            if isinstance(event, h11.EndOfMessage):
                closed = await _relay_response(upstream, client, up_reader, to_client)
                if closed or client.our_state is not h11.DONE:
                    break
                try:
                    client.start_next_cycle()
                    upstream.start_next_cycle()
                except h11.LocalProtocolError:
                    break
    except (h11.RemoteProtocolError, h11.LocalProtocolError) as exc:
        ex.refused = ex.refused or f"not HTTP/1.1 the broker can read: {exc}"
    finally:
        up_writer.close()
    return ex


async def _relay_response(
    upstream: h11.Connection, client: h11.Connection, up_reader: asyncio.StreamReader, to_client: object
) -> bool:
    """Copy one response from the upstream to the client; True when the upstream closed."""
    send = to_client  # an async callable
    while True:
        event = upstream.next_event()
        if event is h11.NEED_DATA:
            data = await up_reader.read(65536)
            upstream.receive_data(data)
            continue
        if isinstance(event, h11.ConnectionClosed):
            return True
        if isinstance(event, h11.InformationalResponse | h11.Response):
            # the same status and headers, sent as HTTP/1.1 (h11 speaks nothing else to the client)
            kind = type(event)
            again = kind(status_code=event.status_code, headers=event.headers, reason=event.reason)
            await send(client.send(again))  # type: ignore[operator]
            continue
        if isinstance(event, h11.Data):
            await send(client.send(event))  # type: ignore[operator]
            continue
        if isinstance(event, h11.EndOfMessage):
            await send(client.send(event))  # type: ignore[operator]
            return upstream.our_state is h11.MUST_CLOSE or upstream.their_state is h11.MUST_CLOSE
        return True
