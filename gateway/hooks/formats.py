"""The agents' pre-tool-use hook formats: what each sends on stdin, and how each reads an answer.

Facts from the agents' own documentation and sources (docs/hooks.md cites them):

- **Claude Code** `PreToolUse`: stdin `{session_id, transcript_path, cwd, permission_mode,
  hook_event_name: "PreToolUse", tool_name, tool_input, tool_use_id}`; `Bash` carries
  `tool_input.command`, `Read`/`Write`/`Edit`/`MultiEdit` an absolute `file_path`,
  `NotebookEdit` `notebook_path`, `Glob`/`Grep` an optional `path`. The answer, exit 0:
  `{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision":
  "allow"|"deny"|"ask", "permissionDecisionReason": ...}}`.
- **Codex** `PreToolUse`: the same envelope plus `model` and `turn_id`; `Bash` and
  `apply_patch` carry their text in `tool_input.command` (a patch names its files in
  `*** Add File: / *** Update File: / *** Delete File: / *** Move to:` lines). It takes `deny`
  with a non-empty reason, and `allow` with `updatedInput` (a `Bash` call's rewritten
  `command`); a bare `allow` and `ask` are "unsupported" and read as a failed hook, which lets
  the tool run: so an allow without a rewrite is an empty answer, and an ask is answered as a
  denial that says a supervisor must approve.
- **Gemini CLI** `BeforeTool`: stdin `{session_id, transcript_path, cwd, hook_event_name:
  "BeforeTool", timestamp, tool_name, tool_input}`; tools `run_shell_command` (`command`,
  `dir_path`), `read_file`/`write_file`/`replace` (`file_path`), `list_directory`, `glob`,
  `grep_search` (`dir_path`), `read_many_files` (`include`). The answer, exit 0: `{"decision":
  "allow"|"deny"|"ask", "reason": ...}` (`ask` makes the CLI confirm with the user).

Claude Code's `updatedInput` (with `allow` or `ask`) replaces the tool's input: an allowed
`Bash` call is answered with its command rewritten into a run through the gateway's sandbox
(`service.py`). Gemini CLI documents `hookSpecificOutput.tool_input` for the same; it is not
used here (no Gemini CLI runs in this project's tests), so Gemini's commands run unsandboxed.

Every agent treats a hook that exits with a code other than 0 or 2, or prints what it cannot
parse, as no objection: so every answer here is well-formed, and anything this module does not
recognise (another event, another tool, a missing field) is a denial naming what was wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

AGENTS = ("claude-code", "codex", "gemini")
EVENTS = {"claude-code": "PreToolUse", "codex": "PreToolUse", "gemini": "BeforeTool"}
MAX_PATH = 4096


class HookInputError(ValueError):
    """The hook input is not one this gate can decide: the call is denied with this message."""


@dataclass(frozen=True)
class Shell:
    """A shell command the agent's tool would run, in `cwd`."""

    command: str
    cwd: str


@dataclass(frozen=True)
class Paths:
    """Files the agent's tool would touch: (absolute path, "read" | "write") each."""

    action: str
    paths: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class HookCall:
    agent: str
    tool: str
    """The agent's own name for the tool (`Bash`, `apply_patch`, `read_file`, ...)."""
    cwd: str
    request: Shell | Paths
    session_id: str | None = None
    tool_use_id: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    """What the decision record keeps of the tool input (sizes, never file contents)."""
    tool_input: dict[str, Any] = field(default_factory=dict, repr=False)
    """The tool input as the agent sent it (a rewritten input keeps its other fields)."""


