"""Policy layering: a policy may `include` others, which are lower layers.

Merge, lowest layer first:
- `principals`, `roles`, `tools`: an upper layer's entry replaces the lower one of the same key;
- `workspace`, `home`, `second_opinion`, `sandbox`, `audit`, `tests`: the upper layer's value
  wins when it sets one;
- `rules`: concatenated; an upper rule with the id of a lower one replaces it, unless the lower
  one is `final`, which is an error (an admin layer can pin rules that a project layer cannot
  relax). Relative paths (`workspace`, `tests`) are resolved against the file that names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.policy.loader import PolicyError, parse_policy
from gateway.policy.schema import Policy, Rule

MAX_INCLUDE_DEPTH = 8


@dataclass(frozen=True)
class Layered:
    """The merged policy, where each rule came from, and the files read (for reload checks)."""

    policy: Policy
    rule_sources: dict[str, Path]
    files: tuple[Path, ...]
    workspace: Path | None
    tests: Path | None


def load_layers(path: Path) -> Layered:
    files: list[Path] = []
    merged, sources, workspace, tests = _load(path.resolve(), files, ())
    return Layered(merged, sources, tuple(files), workspace, tests)


def _load(
    path: Path, files: list[Path], stack: tuple[Path, ...]
) -> tuple[Policy, dict[str, Path], Path | None, Path | None]:
    if path in stack:
        chain = " -> ".join(str(p) for p in (*stack, path))
        raise PolicyError(f"{path}: include cycle: {chain}")
    if len(stack) >= MAX_INCLUDE_DEPTH:
        raise PolicyError(f"{path}: includes nested more than {MAX_INCLUDE_DEPTH} deep")
    files.append(path)
    top = parse_policy(path)
    base: Policy | None = None
    sources: dict[str, Path] = {}
    workspace = (path.parent / top.workspace).resolve() if top.workspace else None
    tests = (path.parent / top.tests).resolve() if top.tests else None
    for inc in top.include:
        lower, lower_sources, lower_ws, lower_tests = _load((path.parent / inc).resolve(), files, (*stack, path))
        base = lower if base is None else _merge(base, sources, lower, lower_sources, path)
        sources.update(lower_sources)
        workspace = workspace or lower_ws
        tests = tests or lower_tests
    own_sources = {r.id: path for r in top.rules}
    if base is None:
        return top, own_sources, workspace, tests
    merged = _merge(base, sources, top, own_sources, path)
    sources.update(own_sources)
    return merged, sources, workspace, tests


def _merge(
    lower: Policy, lower_sources: dict[str, Path], upper: Policy, upper_sources: dict[str, Path], at: Path
) -> Policy:
    rules: dict[str, Rule] = {r.id: r for r in lower.rules}
    for rule in upper.rules:
        old = rules.get(rule.id)
        if old is not None and old.final:
            raise PolicyError(
                f"{upper_sources.get(rule.id, at)}: rule {rule.id!r} is final in {lower_sources.get(rule.id, '?')} "
                "and cannot be redefined by a later layer"
            )
        rules[rule.id] = rule
    fields = upper.model_fields_set
    return Policy(
        version=1,
        workspace=upper.workspace if "workspace" in fields else lower.workspace,
        home=upper.home if "home" in fields else lower.home,
        principals={**lower.principals, **upper.principals},
        roles={**lower.roles, **upper.roles},
        tools={**lower.tools, **upper.tools},
        second_opinion=upper.second_opinion if "second_opinion" in fields else lower.second_opinion,
        sandbox=upper.sandbox if "sandbox" in fields else lower.sandbox,
        audit=upper.audit if "audit" in fields else lower.audit,
        rules=list(rules.values()),
        tests=upper.tests if "tests" in fields else lower.tests,
    )
