"""Compile a layered policy into what the decision stages use.

- Roles are resolved (inheritance, levels, roots made absolute against the workspace).
- casbin decides who may use what: every rule and every tool-family decision is a permission
  (`rule:<id>`, `tool:<tool>:allow|ask`) granted to the roles whose level reaches it, and
  principals and inheriting roles are casbin groupings (policies/model.conf).
- Rules are indexed by program, so the cost of a decision does not grow with the rule count:
  only the rules naming the command's program are looked at, and casbin answers are memoised per
  (principal, permission) until the policy is reloaded.

`Casbin` wraps the enforcer so it can never answer "allowed" because it is disabled, empty or
misloaded (pycasbin's `enforce` returns True when disabled), and serialises access to it
(concurrent `enforce` calls raised SystemError / IndexError, ../shared/notes/dependencies.md).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import casbin

from gateway import programs
from gateway.policy.layers import load_layers, network_widenings, resolve_roots
from gateway.policy.loader import PolicyError, UnknownPrincipal
from gateway.policy.schema import NetworkSettings, Policy, Rule, RuleDecision, Tool
from gateway.sandbox import egress as _egress
from gateway.sandbox.egress.presets import PresetError
from gateway.sandbox.egress.rules import Egress, PatternError
from gateway.sandbox.masks import Patterns
from gateway.sandbox.plan import RUNTIME as _RUNTIME
from gateway.stages.decision_cache import DecisionCache

MODEL_PATH = Path(__file__).resolve().parent.parent.parent / "policies" / "model.conf"
MAX_ROLE_DEPTH = 10  # casbin's role hierarchy limit; deeper chains would silently deny


class CasbinError(Exception):
    """The enforcer is unusable. Callers turn this into a denial."""


class Casbin:
    """The enforcer behind a lock, with a memo and fail-closed checks."""

    _CANARY = ("\x00no-such-principal", "\x00no-such-permission")

    def __init__(self, policies: list[list[str]], groupings: list[list[str]]) -> None:
        if not MODEL_PATH.is_file():
            raise PolicyError(f"casbin model not found at {MODEL_PATH}")
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, str], bool] = {}
        self._enforcer = casbin.Enforcer(str(MODEL_PATH))
        if policies:
            self._enforcer.add_policies(policies)
        if groupings:
            self._enforcer.add_grouping_policies(groupings)
        self.size = len(policies)
        if self._enforcer.enforce(*self._CANARY):
            raise PolicyError("casbin allows an unknown principal: the model is misloaded")

    @property
    def enforcing(self) -> bool:
        """False once the enforcer has been disabled: nothing decided before may be served then."""
        return self._enforcer.enabled is True

    def allows(self, principal: str, permission: str) -> bool:
        key = (principal, permission)
        with self._lock:
            if key in self._memo:
                return self._memo[key]
            if self._enforcer.enabled is not True:
                raise CasbinError("the casbin enforcer is disabled")
            if self.size == 0:
                return False  # nothing granted: nothing allowed
            try:
                allowed = bool(self._enforcer.enforce(principal, permission))
            except Exception as exc:
                raise CasbinError(f"casbin failed: {type(exc).__name__}: {exc}") from exc
            self._memo[key] = allowed
            return allowed


@dataclass(frozen=True)
class ResolvedRole:
    name: str
    level: int
    read_roots: tuple[Path, ...]
    write_roots: tuple[Path, ...]
    protected: tuple[Path, ...]


@dataclass(frozen=True)
class Grant:
    """What a principal has, all roles and inheritance folded in."""

    principal: str
    level: int
    read_roots: tuple[Path, ...]
    write_roots: tuple[Path, ...]
    protected: tuple[Path, ...]
    private: tuple[Path, ...] = ()
    """The gateway's own records (audit log, keys, tokens, state): never read or written, whatever
    the roots say. Set by the gateway on the grant it hands an executor that opens files itself."""
    unseen: tuple[Path, ...] = ()
    """Host directories the sandbox hides although a wide root covers them (/home, /run,
    /var/tmp, host /tmp...: sandbox.plan.unseen): an executor that opens files itself refuses
    them too, so it sees what a command sees. Set by the gateway, like `private`."""
    outputs: Path | None = None
    """The principal's own saved outputs (gateway/tools/run.py), inside the gateway's state: may
    be read although `private` holds them. Set by the files tool for reads."""
    path: tuple[Path, ...] = ()
    """Directories the sandbox's PATH adds after the system ones (read-only: checked at load)."""
    deny_read: Patterns | None = None
    """Paths never read nor written, whatever the roots say (roles' `deny_read`, all of them)."""
    deny_write: Patterns | None = None
    """Paths never written (roles' `deny_write`)."""


