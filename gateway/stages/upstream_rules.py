"""Deciding a call to an upstream MCP tool: pure, like `gateway.decide.evaluate` (the only I/O is
resolving the paths of `path` conditions).

Stages, each able only to make the verdict stricter:

    upstream   the upstream is one the policy defines
    tool       may this principal call upstream tools at all (`tools: {upstream: ...}`, casbin)
    rules      the rules naming the tool (`tool:` globs over `UPSTREAM.TOOL`) that the principal
               may use and whose every argument condition holds; the strictest decides, and no
               matching rule is a denial naming each condition that failed
    pathjail   each `path` condition's value inside the principal's roots (in the rules stage:
               a path outside them makes the condition fail)

What the gateway cannot decide (a value it cannot read, a broken stage) is a denial.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from functools import lru_cache
from pathlib import Path
from typing import Any

from gateway.decision import Decision, Reason, Verdict
from gateway.policy.compile import CompiledPolicy, Grant
from gateway.policy.schema import Rule, Tool
from gateway.policy.upstreams import ArgumentCondition
from gateway.regex import safe_regex
from gateway.sandbox import plan as sandbox_plan
from gateway.stages.pathjail import PathRefused, check_path, real_path

STAGE = "rules"
STATE_STAGE = "upstream_state"
"""The reasons of a denial by the upstream's state (not offered, not pinned, changed,
unreachable: gateway/tools/upstream.py): facts of the moment, which a replay under a draft keeps
as they were."""
MAX_SHOWN = 80
"""Characters of an argument's value quoted in a reason."""


# --- JSON pointers (RFC 6901) ---------------------------------------------------------------
def _tokens(pointer: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]] if pointer else []


def _index(token: str, size: int) -> int | None:
    """An array index token (`0`, `12`; not `01`, `-1`, `-`), or None."""
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        return None
    n = int(token)
    return n if n < size else None


def pointer_get(document: Any, pointer: str) -> tuple[bool, Any]:
    """(found, value) of `pointer` in `document`."""
    value = document
    for token in _tokens(pointer):
        if isinstance(value, dict):
            if token not in value:
                return False, None
            value = value[token]
        elif isinstance(value, list):
            i = _index(token, len(value))
            if i is None:
                return False, None
            value = value[i]
        else:
            return False, None
    return True, value


def pointer_set(document: Any, pointer: str, new: Any) -> Any:
    """A copy of `document` with the value at `pointer` (which exists) replaced by `new`."""
    tokens = _tokens(pointer)
    if not tokens:
        return new
    head, rest = tokens[0], "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens[1:])
    if isinstance(document, dict):
        return {**document, head: pointer_set(document[head], rest, new)}
    out = list(document)
    i = int(head)
    out[i] = pointer_set(out[i], rest, new)
    return out


