"""The `methings` profile (seed 000): the one-shot shells, the persistent sessions and `termux_fs`.

`local_run_shell` (`/bin/sh`-style: bash in POSIX mode, so the policy's `shells` must list `sh`)
and `termux_run_shell` (bash):

    {"command": "ls", "cwd": "src", "timeout_ms": 60000, "env": {"APP_MODE": "test"}}
    {"status": "ok", "exit_code": 0, "stdout": "...", "stderr": "", "call_id": "..."}
    {"status": "timeout", "exit_code": -1, "stdout": "...", "stderr": "Command timed out after 60s", "call_id": "..."}

A non-zero exit is `status: ok` with its exit code, as a shell reports it. What the seed has no
status for (a denial, an unknown program, a sandbox that cannot start, invalid arguments) is
`status: error`, `exit_code` (-1 when nothing ran, 127 for an unknown program), the message
in `stderr`, and the gateway's `error` object (code, message, and the deciding `rule` and
`reasons` for a denial). A call a supervisor must approve is `status: pending` with its
`call_id`: `await_call` returns the result in this same shape.

`local_shell_session` (pipes, `sh`) and `termux_shell_session` (a PTY, bash) are the gateway's
`session` tool: every command, sent with `exec` or typed with `write` to the idle shell, is
decided like a `run`; text for a running program is audited as input. Their replies are the
seed's (`start` {session_id, output}, `exec` and `read` {output, alive}, `write` {ok}, `list`
{sessions}), plus `exit_code`, `running` and `call_id`; a failure is `{status: "error", error:
{code, message, ...}}`. `termux_fs` is the gateway's `files` tool (the path jail, the
sandbox's account, `delete` decided as the `rm` that would do it); paths are absolute, `~/...`,
or relative to `~` (the policy's `home`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.calls import MAX_SHELL_CHARS, Content, EnvMap, FilesCall, PathText, RunCall, SessionCall, ShellText
from gateway.policy.schema import Tool
from gateway.server.specs import RUNS, Spec

NAME = "methings"
DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 300_000
DEFAULT_EXEC_TIMEOUT_S = 30
MAX_EXEC_TIMEOUT_S = 300
DEFAULT_READ_BYTES = 1 << 20
MAX_READ_BYTES = 10 << 20
PROMPT = "$ "
"""What the sessions print after each command (and `start` returns): the seed's shell prompt."""


