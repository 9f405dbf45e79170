"""The policy's `upstreams:` (MCP servers the gateway connects to and governs) and the argument
conditions of rules that name upstream tools. docs/upstream.md is the prose reference; each
field is documented where it is declared.

    upstreams:
      github: {command: ["github-mcp-server", "stdio"], env_from: [GITHUB_TOKEN]}
      tickets: {url: "https://tickets.example/mcp", headers_from: {Authorization: TICKETS_TOKEN}}

    rules:
      - id: issues-in-our-repo
        decision: allow
        justification: "issues in our own repositories only"
        tool: "github.create_issue"
        arguments: [{at: "/owner", equals: "our-org"}, {at: "/title", max_length: 200}]
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from gateway.regex import safe_regex

_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]|_(?!_))*")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
SEPARATOR = "__"
"""Between an upstream's prefix and its tool's name in what the agent sees: `github__create_issue`."""
MAX_NAME = 32


def _upstream_name(name: str) -> str:
    if len(name) > MAX_NAME or not _NAME.fullmatch(name) or name.endswith("_"):
        raise ValueError(
            f"{name!r}: an upstream's name (and prefix) is lowercase letters, digits, '-' and single '_' "
            f"(at most {MAX_NAME}; no '__', which separates it from the tool's name)"
        )
    return name


UpstreamName = Annotated[str, AfterValidator(_upstream_name)]


def _env_name(name: str) -> str:
    if not _ENV.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable's name")
    return name


EnvName = Annotated[str, AfterValidator(_env_name)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Upstream(_Model):
    """One MCP server whose tools the gateway offers its agents, decided by the rules that name
    them (`tool: "NAME.TOOL"`). Either `command` (stdio, run in the gateway's sandbox) or `url`
    (streamable HTTP). Credentials come from the gateway's own environment and never reach the
    agent."""

    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    """stdio: the server's program and its arguments. It runs in the gateway's sandbox (as the
    sandbox's account, its own roots, no network unless `network`), started at its first use and
    kept; the program must be in the system runtime or in `read_roots`."""
    env_from: list[EnvName] = []
    """stdio: variables of the gateway's own environment passed to the server (its credentials).
    A variable that is not set makes the upstream unavailable, naming it."""
    url: Annotated[str, Field(pattern=r"^https?://[^\s/?#]+(/[^\s]*)?$")] | None = None
    """HTTP: the server's streamable HTTP endpoint (`https://tickets.example/mcp`)."""
    headers_from: dict[Annotated[str, Field(pattern=_HEADER.pattern)], EnvName] = {}
    """HTTP: request headers whose values are variables of the gateway's environment
    (`{Authorization: TICKETS_TOKEN}`: the variable holds the whole value, `Bearer ...`)."""
    read_roots: list[str] = []
    """stdio: directories the server's sandbox shows read-only (relative: against the
    workspace). Nothing of the host exists there but the system runtime and these roots."""
    write_roots: list[str] = []
    """stdio: directories the server's sandbox may write."""
    network: StrictBool = False
    """stdio: the server's sandbox may reach the network. Needs the policy's `sandbox.network`
    (a per-host egress list replaces this once the gateway has one)."""
    prefix: UpstreamName | None = None
    """The namespace of its tools for the agent: `PREFIX__TOOL` (default: the upstream's name)."""
    timeout_ms: Annotated[StrictInt, Field(gt=0, le=3_600_000)] = 60_000
    """A call the server has not answered in this long is cancelled (UPSTREAM_TIMEOUT)."""
    connect_timeout_ms: Annotated[StrictInt, Field(gt=0, le=600_000)] = 30_000
    """Starting or reaching the server and listing its tools, at most this long."""
    result_bytes: Annotated[StrictInt, Field(ge=1024, le=64 << 20)] = 1 << 20
    """The largest result (its JSON) passed on to the agent; a larger one is refused
    (UPSTREAM_RESULT_TOO_LARGE). A message over four times this, or a server that keeps
    talking that much without answering, is cut off and its connection closed."""
    forward_identity: StrictBool = False
    """Tell the server on whose behalf each call is made: the principal and the call's id in the
    request's `_meta` (`agent-gateway/principal`, `agent-gateway/call_id`) and, for an HTTP
    server, in the headers `X-Agent-Gateway-Principal` and `X-Agent-Gateway-Call-Id`. Set by the
    gateway from the call it decided; what the agent puts in its own `_meta` never reaches it."""
    injection_flag: StrictBool = False
    """Mark results holding text that reads like instructions to the agent. A heuristic, shown
    to the agent as such; never a security boundary: nothing is blocked because of it."""
    memory_bytes: Annotated[StrictInt, Field(ge=16 << 20)] | None = None
    """stdio: memory the server's sandbox may use (default 2 GiB)."""
    pids: Annotated[StrictInt, Field(ge=8)] | None = None
    """stdio: processes and threads the server's sandbox may hold (default 512)."""

    def problem(self) -> str:
        """What is wrong with this upstream as the merged policy has it ("" when nothing): checked
        when the policy compiles, since a layer may write some of its fields and leave the rest."""
        if (self.command is None) == (self.url is None):
            return "give either command (a stdio server) or url (a streamable HTTP server)"
        if self.url is not None:
            local = [f for f in ("env_from", "read_roots", "write_roots", "network", "memory_bytes", "pids")
                     if getattr(self, f) not in (None, False, [])]  # fmt: skip
            if local:
                return f"{', '.join(local)}: only for a stdio server (command), not a url"
        elif self.headers_from:
            return "headers_from: only for an HTTP server (url), not a command"
        return ""


def _pointer(text: str) -> str:
    if text and not text.startswith("/"):
        raise ValueError(f"{text!r} is not a JSON pointer: it starts with '/' (or is '' for the whole arguments)")
    if re.search(r"~(?![01])", text):
        raise ValueError(f"{text!r}: in a JSON pointer '~' is written ~0 and '/' inside a name ~1")
    return text


def _regex(pattern: str) -> str:
    safe_regex(pattern)  # RE2: linear time, whatever the agent sends
    return pattern


class ArgumentCondition(_Model):
    """A condition on the value at `at` in a call's JSON arguments. Every check written must
    hold; a rule matches a call only when all its conditions do."""

    at: Annotated[str, AfterValidator(_pointer)]
    """A JSON pointer (RFC 6901): `/owner`, `/labels/0`, `/a~1b` for the key `a/b`."""
    equals: Any = None
    """The value must be exactly this JSON value (`true` is not `1`)."""
    one_of: Annotated[list[Any], Field(min_length=1)] | None = None
    """The value must be one of these JSON values."""
    regex: Annotated[str, AfterValidator(_regex)] | None = None
    """The value must be a string matching this RE2 expression in full."""
    max_length: Annotated[StrictInt, Field(ge=0)] | None = None
    """A string of at most this many characters, or a list of at most this many items."""
    path: Literal["read", "write"] | None = None
    """The value is a path the principal must be allowed to read (or write), jailed like a
    command's (`~` is the policy's home, relative paths are against the workspace, links are
    resolved). The upstream receives the absolute path that was checked."""
    required: StrictBool = True
    """false: a call without a value at `at` passes this condition."""

    @model_validator(mode="after")
    def _some_check(self) -> ArgumentCondition:
        checks = {"equals", "one_of", "regex", "max_length", "path"} & self.model_fields_set
        if not checks:
            raise ValueError(f"{self.at!r}: give a check (equals, one_of, regex, max_length or path)")
        if self.path is not None and self.at == "":
            raise ValueError("path: names one argument (a JSON pointer such as /path), not the whole arguments")
        return self

    @property
    def checks_equals(self) -> bool:
        """`equals` was written (`equals: null` included)."""
        return "equals" in self.model_fields_set


TOOL_GLOB = r"^[A-Za-z0-9_*?\[\]!-]+\.[A-Za-z0-9_.*?\[\]!/-]+$"
"""`UPSTREAM.TOOL` where either part may hold `*`, `?` and `[...]`."""
