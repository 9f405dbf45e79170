"""The `os` profile (seed 001): `shell_cmd`, `stop_daemon`, `get_daemon_output`, `env_get`,
`env_set`, `env_unset`, every reply in the seed's YAML output contract (`status: ok` first, then
the fields; an error is `status: error`, `error_code`, `message`), emitted with pyyaml's safe_dump.
The seed's text is public: longrun-ai/dominds, `main/tools/prompts/os/en/tools.md` and
`errors.md` (its implementation `main/tools/os.ts` gives the defaults); read for facts only.

    status: ok                           status: error
    command: echo hi                     error_code: DAEMON_NOT_FOUND
    exit_code: 0                         message: no daemon 7 of yours ...
    stdout: |                            pid: 7
      hi                                 call_id: 3f2a...
    ...

A command still running after `timeoutSeconds` is tracked as a daemon rather than killed: the
call is a `run` with `background_after_ms`, so the gateway's durable background processes take
it over (decided like any `run`, sandboxed, audited), and the reply names it by its `pid`. That
`pid` is a number of the principal's own, not the kernel's (the command runs in a sandbox's pid
namespace): the gateway numbers each principal's durable processes 1, 2, 3... in the order they
were started and keeps the number in the process's record, so a restarted gateway finds the
daemons that ran on by the same numbers and never gives a number twice. A number is looked up
among the caller's own processes only (another principal's number 1 is another process, and a
number that names nothing of yours is DAEMON_NOT_FOUND, decided and audited like any process
call).

A `shell` other than bash or sh is refused (INVALID_INPUT, recorded): the gateway's analyser
reads bash, so no other shell's text can be checked.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gateway.calls import EnvCall, EnvName, ProcessCall, RunCall, ShellText
from gateway.policy.schema import Tool
from gateway.server.specs import READS, RUNS, SETS, Spec

NAME = "os"
DEFAULT_BUFFER_LINES = 500
"""The seed's default (its implementation's `bufferSize` description: "default: 500")."""
MAX_BUFFER_LINES = 100_000
MAX_TIMEOUT_SECONDS = 24 * 3600
SHELLS = ("bash", "sh")
DAEMON_OUTPUT_BYTES = 1 << 20
"""How much of a daemon's log get_daemon_output reads (its last `bufferSize` lines are kept)."""
MAX_NUMBERED = 10_000
"""Daemons whose bufferSize is remembered (the oldest go first)."""


def _now() -> str:
    """The seed's timestamp format (its `formatUnifiedTimestamp`): `YYYY-MM-DD HH:MM:SS`, the
    gateway's local time."""
    return datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _stamp(iso: Any) -> str:
    """A gateway ISO-8601 timestamp in the seed's format (local time)."""
    if not isinstance(iso, str):
        return _now()
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return _now()


