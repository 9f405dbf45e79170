"""What an MCP client sees of each tool: its name, the JSON schema of its arguments (derived from
the call models in `gateway/calls.py`, so the schema and the validation are one thing), a
description an LLM can act on, and MCP's behaviour hints.

`family` names the policy's tool family; a principal whose policy denies that family never sees
the tool listed. Tools without a family (`format_output`, `await_call`) run nothing.

A profile's tool (`gateway/server/profiles/`) is a `Spec` too: its `model` holds the seed's own
arguments, `adapt` turns them into one of the gateway's call models (so the call meets the same
gate: decision, sandbox, approvals, audit), and `reply` turns the gateway's envelope into the
seed's reply shape.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from gateway.calls import AskUserCall, EnvCall, FilesCall, FormatOutputCall, ProcessCall, RunCall, SessionCall
from gateway.policy.schema import Tool

_SET_BY_GATEWAY = ("principal", "tool")  # never in a schema: the gateway fills them


class AwaitCall(BaseModel):
    """Arguments of `await_call` (the MCP server's own tool)."""

    model_config = {"extra": "forbid", "frozen": True, "use_attribute_docstrings": True}
    call_id: str = Field(min_length=1, max_length=64)
    """The call_id of the call that returned status `pending`."""
    wait_ms: int = Field(default=30_000, ge=0, le=300_000)
    """How long to wait for the answer before returning `pending` again."""


@dataclass(frozen=True)
class Spec:
    name: str
    model: type[BaseModel]
    family: Tool | None
    title: str
    description: str
    annotations: ToolAnnotations
    resolver: Literal["client", "user"] | None = None
    """What the server asks before the call's body runs: `client` (the client may approve a
    command of a rule that opts in: run, process start), `user` (ask_user's form), or nothing."""
    adapt: Callable[[Any, str], BaseModel] | None = None
    """A profile's tool: (the seed's validated arguments, the principal) -> the gateway's call.
    None: `model` is the gateway's call model itself."""
    reply: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """A profile's tool: the gateway's envelope -> the seed's reply. None: the envelope itself."""
    reply_for: Callable[[dict[str, Any], str], dict[str, Any]] | None = None
    """Instead of `reply`, for a seed whose reply depends on who called: (the envelope, the
    principal) -> the seed's reply (seed 001 numbers each principal's daemons)."""
    render: Callable[[dict[str, Any]], str] | None = None
    """A profile's tool whose seed replies in another text than JSON: the seed's reply -> the
    text sent (seed 001's YAML). None: JSON."""

    def call(self, arguments: dict[str, Any], principal: str) -> BaseModel:
        """The gateway's call for these arguments (raises ValidationError or ValueError)."""
        if self.adapt is None:
            return self.model.model_validate({**arguments, "principal": principal})
        return self.adapt(self.model.model_validate(arguments), principal)

    def replier(self, principal: str) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """The reply for `principal`'s calls (None: the envelope itself)."""
        reply_for = self.reply_for
        if reply_for is not None:
            return lambda envelope: reply_for(envelope, principal)
        return self.reply

    def input_schema(self) -> dict[str, Any]:
        return input_schema(self.model)


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema without the fields the gateway sets, and closed to extra fields."""
    schema = copy.deepcopy(model.model_json_schema())
    for name in _SET_BY_GATEWAY:
        schema.get("properties", {}).pop(name, None)
    if "required" in schema:
        schema["required"] = [r for r in schema["required"] if r not in _SET_BY_GATEWAY]
    schema["additionalProperties"] = False
    schema.pop("title", None)
    return schema


_DENIALS = (
    " Every call is decided by the gateway's policy: a denied call comes back with isError, an "
    "error code, the rule that decided and its justification (do not retry it unchanged; follow the "
    "justification). A call a supervisor must approve comes back with status `pending` and a "
    "call_id: call `await_call` with it to get the result."
)

RUNS = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)
"""A tool that runs commands or changes files: every profile's hints for such a tool."""
READS = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
"""A tool that only reads."""
SETS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
"""A tool that sets state idempotently (the stored environment)."""
ASKS = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=True)
"""A tool that asks a person."""

SPECS: tuple[Spec, ...] = (
    Spec(
        "run",
        RunCall,
        Tool.RUN,
        "Run a shell command",
        "Run one bash command in the workspace, in a sandbox (no network, writes only inside the "
        "workspace), and return exit_code, stdout, stderr and duration. Use it for builds, tests, git "
        "and inspection. State does not persist between calls: use `session` for a shell that keeps "
        "cwd and variables, `process` for servers and watchers." + _DENIALS,
        RUNS,
        resolver="client",
    ),
    Spec(
        "session",
        SessionCall,
        Tool.SESSION,
        "Persistent shell sessions",
        "A shell that keeps its cwd and variables between commands, over pipes or a PTY. Actions: "
        "start (returns session_id), exec (run a command, wait for it), write (send input to the running "
        "program, or commands to the idle shell; '\\u0003' is Ctrl-C), read (new output), resize, kill, "
        "list. Every command is decided like `run`." + _DENIALS,
        RUNS,
    ),
    Spec(
        "files",
        FilesCall,
        Tool.FILES,
        "Read, write and search files",
        "File operations inside the directories the policy lets you read or write, without running a "
        "program. Actions: read (lines, or bytes with max_bytes; images come back as images), read_json, "
        "write (atomic), edit (replace text that occurs exactly once), list, stat, mkdir, delete, grep "
        "(regex), find (glob), write_output (save a markdown/JSON report). Paths outside the allowed "
        "roots are refused (PATH_OUTSIDE_JAIL)." + _DENIALS,
        RUNS,
    ),
    Spec(
        "process",
        ProcessCall,
        Tool.PROCESSES,
        "Background processes",
        "Durable background processes (dev servers, watchers) that outlive the call: start (with "
        "keep_alive to restart on exit), list, get, output (tail of its log), stop, stop_all. Each start "
        "is decided like `run`." + _DENIALS,
        RUNS,
        resolver="client",  # a session's cwd is the shell's: only a supervisor answers there
    ),
    Spec(
        "env",
        EnvCall,
        Tool.ENV,
        "Environment variables for later calls",
        "Get, set, unset or list variables that your later run, session and process calls inherit. "
        "Only names the policy allows can be set; PATH, HOME, LD_* and the like never." + _DENIALS,
        SETS,
    ),
    Spec(
        "ask_user",
        AskUserCall,
        Tool.ASK_USER,
        "Ask the user a question",
        "Ask your user a question and wait for the answer (through your MCP client's form). Use it for "
        "choices and missing information, not to ask permission for commands: the gateway's policy does "
        "that. `validation` constrains the answer; `password` keeps it out of the logs.",
        ASKS,
        resolver="user",
    ),
    Spec(
        "format_output",
        FormatOutputCall,
        None,
        "Format a message",
        "Format a success/error/warning/info message, a table or JSON for a human, with or without ANSI "
        "colours. Runs nothing.",
        READS,
    ),
    Spec(
        "await_call",
        AwaitCall,
        None,
        "Wait for a pending call",
        "Wait for the result of a call that returned status `pending` (a supervisor must approve it). "
        "Returns the call's result once answered (denied if the supervisor said no or did not answer in "
        "time), or `pending` again after wait_ms.",
        READS,
    ),
)

BY_NAME = {s.name: s for s in SPECS}
