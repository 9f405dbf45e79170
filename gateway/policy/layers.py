"""Policy layering: a policy may `include` others, which are lower layers.

A lower layer is the authority over what it grants: its sandbox settings, its roles' roots,
protected paths, deny lists, levels and limits, its principals, its tool levels, second-opinion, environment,
shell and redaction settings are ceilings, which a layer including it may tighten and never
widen. Where a lower layer that defines principals sets nothing, the default is the ceiling (the
ci-runner example sets no `sandbox`, so its includers cannot turn the network on); a lower layer
without principals (a fragment: shared rules or roles) grants nobody anything, and only what it
writes is a ceiling. Only rules stay open to an upper layer, as before: it may add rules and
replace rules by id, except the ones marked `final`. One ceiling is wider than what its layer
puts in force: `shells_available` lists shells an upper layer may enable beyond the lower
`shells` (the shipped policy offers `sh`, which the profiles' layers enable).

Merge, lowest layer first (includes in the order listed, each over the ones before it, then the
file itself over all of them):
- every field, at every depth, by key: an upper layer changes only what it writes.
  `sandbox: {etc: [x]}` keeps the lower `network` and `require_landlock`; a role written again
  keeps the lower fields it does not name (`limits` too, limit by limit). A list or a value an
  upper layer writes replaces the lower one;
- `rules`: concatenated; an upper rule with the id of a lower one replaces it, unless the lower
  one is `final`, which is an error;
- then the merged policy is compared with the lower one, field by field (`_widenings`; the table
  in docs/policy.md says what "wider" means for each). Anything wider is a load error naming
  where the upper layer wrote it (file:line:column), the field, and where the ceiling comes
  from in the lower layers.

Roles and principals that only an upper layer defines are new definitions, bounded by nothing
but the tool levels (those apply to every role). A principal the lower layers define is compared
as a whole (all its roles, inherited ones included): an upper layer may give it another role only
if that adds nothing wider than it had.

Relative paths (`workspace`, `tests`) are resolved against the file that names them; roots are
compared as the gateway uses them (absolute, symlinks resolved), each layer's against its own
workspace (or the `--workspace` the gateway runs with), so moving the workspace cannot move a
role's roots out from under the lower layers' ones.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway.policy.loader import PolicyError, Positions, parse_policy_at
from gateway.policy.schema import LIMIT_DEFAULTS, NetworkSettings, Policy, Rule, RuleDecision, Tool
from gateway.sandbox.egress.rules import parse_pattern

MAX_INCLUDE_DEPTH = 8
_OPEN = {RuleDecision.DENY: 0, RuleDecision.ASK: 1, RuleDecision.ALLOW: 2}  # how much a decision lets through


@dataclass(frozen=True)
class Layered:
    """The merged policy, where each rule came from, and the files read (for reload checks)."""

    policy: Policy
    rule_sources: dict[str, Path]
    files: tuple[Path, ...]
    workspace: Path | None
    tests: Path | None
    sha256: str = ""
    """SHA-256 of the bytes of `files`, in order, exactly as they were parsed (each file is read
    once): the digest names what decides, even if a file changes while it loads."""


@dataclass(frozen=True)
class _Layer:
    """A file merged over its includes."""

    path: Path
    data: dict[str, Any]
    """Every field its files write (rules apart), as plain data: what it overrides when merged."""
    rules: dict[str, Rule]
    rule_sources: dict[str, Path]
    origins: dict[tuple[str, ...], str]
    """Where each written value is: `file:line:column`, by field path (`("sandbox", "network")`)."""
    workspace: Path | None
    tests: Path | None
    policy: Policy
    """`data` and `rules` validated, defaults filled in."""


def load_layers(path: Path, workspace: Path | None = None) -> Layered:
    """Read `path` and its includes and merge them. `workspace` is the one the gateway runs with
    (`--workspace`), if any: roots are compared against it."""
    files: list[Path] = []
    read: list[bytes] = []
    top = _load(path.resolve(), files, (), workspace, read)
    sha256 = hashlib.sha256(b"".join(read)).hexdigest()
    return Layered(top.policy, top.rule_sources, tuple(files), top.workspace, top.tests, sha256)


def layer_files(path: Path) -> tuple[Path, ...]:
    """The file and every file it includes, as far as they can be read (reload watches these:
    a layer that fails to load or merge must still be watched, so that fixing it is noticed)."""
    out: list[Path] = []
    todo = [path.resolve()]
    while todo and len(out) < 100:
        file = todo.pop(0)
        if file in out:
            continue
        out.append(file)
        try:
            includes = parse_policy_at(file)[0].include
        except PolicyError:
            continue
        todo.extend((file.parent / inc).resolve() for inc in includes)
    return tuple(out)


def resolve_roots(entries: Iterable[str], workspace: Path) -> tuple[Path, ...]:
    """Roots as the gateway uses them: absolute, against the workspace, symlinks resolved."""
    return tuple(Path(os.path.realpath(workspace / e)) for e in entries)


def _load(path: Path, files: list[Path], stack: tuple[Path, ...], workspace: Path | None, read: list[bytes]) -> _Layer:
    if path in stack:
        chain = " -> ".join(str(p) for p in (*stack, path))
        raise PolicyError(f"{path}: include cycle: {chain}")
    if len(stack) >= MAX_INCLUDE_DEPTH:
        raise PolicyError(f"{path}: includes nested more than {MAX_INCLUDE_DEPTH} deep")
    files.append(path)
    top, positions, raw = parse_policy_at(path)
    read.append(raw)  # the bytes parsed, in the order of `files`
    own = _own(path, top, positions)
    below: _Layer | None = None
    for inc in top.include:
        lower = _load((path.parent / inc).resolve(), files, (*stack, path), workspace, read)
        below = lower if below is None else _overlay(below, lower, workspace)
    return own if below is None else _overlay(below, own, workspace)


def _own(path: Path, policy: Policy, positions: Positions) -> _Layer:
    data = policy.model_dump(mode="json", exclude_unset=True, exclude={"version", "include", "rules"})
    origins: dict[tuple[str, ...], str] = {}

    def note(node: dict[str, Any], at: tuple[str, ...]) -> None:
        for key, value in node.items():
            line, col = positions.get((*at, key), (1, 1))
            origins[(*at, key)] = f"{path}:{line}:{col}"
            if isinstance(value, dict):
                note(value, (*at, key))

    note(data, ())
    return _Layer(
        path=path,
        data=data,
        rules={r.id: r for r in policy.rules},
        rule_sources={r.id: path for r in policy.rules},
        origins=origins,
        workspace=(path.parent / policy.workspace).resolve() if policy.workspace else None,
        tests=(path.parent / policy.tests).resolve() if policy.tests else None,
        policy=policy,
    )


def _deep_merge(lower: dict[str, Any], upper: dict[str, Any]) -> dict[str, Any]:
    out = dict(lower)
    for key, value in upper.items():
        below = out.get(key)
        out[key] = _deep_merge(below, value) if isinstance(value, dict) and isinstance(below, dict) else value
    return out


def _overlay(lower: _Layer, upper: _Layer, workspace: Path | None) -> _Layer:
    rules = dict(lower.rules)
    for rule_id, rule in upper.rules.items():
        old = rules.get(rule_id)
        if old is not None and old.final:
            raise PolicyError(
                f"{upper.rule_sources[rule_id]}: rule {rule_id!r} is final in {lower.rule_sources[rule_id]} "
                "and cannot be redefined by a later layer"
            )
        rules[rule_id] = rule
    data = _deep_merge(lower.data, upper.data)
    try:
        policy = Policy.model_validate({"version": 1, **data, "rules": list(rules.values())})
    except ValidationError as exc:  # each part was valid on its own; say so if the whole is not
        raise PolicyError(f"{upper.path}: merged over its includes, the policy is invalid: {exc}") from None
    merged = _Layer(
        path=upper.path,
        data=data,
        rules=rules,
        rule_sources={**lower.rule_sources, **upper.rule_sources},
        origins={**lower.origins, **upper.origins},
        workspace=upper.workspace or lower.workspace,
        tests=upper.tests or lower.tests,
        policy=policy,
    )
    problems = _widenings(_as_ceiling(lower, merged), merged, upper, workspace)
    if problems:
        raise PolicyError("\n".join(problems))
    return merged


def _as_ceiling(lower: _Layer, merged: _Layer) -> _Layer:
    """What the upper layer is held to. A lower layer that defines principals is a policy: what
    it allows, defaults included, is what its principals get, so all of it is a ceiling. One
    that defines none is a fragment (shared rules, roles): it grants nobody anything, so only
    what it writes is a ceiling, and the rest is taken from the merge."""
    if lower.policy.principals:
        return lower
    data = _deep_merge(merged.data, lower.data)
    policy = Policy.model_validate({"version": 1, **data, "rules": list(lower.rules.values())})
    return replace(lower, data=data, policy=policy, workspace=lower.workspace or merged.workspace)


# --- what "wider" means, field by field ---------------------------------------------------


@dataclass(frozen=True)
class _Reach:
    """What a role or a principal may do, inheritance folded in (as compile.py and the
    pipeline fold it)."""

    level: int
    read_roots: tuple[Path, ...]
    write_roots: tuple[Path, ...]
    protected: tuple[Path, ...]
    limits: dict[str, int]
    denied: dict[str, frozenset[str]] = field(default_factory=dict)
    """deny_read and deny_write: every entry of the roles (patterns and `!` exceptions)."""


def _closure(policy: Policy, roles: Iterable[str]) -> list[str]:
    """The roles and every role they inherit (unknown names are compile.py's to report)."""
    seen: list[str] = []
    todo = list(roles)
    while todo:
        name = todo.pop()
        if name in seen or name not in policy.roles:
            continue
        seen.append(name)
        todo.extend(policy.roles[name].inherits)
    return seen


def _reach(policy: Policy, held: list[str], workspace: Path) -> _Reach:
    folded = [policy.roles[r] for r in _closure(policy, held)]
    limits: dict[str, int] = {}
    for key, default in LIMIT_DEFAULTS.items():  # pipeline.limits: the largest a held role sets
        values = [v for r in held if r in policy.roles and (v := getattr(policy.roles[r].limits, key)) is not None]
        limits[key] = max(values) if values else default
    return _Reach(
        level=max((r.level for r in folded), default=0),
        read_roots=resolve_roots({e for r in folded for e in r.read_roots}, workspace),
        write_roots=resolve_roots({e for r in folded for e in r.write_roots}, workspace),
        protected=resolve_roots({e for r in folded for e in r.protected}, workspace),
        limits=limits,
        denied={f: frozenset(e for r in folded for e in getattr(r, f)) for f in ("deny_read", "deny_write")},
    )


def _within(path: Path, root: Path) -> bool:
    return path.is_relative_to(root)


def _tool_decision(policy: Policy, tool: Tool, level: int) -> RuleDecision:
    access = policy.tools.get(tool)
    if access is None:
        return RuleDecision.DENY
    if access.allow_from is not None and level >= access.allow_from:
        return RuleDecision.ALLOW
    if access.ask_from is not None and level >= access.ask_from:
        return RuleDecision.ASK
    return RuleDecision.DENY


def _covers(pattern: str, name: str) -> bool:
    """An `environment.allow` entry covers a name or a narrower prefix pattern."""
    if pattern.endswith("*"):
        return name.removesuffix("*").startswith(pattern[:-1])
    return name == pattern


def _widenings(lower: _Layer, merged: _Layer, upper: _Layer, workspace: Path | None) -> list[str]:
    """What `upper` made wider than `lower` allowed, one message per field."""
    lo, hi = lower.policy, merged.policy
    out: list[str] = []

    def wider(field: tuple[str, ...], got: str, ceiling: str, label: str | None = None) -> None:
        out.append(
            f"{_written(upper, field)}: {label or '.'.join(field)}: {got} is wider than {ceiling}, "
            f"{_ceiling(lower, field)}; a layer may only tighten the layers it includes (docs/policy.md, Layering)"
        )

    for got, ceiling in network_widenings(lo.sandbox.network, hi.sandbox.network):
        wider(("sandbox", "network"), got, ceiling)
    for name, secret in hi.secrets.items():  # a brokered credential is power: only a lower layer grants it
        granted = lo.secrets.get(name)
        if granted is None:
            wider(("secrets",), f"the secret {name}", f"{sorted(lo.secrets)}")
        elif extra := [h for h in secret.hosts if h not in granted.hosts]:
            wider(("secrets", name), f"hosts {extra}", f"{granted.hosts}")
    if lo.sandbox.require_landlock and not hi.sandbox.require_landlock:
        wider(("sandbox", "require_landlock"), "false", "true")
    if extra := [e for e in hi.sandbox.etc if e not in lo.sandbox.etc]:
        wider(("sandbox", "etc"), f"showing {extra}", f"{lo.sandbox.etc}")
    if _OPEN[hi.second_opinion.unconfirmed] > _OPEN[lo.second_opinion.unconfirmed]:
        was, now = lo.second_opinion.unconfirmed, hi.second_opinion.unconfirmed
        wider(("second_opinion", "unconfirmed"), repr(now.value), repr(was.value))
    offered = [*lo.shells, *(s for s in lo.shells_available if s not in lo.shells)]  # what an upper layer may enable
    if extra := [s for s in hi.shells if s not in offered]:
        wider(("shells",), f"{extra}", f"{offered}")
    if extra := [s for s in hi.shells_available if s not in offered]:
        wider(("shells_available",), f"{extra}", f"{offered}")
    if extra := [n for n in hi.environment.allow if not any(_covers(p, n) for p in lo.environment.allow)]:
        wider(("environment", "allow"), f"{extra}", f"{lo.environment.allow}")
    if hi.fleet.max_policy_age_seconds > lo.fleet.max_policy_age_seconds:
        age, limit = hi.fleet.max_policy_age_seconds, lo.fleet.max_policy_age_seconds
        wider(("fleet", "max_policy_age_seconds"), f"{age}", f"{limit}")
    if dropped := [p for p in lo.audit.redact if p not in hi.audit.redact]:
        wider(("audit", "redact"), f"dropping {dropped}", f"{lo.audit.redact}")
    for tool in Tool:
        for level in range(101):
            was, now = _tool_decision(lo, tool, level), _tool_decision(hi, tool, level)
            if _OPEN[now] > _OPEN[was]:
                wider(("tools", tool.value), f"{now.value} at level {level}", f"{was.value}")
                break

    for name, role in hi.roles.items():  # a role's own network narrows the sandbox's, and what it had
        if role.network is None:
            continue
        had = lo.roles[name].network if name in lo.roles and lo.roles[name].network is not None else None
        for ceiling_setting in (hi.sandbox.network, had):
            if ceiling_setting is None:
                continue
            for got, ceiling in network_widenings(ceiling_setting, role.network):
                wider(("roles", name, "network"), got, ceiling)
    lo_ws = _workspace(lower, workspace)
    hi_ws = _workspace(merged, workspace)
    _upstream_widenings(lo, hi, lo_ws, hi_ws, wider)
    # roots resolve against the workspace: say so when this layer moved it
    moved = "" if lo_ws == hi_ws else f" (roots resolve against the workspace, which this layer makes {hi_ws})"
    before = len(out)
    for name, role in lo.roles.items():
        inherits = hi.roles[name].inherits
        note = moved + (f" (it now inherits {inherits})" if inherits != role.inherits else "")
        _reach_widenings(("roles", name), _reach(lo, [name], lo_ws), _reach(hi, [name], hi_ws), wider, note=note)
    if len(out) == before:  # a principal widened by a role already reported would say it twice
        for name, principal in lo.principals.items():
            held = hi.principals[name].roles
            _reach_widenings(
                ("principals", name),
                _reach(lo, principal.roles, lo_ws),
                _reach(hi, held, hi_ws),
                wider,
                f"principals.{name} (roles {held}, inherited ones included)",
                moved,
            )
    return out


Wider = Callable[[tuple[str, ...], str, str, str | None], None]

_UPSTREAM_SAME = ("command", "url", "env_from", "headers_from", "prefix")
"""What an upper layer may not change about an upstream a lower layer runs: which server it is,
and which of the gateway's credentials it gets."""
_UPSTREAM_CAPS = {"timeout_ms": None, "connect_timeout_ms": None, "result_bytes": None,
                  "memory_bytes": LIMIT_DEFAULTS["memory_bytes"], "pids": LIMIT_DEFAULTS["pids"]}  # fmt: skip
"""Upstream settings an upper layer may lower and never raise (None: the field has a default)."""


def _upstream_widenings(lo: Policy, hi: Policy, lo_ws: Path, hi_ws: Path, wider: Callable[..., None]) -> None:
    """An upper layer runs no upstream the lower layers do not, and changes none of theirs but
    to tighten it: the same server and credentials, roots within theirs, no network they do not
    give, no higher limit, the injection flag and identity forwarding kept."""
    for name, up in hi.upstreams.items():
        was = lo.upstreams.get(name)
        if was is None:
            wider(("upstreams", name), "running it", f"the upstreams {sorted(lo.upstreams)}", f"upstreams.{name}")
            continue
        for key in _UPSTREAM_SAME:
            if getattr(up, key) != getattr(was, key):
                wider(("upstreams", name, key), repr(getattr(up, key)), f"{getattr(was, key)!r} (it may not change)")
        was_write = resolve_roots(was.write_roots, lo_ws)
        for root in resolve_roots(up.write_roots, hi_ws):
            if not any(_within(root, r) for r in was_write):
                wider(("upstreams", name, "write_roots"), f"writing {root}", f"{[str(r) for r in was_write]}")
        was_read = (*resolve_roots(was.read_roots, lo_ws), *was_write)
        for root in resolve_roots(up.read_roots, hi_ws):
            if not any(_within(root, r) for r in was_read):
                wider(("upstreams", name, "read_roots"), f"reading {root}", f"{[str(r) for r in was_read]}")
        if up.network and not was.network:
            wider(("upstreams", name, "network"), "true", "false")
        if was.injection_flag and not up.injection_flag:
            wider(("upstreams", name, "injection_flag"), "false", "true")
        if was.forward_identity and not up.forward_identity:  # the server's own record of who asked
            wider(("upstreams", name, "forward_identity"), "false", "true")
        for key, default in _UPSTREAM_CAPS.items():
            now, before = getattr(up, key), getattr(was, key)
            now, before = (default if now is None else now), (default if before is None else before)
            if now is not None and before is not None and now > before:
                wider(("upstreams", name, key), str(now), str(before))


def _reach_widenings(
    field: tuple[str, ...], was: _Reach, now: _Reach, wider: Wider, label: str | None = None, note: str = ""
) -> None:
    def say(sub: tuple[str, ...], got: str, ceiling: str) -> None:
        where = field if label else (*field, *sub)
        wider(where, got, ceiling, f"{label}: {'.'.join(sub)}{note}" if label else f"{'.'.join(where)}{note}")

    if now.level > was.level:
        say(("level",), str(now.level), str(was.level))
    readable = (*was.read_roots, *was.write_roots)
    for root in now.write_roots:
        if not any(_within(root, r) for r in was.write_roots):
            say(("write_roots",), f"writing {root}", f"the write roots {[str(r) for r in was.write_roots]}")
    for root in now.read_roots:
        if not any(_within(root, r) for r in readable):
            say(("read_roots",), f"reading {root}", f"the read and write roots {[str(r) for r in readable]}")
    for p in was.protected:
        for root in now.write_roots:
            if not (_within(root, p) or _within(p, root)):
                continue
            deeper = root if _within(root, p) else p
            if not any(_within(deeper, q) for q in now.protected):
                say(("protected",), f"leaving {deeper} writable", f"protecting {p}")
    for key, value in now.limits.items():
        if value > was.limits[key]:
            say(("limits", key), str(value), str(was.limits[key]))
    for name, lower in was.denied.items():  # a pattern dropped, or an exception added, reads more
        upper = now.denied.get(name, frozenset())
        if dropped := sorted(e for e in lower - upper if not e.startswith("!")):
            say((name,), f"dropping {dropped}", f"{sorted(lower)}")
        if excepted := sorted(e for e in upper - lower if e.startswith("!")):
            say((name,), f"the exceptions {excepted}", f"{sorted(lower)}")


def _workspace(layer: _Layer, override: Path | None) -> Path:
    # as compile.load_policy picks it
    return Path(override or layer.workspace or Path.cwd() / "workspace").expanduser().resolve()


def _written(upper: _Layer, field: tuple[str, ...]) -> str:
    """Where the upper layer wrote a field (or the closest thing it wrote that holds it)."""
    for n in range(len(field), 0, -1):
        if field[:n] in upper.origins:
            return upper.origins[field[:n]]
    return str(upper.path)


def _ceiling(lower: _Layer, field: tuple[str, ...]) -> str:
    """Where the ceiling comes from in the lower layers."""
    if field in lower.origins:
        return f"set at {lower.origins[field]}"
    for n in range(len(field) - 1, 0, -1):
        if field[:n] in lower.origins:
            return f"the default under {'.'.join(field[:n])} at {lower.origins[field[:n]]}"
    return f"the default in {lower.path}, which does not set it"


def network_widenings(lo: bool | NetworkSettings, hi: bool | NetworkSettings) -> list[tuple[str, str]]:
    """How `hi` reaches more of the network than `lo` allowed: (what, the lower bound) each."""
    if lo is True or hi is False:
        return []
    if lo is False:
        return [("true (commands reach the network)" if hi is True else "a network policy (hosts)", "false")]
    if hi is True:
        return [("true (every host)", "a network policy (hosts)")]
    assert isinstance(lo, NetworkSettings) and isinstance(hi, NetworkSettings)
    out: list[tuple[str, str]] = []
    if extra := [str(p) for p in hi.presets if p not in lo.presets]:
        out.append((f"presets {extra}", f"presets {lo.presets}"))
    lo_allow = [parse_pattern(p, "allow") for p in lo.allow]
    lo_ask = [parse_pattern(p, "ask") for p in lo.ask]
    if extra := [p for p in hi.allow if not any(c.covers(parse_pattern(p, "allow")) for c in lo_allow)]:
        out.append((f"allowing {extra}", f"allow {lo.allow}"))
    if extra := [p for p in hi.ask if not any(c.covers(parse_pattern(p, "ask")) for c in (*lo_allow, *lo_ask))]:
        out.append((f"asking about {extra}", f"allow {lo.allow} and ask {lo.ask}"))
    hi_deny = [parse_pattern(p, "deny") for p in hi.deny]
    if dropped := [p for p in lo.deny if not any(c.covers(parse_pattern(p, "deny")) for c in hi_deny)]:
        out.append((f"dropping deny {dropped}", f"deny {lo.deny}"))
    if hi.max_connections > lo.max_connections:
        out.append((f"max_connections {hi.max_connections}", f"{lo.max_connections}"))
    if hi.max_bytes > lo.max_bytes:
        out.append((f"max_bytes {hi.max_bytes}", f"{lo.max_bytes}"))
    kept = {i.host: i for i in hi.intercept}
    for i in lo.intercept:  # an intercepted host's request rules stay at least as strict
        now = kept.get(i.host)
        if now is None or (i.read_only and not now.read_only) or (i.paths and not set(now.paths) <= set(i.paths)):
            out.append((f"intercept of {i.host} relaxed or dropped", f"{i.model_dump()}"))
    return out