def parse(agent: str, raw: bytes) -> HookCall:
    """The call an agent's hook input describes. Raises HookInputError naming the field."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HookInputError(f"the hook input is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise HookInputError("the hook input is not a JSON object")
    event = data.get("hook_event_name")
    if event != EVENTS[agent]:
        raise HookInputError(
            f"hook_event_name is {event!r}: `gateway hook {agent}` answers {EVENTS[agent]} only (see docs/hooks.md)"
        )
    tool = data.get("tool_name")
    if not isinstance(tool, str) or not tool:
        raise HookInputError("tool_name: missing or not a string")
    tool_input = data.get("tool_input")
    if not isinstance(tool_input, dict):
        raise HookInputError("tool_input: missing or not an object")
    cwd = data.get("cwd")
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\0" in cwd:
        raise HookInputError("cwd: missing or not an absolute path")
    cwd = os.path.normpath(cwd)
    handler = _TOOLS[agent].get(tool)
    if handler is None:
        known = ", ".join(sorted(_TOOLS[agent]))
        raise HookInputError(
            f"tool {tool!r} is not one this gate decides for {agent} ({known}): "
            "leave it out of the hook's matcher, or ask the user to decide it"
        )
    request, arguments = handler(tool_input, cwd)
    return HookCall(
        agent,
        tool,
        cwd,
        request,
        _optional_str(data, "session_id"),
        _optional_str(data, "tool_use_id"),
        arguments,
        tool_input,
    )


def _optional_str(data: dict[str, Any], name: str) -> str | None:
    value = data.get(name)
    return value[:200] if isinstance(value, str) else None


def _text(tool_input: dict[str, Any], name: str) -> str:
    value = tool_input.get(name)
    if not isinstance(value, str) or not value.strip():
        raise HookInputError(f"tool_input.{name}: missing, empty or not a string")
    return value


def _path(value: Any, name: str, base: str) -> str:
    """An absolute, normalised path (symlinks are resolved by the jail, not here)."""
    if not isinstance(value, str) or not value:
        raise HookInputError(f"tool_input.{name}: missing or not a string")
    if "\0" in value or len(value) > MAX_PATH:
        raise HookInputError(f"tool_input.{name}: a NUL byte, or longer than {MAX_PATH}")
    if value.startswith("~"):
        raise HookInputError(f"tool_input.{name}: {value!r} starts with ~: give the path itself")
    return os.path.normpath(os.path.join(base, value))


def _dir(tool_input: dict[str, Any], name: str, cwd: str) -> str:
    value = tool_input.get(name)
    return cwd if value is None or value == "" else _path(value, name, cwd)


def _glob(value: Any, name: str) -> str:
    """A glob that stays under the directory it is given: relative, no `..` anywhere."""
    if not isinstance(value, str) or not value:
        raise HookInputError(f"tool_input.{name}: missing or not a string")
    if value.startswith(("/", "~")) or ".." in value or "\0" in value:
        raise HookInputError(
            f"tool_input.{name}: {value!r} could reach outside its directory (absolute, ~ or ..): "
            "give the directory as the path and a relative pattern"
        )
    return value


# --- the tools, per agent: each returns (request, what the record keeps) ----------------------


def _shell(tool_input: dict[str, Any], cwd: str) -> tuple[Shell, dict[str, Any]]:
    command = _text(tool_input, "command")
    return Shell(command, cwd), {"command": command, "cwd": cwd}


def _one(action: str, name: str, *accesses: str) -> Any:
    def handler(tool_input: dict[str, Any], cwd: str) -> tuple[Paths, dict[str, Any]]:
        path = _path(tool_input.get(name), name, cwd)
        return Paths(action, tuple((path, a) for a in accesses)), {"action": action, "path": path}

    return handler


def _search(action: str, dir_name: str, glob_name: str | None) -> Any:
    def handler(tool_input: dict[str, Any], cwd: str) -> tuple[Paths, dict[str, Any]]:
        where = _dir(tool_input, dir_name, cwd)
        out: dict[str, Any] = {"action": action, "path": where}
        if glob_name is not None:
            out["pattern"] = _glob(tool_input.get(glob_name), glob_name)
        return Paths(action, ((where, "read"),)), out

    return handler


def _gemini_shell(tool_input: dict[str, Any], cwd: str) -> tuple[Shell, dict[str, Any]]:
    command = _text(tool_input, "command")
    where = _dir(tool_input, "dir_path", cwd)
    return Shell(command, where), {"command": command, "cwd": where}


def _read_many(tool_input: dict[str, Any], cwd: str) -> tuple[Paths, dict[str, Any]]:
    include = tool_input.get("include")
    if not isinstance(include, list) or not include:
        raise HookInputError("tool_input.include: missing or not a list of paths and patterns")
    patterns = [_glob(p, "include") for p in include[:256]]
    return Paths("read", ((cwd, "read"),)), {"action": "read", "path": cwd, "include": patterns}


PATCH_HEADERS = ("*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: ")


def patch_paths(patch: str, cwd: str) -> list[str]:
    """The files a Codex `apply_patch` envelope writes, absolute."""
    found: list[str] = []
    for line in patch.splitlines():
        for header in PATCH_HEADERS:
            if line.startswith(header):
                found.append(_path(line[len(header) :].strip(), "command (a patch's file)", cwd))
    return found


def _apply_patch(tool_input: dict[str, Any], cwd: str) -> tuple[Paths, dict[str, Any]]:
    patch = _text(tool_input, "command")
    paths = patch_paths(patch, cwd)
    if not paths:
        raise HookInputError("tool_input.command: an apply_patch that names no file (*** Add/Update/Delete File:)")
    accesses = tuple((p, a) for p in paths for a in ("read", "write"))
    return Paths("edit", accesses), {"action": "apply_patch", "paths": paths, "patch_bytes": len(patch.encode())}


_TOOLS: dict[str, dict[str, Any]] = {
    "claude-code": {
        "Bash": _shell,
        "Read": _one("read", "file_path", "read"),
        "Write": _one("write", "file_path", "write"),
        "Edit": _one("edit", "file_path", "read", "write"),
        "MultiEdit": _one("edit", "file_path", "read", "write"),
        "NotebookEdit": _one("edit", "notebook_path", "read", "write"),
        "NotebookRead": _one("read", "notebook_path", "read"),
        "Glob": _search("find", "path", "pattern"),
        "Grep": _search("grep", "path", None),
        "LS": _search("list", "path", None),
    },
    "codex": {
        "Bash": _shell,
        "apply_patch": _apply_patch,
    },
    "gemini": {
        "run_shell_command": _gemini_shell,
        "read_file": _one("read", "file_path", "read"),
        "write_file": _one("write", "file_path", "write"),
        "replace": _one("edit", "file_path", "read", "write"),
        "list_directory": _search("list", "dir_path", None),
        "glob": _search("find", "dir_path", "pattern"),
        "grep_search": _search("grep", "dir_path", None),
        "read_many_files": _read_many,
    },
}


# --- answers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    exit: int
    stdout: bytes
    stderr: bytes
    told: str
    """What the agent was told: allow, ask or deny (Codex cannot be told ask)."""


def _json(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8", "replace")


REWRITES = ("claude-code", "codex")
"""The agents whose hook answer can replace a shell call's command (`updatedInput`)."""