# --- conditions ------------------------------------------------------------------------------
def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _same_json(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return safe_regex(pattern)


class _Lazy:
    """The path jail, made only when a `path` condition needs it (it reads the host)."""

    def __init__(self, make: Callable[[], PathJail]) -> None:
        self._make = make
        self._jail: PathJail | None = None

    def resolve(self, value: str, access: str, who: str) -> str:
        if self._jail is None:
            self._jail = self._make()
        return self._jail.resolve(value, access, who)


@dataclass(frozen=True)
class PathJail:
    """How `path` conditions resolve and check a value: for `principal` under `policy`, with the
    gateway's own directories (`private`) refused whatever the roots say."""

    policy: CompiledPolicy
    grant: Grant

    def resolve(self, value: str, access: str, who: str) -> str:
        """The real, absolute path `value` names, checked for `access`. Raises PathRefused."""
        if "\0" in value:
            raise PathRefused("nul_byte", f"{who}: a path cannot hold a NUL byte")
        if value.startswith("~"):
            head, _, rest = value.partition("/")
            if head != "~":
                raise PathRefused("tilde_user", f"{who}: {value!r}: only ~ (the policy's home) is understood")
            if self.policy.home is None:
                raise PathRefused("tilde_without_home", f"{who}: {value!r}: the policy sets no home for ~")
            path = self.policy.home / rest if rest else self.policy.home
        else:
            path = Path(value) if os.path.isabs(value) else self.policy.workspace / value
        real = real_path(str(path))
        check_path(real, access, self.grant, who)
        return real


def check_condition(
    cond: ArgumentCondition, arguments: dict[str, Any], jail: PathJail | _Lazy | None, who: str
) -> tuple[str | None, str | None]:
    """(why the condition fails or None, the checked absolute path of a `path` condition). Without
    a `jail` (a policy's examples) a path condition only needs a string."""
    found, value = pointer_get(arguments, cond.at)
    at = cond.at or "(the arguments)"
    if not found:
        return (None, None) if not cond.required else (f"{at} is missing", None)
    if cond.checks_equals and not _same_json(value, cond.equals):
        return f"{at} must equal {_shown(cond.equals)} (got {_shown(value)})", None
    if cond.one_of is not None and not any(_same_json(value, v) for v in cond.one_of):
        return f"{at} must be one of {_shown(cond.one_of)} (got {_shown(value)})", None
    if cond.regex is not None:
        if not isinstance(value, str):
            return f"{at} must be a string matching {cond.regex!r} (got {_shown(value)})", None
        if _compiled(cond.regex).fullmatch(value) is None:
            return f"{at} must match {cond.regex!r} (got {_shown(value)})", None
    if cond.max_length is not None:
        if not isinstance(value, str | list):
            return f"{at} must be a string or a list of at most {cond.max_length} (got {_shown(value)})", None
        if len(value) > cond.max_length:
            unit = "characters" if isinstance(value, str) else "items"
            return f"{at} has {len(value)} {unit}, more than {cond.max_length}", None
    if cond.path is not None:
        if not isinstance(value, str) or not value:
            return f"{at} must be a path (got {_shown(value)})", None
        if jail is None:
            return None, None
        try:
            return None, jail.resolve(value, cond.path, f"{who} {at}")
        except PathRefused as exc:
            return exc.message, None
    return None, None


def rule_matches(
    rule: Rule, arguments: dict[str, Any], jail: PathJail | _Lazy | None, who: str
) -> tuple[list[str], dict[str, str]]:
    """(the conditions that failed, the checked paths by pointer): the rule matches when the
    first is empty."""
    failed: list[str] = []
    paths: dict[str, str] = {}
    for cond in rule.arguments:
        why, path = check_condition(cond, arguments, jail, who)
        if why is not None:
            failed.append(why)
        elif path is not None:
            paths[cond.at] = path
    return failed, paths


# --- the decision ------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpstreamDecision:
    decision: Decision
    arguments: dict[str, Any]
    """The arguments to forward: the call's, with each checked path made the absolute path the
    jail checked (what was decided is what the upstream gets)."""


def qualified(upstream: str, tool: str) -> str:
    """How rules name a tool: `UPSTREAM.TOOL`."""
    return f"{upstream}.{tool}"


def family_decision(policy: CompiledPolicy, principal: str) -> Decision:
    """May `principal` call upstream tools at all (`tools: {upstream: ...}`)."""
    verdict = Verdict.parse(policy.tool_decision(principal, Tool.UPSTREAM).value)
    if verdict is Verdict.ALLOW:
        return Decision(Verdict.ALLOW, None, ())
    level = policy.grant(principal).level
    if verdict is Verdict.ASK:
        message = f"upstream tools ask a supervisor for {principal} (level {level}; the policy's tools section)"
    else:
        message = f"{principal} (level {level}) may not call upstream tools (the policy's tools section)"
    return Decision(verdict, None, (Reason("tool", f"tool_{verdict.label}", message),))


def jail_for(policy: CompiledPolicy, principal: str, private: tuple[Path, ...]) -> PathJail:
    """The path jail of `principal`'s path conditions: its roots, never the gateway's own records
    (`private`), nor what the sandbox hides from commands under a wide root."""
    grant = policy.grant(principal)
    roots = [str(r) for r in (*grant.read_roots, *grant.write_roots)]
    seen = replace(grant, private=private, unseen=tuple(Path(p) for p in sandbox_plan.unseen(roots)))
    return PathJail(policy, seen)


def decide(
    policy: CompiledPolicy,
    principal: str,
    upstream: str,
    tool: str,
    arguments: dict[str, Any],
    private: tuple[Path, ...] = (),
) -> UpstreamDecision:
    """The decision on `principal` calling `tool` of `upstream` with `arguments`. Raises
    UnknownPrincipal (the caller's to report); any other failure is a denial."""
    policy.grant(principal)
    name = qualified(upstream, tool)
    try:
        if upstream not in policy.policy.upstreams:
            known = ", ".join(sorted(policy.policy.upstreams)) or "none"
            reason = Reason("upstream", "unknown_upstream", f"{name}: no upstream {upstream!r} (defined: {known})")
            return UpstreamDecision(Decision(Verdict.DENY, None, (reason,)), arguments)
        family = family_decision(policy, principal)
        if family.verdict is Verdict.DENY:
            return UpstreamDecision(family, arguments)
        jail = _Lazy(lambda: jail_for(policy, principal, private))
        matched: list[tuple[Rule, dict[str, str]]] = []
        misses: list[str] = []
        for rule in policy.tool_rules:
            assert rule.tool is not None
            if not fnmatchcase(name, rule.tool):
                continue
            if not policy.may_use(principal, rule):
                misses.append(f"rule {rule.id} needs level {rule.min_level}")
                continue
            failed, paths = rule_matches(rule, arguments, jail, name)
            if failed:
                misses.append(f"rule {rule.id}: {'; '.join(failed)}")
            else:
                matched.append((rule, paths))
        if not matched:
            code = "arguments_refused" if misses else "no_rule"
            message = f"no rule allows {name} with these arguments" if misses else f"no rule names {name}"
            if misses:
                message += " (" + "; ".join(misses[:4]) + ")"
            reason = Reason(STAGE, code, message, None, {"tool": name})
            return UpstreamDecision(Decision(Verdict.DENY, None, (reason,)), arguments)
        verdict = max(Verdict.parse(r.decision.value) for r, _ in matched)
        deciders = [(r, p) for r, p in matched if Verdict.parse(r.decision.value) == verdict]
        code = {Verdict.ALLOW: "allowed", Verdict.ASK: "ask", Verdict.DENY: "denied"}[verdict]
        first = deciders[0][0]
        if verdict is Verdict.ALLOW:
            reasons: tuple[Reason, ...] = (Reason(STAGE, code, f"{name} allowed by {first.id}", first.id),)
        else:
            reasons = tuple(Reason(STAGE, code, f"{name}: {r.justification}", r.id) for r, _ in deciders)
        decisions = [Decision(verdict, deciders[0][0].id, reasons)]
        if family.verdict is not Verdict.ALLOW:
            decisions.append(family)
        forwarded = arguments
        paths = {at: p for _, found in deciders for at, p in found.items()}
        for at, path in sorted(paths.items()):
            forwarded = pointer_set(forwarded, at, path)
        if paths:
            checked = Reason("pathjail", "paths_checked", f"{len(paths)} path(s) inside the roots", None, paths)
            decisions.append(Decision(Verdict.ALLOW, None, (checked,)))
        return UpstreamDecision(_strictest(decisions), forwarded)
    except Exception as exc:  # fail closed: a broken stage is a denial, never an allow
        reason = Reason("pipeline", "internal_error", f"{name}: {type(exc).__name__}: {exc}")
        return UpstreamDecision(Decision(Verdict.DENY, None, (reason,)), arguments)


def _strictest(decisions: list[Decision]) -> Decision:
    merged = Decision.merge(decisions)
    rule = next((d.rule for d in decisions if d.verdict is merged.verdict and d.rule), None)
    reasons = tuple(r for d in decisions if d.verdict is merged.verdict or merged.verdict is Verdict.ALLOW
                    for r in d.reasons)  # fmt: skip
    return Decision(merged.verdict, rule, reasons)


def visible(policy: CompiledPolicy, principal: str, upstream: str, tool: str) -> bool:
    """Whether `principal` is shown the tool: the family is not denied, some rule it may use
    allows or asks about the tool (for some arguments), and no rule it may use denies the tool
    whatever the arguments. Only a listing: every call is decided whether listed or not."""
    if upstream not in policy.policy.upstreams or policy.tool_decision(principal, Tool.UPSTREAM).value == "deny":
        return False
    name = qualified(upstream, tool)
    shown = False
    for rule in policy.tool_rules:
        assert rule.tool is not None
        if not fnmatchcase(name, rule.tool) or not policy.may_use(principal, rule):
            continue
        if rule.decision.value == "deny":
            if not rule.arguments:
                return False
        else:
            shown = True
    return shown


def example_decides(tool_rules: tuple[Rule, ...], rule: Rule, text: str) -> str:
    """Why the tool rules do not decide the example `text` as `rule` does, for a principal of the
    rule's level ("" when they do): the strictest of the rules matching it must be the rule's
    decision, and the rule among the ones making it."""
    name, _, rest = text.strip().partition(" ")
    arguments = json.loads(rest) if rest.strip() else {}
    found = [
        r for r in tool_rules
        if r.min_level <= rule.min_level and r.tool is not None and fnmatchcase(name, r.tool)
        and not rule_matches(r, arguments, None, name)[0]
    ]  # fmt: skip
    if not found:
        return "no rule allows it"
    worst = max(Verdict.parse(r.decision.value) for r in found)
    deciders = sorted(r.id for r in found if Verdict.parse(r.decision.value) is worst)
    if worst is Verdict.parse(rule.decision.value) and rule.id in deciders:
        return ""
    return f"the policy decides it {worst.label} ({', '.join(deciders)}), not {rule.decision.value} by this rule"


def example_matches(rule: Rule, text: str) -> bool | str:
    """A `tool` rule's example, `UPSTREAM.TOOL {json arguments}`: True when the rule matches it,
    else why not (path conditions only need a string: whoever the principal)."""
    assert rule.tool is not None
    name, _, rest = text.strip().partition(" ")
    try:
        arguments = json.loads(rest) if rest.strip() else {}
    except ValueError as exc:
        return f"the example's arguments are not JSON ({exc})"
    if not isinstance(arguments, dict):
        return "the example's arguments are not a JSON object"
    if not fnmatchcase(name, rule.tool):
        return f"{name} is not {rule.tool}"
    failed, _ = rule_matches(rule, arguments, None, name)
    return True if not failed else "; ".join(failed)
