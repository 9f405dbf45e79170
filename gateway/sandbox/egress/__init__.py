"""The network as a policy: a sandbox reaches hosts by name through the gateway.

    rules.py      host patterns and the decision for one host:port (a value: `Egress`)
    presets.py    the hosts the machine's pip, npm and apt use, read from their configuration
    netns.py      the sandbox's own sockets, made in its network namespace by the helper
    inspect.py    a connection's first bytes: TLS server name, HTTP Host (OpenSSL, h11)
    proxy.py      the resolver and the proxy, on one event loop of the gateway

docs/sandbox.md (The network) says what it holds and what a host allowlist cannot stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.sandbox.egress import broker as _broker
from gateway.sandbox.egress import presets as _presets
from gateway.sandbox.egress.rules import Egress, HostPattern, PatternError, parse_pattern

__all__ = ["Egress", "HostPattern", "PatternError", "build", "parse_pattern"]


def build(
    *,
    presets: Sequence[str],
    allow: Sequence[str],
    ask: Sequence[str],
    deny: Sequence[str],
    max_connections: int,
    max_bytes: int,
    intercept: Sequence[tuple[str, bool, Sequence[str]]] = (),
    secrets: Sequence[tuple[str, Sequence[str], str]] = (),
    environ: Mapping[str, str] | None = None,
) -> Egress:
    """The compiled network policy, presets resolved against this machine's configuration.
    `intercept`: (host pattern, read_only, paths); `secrets`: (name, host patterns, value), each
    host an intercepted one. Raises PatternError or presets.PresetError (load errors)."""
    intercepts = tuple(_broker.Intercept(parse_pattern(h, "allow").text, ro, tuple(p)) for h, ro, p in intercept)
    brokered: list[_broker.Secret] = []
    for name, hosts, value in secrets:
        for h in hosts:
            wanted = parse_pattern(h, "allow")
            if not any(parse_pattern(i.host, "allow").covers(wanted) for i in intercepts):
                raise PatternError(
                    f"the secret {name} is for {h!r}, which sandbox.network.intercept does not name: the proxy "
                    "can put a secret only into requests it reads"
                )
        brokered.append(_broker.Secret(name, tuple(hosts), value, _broker.placeholder(name)))
    allowed = [parse_pattern(p, "allow") for p in allow]
    env: dict[str, str] = {}
    preset_hosts: list[tuple[str, str]] = []
    for name in presets:
        resolved = _presets.resolve(name, environ)
        for host in resolved.hosts:
            allowed.append(parse_pattern(host, "allow"))
            preset_hosts.append((name, host))
        env.update(dict(resolved.env))
    return Egress(
        allow=tuple(dict.fromkeys(allowed)),
        ask=tuple(parse_pattern(p, "ask") for p in ask),
        deny=tuple(parse_pattern(p, "deny") for p in deny),
        presets=tuple(presets),
        env=tuple(sorted(env.items())),
        max_connections=max_connections,
        max_bytes=max_bytes,
        preset_hosts=tuple(preset_hosts),
        intercepts=intercepts,
        secrets=tuple(brokered),
        ca_bundle=_broker.trust_bundle() if intercepts else b"",
    )
