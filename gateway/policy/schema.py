"""The policy file format (YAML), as pydantic models. docs/policy.md is the prose reference;
each field is documented where it is declared. `gateway policy schema` prints the JSON Schema.

Models are frozen and forbid unknown keys, so a typo is an error, not an ignored line.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from gateway.policy.upstreams import TOOL_GLOB, ArgumentCondition, Upstream, UpstreamName
from gateway.sandbox import masks
from gateway.sandbox.egress import rules as egress_rules


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuleDecision(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class Tool(StrEnum):
    """Tool families an agent can call."""

    RUN = "run"
    SESSION = "session"
    FILES = "files"
    PROCESSES = "processes"
    ENV = "env"
    ASK_USER = "ask_user"
    UPSTREAM = "upstream"
    """The tools of the policy's `upstreams` (docs/upstream.md): may a principal call them at all."""


Level = Annotated[StrictInt, Field(ge=0, le=100)]
RuleId = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]


class Limits(_Model):
    """Resource limits for a role's calls. Unset means the gateway's default."""

    timeout_ms: Annotated[StrictInt, Field(gt=0)] | None = None
    """Wall-clock limit of one command, in milliseconds."""
    output_bytes: Annotated[StrictInt, Field(gt=0)] | None = None
    """Bytes of output kept per stream (head and tail); also the most one files read returns
    and the size of a session's unread-output buffer."""
    reply_bytes: Annotated[StrictInt, Field(ge=1000)] | None = None
    """Bytes of each output stream one `run` reply carries to the agent (default 30000): a
    longer stream shows its head and a longer tail, with a notice naming the file (in the
    gateway's state, readable by this principal through the files tool) that holds all of it."""
    sessions: Annotated[StrictInt, Field(ge=0)] | None = None
    """Live shell sessions per principal (default 8)."""
    session_idle_seconds: Annotated[StrictInt, Field(gt=0)] | None = None
    """A session unused this long is killed (default 1800: 30 minutes)."""
    processes: Annotated[StrictInt, Field(ge=0)] | None = None
    """Live background processes per principal (default 8)."""
    cpu_seconds: Annotated[StrictInt, Field(gt=0)] | None = None
    """CPU time of one command (RLIMIT_CPU)."""
    file_bytes: Annotated[StrictInt, Field(gt=0)] | None = None
    """Largest file a command may write (RLIMIT_FSIZE), and the file tools' write limit."""
    open_files: Annotated[StrictInt, Field(gt=0)] | None = None
    """Open file descriptors (RLIMIT_NOFILE)."""
    memory_bytes: Annotated[StrictInt, Field(ge=16 << 20)] | None = None
    """Memory one sandbox (a run, a session, a background process, with all it starts) may use
    (default 2 GiB): a cgroup's memory limit where the gateway may create one, RLIMIT_AS per
    process otherwise (`gateway doctor` says which). Its private tmpfs counts too."""
    pids: Annotated[StrictInt, Field(ge=8)] | None = None
    """Processes and threads one sandbox may hold at once (default 512; cgroup pids.max, or the
    sandbox account's RLIMIT_NPROC where there is no cgroup)."""
    tmpfs_bytes: Annotated[StrictInt, Field(ge=1 << 20)] | None = None
    """Size of each private tmpfs: /tmp, /dev/shm and HOME (default 256 MiB each)."""
    disk_bytes: Annotated[StrictInt, Field(ge=1 << 20)] | None = None
    """Bytes the principal's write roots may hold together (default 10 GiB; disk blocks, each
    file or directory at least 4 KiB, a file with many names once): a command that takes them
    past it is stopped and its call fails with DISK_BUDGET, naming this limit and its role
    (docs/sandbox.md, Disk budget). Shared by all of the principal's sandboxes."""


LIMIT_DEFAULTS: dict[str, int] = {
    "timeout_ms": 120_000,
    "output_bytes": 1 << 20,
    "reply_bytes": 30_000,
    "sessions": 8,
    "session_idle_seconds": 1800,
    "processes": 8,
    "cpu_seconds": 600,
    "file_bytes": 10 << 20,
    "open_files": 1024,
    "memory_bytes": 2 << 30,
    "pids": 512,
    "tmpfs_bytes": 256 << 20,
    "disk_bytes": 10 << 30,
}
"""What an unset limit allows, for policy layering (an upper layer may not set a limit above
what a lower layer allows). Where the gateway's uses of one limit differ, the smallest:
`file_bytes` is 1 GiB for a sandbox's RLIMIT_FSIZE but 10 MiB for the files tool.
tests/policy/test_layers.py checks these against the constants the gateway uses."""