def answer(agent: str, verdict: str, message: str, updated_input: dict[str, Any] | None = None) -> Answer:
    """`verdict` (allow, ask, deny) with `message`, in the agent's format. `updated_input`: the
    tool input the agent runs instead (Claude Code with allow or ask, Codex with allow)."""
    reason = f"agent-gateway: {message}"
    if agent == "claude-code":
        out: dict[str, Any] = {
            "hookEventName": "PreToolUse", "permissionDecision": verdict, "permissionDecisionReason": reason,
        }  # fmt: skip
        if updated_input is not None and verdict != "deny":
            out["updatedInput"] = updated_input
        return Answer(0, _json({"hookSpecificOutput": out}), b"", verdict)
    if agent == "codex":
        if verdict == "allow" and updated_input is not None:
            rewritten = {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                         "permissionDecisionReason": reason, "updatedInput": updated_input}  # fmt: skip
            return Answer(0, _json({"hookSpecificOutput": rewritten}), b"", "allow")
        if verdict == "allow":  # no objection: Codex's own approval settings still apply
            return Answer(0, b"", b"", "allow")
        if verdict == "ask":
            reason += (
                " Codex's PreToolUse hook cannot ask the user, so this gate denies it: ask the user to run "
                "the command themselves, or to change the policy."
            )
        out = {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": reason}
        return Answer(0, _json({"hookSpecificOutput": out}), b"", "deny")
    if agent == "gemini":
        if verdict == "ask":
            return Answer(0, _json({"decision": "ask", "reason": reason, "systemMessage": reason}), b"", "ask")
        return Answer(0, _json({"decision": verdict, "reason": reason}), b"", verdict)
    return Answer(2, b"", (reason + "\n").encode("utf-8", "replace"), "deny")