class RunShell(BaseModel):
    """Arguments of seed 000's `local_run_shell` and `termux_run_shell`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    command: ShellText
    """The shell command."""
    cwd: PathText | None = None
    """Directory to run in (default: the workspace; relative: against it; `~`: the policy's home)."""
    timeout_ms: int = Field(default=DEFAULT_TIMEOUT_MS, gt=0, le=MAX_TIMEOUT_MS)
    """Milliseconds before the command is killed (default 60000, at most 300000; the policy may cap it lower)."""
    env: EnvMap = {}
    """Variables for the command; each named by the policy's environment.allow, or allowed by the
    rules deciding it."""


def _adapter(shell: Literal["bash", "sh"]) -> Any:
    def adapt(args: RunShell, principal: str) -> RunCall:
        return RunCall(
            principal=principal, command=args.command, cwd=args.cwd, env=args.env, timeout_ms=args.timeout_ms,
            shell=shell,
        )  # fmt: skip

    return adapt


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


def run_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The gateway's run envelope as seed 000's `{status, exit_code, stdout, stderr}`."""
    status = envelope.get("status")
    call_id = envelope.get("call_id")
    stdout = envelope.get("stdout", "")
    if status == "ok":
        out = {
            "status": "ok",
            "exit_code": envelope.get("exit_code"),
            "stdout": stdout,
            "stderr": envelope.get("stderr", ""),
        }
    elif status == "timeout" and (envelope.get("error") or {}).get("code") == "COMMAND_TIMEOUT":
        limit = int(envelope.get("timeout_ms") or DEFAULT_TIMEOUT_MS)
        out = {
            "status": "timeout",
            "exit_code": -1,
            "stdout": stdout,
            "stderr": f"Command timed out after {_seconds(limit)}",
        }
    elif status == "pending":
        out = {"status": "pending", "exit_code": -1, "stdout": "", "stderr": str(envelope.get("next", ""))}
        out |= {k: envelope[k] for k in ("approval", "next") if k in envelope}
    else:
        err = envelope.get("error") or {}
        code = envelope.get("exit_code")
        stderr = envelope.get("stderr") if code is not None and envelope.get("stderr") else err.get("message", "")
        out = {"status": "error", "exit_code": code if code is not None else -1, "stdout": stdout, "stderr": stderr}
        out["error"] = {k: v for k, v in err.items() if k in ("code", "message")}
        out["error"] |= {k: envelope[k] for k in ("rule", "reasons") if envelope.get(k) is not None}
    for k in ("notice", "reply_cut"):
        if k in envelope:
            out[k] = _retold(envelope[k]) if k == "notice" else envelope[k]
    out["call_id"] = call_id
    return out


class ShellSession(BaseModel):
    """Arguments of seed 000's `local_shell_session` and `termux_shell_session`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    action: Literal["start", "exec", "write", "read", "resize", "kill", "list"]
    session_id: str | None = Field(default=None, max_length=100)
    """The session (every action but start and list)."""
    command: ShellText | None = None
    """exec: the command."""
    input: Annotated[str, Field(max_length=MAX_SHELL_CHARS)] | None = None
    """write: raw stdin text (`"y\\n"`): input to the running program, or commands (a line each) to an idle shell."""
    cwd: PathText | None = None
    """start: the initial directory (default: `~`, the policy's home; absolute, `~/...`, or
    relative to `~`, as the seed's paths are)."""
    rows: int = Field(default=24, ge=2, le=1000)
    """start, resize: terminal rows (no effect on a pipe session)."""
    cols: int = Field(default=80, ge=10, le=1000)
    """start, resize: terminal columns (no effect on a pipe session)."""
    timeout: int = Field(default=DEFAULT_EXEC_TIMEOUT_S, gt=0, le=MAX_EXEC_TIMEOUT_S)
    """exec: seconds to wait for the command (default 30, at most 300; the policy may cap it); it runs on after."""
    env: EnvMap = {}
    """start: extra variables for the shell (each must be allowed by the policy)."""


def _session_adapter(pty: bool) -> Any:
    def adapt(args: ShellSession, principal: str) -> SessionCall:
        common: dict[str, Any] = {"principal": principal, "action": args.action, "session_id": args.session_id}
        if args.action == "start":
            return SessionCall(
                **common, cwd=_home_path(args.cwd or "~"), env=args.env, pty=pty, rows=args.rows, cols=args.cols,
                shell_type="bash" if pty else "sh", prompt=PROMPT, echo=pty,
            )  # fmt: skip
        if args.action == "exec":
            return SessionCall(**common, command=args.command, timeout_ms=args.timeout * 1000)
        if args.action == "write":
            return SessionCall(**common, input=args.input)
        if args.action == "resize":
            return SessionCall(**common, rows=args.rows, cols=args.cols)
        return SessionCall(**common)

    return adapt


def _failure(envelope: dict[str, Any]) -> dict[str, Any]:
    """What the seed has no reply for (a denial, an unknown session, bad arguments)."""
    if envelope.get("status") == "pending":
        pending: dict[str, Any] = {k: envelope[k] for k in ("approval", "next") if k in envelope}
        return {"status": "pending", **pending, "call_id": envelope.get("call_id")}
    err = envelope.get("error") or {}
    out: dict[str, Any] = {k: v for k, v in err.items() if k in ("code", "message")}
    out |= {k: envelope[k] for k in ("rule", "reasons") if envelope.get(k) is not None}
    return {"status": "error", "error": out, "call_id": envelope.get("call_id")}


def _session_reply(pty: bool) -> Any:
    def reply(envelope: dict[str, Any]) -> dict[str, Any]:
        if envelope.get("status") != "ok":
            failed = _failure(envelope)
            if "output" in envelope:  # a command that did not finish cleanly still showed something
                failed |= {k: envelope.get(k) for k in ("output", "alive")}
            return failed
        call_id = envelope.get("call_id")
        out: dict[str, Any]
        if "sessions" in envelope:  # list: this tool's kind of session
            seen = [s for s in envelope["sessions"] if bool(s.get("pty")) == pty]
            keep = ("session_id", "alive", "idle_seconds", "uptime_seconds")
            out = {"sessions": [{k: s.get(k) for k in keep} for s in seen]}
        elif "sandbox" in envelope:  # start
            out = {"session_id": envelope.get("session_id"), "output": envelope.get("output", "")}
        elif "sent" in envelope or "interrupted" in envelope or set(envelope) <= {"status", "call_id"}:
            out = {"ok": True}  # write: what commands it ran printed comes along
            out |= {k: envelope[k] for k in ("output", "alive") if k in envelope}
        elif "rows" in envelope:  # resize
            out = {"ok": True, "rows": envelope["rows"], "cols": envelope["cols"]}
            out |= {k: envelope[k] for k in ("resized",) if k in envelope}
        elif "output" in envelope:  # exec, read
            out = {"output": envelope.get("output", ""), "alive": envelope.get("alive")}
            out |= {k: envelope.get(k) for k in ("exit_code", "running")}
        else:  # kill
            out = {"ok": True, "session_id": envelope.get("session_id"), "alive": envelope.get("alive", False)}
        out |= {k: envelope[k] for k in ("notice", "reply_cut") if k in envelope}
        if "notice" in out:
            out["notice"] = _retold(out["notice"])
        out["call_id"] = call_id
        return out

    return reply


def _retold(notice: str) -> str:
    """The gateway's notice in this profile's words: its files tool is `termux_fs`."""
    for gateway, here in _RETOLD:
        notice = notice.replace(gateway, here)
    return notice


_RETOLD = (
    (" (offset/limit in lines, or max_bytes), or files grep there", " (offset, max_bytes)"),
    ("files read with path", "termux_fs read with path"),
    ("session read for more output, session write to answer it, session kill", "action read for more output, "
     "write to answer it, kill"),
)  # fmt: skip


class TermuxFs(BaseModel):
    """Arguments of seed 000's `termux_fs`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    action: Literal["read", "write", "list", "stat", "mkdir", "delete"]
    path: PathText = Field(min_length=1)
    """Absolute, `~/...`, or relative to `~` (the policy's home)."""
    content: Content | None = None
    """write: the file's content."""
    encoding: Literal["utf-8", "base64"] = "utf-8"
    """write: how `content` is carried (read chooses by itself: utf-8 for text, base64 for binary)."""
    max_bytes: int = Field(default=DEFAULT_READ_BYTES, ge=1, le=MAX_READ_BYTES)
    """read: bytes to read (default 1 MB, at most 10 MB; the policy's limits.output_bytes caps it). Not given, a
    reply holds at most the policy's limits.reply_bytes (30000 by default) and says where to read on."""
    offset: int = Field(default=0, ge=0)
    """read: the byte to start at."""
    show_hidden: bool = False
    """list: include names starting with a dot."""
    parents: bool = True
    """mkdir: create missing parents too."""
    recursive: bool = False
    """delete: a directory and all it holds (decided as `rm -r`: the policy may ask a supervisor)."""

    @model_validator(mode="after")
    def _content_for_write(self) -> TermuxFs:
        if self.action == "write" and self.content is None:
            raise ValueError("content: required for write")
        return self


def _home_path(path: str) -> str:
    """The seed's paths are relative to $HOME: here, the policy's `home` (`~`)."""
    return path if path.startswith(("/", "~")) else f"~/{path}"


def _fs_call(args: TermuxFs, principal: str) -> FilesCall:
    common: dict[str, Any] = {"principal": principal, "action": args.action, "path": _home_path(args.path)}
    if args.action == "read":  # a size the caller did not give is the reply's bound, not a megabyte
        size = args.max_bytes if "max_bytes" in args.model_fields_set else None
        return FilesCall(**common, offset=args.offset, max_bytes=size, encoding="auto")
    if args.action == "write":
        return FilesCall(**common, content=args.content, encoding=args.encoding)
    if args.action == "list":
        return FilesCall(**common, show_hidden=args.show_hidden, max_results=10_000)
    if args.action == "mkdir":
        return FilesCall(**common, parents=args.parents)
    if args.action == "delete":
        return FilesCall(**common, recursive=args.recursive)
    return FilesCall(**common)


def _epoch(iso: Any) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if isinstance(iso, str) else None


def fs_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The files envelope as seed 000's `termux_fs` replies."""
    if envelope.get("status") != "ok":
        return _failure(envelope)
    e = envelope
    out: dict[str, Any]
    if "content" in e:  # read
        out = {
            "content": e["content"], "encoding": e.get("encoding"), "size": e.get("size"),
            "offset": e.get("offset"), "read_bytes": e.get("bytes"), "truncated": e.get("truncated"),
        }  # fmt: skip
        out |= {k: e[k] for k in ("next_offset",) if k in e}
    elif isinstance(e.get("entries"), list):  # list
        items = [
            {"name": x["name"], "is_dir": x["type"] == "directory", "size": x["size"], "mtime": _epoch(x["mtime"])}
            for x in e["entries"]
        ]
        out = {"path": e.get("path"), "items": items}
        if e.get("truncated"):
            out |= {"truncated": True, "total": e.get("total")}
    elif "is_symlink" in e:  # stat
        out = {
            "is_file": e["type"] == "file", "is_dir": e["type"] == "directory", "is_link": e["is_symlink"],
            "size": e["size"], "mtime": _epoch(e.get("mtime")), "atime": _epoch(e.get("atime")),
            "mode": e.get("mode"),
        }  # fmt: skip
    elif "created" in e and "bytes" in e:  # write
        out = {"path": e["path"], "size": e["bytes"]}
    elif "created" in e:  # mkdir
        out = {"ok": True, "path": e["path"], "created": e["created"]}
    else:  # delete
        out = {"ok": True, "path": e.get("path"), "deleted": e.get("deleted"), "entries": e.get("entries")}
    out |= {k: e[k] for k in ("notice",) if k in e}
    out["call_id"] = e.get("call_id")
    return out


_GATE = (
    " Every command is decided by the gateway's policy, runs in a sandbox and is recorded; a denial "
    "is status error with error.code POLICY_DENIED and the rule's justification (follow it, do not "
    "retry unchanged). A call a supervisor must approve returns status `pending` and a call_id: call "
    "`await_call` with it."
)
_HINTS = RUNS

SPECS: tuple[Spec, ...] = (
    Spec(
        "local_run_shell",
        RunShell,
        Tool.RUN,
        "Run a shell command (sh)",
        "Run one command with a POSIX sh (bash in POSIX mode) and return {status, exit_code, stdout, "
        "stderr}. timeout_ms defaults to 60000 (at most 300000); on timeout status is `timeout` and "
        "exit_code -1." + _GATE,
        _HINTS,
        resolver="client",
        adapt=_adapter("sh"),
        reply=run_reply,
    ),
    Spec(
        "termux_run_shell",
        RunShell,
        Tool.RUN,
        "Run a shell command (bash)",
        "Run one bash command and return {status, exit_code, stdout, stderr}. timeout_ms defaults to "
        "60000 (at most 300000); on timeout status is `timeout` and exit_code -1." + _GATE,
        _HINTS,
        resolver="client",
        adapt=_adapter("bash"),
        reply=run_reply,
    ),
    Spec(
        "local_shell_session",
        ShellSession,
        Tool.SESSION,
        "Persistent shell sessions (sh, pipes)",
        "A POSIX sh (bash in POSIX mode) over pipes that keeps its cwd and variables between commands. "
        "Actions: start ({session_id, output}), exec (command; waits up to `timeout` seconds, default 30: "
        "{output, alive}), write (raw `input`: to the running program, or newline-ended commands to the "
        "idle shell), read ({output, alive}: output since the last read), resize (accepted, no effect: no "
        "terminal), kill, list. Sessions end after 30 idle minutes. Long output is cut to its head and "
        "tail with a `notice` saying where the whole is saved." + _GATE,
        _HINTS,
        adapt=_session_adapter(pty=False),
        reply=_session_reply(pty=False),
    ),
    Spec(
        "termux_shell_session",
        ShellSession,
        Tool.SESSION,
        "Persistent terminal sessions (bash, PTY)",
        "A bash on a pseudo-terminal that keeps its cwd, variables and running programs between commands. "
        "Actions: start (cwd, rows, cols, env: {session_id, output}), exec (command; waits up to `timeout` "
        'seconds, default 30: {output, alive}), write (raw `input`, e.g. "y\\n" to answer a prompt; '
        '"\\u0003" is Ctrl-C), read ({output, alive}), resize (rows, cols), kill, list. Sessions end after '
        "30 idle minutes. Long output is cut to its head and tail with a `notice` saying where the whole "
        "is saved." + _GATE,
        _HINTS,
        adapt=_session_adapter(pty=True),
        reply=_session_reply(pty=True),
    ),
    Spec(
        "termux_fs",
        TermuxFs,
        Tool.FILES,
        "Read and write files in the home",
        "File operations without running a program, inside the directories the policy lets you read or "
        "write: read ({content, encoding, size, offset, read_bytes, truncated}; utf-8, or base64 for "
        "binary; max_bytes, offset), write (content, encoding utf-8 or base64: {path, size}), list "
        "(show_hidden: {items}), stat, mkdir (parents, default true), delete (recursive). Paths are "
        "absolute, `~/...` or relative to `~` (the home). A read that gives no max_bytes returns at most "
        "the policy's reply limit and says where to go on (truncated, next_offset)." + _GATE,
        RUNS,
        adapt=_fs_call,
        reply=fs_reply,
    ),
)