class Daemons:
    """The `bufferSize` each daemon's shell_cmd asked for, by (principal, number), for its
    get_daemon_output. The numbers themselves are the gateway's: kept with each process record
    (`gateway/executors/processes.py`), so they outlive a restart; a bufferSize does not (after a
    restart, get_daemon_output keeps the default 500 lines)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer: OrderedDict[tuple[str, int], int] = OrderedDict()

    def remember(self, principal: str, number: int, buffer_lines: int) -> None:
        with self._lock:
            self._buffer[(principal, number)] = buffer_lines
            while len(self._buffer) > MAX_NUMBERED:
                self._buffer.popitem(last=False)

    def buffer_lines(self, principal: str, number: int) -> int:
        with self._lock:
            return self._buffer.get((principal, number), DEFAULT_BUFFER_LINES)


DAEMONS = Daemons()
_BUFFER: ContextVar[int] = ContextVar("os_buffer_lines", default=DEFAULT_BUFFER_LINES)
"""The bufferSize of the shell_cmd call this request makes: its adapter sets it, its reply reads
it (one MCP request is one task). A result fetched later by `await_call` keeps the default."""
_COMMAND: ContextVar[str | None] = ContextVar("os_command", default=None)
"""The command of the shell_cmd call this request makes (the seed's reply names it)."""
_ASKED: ContextVar[int | None] = ContextVar("os_daemon_asked", default=None)
_VALUE: ContextVar[str | None] = ContextVar("os_env_value", default=None)
"""The value this request's env_set sets (its reply repeats it, as the seed's does)."""
"""The daemon number this request's stop_daemon or get_daemon_output asked for (for its reply)."""


def _by_number(number: int) -> str:
    """How the process tool names the caller's own process number N (`daemon-N`): looked up among
    that principal's processes only, so another principal's N, or a number nobody was given,
    is PROCESS_NOT_FOUND through the same gate, recorded."""
    return f"daemon-{number}"


# --- arguments ----------------------------------------------------------------------------------
class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ShellCmd(_Args):
    """Arguments of seed 001's `shell_cmd`."""

    command: ShellText
    """The shell command."""
    shell: str = Field(default="bash", max_length=100)
    """`bash` (default) or `sh` (bash in POSIX mode, where the policy's `shells` lists it).
    Any other shell is refused: the gateway can only check bash."""
    bufferSize: int = Field(default=DEFAULT_BUFFER_LINES, ge=0, le=MAX_BUFFER_LINES)  # the seed's name
    """Lines of stdout and of stderr kept in the reply (the last ones), and of a daemon's output
    (default 500; 0 means the default, as in the seed)."""
    timeoutSeconds: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT_SECONDS)  # the seed's name
    """Seconds after which a still-running command is tracked as a daemon (its pid is in the reply)
    instead of killed. Without it (or 0), the command is killed at the policy's time limit."""


class DaemonId(_Args):
    """Arguments of seed 001's `stop_daemon`."""

    pid: int = Field(ge=1)
    """The daemon's pid, as shell_cmd returned it (a number of yours, not the kernel's)."""


class DaemonOutput(DaemonId):
    """Arguments of seed 001's `get_daemon_output`."""

    stream: Literal["stdout", "stderr"] | None = None
    """Accepted as the seed's implementation has it; a daemon's stdout and stderr are one stream
    here (the reply says `merged_output: true`), so either gives the same output."""


class EnvGet(_Args):
    """Arguments of seed 001's `env_get` and `env_unset`."""

    key: EnvName = Field(min_length=1)
    """The variable's name."""


class EnvSet(_Args):
    """Arguments of seed 001's `env_set`."""

    key: EnvName = Field(min_length=1)
    """The variable's name (the policy's environment.allow must list it; PATH, LD_* and the like never)."""
    value: str = Field(max_length=128 * 1024)
    """Its value, for later shell_cmd calls."""


# --- adapters -----------------------------------------------------------------------------------
def _shell_call(args: ShellCmd, principal: str) -> RunCall:
    if args.shell not in SHELLS:
        raise ValueError(
            f"shell: {args.shell!r} is refused: the gateway's analyser reads bash, so only bash and sh "
            "(bash in POSIX mode) commands can be checked; use bash"
        )
    after = args.timeoutSeconds * 1000 if args.timeoutSeconds else None
    return RunCall(principal=principal, command=args.command, shell=args.shell, background_after_ms=after)  # type: ignore[arg-type]


def _daemon(action: str) -> Any:
    def adapt(args: DaemonId, principal: str) -> ProcessCall:
        _ASKED.set(args.pid)
        process_id = _by_number(args.pid)
        if action == "output":
            return ProcessCall(
                principal=principal, action="output", process_id=process_id, max_bytes=DAEMON_OUTPUT_BYTES
            )
        return ProcessCall(principal=principal, action="stop", process_id=process_id)

    return adapt


def _env_get(args: EnvGet, principal: str) -> EnvCall:
    return EnvCall(principal=principal, action="get", name=args.key)


def _env_set(args: EnvSet, principal: str) -> EnvCall:
    _VALUE.set(args.value)  # the seed's env_set reply repeats it
    return EnvCall(principal=principal, action="set", name=args.key, value=args.value)


def _env_unset(args: EnvGet, principal: str) -> EnvCall:
    return EnvCall(principal=principal, action="unset", name=args.key)


