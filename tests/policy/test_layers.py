"""Policy layers: every field merges, and a lower layer's settings are ceilings an upper layer
may tighten but never widen (docs/policy.md, Layering)."""

from __future__ import annotations

import json
import os
import socket
import threading
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.executors.files import FileLimits
from gateway.pipeline import (
    DEFAULT_CPU_SECONDS,
    DEFAULT_DISK_BYTES,
    DEFAULT_MEMORY_BYTES,
    DEFAULT_OPEN_FILES,
    DEFAULT_PIDS,
    DEFAULT_PROCESSES,
    DEFAULT_SESSION_IDLE_S,
    DEFAULT_SESSIONS,
    DEFAULT_TMPFS_BYTES,
    Gateway,
)
from gateway.policy.compile import load_policy
from gateway.policy.layers import Layered, load_layers
from gateway.policy.loader import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.policy.schema import LIMIT_DEFAULTS, Limits, Policy, Tool
from gateway.sandbox.identity import hand_over
from gateway.tools.replies import DEFAULT_REPLY_BYTES

CI_RUNNER = Path(__file__).resolve().parents[2] / "policies" / "examples" / "ci-runner.yaml"

LIMITS = {
    "timeout_ms": 60_000,
    "output_bytes": 65_536,
    "reply_bytes": 20_000,
    "sessions": 2,
    "session_idle_seconds": 600,
    "processes": 2,
    "cpu_seconds": 60,
    "file_bytes": 1 << 20,
    "open_files": 256,
    "memory_bytes": 256 << 20,
    "pids": 64,
    "tmpfs_bytes": 64 << 20,
    "disk_bytes": 512 << 20,
}

# The lower layer every case below is laid over: it sets every field.
BASE: dict[str, Any] = {
    "version": 1,
    "workspace": "ws",
    "home": ".",
    "principals": {"agent": {"roles": ["dev"]}},
    "roles": {
        "dev": {
            "level": 2,
            "read_roots": ["."],
            "write_roots": ["src"],
            "protected": ["src/.hooks"],
            "deny_read": [".env", "*.pem", "!.env.example"],
            "deny_write": [".envrc"],
            "limits": LIMITS,
        },
        "helper": {"level": 1, "read_roots": ["docs"]},
    },
    "tools": {"run": {"allow_from": 1, "ask_from": 0}, "session": {"ask_from": 2}},
    "second_opinion": {"unconfirmed": "ask"},
    "sandbox": {"network": False, "require_landlock": True, "etc": ["java-17-openjdk", "ca-certificates"]},
    "audit": {"redact": ["^INTERNAL_"]},
    "environment": {"allow": ["CI", "APP_*"]},
    "shells": ["bash"],
    "rules": [
        {
            "id": "ls",
            "decision": "allow",
            "justification": "listing",
            "programs": ["ls"],
            "examples": {"match": ["ls"]},
        }
    ],
    "tests": "base.tests.jsonl",
    "upstreams": {
        "gh": {
            "command": ["python3", "gh.py"],
            "env_from": ["GH_TOKEN"],
            "read_roots": ["."],
            "write_roots": ["src"],
            "network": False,
            "prefix": "github",
            "timeout_ms": 60_000,
            "connect_timeout_ms": 30_000,
            "result_bytes": 1 << 20,
            "injection_flag": True,
            "forward_identity": True,
            "memory_bytes": 256 << 20,
            "pids": 64,
        },
        "tk": {"url": "https://tickets.example/mcp", "headers_from": {"Authorization": "TK_TOKEN"}},
    },
}

Get = Callable[[Layered], object]


def _role(**fields: object) -> dict[str, Any]:
    return {"roles": {"dev": fields}}


def _limit(key: str, value: int) -> dict[str, Any]:
    return _role(limits={key: value})


def _upstream(name: str = "gh", **fields: object) -> dict[str, Any]:
    return {"upstreams": {name: fields}}


