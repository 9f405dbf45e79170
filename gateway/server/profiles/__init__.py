"""Profiles: the tool sets `gateway serve --profile NAME[,NAME...]` serves.

`gateway` is the gateway's own tools (`gateway/server/specs.py`), the default. Every other
profile is one seed's tool contract, literally: the seed's tool names, parameters, defaults,
limits, reply shapes and error codes, declared in one module here. A profile's tool is a `Spec`
whose `adapt` turns the seed's arguments into one of the gateway's call models and whose
`reply` turns the gateway's envelope into the seed's reply. Nothing else differs: the call goes
through `Gateway.handle` like any other, so the decision, the sandbox, the approvals and the
audit record are the ones `run` would get. A profile has no code path to a shell of its own.

docs/tools.md has a section per profile mapping each seed tool to the gate.
"""

from __future__ import annotations

from gateway.server.profiles import methings, os_tools, shell_plugin, system_ops, terminal
from gateway.server.specs import BY_NAME, SPECS, Spec

GATEWAY = "gateway"
PROFILES: dict[str, tuple[Spec, ...]] = {
    GATEWAY: SPECS,
    system_ops.NAME: system_ops.SPECS,
    methings.NAME: methings.SPECS,
    shell_plugin.NAME: shell_plugin.SPECS,
    os_tools.NAME: os_tools.SPECS,
    terminal.NAME: terminal.SPECS,
}
"""Every profile's tools, by profile name."""


class ProfileError(ValueError):
    """A `--profile` value that names no profile, or profiles whose tool names collide."""


def specs_for(names: str | list[str]) -> tuple[Spec, ...]:
    """The tools of the profiles named (a comma-separated list, or a list), in order, plus
    `await_call` (a call a supervisor must approve returns `pending` in every profile). Two
    profiles that both define a tool name cannot be served together: the client could not tell
    which contract it calls."""
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
    if not wanted or any(not n for n in wanted):
        raise ProfileError(f"--profile: expected NAME[,NAME...], one of {', '.join(PROFILES)}")
    out: dict[str, Spec] = {}
    owner: dict[str, str] = {}
    for name in dict.fromkeys(wanted):
        if name not in PROFILES:
            raise ProfileError(f"--profile: no profile {name!r} (profiles: {', '.join(PROFILES)})")
        for spec in PROFILES[name]:
            if spec.name in out and out[spec.name] is not spec:
                raise ProfileError(
                    f"--profile: {owner[spec.name]} and {name} both have a tool named {spec.name!r}: "
                    "serve them from two servers"
                )
            out[spec.name], owner[spec.name] = spec, name
    out.setdefault("await_call", BY_NAME["await_call"])
    return tuple(out.values())


__all__ = ["GATEWAY", "PROFILES", "ProfileError", "specs_for"]
