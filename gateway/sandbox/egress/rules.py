"""What a sandbox may reach, as a value: host patterns and the decision for one `host:port`.

A pattern is one of

    github.com              that name exactly
    *.githubusercontent.com any name under it (not the name itself)
    metadata.*              any name whose first label is `metadata` (ask and deny only)
    *                       anything no other pattern names (ask and deny only)
    169.254.169.254         that address (IPv4 or IPv6 literal; `[::1]:8080` with a port)

each with an optional `:port` (without one: 443 and 80 under allow and ask, every port under
deny). Deny beats ask beats allow among the patterns that name a host; `*` decides only what
no other pattern names; what nothing names is refused. Bad patterns raise `PatternError` with
what is wrong: the policy's loader turns it into a load error with file, line and field.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.sandbox.egress.broker import Intercept, Secret

DEFAULT_PORTS = (443, 80)
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
Verdict = Literal["allow", "ask", "deny"]


class PatternError(ValueError):
    """A host pattern the policy cannot use."""


@dataclass(frozen=True)
class HostPattern:
    text: str
    """As written in the policy (the rule a decision names)."""
    kind: Literal["exact", "suffix", "prefix", "any", "address"]
    host: str
    """The name (lower case, no trailing dot), the suffix after `*.`, the label before `.*`, or
    the address in its compressed form."""
    ports: tuple[int, ...] | None = None
    """None: the list's default (443 and 80 to allow or ask, every port to deny)."""

    def names(self, host: str) -> bool:
        """Whether this pattern names `host` (a normalised name or address), whatever the port."""
        if self.kind == "any":
            return True
        if self.kind == "address":
            return _address(host) == self.host
        if _address(host) is not None:
            return False  # a name pattern never names an address
        if self.kind == "exact":
            return host == self.host
        if self.kind == "suffix":
            return host.endswith("." + self.host)
        return host.startswith(self.host + ".")

    def covers_port(self, port: int, default: tuple[int, ...] | None) -> bool:
        ports = self.ports if self.ports is not None else default
        return ports is None or port in ports

    def covers(self, other: HostPattern) -> bool:
        """Whether everything `other` names (hosts and ports) this pattern names too (a layer's
        narrowing check; conservative: False when unsure)."""
        if self.ports is not None and (other.ports is None or not set(other.ports) <= set(self.ports)):
            return False
        if self.kind == "any":
            return True
        if other.kind == "any":
            return False
        if self.kind == other.kind and self.host == other.host:
            return True
        if other.kind in ("exact", "suffix") and self.kind == "suffix":
            return other.host.endswith("." + self.host)
        if other.kind == "exact":
            return self.names(other.host)
        return False