@dataclass(frozen=True)
class CompiledPolicy:
    source: Path
    policy: Policy
    sha256: str
    workspace: Path
    home: Path | None
    tests: Path | None
    files: tuple[Path, ...]  # the policy file and every file it includes
    rules: dict[str, Rule]
    by_program: dict[str, tuple[Rule, ...]]
    grants: dict[str, Grant]
    casbin: Casbin
    egress: Egress | None = None
    """`sandbox.network` as a mapping, compiled (presets resolved when the policy loaded)."""
    networks: dict[str, tuple[bool, Egress | None]] = field(default_factory=dict)
    """Principal -> (everything, hosts) where its roles set their own `network`."""

    def network_of(self, principal: str) -> tuple[bool, Egress | None]:
        """What the principal's sandboxes reach: (True, None) everything; (False, Egress) the
        hosts of a network policy; (False, None) nothing."""
        if principal in self.networks:
            return self.networks[principal]
        return self.policy.sandbox.network is True, self.egress

    # decisions made under this policy (pipeline.evaluate): a reloaded policy starts empty
    decisions: DecisionCache = field(default_factory=DecisionCache, init=False, compare=False, repr=False)
    tool_rules: tuple[Rule, ...] = ()
    """The rules naming upstream MCP tools (`tool:`), in policy order (docs/upstream.md)."""

    def grant(self, principal: str) -> Grant:
        found = self.grants.get(principal)
        if found is None:
            known = ", ".join(sorted(self.grants)) or "none"
            raise UnknownPrincipal(f"unknown principal {principal!r} (the policy defines: {known})")
        return found

    def may_use(self, principal: str, rule: Rule) -> bool:
        return self.casbin.allows(principal, f"rule:{rule.id}")

    def tool_decision(self, principal: str, tool: Tool) -> RuleDecision:
        if self.casbin.allows(principal, f"tool:{tool.value}:allow"):
            return RuleDecision.ALLOW
        if self.casbin.allows(principal, f"tool:{tool.value}:ask"):
            return RuleDecision.ASK
        return RuleDecision.DENY


def load_policy(path: Path, workspace: Path | None = None) -> CompiledPolicy:
    """Read, merge, validate and compile a policy (its inline examples are checked by
    `selftest.check_examples`, which `load_checked` runs)."""
    layered = load_layers(path, workspace)
    ws = workspace or layered.workspace or Path.cwd() / "workspace"
    # the digest of the bytes that were parsed, never of the files read again: a save between
    # the two reads made decisions name a policy that never decided anything
    return compile_policy(layered.policy, path, ws, layered.sha256, layered.tests, layered.files)


def compile_policy(
    policy: Policy,
    source: Path,
    workspace: Path,
    sha256: str = "",
    tests: Path | None = None,
    files: tuple[Path, ...] = (),
) -> CompiledPolicy:
    try:  # a broken program model stops the policy from loading, like a broken rule
        programs.models()
    except programs.ProgramModelError as exc:
        raise PolicyError(f"{source}: the program models (gateway/programs/) do not load:\n{exc}") from None
    ws = Path(workspace).expanduser().resolve()
    home = (ws / policy.home).resolve() if policy.home else None
    roles = _resolve_roles(policy, ws, source)
    grants: dict[str, Grant] = {}
    groupings: list[list[str]] = []
    for name, principal in policy.principals.items():
        missing = [r for r in principal.roles if r not in roles]
        if missing:
            raise PolicyError(f"{source}: principals.{name}.roles: unknown role {missing[0]!r}")
        held = [roles[r] for r in principal.roles]
        # a principal's roots and level fold in every inherited role
        closure = {r for role in principal.roles for r in _ancestors(policy, role)}
        folded = [roles[r] for r in closure] or held
        grants[name] = Grant(
            principal=name,
            level=max(r.level for r in folded),
            read_roots=tuple(sorted({p for r in folded for p in r.read_roots})),
            write_roots=tuple(sorted({p for r in folded for p in r.write_roots})),
            protected=tuple(sorted({p for r in folded for p in r.protected})),
        )
        deny_read, deny_write = _secrets(policy, closure, grants[name], ws, source)
        grants[name] = replace(
            grants[name],
            path=_tool_path(policy, closure, grants[name], ws, source),
            deny_read=deny_read,
            deny_write=deny_write,
        )
        groupings.extend([name, f"role:{r}"] for r in principal.roles)
    for name, role in policy.roles.items():
        groupings.extend([f"role:{name}", f"role:{parent}"] for parent in role.inherits)
    # a permission is granted to every role whose own level reaches it; principals reach it
    # through their roles and the roles those inherit
    policies: list[list[str]] = []
    for rule in policy.rules:
        policies.extend([f"role:{name}", f"rule:{rule.id}"] for name, r in roles.items() if r.level >= rule.min_level)
    for tool, access in policy.tools.items():
        for name, r in roles.items():
            if access.allow_from is not None and r.level >= access.allow_from:
                policies.append([f"role:{name}", f"tool:{tool.value}:allow"])
            if access.ask_from is not None and r.level >= access.ask_from:
                policies.append([f"role:{name}", f"tool:{tool.value}:ask"])
    _check_upstreams(policy, source)
    by_program: dict[str, list[Rule]] = {}
    for rule in policy.rules:
        for program in rule.programs:
            by_program.setdefault(program, []).append(rule)
    _secrets_unseen(policy, grants, source)
    egress = _network(policy, policy.sandbox.network, source)
    return CompiledPolicy(
        source=source,
        policy=policy,
        sha256=sha256,
        workspace=ws,
        home=home,
        tests=tests,
        files=files or (source,),
        rules={r.id: r for r in policy.rules},
        by_program={k: tuple(v) for k, v in by_program.items()},
        grants=grants,
        casbin=Casbin(policies, groupings),
        egress=egress,
        networks=_role_networks(policy, source),
        tool_rules=tuple(r for r in policy.rules if r.tool is not None),
    )


