"""Tool calls, as validated values: one model per tool family (docs/tools.md lists them).

Each model is frozen and forbids unknown fields, so a typo in a call is INVALID_INPUT naming the
field. Families with several actions (`session`, `files`, `process`, `env`) carry an `action`
and the fields the actions use; `_require` names the field an action is missing.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Millis = Annotated[int, Field(gt=0, le=24 * 3600 * 1000)]

# Sizes are checked here, before anything else looks at a call: no field makes the gateway do
# work or write records in proportion to what an agent chose to send. The shell analyser refuses
# commands over 64 KiB with its own reason; these are the outer bounds.
MAX_SHELL_CHARS = 1 << 20
MAX_PATH_CHARS = 4096  # PATH_MAX
MAX_ENV_VARS = 256
MAX_ENV_VALUE_CHARS = 128 * 1024  # the kernel's limit on one argument or variable (MAX_ARG_STRLEN)
MAX_CONTENT_CHARS = 16 << 20  # a 10 MiB file as base64 (docs/tools.md), with room
MAX_STARTUP_COMMANDS = 64
MAX_CHOICES = 256
MAX_EDITS = 100

ShellText = Annotated[str, Field(min_length=1, max_length=MAX_SHELL_CHARS)]
PathText = Annotated[str, Field(max_length=MAX_PATH_CHARS)]
Pattern = Annotated[str, Field(max_length=MAX_PATH_CHARS)]
EnvName = Annotated[str, Field(max_length=256)]
EnvMap = Annotated[dict[EnvName, Annotated[str, Field(max_length=MAX_ENV_VALUE_CHARS)]], Field(max_length=MAX_ENV_VARS)]
Content = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]


_DATA_FIELDS = frozenset({"content", "input", "old", "new", "edits"})
"""Fields that are data (a file's bytes, a program's input), where a NUL byte is a byte like any other."""


def _nul_at(value: Any, where: str) -> str | None:
    """Where in `value` a string holds a NUL byte (dict keys included), or None."""
    if isinstance(value, str):
        return where if "\0" in value else None
    if isinstance(value, dict):
        for k, v in value.items():
            found = _nul_at(k, f"{where} (a name)") or _nul_at(v, f"{where}.{k}")
            if found:
                return found
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            found = _nul_at(v, f"{where}[{i}]")
            if found:
                return found
    return None


class _Call(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    principal: str
    """Who calls: set by the gateway (the CLI's --principal, the MCP token's owner), never by the agent."""

    @model_validator(mode="after")
    def _no_nul(self) -> _Call:
        """A NUL byte cannot be passed to the OS (paths, a cwd, environment names and values,
        argv, a command's text): refused here as INVALID_INPUT naming the field, before
        anything is decided or run. Data fields (file content, a program's input) may hold it."""
        for name in type(self).model_fields:
            if name not in _DATA_FIELDS:
                found = _nul_at(getattr(self, name), name)
                if found:
                    raise ValueError(f"{found}: a NUL byte is not allowed here")
        return self


def _require(call: BaseModel, needs: dict[str, tuple[str, ...]]) -> None:
    action = getattr(call, "action", None)
    for name in needs.get(str(action), ()):
        if getattr(call, name) is None:
            raise ValueError(f"{name}: required for action {action!r}")


class RunCall(_Call):
    """Run one shell command (the `run` tool)."""

    tool: Literal["run"] = "run"
    command: ShellText
    """The shell text, as an agent wrote it."""
    cwd: PathText | None = None
    """Directory to run in (default: the workspace). Must lie in the principal's roots."""
    env: EnvMap = {}
    """Variables to set for the command; each name in the policy's environment.allow, or allowed by
    the rules deciding it."""
    timeout_ms: Millis | None = None
    """Wall-clock limit; capped by the policy's limit."""
    shell: Literal["bash", "sh"] = "bash"
    """`bash` (default), or `sh` (bash in POSIX mode) where the policy's `shells` allows it."""
    silent: bool = False
    """Leave stdout and stderr out of the result (their sizes are still reported)."""
    capture_output: bool = True
    """False: the command's output goes to /dev/null and is never read."""
    background_after_ms: Millis | None = None
    """A command still running after this long is handed to the process tools (its id is in the
    result) instead of being killed at the timeout."""
    fail_on_error: bool = False
    """A non-zero exit is reported as an error (COMMAND_FAILED) instead of `ok`."""


class SessionCall(_Call):
    """A persistent shell (the `session` tool): pipe or PTY."""

    tool: Literal["session"] = "session"
    action: Literal["start", "exec", "write", "read", "resize", "kill", "list"]
    session_id: str | None = Field(default=None, max_length=100)
    """The session (every action but start and list)."""
    cwd: PathText | None = None
    """start: the directory the shell starts in (default: the workspace)."""
    env: EnvMap = {}
    """start: variables for the shell (checked like the env tool's)."""
    pty: bool = False
    """start: a pseudo-terminal (programs see a terminal, ANSI codes and all) instead of pipes."""
    rows: int = Field(default=24, ge=2, le=1000)
    """start, resize: terminal rows (PTY only)."""
    cols: int = Field(default=80, ge=10, le=1000)
    """start, resize: terminal columns (PTY only)."""
    shell_type: Literal["bash", "sh", "zsh", "python"] = "bash"
    """start: `bash`, or `sh` (bash in POSIX mode) or `zsh` where the policy's `shells` allows it
    (a zsh line runs only where zsh reads it as bash does: gateway/analysis/zsh.py); or `python`,
    a Python REPL (PTY only) where the policy's rules allow `python3` with no arguments: its lines
    are recorded in full, not decided one by one (the sandbox is their boundary)."""
    prompt: str | None = Field(default=None, max_length=200)
    """start: text shown after each command in the output (PTY sessions), like PS1."""
    echo: bool = False
    """start: each command's output begins with the command, as a terminal echoes what is typed
    (commands reach the shell by the gateway's own channel, never typed on its terminal)."""
    programs: bool = False
    """start: also answer `programs`, the programs the policy's rules let this principal run
    (allowed or asked about): what can be typed in the shell (seed 003's `available_commands`)."""
    startup_commands: Annotated[list[ShellText], Field(max_length=MAX_STARTUP_COMMANDS)] = []
    """start: commands run first, each decided like an exec."""
    command: ShellText | None = None
    """exec: the shell text."""
    timeout_ms: Millis | None = None
    """exec: how long to wait for the command to finish (it keeps running after)."""
    input: Annotated[str, Field(max_length=MAX_SHELL_CHARS)] | None = None
    """write: raw text (a newline is not added). To the shell, each line is a command and is
    decided; to a running program, it is input."""

    @model_validator(mode="after")
    def _fields(self) -> SessionCall:
        needs: dict[str, tuple[str, ...]] = {a: ("session_id",) for a in ("exec", "write", "read", "resize", "kill")}
        needs["exec"] += ("command",)
        needs["write"] += ("input",)
        _require(self, needs)
        return self


class ValidationSpec(BaseModel):
    """How an answer to ask_user must look."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    pattern: Pattern | None = None
    """A regular expression the whole answer must match."""
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=1)
    allowed_values: Annotated[list[Annotated[str, Field(max_length=4000)]], Field(max_length=MAX_CHOICES)] | None = None

    @model_validator(mode="after")
    def _bounds(self) -> ValidationSpec:
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            raise ValueError(f"min_length {self.min_length} is greater than max_length {self.max_length}")
        if self.allowed_values is not None and not self.allowed_values:
            raise ValueError("allowed_values: give at least one value")
        return self


class AskUserCall(_Call):
    """Ask the human a question (the `ask_user` tool)."""

    tool: Literal["ask_user"] = "ask_user"
    prompt: str = Field(min_length=1, max_length=4000)
    default: str | None = Field(default=None, max_length=4000)
    """The answer used when the human just presses enter."""
    validation: ValidationSpec | None = None
    password: bool = False
    """Do not echo the answer; it never reaches the audit log."""
    timeout_ms: Millis | None = None


class EnvCall(_Call):
    """The caller's session environment (the `env` tool): what later run, session and process
    calls inherit."""

    tool: Literal["env"] = "env"
    action: Literal["get", "set", "unset", "list"]
    name: EnvName | None = None
    value: Annotated[str, Field(max_length=MAX_ENV_VALUE_CHARS)] | None = None

    @model_validator(mode="after")
    def _fields(self) -> EnvCall:
        _require(self, {"get": ("name",), "set": ("name", "value"), "unset": ("name",)})
        return self


class FileEdit(BaseModel):
    """One replacement of a files `edit` with `edits`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    old: Content = Field(min_length=1)
    """The exact text to replace."""
    new: Content
    """Its replacement."""
    replace: Literal["once", "first", "all"] = "once"
    """`once`: `old` must occur exactly once; `first`: its first occurrence; `all`: every one."""


class FilesCall(_Call):
    """File tools (the `files` tool), implemented in the gateway: no program runs."""

    tool: Literal["files"] = "files"
    action: Literal[
        "read", "read_json", "write", "edit", "list", "stat", "mkdir", "delete", "grep", "find", "write_output"
    ]
    path: PathText | None = None
    """The file or directory (relative paths resolve against the workspace). grep/find: where
    to search (default: the workspace)."""
    offset: int | None = Field(default=None, ge=0)
    """read: the first line (1-based) in line mode, the first byte (0-based) in byte mode."""
    limit: int | None = Field(default=None, ge=1)
    """read: how many lines (without limit or max_bytes, a read returns at most the policy's
    limits.reply_bytes and says where to go on; with them, up to limits.output_bytes)."""
    max_bytes: int | None = Field(default=None, ge=1)
    """read: byte mode, how many bytes (at most the policy's limits.output_bytes)."""
    encoding: Literal["utf-8", "base64", "auto"] = "utf-8"
    """read (byte mode) and write: how content is carried. `auto` (read only, byte mode even
    without max_bytes): utf-8 when the bytes are text, base64 when they are not."""
    content: Content | None = None
    """write: the new content. write_output: the text (markdown) or a JSON document."""
    old: Content | None = None
    """edit: the exact text to replace; it must occur exactly once."""
    new: Content | None = None
    """edit: its replacement."""
    edits: Annotated[list[FileEdit], Field(min_length=1, max_length=MAX_EDITS)] | None = None
    """edit, instead of old/new: replacements applied in order, all or none."""
    append: bool = False
    """write: add the content at the end of the file (created if missing)."""
    show_hidden: bool = False
    """list: include names starting with a dot."""
    parents: bool = False
    """mkdir and write: create missing parent directories too."""
    recursive: bool = False
    """delete: a directory and all it holds (without it, only files and empty directories)."""
    pattern: Pattern | None = None
    """grep: a regular expression. find: a glob (`**/*.py`)."""
    glob: Pattern | None = None
    """grep: only files whose path matches this glob."""
    context: int = Field(default=0, ge=0, le=10)
    """grep: lines of context before and after each match (`before`, `after`)."""
    max_results: int = Field(default=200, ge=1, le=10_000)
    ignored: bool = False
    """grep/find: search what ignore rules leave out too (`.gitignore` files, `node_modules`);
    `.git` is skipped whatever this says."""
    format: Literal["markdown", "json"] = "markdown"
    """write_output: the document's kind."""
    name: str | None = Field(default=None, max_length=100)
    """write_output: a name for the file (`~/outputs/YYYYMMDDHHMMSS-name.md`, then `-1`, `-2`... when taken)."""

    @model_validator(mode="after")
    def _fields(self) -> FilesCall:
        path_needed = ("read", "read_json", "write", "edit", "list", "stat", "mkdir", "delete")
        needs: dict[str, tuple[str, ...]] = {a: ("path",) for a in path_needed}
        needs["write"] += ("content",)
        if self.edits is None:
            needs["edit"] += ("old", "new")
        elif self.old is not None or self.new is not None:
            raise ValueError("edits: give either old/new or edits, not both")
        needs["grep"] = ("pattern",)
        needs["find"] = ("pattern",)
        needs["write_output"] = ("content",)
        _require(self, needs)
        if self.encoding == "auto" and self.action != "read":
            raise ValueError(f"encoding: auto is for read (say utf-8 or base64 for {self.action})")
        return self


class ProcessCall(_Call):
    """Durable background processes (the `process` tool)."""

    tool: Literal["process"] = "process"
    action: Literal["start", "list", "get", "output", "stop", "stop_all"]
    process_id: str | None = Field(default=None, max_length=100)
    command: ShellText | None = None
    """start: the shell text."""
    cwd: PathText | None = None
    env: EnvMap = {}
    keep_alive: bool = False
    """start: restart it when it exits (with backoff), until stopped."""
    name: str | None = Field(default=None, max_length=100)
    max_bytes: int = Field(default=16_384, ge=1, le=1 << 20)
    """output: how much of the log's tail to return."""

    @model_validator(mode="after")
    def _fields(self) -> ProcessCall:
        _require(
            self, {"start": ("command",), "get": ("process_id",), "output": ("process_id",), "stop": ("process_id",)}
        )
        return self


class FormatOutputCall(_Call):
    """Format a message for a human (the `format_output` tool). Runs nothing."""

    tool: Literal["format_output"] = "format_output"
    kind: Literal["success", "error", "warning", "info", "table", "json"]
    message: Content | None = None
    """success / error / warning / info: the text."""
    data: Any = None
    """table: a list of objects (or of lists, the first being the header); json: any value."""
    color: bool = True
    """Use ANSI colours."""


MAX_UPSTREAM_ARGUMENTS = MAX_CONTENT_CHARS
"""The largest JSON arguments an upstream tool is called with."""
MAX_JSON_DEPTH = 64


def _depth(value: Any, limit: int) -> int:
    """How deep `value` nests (lists and objects), counting no further than `limit`."""
    todo, deepest = [(value, 1)], 0
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d <= limit:
                todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


class UpstreamCall(_Call):
    """A tool of an upstream MCP server (the policy's `upstreams`, docs/upstream.md), as the
    agent called it: `upstream` and `name` come from the namespaced name it called
    (`github__create_issue`), `arguments` are its JSON arguments, decided by the rules that
    name the tool and then forwarded."""

    tool: Literal["upstream"] = "upstream"
    upstream: str = Field(min_length=1, max_length=64)
    """The upstream, as the policy names it."""
    name: str = Field(min_length=1, max_length=128)
    """The upstream's own name for the tool."""
    arguments: dict[str, Any] = {}
    """The tool's arguments, as JSON."""

    @model_validator(mode="after")
    def _bounded(self) -> UpstreamCall:
        if _depth(self.arguments, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
            raise ValueError(f"arguments: nested deeper than {MAX_JSON_DEPTH}")
        size = len(json.dumps(self.arguments, ensure_ascii=False, default=str))
        if size > MAX_UPSTREAM_ARGUMENTS:
            raise ValueError(f"arguments: {size} characters of JSON, more than {MAX_UPSTREAM_ARGUMENTS}")
        return self


ToolCall = Annotated[
    RunCall | SessionCall | AskUserCall | EnvCall | FilesCall | ProcessCall | FormatOutputCall | UpstreamCall,
    Field(discriminator="tool"),
]