# --- replies ------------------------------------------------------------------------------------
CODES = {
    "PROCESS_NOT_FOUND": "DAEMON_NOT_FOUND", "ENV_NOT_SET": "ENV_NOT_FOUND",
    "COMMAND_NOT_FOUND": "SHELL_COMMAND_FAILED", "COMMAND_TIMEOUT": "SHELL_COMMAND_FAILED",
    "SPAWN_FAILED": "SHELL_COMMAND_FAILED",
}  # fmt: skip
"""The gateway's codes under the seed's names (its errors.md: SHELL_COMMAND_FAILED is "command
doesn't exist, insufficient permissions, command execution timeout"; the gateway's own code stays
in `cause`); every other code comes through unchanged."""


class _Dumper(yaml.SafeDumper):
    """safe_dump's dumper, with multi-line text as a literal block (`|`), as a human writes it."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None  # the emitter falls back to quoting where a block cannot hold it
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(reply: dict[str, Any]) -> str:
    """A reply as the seed's YAML: `status` first, the fields in order (pyyaml's safe dumper: plain
    YAML types only, so any YAML reader loads it safely). Its hints name this profile's tools."""
    return yaml.dump(
        _retold(reply), Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1 << 16
    )


_RETOLD: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r" \(env list shows what is\)"), " (env_set sets one; the host's variables are never seen here)"),
    (
        re.compile(r"files read with path '[^']*' \(offset/limit in lines, or max_bytes\), or files grep there"),
        "this profile has no tool that reads it: run the command again with its output redirected to a file "
        "in the workspace, and read that with shell_cmd (sed -n, tail, grep)",
    ),
    (re.compile(r"; the files tool reads, writes, lists and searches files without running a program"), ""),
)
"""The gateway's hints that name its own tools (`env list`, `files read`), in this profile's words:
an agent of seed 001 has shell_cmd, the daemons and env_get/env_set/env_unset only."""