class Role(_Model):
    """A set of permissions. Principals hold roles; roles inherit from roles."""

    inherits: list[str] = []
    """Roles whose level, roots and limits this role also has."""
    level: Level = 0
    """Permission level. A rule applies to a principal whose level (the highest of its roles,
    inherited ones included) is at least the rule's `min_level`."""
    read_roots: list[str] = []
    """Directories whose contents may be read. Relative paths resolve against the workspace."""
    write_roots: list[str] = []
    """Directories whose contents may be written (writing implies reading)."""
    protected: list[str] = []
    """Paths never writable, even inside a write root (e.g. `.git/hooks`)."""
    deny_read: list[str] = []
    """Paths no command, glob, recursive search or files call may read (nor write): `.env`,
    `*.pem`, `id_rsa*` (a name: any component of a path), `config/secrets.yaml` (a path:
    relative to the workspace, `**` for any depth), `!.env.example` (an exception). The sandbox
    masks every match present when it starts (an empty read-only file or directory), so a
    program the policy lets run reads nothing there either (docs/policy.md, Secrets)."""
    deny_write: list[str] = []
    """Paths never written (read is fine), in the same pattern language: `.envrc` (the
    human's shell runs it). Present matches are read-only in the sandbox."""
    path: list[str] = []
    """Directories added to the sandbox's PATH, after the system ones (relative: against the
    workspace). Each must lie in the system runtime (/usr, /bin, ...) or in this principal's
    read roots and outside its write roots: a tool directory is read-only, so nothing the
    agent writes can shadow or become a program found there. Checked at load."""
    limits: Limits = Limits()
    network: NetworkSetting | None = None
    """The network this role's sandboxes get instead of `sandbox.network` (false, or a mapping of
    hosts: docs/sandbox.md, The network). It may only narrow `sandbox.network`; a principal whose
    roles set different ones is a load error."""

    @field_validator("deny_read", "deny_write")
    @classmethod
    def _patterns(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            why = masks.validate(entry)
            if why is not None:
                raise ValueError(f"{entry!r}: {why}")
        return entries


class Principal(_Model):
    """An agent identity (the `--principal` of the CLI, a token's owner over MCP)."""

    roles: list[str] = Field(min_length=1)


class ToolAccess(_Model):
    """How a tool family is decided by level: `allow` from level `allow_from` up, `ask` from
    `ask_from` up, deny below. A tool family not listed is denied."""

    allow_from: Level | None = None
    ask_from: Level | None = None


class PathArgs(_Model):
    """Which positional arguments (after the subcommand, options excluded) are paths."""

    read: Literal["none", "all", "all_but_last", "all_but_first", "first"] = "none"
    write: Literal["none", "all", "last"] = "none"


class PathOptions(_Model):
    """Options whose value is a path: `-o FILE`, `-oFILE`, `--output=FILE`, `--output FILE`."""

    read: list[str] = []
    write: list[str] = []


class Examples(_Model):
    """Commands the rule must match, and commands it must not: checked when the policy loads."""

    match: list[str] = Field(min_length=1)
    not_match: list[str] = []


class Rule(_Model):
    """One decision about commands. A command matches a rule when its program is one of
    `programs`, its first argument is one of `subcommands` (if given), and every check below
    passes. Among the rules a principal may use, the strictest matching decision wins
    (deny > ask > allow); a command no rule matches is denied."""

    id: RuleId
    """Stable name, shown in every decision and audit record."""
    decision: RuleDecision
    justification: str = Field(min_length=1)
    """Returned to the agent when this rule denies or asks: say why, and what to do instead."""
    risk: str | None = None
    """(ask rules, mostly) what could go wrong if the call is approved, in a line: shown to the
    supervisor on the console's card beside the justification."""
    programs: list[str] = []
    """Program names (`git`: found on PATH), absolute paths (`/usr/bin/git`), or `./NAME`: the file
    NAME in the command's directory, whose real path the jail checks as a read (a program built in
    the workspace; a link out of the roots is refused). A name never matches a path: `./git` and
    `/tmp/git` do not match `git`. A rule names programs, or `tool`."""
    tool: Annotated[str, Field(pattern=TOOL_GLOB)] | None = None
    """Instead of `programs`: the tools of the policy's `upstreams` this rule decides, as
    `UPSTREAM.TOOL`, globs allowed (`github.create_issue`, `github.*`, `*.delete_*`); such a
    rule takes `arguments` and none of the command fields (docs/upstream.md)."""
    arguments: list[ArgumentCondition] = []
    """With `tool`: conditions on the call's JSON arguments, each at a JSON pointer; the rule
    matches a call only when all of them hold."""
    subcommands: list[str] | None = None
    """The first argument must be one of these (`git status`)."""
    first_arg: list[str] | None = None
    """Anchored regular expressions for the first positional argument after the subcommand
    (`python -m` + `first_arg: [pytest, mypy]`). Unset: any. A deny rule with `first_arg` never
    matches a command without a positional argument."""
    args: list[str] | None = None
    """Anchored regular expressions. An allow or ask rule matches only if every positional
    argument after the subcommand matches one of them in full; a deny rule matches if some
    positional argument does (never the bare program). `[]`: only a command without positional
    arguments. Unset: any argument."""
    forbidden_options: list[str] = []
    """Options that stop an allow/ask rule from matching, in every spelling: `-i` also catches
    `-i.bak` and `-ni`; `--in-place` also `--in-place=x` and prefixes like `--in-pl`."""
    when_options: list[str] = []
    """The rule matches only commands that use one of these options (for deny/ask rules such
    as `git push --force`)."""
    options_end: list[str] = []
    """Options after which the program reads no options of its own: the next word is the
    option's value, and every word after it belongs to what the program runs (python's `-m`:
    in `python -m pip install -r req.txt`, `-r` is pip's). `when_options` and
    `forbidden_options` then look only at the words before; only the option written as a word
    of its own counts (`-m`, not a cluster like `-Im`, which leaves every word an option)."""
    path_args: PathArgs | None = None
    """Which positional arguments are paths. Unset, for a program with a model
    (gateway/programs/) and no `path_options`: the model says which words are paths read or
    written, patterns and scripts, and a use that runs code the model cannot check does not
    match. Unset for a program without a model: no positional argument is a path. Written (even
    `{}`), it overrides the model."""
    path_options: PathOptions = PathOptions()
    """Options whose value is a path. Written, like `path_args`, it turns the model off."""
    env: list[str] = []
    """Variables that may be set for this command (`FOO=1 cmd`, `env FOO=1 cmd`, and for
    `export`: the names it may export). A trailing `*` matches a prefix."""
    accept_unknown: StrictBool = False
    """Accept arguments whose value is only known at run time ($VAR, $(...), xargs input) when
    matching this rule. It does not exempt paths from the jail: see `accept_unknown_paths`."""
    accept_unknown_paths: StrictBool = False
    """Let path arguments whose value is only known at run time pass the path jail unchecked
    (the sandbox is then the only barrier). Redirect targets are never exempt."""
    writes: StrictBool = True
    """(allow/ask rules) `false`: the rule does not match a command that writes a file: one
    redirected into a file (`>`, `>>`, `&>`; /dev/null, /dev/stdout and /dev/stderr are fine), or
    one its program's model says writes (`sort -o F`, uniq's second file, `sed -i`), even where
    the rule's own `path_args` read every word. For a read-only agent whose roots must stay
    writable for git (policies/examples/read-mostly.yaml)."""
    approval: Literal["supervisor", "client"] = "supervisor"
    """Who answers when this rule asks. `supervisor` (default): the supervisor channel (the
    approvals queue or the gateway's terminal). `client`: the agent's own MCP client, through an
    elicitation form; only for low-risk rules, since that client may answer by itself. Such
    approvals are recorded as client-attested. Only on `ask` rules."""
    min_level: Level = 0
    final: StrictBool = False
    """A later policy layer may not redefine this rule (docs/policy.md, layering)."""
    examples: Examples | None = None
    """Required for a rule naming programs; for a `tool` rule, each example is the tool and its
    JSON arguments: `github.create_issue {"owner": "our-org", "title": "x"}`."""

    @field_validator("args", "first_arg")
    @classmethod
    def _compile_args(cls, patterns: list[str] | None) -> list[str] | None:
        for p in patterns or []:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {p!r}: {exc}") from None
        return patterns

    @field_validator("programs")
    @classmethod
    def _programs(cls, programs: list[str]) -> list[str]:
        for p in programs:
            local = p.startswith("./") and "/" not in p[2:] and p[2:] not in ("", ".", "..")
            if not p or ("/" in p and not p.startswith("/") and not local):
                raise ValueError(
                    f"program {p!r} must be a name, an absolute path or ./NAME (in the command's directory)"
                )
        return programs

    @property
    def uses_model(self) -> bool:
        """Does the rule take its path handling from program models (no `path_args` or
        `path_options` written)? A rule naming subcommands reads them through the program's
        model of each (git); a program without a model is matched on its words as before."""
        return self.path_args is None and not self.path_options.read and not self.path_options.write

    @model_validator(mode="wrap")
    @classmethod
    def _subject(cls, data: object, handler: ValidatorFunctionWrapHandler) -> Rule:
        """A rule names programs (and has examples) or an upstream `tool`: a command rule
        missing either is told so field by field, with the other errors of the rule."""
        missing: list[str] = []
        if isinstance(data, dict) and data.get("tool") is None:
            missing = [k for k in ("programs", "examples") if k not in data]
        try:
            rule: Rule = handler(data)
        except ValidationError as exc:
            if not missing:
                raise
            kept: list[Any] = [
                {k: e[k] for k in ("type", "loc", "input", "ctx") if k in e} for e in exc.errors(include_url=False)
            ]
            absent: list[Any] = [{"type": "missing", "loc": (k,), "input": data} for k in missing]
            raise ValidationError.from_exception_data(exc.title, [*kept, *absent]) from None
        if missing:
            absent = [{"type": "missing", "loc": (k,), "input": data} for k in missing]
            raise ValidationError.from_exception_data(cls.__name__, absent)
        return rule

    @model_validator(mode="after")
    def _tool_or_programs(self) -> Rule:
        if self.tool is None:
            if self.arguments:
                raise ValueError("arguments: only for a rule naming an upstream tool (tool), not programs")
            return self
        command = sorted(
            {"programs", "subcommands", "first_arg", "args", "forbidden_options", "when_options", "path_args",
             "path_options", "env", "accept_unknown", "accept_unknown_paths"} & self.model_fields_set
        )  # fmt: skip
        if command:
            raise ValueError(f"{', '.join(command)}: a rule naming an upstream tool takes none of the command fields")
        if self.approval == "client":
            raise ValueError(
                "approval: 'client' is for commands (run, process start); an upstream tool's ask goes to a supervisor"
            )
        return self

    @model_validator(mode="after")
    def _approval_only_on_ask(self) -> Rule:
        if self.approval != "supervisor" and self.decision is not RuleDecision.ASK:
            raise ValueError(
                f"approval: {self.approval!r} only applies to rules that ask (this one is {self.decision})"
            )
        if not self.writes and self.decision is RuleDecision.DENY:
            raise ValueError("writes: false only applies to rules that allow or ask (a deny rule matches regardless)")
        if not self.writes and ((self.path_args and self.path_args.write != "none") or self.path_options.write):
            raise ValueError("writes: false contradicts the paths this rule says its commands write (path_args.write, "
                             "path_options.write)")  # fmt: skip
        return self


class SecondOpinion(_Model):
    unconfirmed: RuleDecision = RuleDecision.ASK
    """What to do when the second parser could not confirm the analysis (bashlex could not parse a
    construct, was blind to one, or timed out, and mvdan/sh could not confirm it either).
    Disagreement is always a denial."""


class EnvironmentSettings(_Model):
    """What the env tool may set in a principal's session environment (inherited by later run,
    session and process calls). Protected names (PATH, LD_*, BASH_ENV, HOME, ...) are refused
    whatever this says."""

    allow: list[str] = []
    """Names that may be set; a trailing `*` matches a prefix (`PYTHON*`)."""

    @field_validator("allow")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for n in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", n):
                raise ValueError(f"{n!r} is not a variable name (a trailing * is allowed)")
        return names


def _host_patterns(where: Literal["allow", "ask", "deny"]) -> AfterValidator:
    def check(text: str) -> str:
        egress_rules.parse_pattern(text, where)  # PatternError (a ValueError): a load error on this line
        return text

    return AfterValidator(check)


class InterceptSettings(_Model):
    """A host whose TLS the proxy terminates (with the gateway's own CA, trusted only by its
    sandboxes) to read its requests: to put brokered secrets in, and to apply request rules."""

    host: Annotated[str, _host_patterns("allow")]
    read_only: StrictBool = False
    """Only GET, HEAD and OPTIONS requests."""
    paths: list[Annotated[str, Field(pattern=r"^/")]] = []
    """Request paths allowed (`*` matches any characters, `/` included); empty: any path."""


class NetworkSettings(_Model):
    """The network as a policy: each connection decided by host and port, through the
    gateway's resolver and proxy (docs/sandbox.md, The network)."""

    presets: list[Literal["python-packages", "npm-packages", "debian-packages"]] = []
    """The hosts this machine's pip, npm or apt are set up to use, read from their configuration
    when the policy loads (index URLs, extra indexes, registries, mirrors), allowed; and the same
    settings passed into the sandbox, so a private index works without naming it here."""
    allow: list[Annotated[str, _host_patterns("allow")]] = []
    """Host patterns reached without asking: `github.com`, `*.githubusercontent.com`,
    `pypi.org:443`; an IP literal only where listed as such. Without a port: 443 and 80."""
    ask: list[Annotated[str, _host_patterns("ask")]] = []
    """Host patterns a supervisor decides, connection held until answered (`*`: anything no
    other pattern names)."""
    deny: list[Annotated[str, _host_patterns("deny")]] = []
    """Host patterns always refused (without a port: every port). Deny beats ask beats allow."""
    max_connections: Annotated[StrictInt, Field(ge=1, le=4096)] = 64
    """Connections one sandbox may hold open at once."""
    max_bytes: Annotated[StrictInt, Field(ge=1)] = 1 << 30
    """Bytes one sandbox may move through the proxy (both ways); then its connections are cut."""
    intercept: list[InterceptSettings] = []
    """Hosts whose requests the proxy reads (TLS terminated): secrets are brokered only to
    these, and they take request rules (`read_only`, `paths`)."""


class SecretSettings(_Model):
    """A credential the gateway holds: commands see a placeholder in the variable of this name,
    and the proxy puts the real value in where a request to one of `hosts` carries it."""

    env: str | None = None
    """The gateway's own environment variable holding it."""
    file: str | None = None
    """A file holding it (read when the policy loads; never inside a root a sandbox sees)."""
    hosts: list[Annotated[str, _host_patterns("allow")]] = Field(min_length=1)
    """The hosts it is for: each must be an intercepted host of `sandbox.network`."""

    @model_validator(mode="after")
    def _one_source(self) -> SecretSettings:
        if (self.env is None) == (self.file is None):
            raise ValueError("a secret comes from exactly one of `env` (the gateway's environment) or `file`")
        return self


def _network_kind(value: object) -> str:
    return (
        "tagged:switch" if isinstance(value, bool) or not isinstance(value, dict | NetworkSettings) else "tagged:hosts"
    )


NetworkSetting = Annotated[
    Annotated[StrictBool, Tag("tagged:switch")] | Annotated[NetworkSettings, Tag("tagged:hosts")],
    Discriminator(_network_kind),
]


class SandboxSettings(_Model):
    network: NetworkSetting = False
    """`false` (the default): the sandbox has only a loopback interface, and Landlock refuses TCP
    too. `true`: commands reach whatever the host reaches, UDP included (`gateway check` and
    `gateway doctor` warn). A mapping: hosts by policy (NetworkSettings)."""
    require_landlock: StrictBool = False
    """Refuse to run commands where the kernel has no Landlock (`gateway doctor` says whether
    this host has it). Off: Landlock is applied where available and its absence is audited."""
    etc: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*$")]] = []
    """More /etc entries to show read-only (e.g. `java-17-openjdk`), besides the curated set
    (docs/sandbox.md). Never a secret: `shadow`, `ssh`, `sudoers` and the like are refused."""

    @field_validator("etc")
    @classmethod
    def _not_secret(cls, names: list[str]) -> list[str]:
        for n in names:
            if n.split("/")[0] in _SECRET_ETC or ".." in n.split("/"):
                raise ValueError(f"/etc/{n} holds secrets or leaves /etc: it is never shown to commands")
        return names


_SECRET_ETC = frozenset({
    "shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssh", "ssl", "security", "pam.d",
    "pip.conf", "npmrc", "gitconfig", "machine-id", "passwd", "group",
})  # fmt: skip


class FleetSettings(_Model):
    max_policy_age_seconds: Annotated[StrictInt, Field(ge=1, le=30 * 86400)] = 3600
    """With `--store` and `--policy-key` (docs/fleet.md): how long a gateway cut off from the
    store goes on deciding under the last revision it took; past it, every call is refused
    (`POLICY_TOO_OLD`) until the store answers again. 1 s to 30 days; a layer may only lower it."""


class AuditSettings(_Model):
    redact: list[str] = []
    """Extra regular expressions for names whose values are redacted in the audit log (besides
    TOKEN, KEY, SECRET, PASSWORD, CREDENTIAL, AUTH)."""

    @field_validator("redact")
    @classmethod
    def _valid(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {p!r}: {exc}") from None
        return patterns


class Policy(_Model):
    """A policy file."""

    version: Literal[1]
    include: list[str] = []
    """Lower layers, loaded first (paths relative to this file). This file's entries override
    theirs by key, but may only tighten what they grant (sandbox, roots, protected paths, levels,
    limits, tool levels...: docs/policy.md, Layering); rules may be added or replaced, except
    the ones marked `final`."""
    workspace: str | None = None
    """The jail root that relative roots resolve against (`--workspace` overrides it). Relative
    to this file."""
    home: str | None = None
    """What `~` means in commands. Unset: `~` is refused in paths."""
    principals: dict[str, Principal] = {}
    roles: dict[str, Role] = {}
    tools: dict[Tool, ToolAccess] = {}
    second_opinion: SecondOpinion = SecondOpinion()
    sandbox: SandboxSettings = SandboxSettings()
    secrets: dict[Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,63}$")], SecretSettings] = {}
    """Credentials brokered by the network proxy (docs/sandbox.md, Credentials that never enter
    the sandbox): the key is the variable commands see, holding a placeholder."""
    audit: AuditSettings = AuditSettings()
    fleet: FleetSettings = FleetSettings()
    environment: EnvironmentSettings = EnvironmentSettings()
    shells: list[Literal["bash", "sh", "zsh"]] = ["bash"]
    """Shells `run` and `session` may use: `bash`, and `sh` (bash in POSIX mode; the analyser
    models bash, so no other shell can be checked), and `zsh` for a session only (each line runs
    where zsh reads it as bash does, gateway/analysis/zsh.py; refused with the reason otherwise)."""
    shells_available: list[Literal["bash", "sh", "zsh"]] = []
    """Shells a layer including this one may add to its `shells` (not in force here): the admin
    of a lower layer offers them, an upper layer (a profile's) enables them. They are a ceiling
    like `shells`: an upper layer may drop entries, never add one."""
    upstreams: dict[UpstreamName, Upstream] = {}
    """MCP servers whose tools the gateway offers its agents beside its own (docs/upstream.md);
    their tools are decided by the rules that name them (`tool:`) and the `upstream` tool family."""
    rules: list[Rule] = []
    tests: str | None = None
    """A JSONL file of expected decisions run by `gateway policy test` (relative to this file):
    one `{"command", "principal"?, "cwd"?, "decision", "rule"?}` per line."""

    @model_validator(mode="after")
    def _unique_ids(self) -> Policy:
        seen: set[str] = set()
        for i, rule in enumerate(self.rules):
            if rule.id in seen:
                raise ValueError(f"rules[{i}].id: {rule.id!r} is used by an earlier rule")
            seen.add(rule.id)
        return self