def _secrets_unseen(policy: Policy, grants: dict[str, Grant], source: Path) -> None:
    """A brokered secret's file must lie where no sandbox and no files tool can read it."""
    for name, secret in policy.secrets.items():
        if secret.file is None:
            continue
        path = Path(os.path.realpath(source.parent / secret.file))
        for grant in grants.values():
            for root in (*grant.read_roots, *grant.write_roots):
                if path == root or root in path.parents:
                    raise PolicyError(
                        f"{source}: secrets.{name}.file: {path} lies in {grant.principal}'s root {root}: a command "
                        "could read the secret itself; keep it where no root reaches"
                    )


def _role_networks(policy: Policy, source: Path) -> dict[str, tuple[bool, Egress | None]]:
    """Each principal whose roles (inherited ones included) set their own `network`: the one
    they set, checked to narrow `sandbox.network` as a layer must."""
    out: dict[str, tuple[bool, Egress | None]] = {}
    compiled: dict[str, tuple[bool, Egress | None]] = {}
    for name, principal in policy.principals.items():
        closure = sorted({r for role in principal.roles for r in _ancestors(policy, role)})
        settings: dict[str, bool | NetworkSettings] = {}
        for r in closure:
            own = policy.roles[r].network
            if own is not None:
                settings[r] = own
        if not settings:
            continue
        distinct = {json.dumps(s if isinstance(s, bool) else s.model_dump(), sort_keys=True) for s in settings.values()}
        if len(distinct) > 1:
            raise PolicyError(
                f"{source}: principals.{name}: its roles {sorted(settings)} set different networks: give it one"
            )
        role, setting = next(iter(settings.items()))
        wider = network_widenings(policy.sandbox.network, setting)
        if wider:
            got, ceiling = wider[0]
            raise PolicyError(
                f"{source}: roles.{role}.network: {got} is wider than sandbox.network ({ceiling}); a role may only "
                "narrow it"
            )
        key = next(iter(distinct))
        if key not in compiled:
            compiled[key] = (setting is True, _network(policy, setting, source))
        out[name] = compiled[key]
    return out


def _network(policy: Policy, setting: bool | NetworkSettings, source: Path) -> Egress | None:
    """`sandbox.network` (or a role's `network`) as a mapping, compiled; presets read from this
    machine's pip, npm and apt configuration now (a preset that cannot be read is a load error,
    naming it); brokered secrets read from the gateway's environment or their files now."""
    if not isinstance(setting, NetworkSettings):
        if policy.secrets and setting is policy.sandbox.network:
            raise PolicyError(f"{source}: secrets: brokered secrets need sandbox.network as a mapping of hosts")
        return None
    brokered = []
    for name, secret in policy.secrets.items():
        if secret.env is not None:
            value = os.environ.get(secret.env)
            if not value:
                raise PolicyError(f"{source}: secrets.{name}.env: the gateway's environment has no {secret.env}")
        else:
            path = (source.parent / str(secret.file)).resolve()
            try:
                value = path.read_text().strip()
            except OSError as exc:
                raise PolicyError(f"{source}: secrets.{name}.file: {path} cannot be read: {exc.strerror}") from None
        brokered.append((name, secret.hosts, value))
    try:
        return _egress.build(
            presets=setting.presets, allow=setting.allow, ask=setting.ask, deny=setting.deny,
            max_connections=setting.max_connections, max_bytes=setting.max_bytes,
            intercept=[(i.host, i.read_only, i.paths) for i in setting.intercept], secrets=brokered,
        )  # fmt: skip
    except (PatternError, PresetError) as exc:
        raise PolicyError(f"{source}: sandbox.network: {exc}") from None


