"""Read policy YAML strictly, with the position of every value, and validate it.

The strict reading is gateway/strict_yaml.py's (shared with the program models). YAML traps
refused there (measured on PyYAML 6.0.3, see ../shared/notes/dependencies.md):
duplicate keys (safe_load keeps the last one silently), `yes`/`no`/`on`/`off` as booleans and
`0755` as octal. Only `true`/`false` are booleans and only plain decimals are integers; anything
else stays a string, which the schema then rejects where a boolean or number is expected.

Every error names the file, line and column, and says what was got and what was expected:
`policies/x.yaml:14:15: rules[3].decision: got 'alow', expected 'allow', 'ask' or 'deny'`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from gateway import strict_yaml
from gateway.policy.schema import Policy
from gateway.strict_yaml import Positions as Positions
from gateway.strict_yaml import describe_errors as describe_errors


class PolicyError(Exception):
    """A policy that cannot be used. The message says where and what to fix."""


class UnknownPrincipal(PolicyError):
    """A call for a principal the policy does not define (a token or a `register_tools`
    principal function naming one the policy has dropped): denied as UNKNOWN_PRINCIPAL."""


class Parsed(NamedTuple):
    """One policy file as it was parsed: the policy, where each value is, and the exact bytes
    read (once: the policy's digest is of these bytes, never of a second read that an edit in
    between could have changed)."""

    policy: Policy
    positions: Positions
    raw: bytes


def parse_policy(path: Path) -> Policy:
    """One policy file, validated (its includes are not followed: see layers.load_layers)."""
    return parse_policy_at(path)[0]


def parse_policy_at(path: Path) -> Parsed:
    """One policy file, validated, the (line, column) of every value in it, and its bytes."""
    try:
        raw = strict_yaml.read_source(path, "the policy")
        data, positions = strict_yaml.parse_yaml(path, raw, what="the policy")
    except strict_yaml.YamlError as exc:
        raise PolicyError(str(exc)) from None
    try:
        return Parsed(Policy.model_validate(data), positions, raw)
    except ValidationError as exc:
        raise PolicyError(describe_errors(path, exc, positions)) from None