# (schema field, upper layer's fields that tighten, what the merge must then hold, upper layer's
# fields that widen and what the error says, or None where the field is no ceiling). Every field of the schema is here:
# test_every_schema_field_has_a_case fails when one is added without a decision.
CASES: list[tuple[str, dict[str, Any], Get, object, tuple[dict[str, Any], str] | None]] = [
    # --- layering itself and values that grant nothing ----------------------------------
    ("version", {"version": 1}, lambda m: m.policy.version, 1, None),
    ("include", {}, lambda m: [f.name for f in m.files], ["top.yaml", "base.yaml"], None),
    (
        "workspace",
        {"workspace": "ws/src", "roles": {"helper": {"read_roots": ["../docs"]}}},  # roots move along
        lambda m: m.workspace and m.workspace.name,
        "src",
        ({"workspace": "."}, "roles.dev.read_roots (roots resolve against the workspace, which this layer makes"),
    ),
    ("home", {"home": "src"}, lambda m: m.policy.home, "src", None),
    ("tests", {"tests": "top.tests.jsonl"}, lambda m: m.tests and m.tests.name, "top.tests.jsonl", None),
    ("rules", {"rules": []}, lambda m: [r.id for r in m.policy.rules], ["ls"], None),
    # --- principals: an existing one may not gain anything through a new or changed role ---
    (
        "principals.*.roles",
        {
            "principals": {"agent": {"roles": ["helper"]}},  # (with the secrets dev keeps from it)
            "roles": {"helper": {"limits": LIMITS, "deny_read": [".env", "*.pem"], "deny_write": [".envrc"]}},
        },
        lambda m: m.policy.principals["agent"].roles,
        ["helper"],
        (
            {"principals": {"agent": {"roles": ["dev", "admin"]}}, "roles": {"admin": {"write_roots": ["."]}}},
            "principals.agent (roles ['dev', 'admin'], inherited ones included): write_roots: writing",
        ),
    ),
    # --- roles ---------------------------------------------------------------------------
    (
        "roles.*.inherits",
        _role(inherits=["helper"]),
        lambda m: m.policy.roles["dev"].inherits,
        ["helper"],
        (
            {"roles": {"helper": {"inherits": ["dev"]}}},
            "roles.helper.level (it now inherits ['dev']): 2 is wider than 1",
        ),
    ),
    (
        "roles.*.level",
        _role(level=1),
        lambda m: m.policy.roles["dev"].level,
        1,
        (_role(level=3), "roles.dev.level: 3 is wider than 2"),
    ),
    (
        "roles.*.read_roots",
        _role(read_roots=["src"]),
        lambda m: m.policy.roles["dev"].read_roots,
        ["src"],
        (_role(read_roots=[".."]), "roles.dev.read_roots: reading"),
    ),
    (
        "roles.*.write_roots",
        _role(write_roots=["src/pkg"]),
        lambda m: m.policy.roles["dev"].write_roots,
        ["src/pkg"],
        (_role(write_roots=["."]), "roles.dev.write_roots: writing"),
    ),
    (
        "roles.*.network",  # a role's own network narrows the sandbox's (docs/sandbox.md, The network)
        _role(network=False),
        lambda m: m.policy.roles["dev"].network,
        False,
        (_role(network=True), "roles.dev.network: true (commands reach the network) is wider than false"),
    ),
    # a tool directory is bounded by the merged roots, checked when the policy compiles
    ("roles.*.path", _role(path=["/usr/local/bin"]), lambda m: m.policy.roles["dev"].path, ["/usr/local/bin"], None),
    (
        "roles.*.protected",
        _role(protected=["src/.hooks", "src/gen"]),
        lambda m: m.policy.roles["dev"].protected,
        ["src/.hooks", "src/gen"],
        (_role(protected=[]), "roles.dev.protected: leaving"),
    ),
    (
        "roles.*.deny_read",
        _role(deny_read=[".env", "*.pem", "!.env.example", "*.key"]),
        lambda m: m.policy.roles["dev"].deny_read,
        [".env", "*.pem", "!.env.example", "*.key"],
        (_role(deny_read=[".env", "!.env.example"]), "roles.dev.deny_read: dropping ['*.pem']"),
    ),
    (
        "roles.*.deny_write",
        _role(deny_write=[".envrc", "Makefile"]),
        lambda m: m.policy.roles["dev"].deny_write,
        [".envrc", "Makefile"],
        (_role(deny_write=[]), "roles.dev.deny_write: dropping ['.envrc']"),
    ),
    *[
        (
            f"roles.*.limits.{key}",
            _limit(key, value - 1),
            (lambda k: lambda m: getattr(m.policy.roles["dev"].limits, k))(key),
            value - 1,
            (_limit(key, value + 1), f"roles.dev.limits.{key}: {value + 1} is wider than {value}"),
        )
        for key, value in LIMITS.items()
    ],
    # --- tool levels -------------------------------------------------------------------------
    (
        "tools.*.allow_from",
        {"tools": {"run": {"allow_from": 2}}},
        lambda m: (m.policy.tools[Tool.RUN].allow_from, m.policy.tools[Tool.RUN].ask_from),
        (2, 0),
        ({"tools": {"run": {"allow_from": 0}}}, "tools.run: allow at level 0 is wider than ask"),
    ),
    (
        "tools.*.ask_from",
        {"tools": {"session": {"ask_from": 3}}},
        lambda m: m.policy.tools[Tool.SESSION].ask_from,
        3,
        ({"tools": {"session": {"ask_from": 1}}}, "tools.session: ask at level 1 is wider than deny"),
    ),
    # --- the rest ------------------------------------------------------------------------------
    (
        "second_opinion.unconfirmed",
        {"second_opinion": {"unconfirmed": "deny"}},
        lambda m: m.policy.second_opinion.unconfirmed.value,
        "deny",
        ({"second_opinion": {"unconfirmed": "allow"}}, "second_opinion.unconfirmed: 'allow' is wider than 'ask'"),
    ),
    (
        "sandbox.network",
        {"sandbox": {"network": False}},
        lambda m: m.policy.sandbox.network,
        False,
        ({"sandbox": {"network": True}}, "sandbox.network: true"),
    ),
    (
        "sandbox.require_landlock",
        {"sandbox": {"require_landlock": True}},
        lambda m: m.policy.sandbox.require_landlock,
        True,
        ({"sandbox": {"require_landlock": False}}, "sandbox.require_landlock: false is wider than true"),
    ),
    (
        "sandbox.etc",
        {"sandbox": {"etc": ["java-17-openjdk"]}},
        lambda m: (m.policy.sandbox.etc, m.policy.sandbox.require_landlock),
        (["java-17-openjdk"], True),  # what the upper layer does not write stays
        ({"sandbox": {"etc": ["java-17-openjdk", "fonts"]}}, "sandbox.etc: showing ['fonts']"),
    ),
    (
        "audit.redact",
        {"audit": {"redact": ["^INTERNAL_", "^MINE_"]}},
        lambda m: m.policy.audit.redact,
        ["^INTERNAL_", "^MINE_"],
        ({"audit": {"redact": ["^MINE_"]}}, "audit.redact: dropping ['^INTERNAL_']"),
    ),
    (
        "environment.allow",
        {"environment": {"allow": ["CI", "APP_DEBUG", "APP_X*"]}},
        lambda m: m.policy.environment.allow,
        ["CI", "APP_DEBUG", "APP_X*"],
        ({"environment": {"allow": ["CI", "APP_*", "PAGER"]}}, "environment.allow: ['PAGER'] is wider"),
    ),
    ("shells", {"shells": []}, lambda m: m.policy.shells, [], ({"shells": ["bash", "sh"]}, "shells: ['sh'] is wider")),
    (
        "shells_available",
        {"shells_available": []},
        lambda m: m.policy.shells_available,
        [],
        ({"shells_available": ["sh"]}, "shells_available: ['sh'] is wider than ['bash']"),
    ),
    *[
        (
            f"secrets.*.{part}",  # a brokered credential: only a lower layer grants one (docs/sandbox.md)
            {"secrets": {}},
            lambda m: m.policy.secrets,
            {},
            ({"secrets": {"API_TOKEN": {"env": "X", "hosts": ["api.example.com"]}}}, "secrets: the secret API_TOKEN"),
        )
        for part in ("env", "file", "hosts")
    ],
    (
        "fleet.max_policy_age_seconds",
        {"fleet": {"max_policy_age_seconds": 60}},
        lambda m: m.policy.fleet.max_policy_age_seconds,
        60,
        ({"fleet": {"max_policy_age_seconds": 7200}}, "fleet.max_policy_age_seconds: 7200 is wider than 3600"),
    ),
    # --- upstreams: the same servers with the same credentials, tightened only ------------------
    *[
        (
            f"upstreams.*.{key}",
            _upstream(timeout_ms=1000),
            (lambda k, n: lambda m: getattr(m.policy.upstreams[n], k))(key, name),
            BASE["upstreams"][name][key],
            (_upstream(name, **{key: other}), f"upstreams.{name}.{key}: {other!r} is wider than"),
        )
        for name, key, other in [
            ("gh", "command", ["python3", "evil.py"]),
            ("gh", "env_from", ["GH_TOKEN", "AWS_SECRET_ACCESS_KEY"]),
            ("gh", "prefix", "gh2"),
            ("tk", "url", "https://evil.example/mcp"),
        ]
    ],
    (
        "upstreams.*.headers_from",
        _upstream("tk", headers_from={"Authorization": "TK_TOKEN"}),
        lambda m: m.policy.upstreams["tk"].headers_from,
        {"Authorization": "TK_TOKEN"},
        (_upstream("tk", headers_from={"Cookie": "GH_TOKEN"}), "upstreams.tk.headers_from: {'Authorization'"),
    ),
    (
        "upstreams.*.read_roots",
        _upstream(read_roots=["src"]),
        lambda m: m.policy.upstreams["gh"].read_roots,
        ["src"],
        (_upstream(read_roots=[".."]), "upstreams.gh.read_roots: reading"),
    ),
    (
        "upstreams.*.write_roots",
        _upstream(write_roots=["src/pkg"]),
        lambda m: m.policy.upstreams["gh"].write_roots,
        ["src/pkg"],
        (_upstream(write_roots=["."]), "upstreams.gh.write_roots: writing"),
    ),
    (
        "upstreams.*.network",
        _upstream(network=False),
        lambda m: m.policy.upstreams["gh"].network,
        False,
        (_upstream(network=True), "upstreams.gh.network: true is wider than false"),
    ),
    (
        "upstreams.*.injection_flag",
        _upstream(injection_flag=True),
        lambda m: m.policy.upstreams["gh"].injection_flag,
        True,
        (_upstream(injection_flag=False), "upstreams.gh.injection_flag: false is wider than true"),
    ),
    (
        "upstreams.*.forward_identity",
        _upstream(forward_identity=True),
        lambda m: m.policy.upstreams["gh"].forward_identity,
        True,
        (_upstream(forward_identity=False), "upstreams.gh.forward_identity: false is wider than true"),
    ),
    *[
        (
            f"upstreams.*.{key}",
            _upstream(**{key: value // 2}),
            (lambda k: lambda m: getattr(m.policy.upstreams["gh"], k))(key),
            value // 2,
            (_upstream(**{key: value * 2}), f"upstreams.gh.{key}: {value * 2} is wider than {value}"),
        )
        for key, value in BASE["upstreams"]["gh"].items()
        if key in ("timeout_ms", "connect_timeout_ms", "result_bytes", "memory_bytes", "pids")
    ],
]

IDS = [c[0] for c in CASES]


def layers(tmp_path: Path, upper: dict[str, Any], base: dict[str, Any] | None = None) -> Path:
    (tmp_path / "ws" / "src").mkdir(parents=True, exist_ok=True)
    (tmp_path / "base.yaml").write_text(json.dumps(BASE if base is None else base))  # JSON is YAML
    top = tmp_path / "top.yaml"
    top.write_text(json.dumps({"version": 1, "include": ["base.yaml"], **upper}))
    return top


def _fields(model: type[BaseModel], prefix: str) -> Iterator[str]:
    for name, info in model.model_fields.items():
        yield from _field(info.annotation, f"{prefix}{name}")


def _field(annotation: Any, path: str) -> Iterator[str]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from _fields(annotation, path + ".")
    elif origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        yield from _fields(args[1], path + ".*.")
    else:  # a value or a list (rules are a list: their layering is by id, tested in test_loader.py)
        yield path


def test_every_schema_field_has_a_case() -> None:
    """A field added to the schema must be given a layering decision here (and in the docs)."""
    assert sorted(_fields(Policy, "")) == sorted(set(IDS))


@pytest.mark.parametrize(("field", "tighter", "get", "expected", "wider"), CASES, ids=IDS)
def test_a_tighter_upper_layer_is_merged(
    tmp_path: Path, field: str, tighter: dict[str, Any], get: Get, expected: object, wider: object
) -> None:
    assert get(load_layers(layers(tmp_path, tighter))) == expected


WIDER = [c for c in CASES if c[4] is not None]


@pytest.mark.parametrize(("field", "tighter", "get", "expected", "wider"), WIDER, ids=[c[0] for c in WIDER])
def test_a_wider_upper_layer_is_refused(
    tmp_path: Path, field: str, tighter: object, get: Get, expected: object, wider: tuple[dict[str, Any], str]
) -> None:
    top = layers(tmp_path, wider[0])
    with pytest.raises(PolicyError) as exc:
        load_layers(top)
    message = str(exc.value)
    assert message.startswith(str(top))  # the upper file (JSON: one line, so no line to check)
    assert wider[1] in message, message  # the field, what it got and its ceiling
    assert str(tmp_path / "base.yaml") in message  # where the ceiling comes from
    assert "docs/policy.md" in message


def test_an_upper_layer_runs_no_upstream_the_lower_ones_do_not(tmp_path: Path) -> None:
    """A server the lower layers do not run could be handed credentials or roots they never gave."""
    top = layers(tmp_path, _upstream("mine", url="https://mine.example/mcp"))
    with pytest.raises(PolicyError) as exc:
        load_layers(top)
    assert "upstreams.mine: running it is wider than the upstreams ['gh', 'tk']" in str(exc.value)


# --- the attack from the issue, and the shape of the error an admin reads ---------------------


def test_an_upper_layer_cannot_turn_on_the_network_the_ci_runner_leaves_off(tmp_path: Path) -> None:
    top = tmp_path / "top.yaml"
    top.write_text(f"version: 1\ninclude: [{json.dumps(str(CI_RUNNER))}]\nsandbox:\n  network: true\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(top, tmp_path)
    # the shipped policy the ci runner includes writes a sandbox section (man's /etc entry) without network
    shipped = CI_RUNNER.parents[1] / "default.yaml"
    line = shipped.read_text().splitlines().index("sandbox:") + 2
    assert str(exc.value) == (
        f"{top}:4:12: sandbox.network: true (commands reach the network) is wider than false, the default under "
        f"sandbox at {shipped}:{line}:3; a layer may only tighten the layers it includes (docs/policy.md, Layering)"
    )


def test_the_error_points_at_the_ceiling_a_lower_file_set(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("version: 1\nroles:\n  dev:\n    write_roots: [src]\n")
    top = tmp_path / "top.yaml"
    top.write_text("version: 1\ninclude: [base.yaml]\nroles:\n  dev:\n    write_roots: [src, /etc]\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(top, tmp_path)
    message = str(exc.value)
    assert message.startswith(f"{top}:5:18: roles.dev.write_roots: writing /etc is wider than the write roots")
    assert f"set at {tmp_path / 'base.yaml'}:4:18" in message


def test_a_layer_that_sets_nothing_still_has_ceilings(tmp_path: Path) -> None:
    """Defaults are ceilings: unset limits are the gateway's defaults, unlisted tools are denied."""
    base = {"version": 1, "principals": {"a": {"roles": ["r"]}}, "roles": {"r": {"level": 1, "read_roots": ["."]}}}
    for upper, field in [
        (_role_r(limits={"timeout_ms": LIMIT_DEFAULTS["timeout_ms"] + 1}), "roles.r.limits.timeout_ms"),
        ({"tools": {"files": {"allow_from": 100}}}, "tools.files: allow at level 100"),
        ({"second_opinion": {"unconfirmed": "allow"}}, "second_opinion.unconfirmed"),
        ({"shells": ["bash", "sh"]}, "shells"),
        ({"environment": {"allow": ["CI"]}}, "environment.allow"),
    ]:
        with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
            load_layers(layers(tmp_path, upper, base))
    assert load_layers(layers(tmp_path, _role_r(limits={"timeout_ms": 1000}), base)).policy.roles["r"].limits == Limits(
        timeout_ms=1000
    )


def test_a_shell_the_lower_layer_offers_may_be_enabled_above_it(tmp_path: Path) -> None:
    """`shells_available` is the admin's offer: not in force in its own layer, enabled by the
    layer above (the shipped policy offers `sh`; the methings and os profiles enable it); an
    offer the lower layers do not make cannot be enabled, nor extended."""
    base = {**BASE, "shells_available": ["sh"]}
    top = layers(tmp_path, {"shells": ["bash", "sh"]}, base)
    assert load_layers(tmp_path / "base.yaml").policy.shells == ["bash"]  # only offered there
    assert load_layers(top).policy.shells == ["bash", "sh"]
    assert load_layers(layers(tmp_path, {"shells": ["sh"], "shells_available": []}, base)).policy.shells == ["sh"]
    middle = tmp_path / "middle.yaml"  # a layer that withdraws the offer: the one above it cannot enable sh
    middle.write_text(json.dumps({"version": 1, "include": ["base.yaml"], "shells_available": []}))
    over = tmp_path / "over.yaml"
    over.write_text(json.dumps({"version": 1, "include": ["middle.yaml"], "shells": ["bash", "sh"]}))
    with pytest.raises(PolicyError, match=r"shells: \['sh'\] is wider than \['bash'\]"):
        load_layers(over)
    with pytest.raises(PolicyError, match=r"shells: \['sh'\] is wider than \['bash'\]"):
        load_layers(layers(tmp_path, {"shells": ["bash", "sh"]}, BASE))  # offered by nobody


def _role_r(**fields: object) -> dict[str, Any]:
    return {"roles": {"r": fields}}


def test_new_principals_and_roles_are_new_definitions(tmp_path: Path) -> None:
    upper = {
        "principals": {"bot": {"roles": ["bot", "dev"]}},
        "roles": {"bot": {"level": 2, "read_roots": ["/"], "write_roots": ["."], "limits": {"timeout_ms": 1 << 30}}},
    }
    merged = load_layers(layers(tmp_path, upper))
    assert merged.policy.principals["bot"].roles == ["bot", "dev"]
    assert merged.policy.roles["dev"] == load_layers(layers(tmp_path, {})).policy.roles["dev"]


def test_an_existing_principal_may_take_a_new_role_that_adds_nothing_wider(tmp_path: Path) -> None:
    upper = {
        "principals": {"agent": {"roles": ["dev", "docs"]}},
        "roles": {"docs": {"level": 1, "read_roots": ["docs"]}},
    }
    assert load_layers(layers(tmp_path, upper)).policy.principals["agent"].roles == ["dev", "docs"]
    upper["roles"] = {"docs": {"level": 1, "read_roots": ["docs"], "limits": {"pids": LIMITS["pids"] + 1}}}
    with pytest.raises(PolicyError, match=r"principals\.agent \(roles \['dev', 'docs'\].*limits\.pids: 65"):
        load_layers(layers(tmp_path, upper))


def test_a_role_named_again_keeps_what_the_upper_layer_does_not_write(tmp_path: Path) -> None:
    merged = load_layers(layers(tmp_path, _role(level=1, limits={"pids": 8}))).policy.roles["dev"]
    assert (merged.level, merged.write_roots, merged.protected) == (1, ["src"], ["src/.hooks"])
    assert merged.limits == Limits(**{**LIMITS, "pids": 8})


def test_an_upper_layer_cannot_except_a_secret_the_lower_one_denies(tmp_path: Path) -> None:
    top = layers(tmp_path, _role(deny_read=[".env", "*.pem", "!.env.example", "!server.pem"]))
    with pytest.raises(PolicyError, match=r"roles\.dev\.deny_read: the exceptions \['!server\.pem'\] is wider"):
        load_layers(top)


def test_an_unprotected_path_outside_every_write_root_is_no_widening(tmp_path: Path) -> None:
    merged = load_layers(layers(tmp_path, _role(write_roots=["src/pkg"], protected=[]))).policy.roles["dev"]
    assert merged.protected == []
    with pytest.raises(PolicyError, match=r"protected: leaving .*src/\.hooks/x writable is wider than protecting"):
        load_layers(layers(tmp_path, _role(write_roots=["src/.hooks/x"], protected=[])))


def test_moving_the_workspace_cannot_move_the_roots_out(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(
        PolicyError,
        match=r"roles\.dev\.read_roots \(roots resolve .* makes .*elsewhere\): reading .*elsewhere is wider",
    ):
        load_layers(layers(tmp_path, {"workspace": "elsewhere"}))
    # the --workspace the gateway runs with applies to every layer alike
    assert load_layers(layers(tmp_path, {}), tmp_path / "elsewhere").policy.workspace == "ws"


def test_a_symlinked_root_is_compared_where_it_leads(tmp_path: Path) -> None:
    (tmp_path / "ws" / "src").mkdir(parents=True)
    (tmp_path / "ws" / "src" / "out").symlink_to("/etc")
    with pytest.raises(PolicyError, match="writing /etc is wider"):
        load_layers(layers(tmp_path, _role(write_roots=["src/out"])))


def test_sibling_includes_are_layered_in_order(tmp_path: Path) -> None:
    layers(tmp_path, {})
    (tmp_path / "open.yaml").write_text("version: 1\nsandbox: {network: true}\n")
    (tmp_path / "closed.yaml").write_text("version: 1\nsandbox: {network: false}\n")
    (tmp_path / "top.yaml").write_text("version: 1\ninclude: [open.yaml, closed.yaml]\n")
    assert load_layers(tmp_path / "top.yaml").policy.sandbox.network is False
    (tmp_path / "top.yaml").write_text("version: 1\ninclude: [closed.yaml, open.yaml]\n")
    with pytest.raises(PolicyError, match=f"{tmp_path / 'open.yaml'}:2:20: sandbox.network"):
        load_layers(tmp_path / "top.yaml")


def test_limit_defaults_are_the_gateways(tmp_path: Path) -> None:
    assert set(LIMIT_DEFAULTS) == set(Limits.model_fields)
    gateway_defaults = {
        "timeout_ms": 120_000,  # tools/run.py
        "output_bytes": FileLimits.read_bytes,
        "reply_bytes": DEFAULT_REPLY_BYTES,
        "sessions": DEFAULT_SESSIONS,
        "session_idle_seconds": DEFAULT_SESSION_IDLE_S,
        "processes": DEFAULT_PROCESSES,
        "cpu_seconds": DEFAULT_CPU_SECONDS,
        "file_bytes": FileLimits.write_bytes,  # smaller than the sandbox's 1 GiB
        "open_files": DEFAULT_OPEN_FILES,
        "memory_bytes": DEFAULT_MEMORY_BYTES,
        "pids": DEFAULT_PIDS,
        "tmpfs_bytes": DEFAULT_TMPFS_BYTES,
        "disk_bytes": DEFAULT_DISK_BYTES,
    }
    assert gateway_defaults == LIMIT_DEFAULTS


@pytest.mark.parametrize("path", sorted(Path("policies").glob("**/*.yaml")), ids=str)
def test_shipped_policies_load_unchanged(path: Path, tmp_path: Path) -> None:
    assert load_policy(path, tmp_path).policy.rules


# --- through the real holder, gateway and sandbox ----------------------------------------------


def _bump(path: Path, text: str, n: int) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + n * 1_000_000_000))


def test_a_reload_cannot_give_sandboxed_code_the_network(tmp_path: Path) -> None:
    """An upper layer over the ci-runner example, changed while the gateway runs, tries to reach
    a port on the host's loopback (as the gateway's own HTTP port would be): the widening reload is
    refused, recorded, and the sandbox stays without a network."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    reached: list[bytes] = []

    def accept() -> None:
        listener.settimeout(60)
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        reached.append(b"x")
        conn.close()

    threading.Thread(target=accept, daemon=True).start()
    ws = tmp_path / "ws"
    ws.mkdir()
    probe = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 5)\n    print('reached')\n"
        "except OSError as e:\n    print('refused', e)\n"
    )
    (ws / "probe.py").write_text(probe)
    (ws / "Makefile").write_text("probe:\n\t@/usr/bin/python3 probe.py\n")
    hand_over(ws)
    top = tmp_path / "policy" / "top.yaml"
    top.parent.mkdir()
    head = f"version: 1\ninclude: [{json.dumps(str(CI_RUNNER))}]\n"
    _bump(top, head, 0)
    events: list[tuple[str, dict[str, Any]]] = []
    holder = PolicyHolder(top, ws, on_event=lambda k, d: events.append((k, d)), interval=0)
    gw = Gateway(holder.current, AuditLog(tmp_path / "audit"))
    try:
        before = gw.handle(RunCall(principal="ci", command="make -s"))
        assert before["status"] == "ok" and str(before["stdout"]).startswith("refused"), before
        kept = holder.current().sha256

        _bump(top, head + "sandbox: {network: true}\n", 1)
        after = gw.handle(RunCall(principal="ci", command="make -s"))
        assert after["status"] == "ok" and str(after["stdout"]).startswith("refused"), after
        assert not reached
        assert holder.current().sha256 == kept
        assert holder.last_error is not None and "sandbox.network" in holder.last_error
        assert [k for k, _ in events][-1] == "policy_rejected" and events[-1][1]["kept"] == kept
    finally:
        gw.close()
        listener.close()


def test_a_widening_layer_stops_the_gateway_from_starting(tmp_path: Path) -> None:
    top = tmp_path / "top.yaml"
    top.write_text(f"version: 1\ninclude: [{json.dumps(str(CI_RUNNER))}]\nsandbox: {{network: true}}\n")
    with pytest.raises(PolicyError, match=r"sandbox\.network"):
        PolicyHolder(top, tmp_path)


def test_while_a_layer_is_refused_its_includes_are_still_watched(tmp_path: Path) -> None:
    base, top = tmp_path / "base.yaml", tmp_path / "top.yaml"
    _bump(base, "version: 1\nsandbox: {network: false}\n", 0)
    _bump(top, "version: 1\ninclude: [base.yaml]\n", 0)
    events: list[str] = []
    holder = PolicyHolder(top, tmp_path, on_event=lambda k, d: events.append(k), interval=0)
    _bump(top, "version: 1\ninclude: [base.yaml]\nsandbox: {network: true}\n", 1)
    assert holder.current().policy.sandbox.network is False
    assert holder.current().policy.sandbox.network is False  # refused once, not again and again
    _bump(base, "version: 1\nsandbox: {network: true}\n", 1)  # the admin raises the ceiling
    assert holder.current().policy.sandbox.network is True
    assert events == ["policy_loaded", "policy_rejected", "policy_loaded"]


def test_a_fragment_without_principals_bounds_only_what_it_writes(tmp_path: Path) -> None:
    """Shared rules or roles grant nobody anything: their includer sets the rest."""
    fragment = {"version": 1, "roles": {"dev": {"write_roots": ["src"]}}, "sandbox": {"require_landlock": True}}
    full = {
        "principals": {"agent": {"roles": ["dev"]}},
        "roles": {"dev": {"level": 2, "read_roots": ["."]}},
        "tools": {"run": {"allow_from": 1}},
        "sandbox": {"network": True},
        "second_opinion": {"unconfirmed": "allow"},
    }
    merged = load_layers(layers(tmp_path, full, fragment)).policy
    assert (merged.tools[Tool.RUN].allow_from, merged.sandbox.network, merged.sandbox.require_landlock) == (
        1,
        True,
        True,
    )
    assert merged.roles["dev"].write_roots == ["src"]
    for wider, field in [
        ({"sandbox": {"require_landlock": False}}, "sandbox.require_landlock"),
        (_role(write_roots=["."]), "roles.dev.write_roots"),
    ]:
        with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
            load_layers(layers(tmp_path, _deep(full, wider), fragment))


def _deep(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