def _check_upstreams(policy: Policy, source: Path) -> None:
    """What only the merged policy can say about `upstreams` and the rules naming their tools."""
    owner: dict[str, str] = {}
    for name, upstream in policy.upstreams.items():
        problem = upstream.problem()
        if problem:
            raise PolicyError(f"{source}: upstreams.{name}: {problem}")
        prefix = upstream.prefix or name
        if prefix in owner:
            raise PolicyError(f"{source}: upstreams.{name}: its tools' prefix {prefix!r} is also {owner[prefix]}'s")
        owner[prefix] = name
        if upstream.network and policy.sandbox.network is False:
            raise PolicyError(
                f"{source}: upstreams.{name}.network: true needs a network in sandbox.network (true, or a "
                "mapping of hosts, which the upstream's sandbox then reaches through the gateway's proxy)"
            )
    for rule in policy.rules:
        if rule.tool is None:
            continue
        named = rule.tool.split(".", 1)[0]
        if not any(c in named for c in "*?[") and named not in policy.upstreams:
            known = ", ".join(sorted(policy.upstreams)) or "none"
            raise PolicyError(f"{source}: rules {rule.id!r}: tool {rule.tool!r} names no upstream (defined: {known})")


def _tool_path(policy: Policy, roles: set[str], grant: Grant, ws: Path, source: Path) -> tuple[Path, ...]:
    """The PATH directories of a principal's roles (policy order), each checked read-only: in
    the system runtime, or in a read root and in no write root."""
    out: list[Path] = []
    for name, role in policy.roles.items():
        if name not in roles:
            continue
        for entry in role.path:
            real = Path(os.path.realpath(ws / entry))
            where = f"{source}: roles.{name}.path: {entry!r} ({real})"
            if ":" in str(real):
                raise PolicyError(f"{where}: a PATH directory cannot hold ':'")
            writable = [w for w in grant.write_roots if real == w or w in real.parents]
            if writable:
                raise PolicyError(
                    f"{where} lies inside the write root {writable[0]} of {grant.principal}: tool directories "
                    "must be read-only, or the agent could plant programs there"
                )
            runtime = any(real == Path(r) or Path(r) in real.parents for r in _RUNTIME if not os.path.islink(r))
            readable = any(real == r or r in real.parents for r in grant.read_roots)
            if not (runtime or readable):
                raise PolicyError(
                    f"{where} is neither in the system runtime {list(_RUNTIME)} nor in the read roots "
                    f"{[str(r) for r in grant.read_roots]} of {grant.principal}"
                )
            if real not in out:
                out.append(real)
    return tuple(out)


def _secrets(
    policy: Policy, roles: set[str], grant: Grant, ws: Path, source: Path
) -> tuple[Patterns | None, Patterns | None]:
    """The principal's deny_read and deny_write patterns (every role's, inherited ones too). A
    root that a deny_read pattern denies whole is refused: nothing in it could be read."""
    out: dict[str, Patterns | None] = {}
    for field_name in ("deny_read", "deny_write"):
        entries = [e for name, role in policy.roles.items() if name in roles for e in getattr(role, field_name)]
        try:
            out[field_name] = Patterns.compile(entries, ws)
        except ValueError as exc:
            raise PolicyError(f"{source}: roles (of {grant.principal}).{field_name}: {exc}") from None
    denied = out["deny_read"]
    if denied is not None:
        for root in (*grant.read_roots, *grant.write_roots):
            hit = denied.match(str(root))
            if hit is not None:
                raise PolicyError(
                    f"{source}: the root {root} of {grant.principal} matches its deny_read pattern {hit!r}: nothing "
                    "in it could be read; narrow the pattern (a path: `dir/name`) or move the root"
                )
    return denied, out["deny_write"]


def _ancestors(policy: Policy, role: str, depth: int = 0) -> set[str]:
    if depth > MAX_ROLE_DEPTH:
        raise PolicyError(f"role {role!r}: inheritance deeper than {MAX_ROLE_DEPTH} (or a cycle)")
    out = {role}
    for parent in policy.roles[role].inherits:
        out |= _ancestors(policy, parent, depth + 1)
    return out


def _resolve_roles(policy: Policy, ws: Path, source: Path) -> dict[str, ResolvedRole]:
    out: dict[str, ResolvedRole] = {}
    for name, role in policy.roles.items():
        for parent in role.inherits:
            if parent not in policy.roles:
                raise PolicyError(f"{source}: roles.{name}.inherits: unknown role {parent!r}")
        _ancestors(policy, name)  # raises on cycles and depth
        out[name] = ResolvedRole(
            name=name,
            level=role.level,
            read_roots=_paths(role.read_roots, ws),
            write_roots=_paths(role.write_roots, ws),
            protected=_paths(role.protected, ws),
        )
    return out


def _paths(entries: list[str], ws: Path) -> tuple[Path, ...]:
    return resolve_roots(entries, ws)