def _retold(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _retold(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_retold(v, key) for v in value]
    if isinstance(value, str) and key in ("message", "notice", "next"):
        for pattern, here in _RETOLD:
            value = pattern.sub(here, value)
    return value


def _last_lines(text: str, keep: int) -> tuple[str, int]:
    """The last `keep` lines of `text`, and how many were dropped."""
    lines = text.splitlines(keepends=True)
    if len(lines) <= keep:
        return text, 0
    return "".join(lines[-keep:]), len(lines) - keep


def _error(envelope: dict[str, Any], **fields: Any) -> dict[str, Any]:
    err = envelope.get("error") or {}
    cause = str(err.get("code", "INTERNAL_ERROR"))
    code = CODES.get(cause, cause)
    message = str(err.get("message", ""))
    asked = _ASKED.get()
    if code == "DAEMON_NOT_FOUND" and asked is not None:
        message = f"no daemon {asked} of yours: the pids are the ones shell_cmd returned"
    elif code == "DAEMON_NOT_RUNNING" and asked is not None:
        message = f"daemon {asked} is not running (it is {(envelope.get('process') or {}).get('state', 'ended')})"
    out: dict[str, Any] = {"status": "error", "error_code": code, "message": message}
    if code == "SHELL_COMMAND_FAILED":
        out["cause"] = cause
    out |= {k: v for k, v in fields.items() if v is not None}
    out |= {k: envelope[k] for k in ("rule", "reasons") if envelope.get(k) is not None}
    return out


def _call_id(envelope: dict[str, Any]) -> dict[str, Any]:
    return {"call_id": envelope.get("call_id")}


def _pending(envelope: dict[str, Any]) -> dict[str, Any]:
    out = {"status": "pending", "call_id": envelope.get("call_id")}
    return out | {k: envelope[k] for k in ("approval", "next") if k in envelope}


def _tail_fields(out: dict[str, Any], envelope: dict[str, Any], keep: int) -> None:
    for stream in ("stdout", "stderr"):
        if stream in envelope:
            out[stream], dropped = _last_lines(str(envelope[stream]), keep)
            if dropped:
                out[f"{stream}_lines_dropped"] = dropped


def shell_reply(keep: int) -> Any:
    def reply(envelope: dict[str, Any], principal: str) -> dict[str, Any]:
        status = envelope.get("status")
        if status == "pending":
            return _pending(envelope)
        command = _COMMAND.get()
        if envelope.get("backgrounded") is True and status == "ok":
            n = envelope.get("process_number")
            if isinstance(n, int):
                DAEMONS.remember(principal, n, keep)
            output, dropped = _last_lines(str(envelope.get("output", "")), keep)
            out: dict[str, Any] = {"status": "ok"}
            if command is not None:
                out["command"] = command
            out |= {
                "pid": n, "daemon": True, "output": output, "executed_at": _now(), "cwd": envelope.get("cwd"),
                "message": f"still running after timeoutSeconds: tracked as daemon pid {n} (get_daemon_output, "
                f"stop_daemon with pid {n})",
            }  # fmt: skip
            if dropped:
                out["output_lines_dropped"] = dropped
            if "reply_cut" in envelope:  # over the role's reply_bytes: where the whole of it is
                out["reply_cut"] = envelope["reply_cut"]
            out["call_id"] = envelope.get("call_id")
            return out
        if status != "ok":
            code = envelope.get("exit_code")
            out = _error(envelope, exit_code=code)
            if code is not None:  # it ran: what it printed belongs with the error
                _tail_fields(out, envelope, keep)
            if "started_at" in envelope:
                out["executed_at"] = _stamp(envelope["started_at"])
            out["call_id"] = envelope.get("call_id")
            return out
        out = {"status": "ok"}
        if command is not None:
            out["command"] = command
        out["exit_code"] = envelope.get("exit_code")
        if "backgrounded" in envelope:  # ran as a tracked process and ended in time: one merged stream
            out["stdout"], dropped = _last_lines(str(envelope.get("output", "")), keep)
            out["stderr"] = ""
            out["executed_at"] = _now()  # the seed's fields first, in its order
            out["merged_output"] = True
            if dropped:
                out["stdout_lines_dropped"] = dropped
        else:
            _tail_fields(out, envelope, keep)
            out["executed_at"] = _stamp(envelope.get("started_at"))
            out["duration_ms"] = envelope.get("duration_ms")
        out["cwd"] = envelope.get("cwd")
        out |= {k: envelope[k] for k in ("notice", "reply_cut") if k in envelope}
        out["call_id"] = envelope.get("call_id")
        return out

    return reply


def _shell_reply(envelope: dict[str, Any], principal: str) -> dict[str, Any]:
    shaped: dict[str, Any] = shell_reply(_BUFFER.get())(envelope, principal)
    return shaped


def _number(envelope: dict[str, Any], principal: str) -> int | None:
    n = envelope.get("number", (envelope.get("process") or {}).get("number"))
    return n if isinstance(n, int) else None


def stop_reply(envelope: dict[str, Any], principal: str) -> dict[str, Any]:
    status = envelope.get("status")
    if status == "pending":
        return _pending(envelope)
    n = _number(envelope, principal)
    proc = envelope.get("process") or {}
    if status != "ok":
        return _error(envelope, pid=n or _ASKED.get(), state=proc.get("state")) | _call_id(envelope)
    return {
        "status": "ok", "pid": n, "stopped_at": _stamp(proc.get("ended_at")), "state": proc.get("state"),
        "exit_code": proc.get("exit_code"), "call_id": envelope.get("call_id"),
    }  # fmt: skip


def output_reply(envelope: dict[str, Any], principal: str) -> dict[str, Any]:
    status = envelope.get("status")
    if status == "pending":
        return _pending(envelope)
    n = _number(envelope, principal)
    if status != "ok":
        return _error(envelope, pid=n or _ASKED.get()) | _call_id(envelope)
    keep = DAEMONS.buffer_lines(principal, n) if n is not None else DEFAULT_BUFFER_LINES
    output, dropped = _last_lines(str(envelope.get("output", "")), keep)
    out: dict[str, Any] = {"status": "ok", "pid": n, "output": output, "retrieved_at": _now()}
    out |= {"state": envelope.get("state"), "running": envelope.get("state") in ("running", "backoff")}
    out["merged_output"] = True
    if dropped or envelope.get("truncated"):
        out["output_lines_dropped"] = dropped
        out["truncated"] = True
    out["call_id"] = envelope.get("call_id")
    return out


def env_reply(stamp: str) -> Any:
    def reply(envelope: dict[str, Any]) -> dict[str, Any]:
        status = envelope.get("status")
        if status == "pending":
            return _pending(envelope)
        if status != "ok":
            return _error(envelope) | _call_id(envelope)
        out: dict[str, Any] = {"status": "ok", "key": envelope.get("name")}
        if "value" in envelope:
            out["value"] = envelope["value"]
        elif stamp == "set_at" and _VALUE.get() is not None:
            out["value"] = _VALUE.get()
        out[stamp] = _now()
        if "was_set" in envelope:
            out["was_set"] = envelope["was_set"]
        out["call_id"] = envelope.get("call_id")
        return out

    return reply


_GATE = (
    " Every call is decided by the gateway's policy and recorded; a denial is `status: error` with "
    "`error_code: POLICY_DENIED` and the rule's justification (follow it; do not retry unchanged). A "
    "call a supervisor must approve is `status: pending` with a call_id: call `await_call` with it. "
    "Replies are YAML."
)
_RUNS = RUNS
_READS = READS
_ENV = SETS


def _shell_spec() -> Spec:
    def adapt(args: ShellCmd, principal: str) -> RunCall:
        _BUFFER.set(args.bufferSize or DEFAULT_BUFFER_LINES)  # for this request's reply (the same task)
        _COMMAND.set(args.command)
        return _shell_call(args, principal)

    return Spec(
        "shell_cmd",
        ShellCmd,
        Tool.RUN,
        "Run a shell command",
        "Run one command (bash, or sh) in a sandbox and reply in YAML: status ok with command, exit_code, "
        "stdout, stderr (their last bufferSize lines, default 500), executed_at. With timeoutSeconds, a "
        "command still running then is tracked as a daemon: status ok, daemon true and a numeric pid for "
        "get_daemon_output and stop_daemon. Errors: status error, error_code (SHELL_COMMAND_FAILED for a "
        "command not found or timed out, with the cause), message." + _GATE,
        _RUNS,
        resolver="client",
        adapt=adapt,
        reply_for=_shell_reply,
        render=render,
    )


SPECS: tuple[Spec, ...] = (
    _shell_spec(),
    Spec(
        "stop_daemon",
        DaemonId,
        Tool.PROCESSES,
        "Stop a daemon",
        "Stop the daemon shell_cmd tracked with this pid: status ok with pid and stopped_at; "
        "DAEMON_NOT_FOUND for a pid that is not one of yours, DAEMON_NOT_RUNNING if it already ended." + _GATE,
        _RUNS,
        adapt=_daemon("stop"),
        reply_for=stop_reply,
        render=render,
    ),
    Spec(
        "get_daemon_output",
        DaemonOutput,
        Tool.PROCESSES,
        "A daemon's output",
        "The output of the daemon shell_cmd tracked with this pid (its last bufferSize lines, stdout and "
        "stderr as one stream), its state and whether it still runs; DAEMON_NOT_FOUND for a pid that is "
        "not one of yours." + _GATE,
        _READS,
        adapt=_daemon("output"),
        reply_for=output_reply,
        render=render,
    ),
    Spec(
        "env_get",
        EnvGet,
        Tool.ENV,
        "Read a variable",
        "The value of a variable you set for later shell_cmd calls (status ok, key, value, "
        "retrieved_at); ENV_NOT_FOUND if it is not set." + _GATE,
        _READS,
        adapt=_env_get,
        reply=env_reply("retrieved_at"),
        render=render,
    ),
    Spec(
        "env_set",
        EnvSet,
        Tool.ENV,
        "Set a variable",
        "Set a variable that later shell_cmd calls inherit (status ok, key, value, set_at). Only names "
        "the policy allows; PATH, HOME, LD_* and the like never." + _GATE,
        _ENV,
        adapt=_env_set,
        reply=env_reply("set_at"),
        render=render,
    ),
    Spec(
        "env_unset",
        EnvGet,
        Tool.ENV,
        "Unset a variable",
        "Remove a variable you set (status ok, key, unset_at, was_set)." + _GATE,
        _ENV,
        adapt=_env_unset,
        reply=env_reply("unset_at"),
        render=render,
    ),
)