def normalise_host(host: str) -> str:
    """A host as the decisions compare it: lower case, no trailing dot; an address compressed."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    addr = _address(host)
    return addr if addr is not None else host


def checked_host(host: str) -> str | None:
    """`host` normalised, if it is an address or a host name in the strict form (letters,
    digits, `-` and `_` in dot-separated labels); None otherwise. Every name the resolver
    answers, the proxy decides and the gateway looks up passes here: a name with an escape
    (`\\097dmin`) or any other character a resolver library would read differently is refused,
    so the name decided is the name looked up."""
    if not isinstance(host, str) or len(host) > 255:
        return None
    normal = normalise_host(host)
    if _address(normal) is not None:
        return normal
    labels = normal.split(".")
    if not normal or len(normal) > 253 or not all(_LABEL.match(label) for label in labels):
        return None
    return normal


def _address(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def parse_pattern(text: str, where: Literal["allow", "ask", "deny"]) -> HostPattern:
    """One pattern of the `where` list. Raises PatternError."""
    if not isinstance(text, str) or not text.strip():
        raise PatternError("an empty host pattern")
    raw = text.strip()
    if "://" in raw:
        raise PatternError(f"{raw!r} has a scheme: write the host alone (e.g. 'pypi.org' or 'pypi.org:443')")
    if "/" in raw:
        raise PatternError(f"{raw!r} has a path: the network policy decides hosts and ports, not URLs")
    if any(c.isspace() for c in raw):
        raise PatternError(f"{raw!r} has a space in it")
    host, ports = _split_port(raw)
    if host == "*":
        if where == "allow":
            raise PatternError("'*' under allow would let every host through: name the hosts, or put '*' under ask")
        return HostPattern(text, "any", "*", ports)
    addr = _address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    if addr is not None:
        return HostPattern(text, "address", addr, ports)
    if host.startswith("[") or ":" in host:
        raise PatternError(f"{raw!r} is not a host, an address or an address with a port ('[::1]:8080')")
    name = host.lower().rstrip(".")
    if name.startswith("*."):
        rest = name[2:]
        _check_name(raw, rest)
        if where == "allow" and "." not in rest:
            raise PatternError(f"{raw!r} names every host of a top-level domain: too wide to allow")
        return HostPattern(text, "suffix", rest, ports)
    if name.endswith(".*"):
        first = name[:-2]
        if where == "allow":
            raise PatternError(f"{raw!r} names hosts under any domain: too wide to allow (use it under ask or deny)")
        _check_name(raw, first)
        if "." in first:
            raise PatternError(f"{raw!r}: a '.*' pattern names one first label (e.g. 'metadata.*')")
        return HostPattern(text, "prefix", first, ports)
    if "*" in name:
        raise PatternError(f"{raw!r}: '*' only as a whole pattern, a '*.' prefix or a '.*' suffix")
    _check_name(raw, name)
    return HostPattern(text, "exact", name, ports)


def _split_port(raw: str) -> tuple[str, tuple[int, ...] | None]:
    if raw.startswith("["):  # [v6]:port
        end = raw.find("]")
        if end < 0:
            raise PatternError(f"{raw!r}: an unclosed '['")
        rest = raw[end + 1 :]
        if not rest:
            return raw[: end + 1], None
        if not rest.startswith(":"):
            raise PatternError(f"{raw!r}: expected ':PORT' after the address")
        return raw[: end + 1], (_port(raw, rest[1:]),)
    if raw.count(":") == 1:
        host, port = raw.split(":")
        return host, (_port(raw, port),)
    return raw, None  # no port, or a bare IPv6 address


def _port(raw: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise PatternError(f"{raw!r}: the port must be a number from 1 to 65535")
    return int(text)


def _check_name(raw: str, name: str) -> None:
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise PatternError(f"{raw!r} is not a host name (letters, digits, '-' and '_' in dot-separated labels)")


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    rule: str | None
    """The pattern that decided, as written (None: no pattern names the host: refused)."""
    why: str


@dataclass(frozen=True)
class Egress:
    """A sandbox's network policy (`sandbox.network` as a mapping), presets resolved."""

    allow: tuple[HostPattern, ...] = ()
    ask: tuple[HostPattern, ...] = ()
    deny: tuple[HostPattern, ...] = ()
    presets: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """Variables the presets pass into the sandbox (index URLs, registries, the CA bundle)."""
    max_connections: int = 64
    """Connections one sandbox may hold open at once; more are refused (and recorded)."""
    max_bytes: int = 1 << 30
    """Bytes one sandbox may move through the proxy, both ways together; then its connections end."""
    http_proxy_port: int = 3128
    """The port of the HTTP proxy inside the sandbox (HTTP_PROXY, HTTPS_PROXY point at it)."""
    preset_hosts: tuple[tuple[str, str], ...] = field(default=())
    """(preset, host pattern) for each host a preset resolved to, as `gateway check` shows them."""
    intercepts: tuple[Intercept, ...] = ()
    secrets: tuple[Secret, ...] = ()
    ca_bundle: bytes = field(default=b"", repr=False)
    """With intercepts: the CAs the sandbox trusts (the system's and the gateway's own)."""

    def intercept_for(self, host: str, port: int) -> Intercept | None:
        host = normalise_host(host)
        for i in self.intercepts:
            p = parse_pattern(i.host, "allow")
            if p.names(host) and p.covers_port(port, DEFAULT_PORTS):
                return i
        return None

    def secrets_for(self, host: str, port: int) -> set[str]:
        """The secrets whose real value may go to `host:port`."""
        host = normalise_host(host)

        def named(text: str) -> bool:
            p = parse_pattern(text, "allow")
            return p.names(host) and p.covers_port(port, DEFAULT_PORTS)

        return {s.name for s in self.secrets if any(named(h) for h in s.hosts)}

    def decide(self, host: str, port: int) -> Decision:
        host = normalise_host(host)
        lists: tuple[tuple[Verdict, tuple[HostPattern, ...], tuple[int, ...] | None], ...] = (
            ("deny", self.deny, None),
            ("ask", self.ask, DEFAULT_PORTS),
            ("allow", self.allow, DEFAULT_PORTS),
        )
        named = [
            (verdict, p)
            for verdict, patterns, default in lists
            for p in patterns
            if p.kind != "any" and p.names(host) and p.covers_port(port, default)
        ]
        if not named:
            for verdict, patterns, default in lists[:2]:
                for p in patterns:
                    if p.kind == "any" and p.covers_port(port, default):
                        return Decision(verdict, p.text, f"{host}:{port} is named by no pattern; '*' under {verdict}")
            return Decision("deny", None, f"{host}:{port} is not in the network policy")
        first, p = named[0]  # deny first, then ask, then allow
        return Decision(first, p.text, f"{host}:{port} matches {p.text!r} under {first}")

    def resolvable(self, host: str) -> bool:
        """Whether the sandbox's resolver answers `host` (some port of it could be allowed or asked)."""
        return any(self.decide(host, port).verdict != "deny" for port in self.ports())

    def ports(self) -> tuple[int, ...]:
        """Every port some allow or ask pattern can reach: the ones the sandbox listens on."""
        out: set[int] = set()
        for p in (*self.allow, *self.ask):
            out.update(p.ports if p.ports is not None else DEFAULT_PORTS)
        return tuple(sorted(out))

    def listed_address(self, address: str) -> bool:
        """Whether the policy names `address` itself under allow or ask (so an allowed name may
        resolve to it although it is loopback, private or link-local)."""
        a = _address(address)
        return a is not None and any(p.kind == "address" and p.host == a for p in (*self.allow, *self.ask))
