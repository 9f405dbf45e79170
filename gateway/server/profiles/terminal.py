"""The `terminal-interface` profile (seed 003): `run_terminal_command`,
`format_terminal_output`, `start_interactive_shell`, and the tools that use the shell it starts
(`execute_in_shell`, `send_shell_input`, `read_shell_output`, `close_shell`, `list_shells`).
The seed's text is public: docxology/codomyrmex,
`src/codomyrmex/terminal_interface/MCP_TOOL_SPECIFICATION.md`; read for facts only.

    {"command": "ls", "working_directory": "src", "timeout_seconds": 30}
    {"success": true, "command": "ls", "return_code": 0, "stdout": "...", "stderr": "",
     "execution_time": 0.012, "working_directory": "/srv/ws/src", "call_id": "..."}

An interactive shell is one of the gateway's sessions, on a pseudo-terminal: every line sent to
it as a command (`startup_commands`, `execute_in_shell`, each line `send_shell_input` writes to
the idle shell) is decided by the policy before the shell sees it, and audited with its own
call_id. The gateway decides shell text as bash reads it: a `shell_type` of bash (or sh, bash in
POSIX mode, or codomyrmex, a bash with the seed's own commands) runs every allowed line. A zsh
shell is a real zsh in the sandbox (its own loop, gateway/executors/sessions.py), and each line is
decided as bash text only where zsh reads it as bash does (gateway/analysis/zsh.py: both of
shfmt's parses equal, nothing zsh-only in it); a line zsh reads otherwise (`*(e:cmd:)`,
`path=(...)`, `setopt`, a function named TRAPEXIT...) is denied with the reason that names it. A
python shell is the interpreter where the policy allows it, each line recorded. fish and any other
`shell_type` is refused with the reason (INVALID_INPUT, recorded): nothing runs unchecked.
`format_terminal_output` is pure formatting (`format_output`): no shell.

Every reply has `success`; a failure adds `error_code` and `error` (the message), and for a
denial the deciding `rule` and `reasons`. A call a supervisor must approve is `success: false`
with `status: pending` and a `call_id` for `await_call`.
"""

from __future__ import annotations

import shlex
from collections import OrderedDict
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.calls import (
    MAX_SHELL_CHARS,
    MAX_STARTUP_COMMANDS,
    Content,
    FormatOutputCall,
    PathText,
    RunCall,
    SessionCall,
    ShellText,
)
from gateway.policy.schema import Tool
from gateway.server.specs import READS, RUNS, Spec
from gateway.tools.format_output import STYLES

ERROR_STYLE = STYLES["error"][0]

NAME = "terminal-interface"
DEFAULT_TIMEOUT_S = 30
MAX_TIMEOUT_S = 3600
SHELL_TYPES = ("bash", "sh", "zsh", "codomyrmex", "python")
SHELL_TOOLS = ("execute_in_shell", "send_shell_input", "read_shell_output", "close_shell", "list_shells")
"""The tools that use a started shell."""
CODOMYRMEX = "codomyrmex"
CODOMYRMEX_PROMPT = "codomyrmex> "
CODOMYRMEX_COMMANDS = ("analyze", "build", "deploy", "help")
"""The seed's `available_commands` of a codomyrmex shell; each becomes a shell command (`_codomyrmex`)."""
ERROR_SYMBOL = "\u274c"
"""The seed's symbol for an error message (its example: `\\u001b[31m\u274c Error: ...`)."""
REFUSED_SHELLS: dict[str, str] = {}
"""shell_types refused, and why (docs/tools.md, terminal-interface: what still differs)."""

Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)]
ShellId = Annotated[str, Field(min_length=1, max_length=100)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class RunTerminalCommand(_Args):
    """Arguments of seed 003's `run_terminal_command`."""

    command: ShellText
    """The command (bash)."""
    working_directory: PathText | None = None
    """Directory to run in (default: the workspace; relative: against it). Must lie in your roots."""
    timeout_seconds: Seconds = DEFAULT_TIMEOUT_S
    """Seconds before the command is killed (the policy's limit caps it)."""
    capture_output: bool = True
    """False: the output is discarded, never read (stdout and stderr come back empty)."""


FormatType = Literal["success", "error", "warning", "info", "table", "json"]


Cell = Annotated[str, Field(max_length=10_000)]


class FormatTerminalOutput(_Args):
    """Arguments of seed 003's `format_terminal_output`."""

    content: Content
    """The content: the message (success, error, warning, info), JSON text (json); for a table,
    kept as `original_content` (the table is `table_headers` and `table_rows`)."""
    format_type: FormatType = "info"
    """success, error, warning, info, table or json."""
    table_headers: Annotated[list[Cell], Field(max_length=100)] | None = None
    """table: the column names (without them, the first row is the header)."""
    table_rows: Annotated[list[Annotated[list[Cell], Field(max_length=100)]], Field(max_length=10_000)] | None = None
    """table: the rows, each a list of cells."""


class StartInteractiveShell(_Args):
    """Arguments of seed 003's `start_interactive_shell`."""

    shell_type: str = Field(default="bash", max_length=100)
    """`bash` (default), `sh`, `zsh` (a real zsh: each line runs where zsh reads it as bash does, and
    is refused with the reason where not), `python` (where the policy allows the interpreter), or
    `codomyrmex` (a bash whose own commands are analyze, build, deploy and help). fish and other
    shells are refused, with the reason: the gateway checks bash."""
    working_directory: PathText | None = None
    """Directory the shell starts in (default: the workspace)."""
    prompt: str | None = Field(default=None, max_length=200)
    """Text shown after each command's output, like PS1."""
    startup_commands: Annotated[list[ShellText], Field(max_length=MAX_STARTUP_COMMANDS)] = []
    """Commands run first, in order, each decided like any other (the first that fails stops the rest)."""


class ExecuteInShell(_Args):
    """Arguments of `execute_in_shell`."""

    shell_id: ShellId
    """The shell_id start_interactive_shell returned."""
    command: ShellText
    """The command."""
    timeout_seconds: Seconds = DEFAULT_TIMEOUT_S
    """How long to wait for it (it keeps running after: read_shell_output, send_shell_input)."""


class SendShellInput(_Args):
    """Arguments of `send_shell_input`."""

    shell_id: ShellId
    input: Annotated[str, Field(min_length=1, max_length=MAX_SHELL_CHARS)]
    """Text to send as typed (add "\\n" to press enter). To a running program it is input; to the
    idle shell each line is a command, decided like execute_in_shell. "\\u0003" is Ctrl-C."""


class ShellOnly(_Args):
    """Arguments of `read_shell_output` and `close_shell`."""

    shell_id: ShellId


class NoArgs(_Args):
    """`list_shells` takes no arguments."""


# --- adapters -------------------------------------------------------------------------------------
_COMMAND: ContextVar[str | None] = ContextVar("terminal_command", default=None)
"""The command of the run_terminal_command call this request makes (the seed's reply names it;
one MCP request is one task). A result fetched later by `await_call` has no `command`."""
_FORMAT: ContextVar[tuple[str, str] | None] = ContextVar("terminal_format", default=None)
"""(format_type, content) of this request's format_terminal_output (its reply repeats them)."""
_SHELL: ContextVar[str | None] = ContextVar("terminal_shell_type", default=None)
"""The shell_type of this request's start_interactive_shell (its reply repeats it)."""


def _run(args: RunTerminalCommand, principal: str) -> RunCall:
    _COMMAND.set(args.command)
    return RunCall(
        principal=principal, command=args.command, cwd=args.working_directory,
        timeout_ms=max(1, round(args.timeout_seconds * 1000)), capture_output=args.capture_output,
    )  # fmt: skip


def _format(args: FormatTerminalOutput, principal: str) -> FormatOutputCall:
    _FORMAT.set((args.format_type, args.content))
    if args.format_type == "table":
        if not args.table_rows:
            raise ValueError("table_rows: a table needs its rows (a list of lists of cells)")
        rows: list[list[str]] = [list(r) for r in args.table_rows]
        if args.table_headers is not None:
            rows = [list(args.table_headers), *rows]
        return FormatOutputCall(principal=principal, kind="table", data=rows)
    return FormatOutputCall(principal=principal, kind=args.format_type, message=args.content)


def _start(args: StartInteractiveShell, principal: str) -> SessionCall:
    if args.shell_type not in SHELL_TYPES:
        why = REFUSED_SHELLS.get(args.shell_type, "the gateway decides every line a shell runs as bash reads it")
        raise ValueError(
            f"shell_type: {args.shell_type!r} is refused: {why}; so it is not run unchecked either. Use bash "
            f"(or sh, zsh, python, or codomyrmex)"
        )
    _SHELL.set(args.shell_type)
    codomyrmex = args.shell_type == CODOMYRMEX
    shell: Literal["bash", "sh", "zsh", "python"] = (
        args.shell_type if args.shell_type in ("sh", "zsh", "python") else "bash"  # type: ignore[assignment]
    )
    return SessionCall(
        principal=principal, action="start", pty=True, shell_type=shell,
        cwd=args.working_directory, prompt=args.prompt or (CODOMYRMEX_PROMPT if codomyrmex else None),
        startup_commands=[_codomyrmex(c) if codomyrmex else c for c in args.startup_commands],
        programs=shell != "python" and not codomyrmex,
    )  # fmt: skip


def _codomyrmex(line: str) -> str:
    """A line for a codomyrmex shell: its own commands as the shell commands they stand for (each
    then decided by the policy like any line), anything else as it is.

        help             the commands, and that any other line is a shell command
        analyze [PATH]   what changed in the project: git status --short, git diff --stat
        build [TARGET]   make [TARGET]
        deploy           refused: the sandbox has no network, and a deployment is a supervisor's act
    """
    word, _, rest = line.strip().partition(" ")
    rest = rest.strip()
    if word == "help":
        lines = [
            "analyze [PATH]  what changed in the project (git status, git diff --stat)",
            "build [TARGET]  make [TARGET]",
            "deploy          not available here: the sandbox has no network",
            "help            this list; any other line is a shell command, decided by the policy",
        ]
        return "printf '%s\\n' " + " ".join(shlex.quote(x) for x in lines)
    if word == "analyze":
        where = f" -- {rest}" if rest else ""
        return f"git status --short{where} && git diff --stat{where}"
    if word == "build":
        return f"make {rest}".rstrip()
    if word == "deploy":
        raise ValueError(
            "deploy is not available through the gateway: the sandbox has no network, and a deployment is a "
            "supervisor's act (build, analyze and shell commands are)"
        )
    return line


_KINDS: OrderedDict[tuple[str, str], str] = OrderedDict()
"""(principal, shell_id) -> a shell_type the gateway's session does not know by itself
(codomyrmex), so execute_in_shell can read that shell's own commands. Bounded: the oldest go."""
MAX_KINDS = 10_000


def _exec(args: ExecuteInShell, principal: str) -> SessionCall:
    kind = _KINDS.get((principal, args.shell_id))
    return SessionCall(
        principal=principal, action="exec", session_id=args.shell_id,
        command=_codomyrmex(args.command) if kind == CODOMYRMEX else args.command,
        timeout_ms=max(1, round(args.timeout_seconds * 1000)),
    )  # fmt: skip


def _write(args: SendShellInput, principal: str) -> SessionCall:
    return SessionCall(principal=principal, action="write", session_id=args.shell_id, input=args.input)


def _session(action: Literal["read", "kill"]) -> Any:
    def adapt(args: ShellOnly, principal: str) -> SessionCall:
        return SessionCall(principal=principal, action=action, session_id=args.shell_id)

    return adapt


def _list(args: NoArgs, principal: str) -> SessionCall:
    return SessionCall(principal=principal, action="list")


# --- replies --------------------------------------------------------------------------------------
def _failure(envelope: dict[str, Any]) -> dict[str, Any]:
    err = envelope.get("error") or {}
    out: dict[str, Any] = {"success": False, "error_code": err.get("code", "INTERNAL_ERROR")}
    out["error"] = err.get("message", "")
    return out | {k: envelope[k] for k in ("rule", "reasons") if envelope.get(k) is not None}


def _shaped(envelope: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """success or the failure, then `fields`, then `call_id`."""
    status = envelope.get("status")
    if status == "pending":
        out = {"success": False, "status": "pending"} | {k: envelope[k] for k in ("approval", "next") if k in envelope}
    elif status == "ok":
        out = {"success": True}
    else:
        out = _failure(envelope)
    out |= {k: v for k, v in fields.items() if v is not None}
    out |= {k: envelope[k] for k in ("notice", "reply_cut") if k in envelope}
    out["call_id"] = envelope.get("call_id")
    return out


def run_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """`success` is the command's: it ran and returned 0 (a non-zero return_code is success false
    without an error_code: the command ran, and isError stays false)."""
    ran = "exit_code" in envelope
    code = envelope.get("exit_code")
    duration = envelope.get("duration_ms")
    out = _shaped(envelope, {
        "command": _COMMAND.get(),
        "return_code": code if code is not None else (-1 if not ran or envelope.get("status") == "timeout" else None),
        "stdout": envelope.get("stdout", "") if ran else None,
        "stderr": envelope.get("stderr", "") if ran else None,
        "execution_time": round(duration / 1000, 3) if isinstance(duration, int | float) else None,
        "working_directory": envelope.get("cwd"),
    })  # fmt: skip
    if envelope.get("status") == "ok" and code != 0:
        out["success"] = False  # the command's failure, not the call's: no error_code
    return out


def format_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The seed's reply: `formatted_content`, `format_type`, `original_content`, `terminal_codes`
    (the escape codes used, as the seed writes them: `["31m", "0m"]`)."""
    asked = _FORMAT.get()
    codes = envelope.get("ansi_codes")
    used = [f"{c}m" for c in codes] + ["0m"] if codes else ([] if codes is not None else None)
    text = envelope.get("text")
    if asked is not None and asked[0] == "error" and isinstance(text, str):  # the seed's symbol
        text = text.replace(f"{ERROR_STYLE} ", f"{ERROR_SYMBOL} ", 1)
    return _shaped(envelope, {
        "formatted_content": text,
        "format_type": asked[0] if asked else None,
        "original_content": asked[1] if asked else None,
        "terminal_codes": used,
    })  # fmt: skip


def _startup(envelope: dict[str, Any]) -> list[dict[str, Any]]:
    done = []
    for r in envelope.get("startup") or []:
        item = {"status": "ok" if r.get("status") == "ok" else r.get("status"), "return_code": r.get("exit_code")}
        item["output"] = r.get("output", "")
        if r.get("status") != "ok":
            item["error_code"] = (r.get("error") or {}).get("code")
        done.append(item | {"call_id": r.get("call_id")})
    return done


def start_reply(envelope: dict[str, Any], principal: str) -> dict[str, Any]:
    """`available_commands` as the seed means them, what can be typed in the shell: a codomyrmex
    shell's own commands; for bash and sh, the programs the policy lets this principal run."""
    shell_id = envelope.get("session_id")
    startup = _startup(envelope)
    kind = _SHELL.get()
    if shell_id and kind == CODOMYRMEX:
        _KINDS[(principal, str(shell_id))] = kind
        while len(_KINDS) > MAX_KINDS:
            _KINDS.popitem(last=False)
    # (a python shell has no commands of its own: each line is Python)
    commands = list(CODOMYRMEX_COMMANDS) if kind == CODOMYRMEX else [] if kind == "python" else envelope.get("programs")
    return _shaped(envelope, {
        "shell_id": shell_id,
        "shell_type": (kind or envelope.get("shell_type")) if shell_id else None,
        "status": ("started" if envelope.get("alive") else "closed") if shell_id else None,
        "working_directory": envelope.get("cwd"),
        "output": envelope.get("output") if shell_id else None,
        "startup_commands_executed": sum(1 for s in startup if s["status"] == "ok") if shell_id else None,
        "startup_results": startup or None,
        "available_commands": commands if shell_id else None,
        "shell_tools": list(SHELL_TOOLS) if shell_id else None,
    })  # fmt: skip


def exec_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """`success` as run_terminal_command's: false for a command that returned non-zero."""
    out = _shaped(envelope, {
        "shell_id": envelope.get("session_id"),
        "output": envelope.get("output"),
        "return_code": envelope.get("exit_code"),
        "running": envelope.get("running"),
        "alive": envelope.get("alive"),
        "working_directory": envelope.get("cwd"),
    })  # fmt: skip
    code = envelope.get("exit_code")
    if envelope.get("status") == "ok" and isinstance(code, int) and code != 0:
        out["success"] = False  # the command's failure, not the call's: no error_code
    return out


def write_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    return _shaped(envelope, {
        "shell_id": envelope.get("session_id"),
        "sent": envelope.get("sent"),
        "output": envelope.get("output"),
        "running": envelope.get("running"),
    })  # fmt: skip


def read_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    return _shaped(envelope, {
        "shell_id": envelope.get("session_id"),
        "output": envelope.get("output"),
        "running": envelope.get("running"),
        "alive": envelope.get("alive"),
        "return_code": envelope.get("exit_code"),
    })  # fmt: skip


def close_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    ok = envelope.get("status") == "ok"
    return _shaped(envelope, {"shell_id": envelope.get("session_id"), "status": "closed" if ok else None})


def list_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    shells = [
        {
            "shell_id": s.get("session_id"),
            "status": "active" if s.get("alive") else "closed",
            "working_directory": s.get("cwd"),
            "running": s.get("running"),
            "idle_seconds": s.get("idle_seconds"),
        }
        for s in envelope.get("sessions") or []
        if s.get("pty")  # the shells this profile starts (a gateway `session` over pipes is not one)
    ]
    return _shaped(envelope, {"shells": shells if envelope.get("status") == "ok" else None})


_GATE = (
    " Every command is decided by the gateway's policy, runs in a sandbox and is recorded; a denial "
    "is success false with error_code POLICY_DENIED and the rule's justification (follow it; do not "
    "retry unchanged). A call a supervisor must approve returns status `pending` and a call_id: call "
    "`await_call` with it."
)
_RUNS = RUNS
_READS = READS

SPECS: tuple[Spec, ...] = (
    Spec(
        "run_terminal_command",
        RunTerminalCommand,
        Tool.RUN,
        "Run a terminal command",
        "Run one bash command and reply {success, command, return_code, stdout, stderr, execution_time (seconds), "
        "working_directory}. timeout_seconds defaults to 30; capture_output false discards the output." + _GATE,
        _RUNS,
        resolver="client",
        adapt=_run,
        reply=run_reply,
    ),
    Spec(
        "format_terminal_output",
        FormatTerminalOutput,
        None,
        "Format text for a terminal",
        "Format content as a success, error, warning or info message, or JSON text, or format table_rows "
        "(with table_headers) as a table, with ANSI terminal codes: {success, formatted_content, format_type, "
        "original_content, terminal_codes (the codes used)}. Runs nothing.",
        READS,
        adapt=_format,
        reply=format_reply,
    ),
    Spec(
        "start_interactive_shell",
        StartInteractiveShell,
        Tool.SESSION,
        "Start an interactive shell",
        "Start a persistent bash on a terminal (keeps cwd and variables) and run startup_commands in it: "
        "{success, shell_id, shell_type, status, startup_commands_executed, available_commands}. Use it with "
        "execute_in_shell, send_shell_input, read_shell_output, close_shell, list_shells. shell_type bash "
        "(default), sh, zsh (a line zsh reads otherwise than bash is refused with the reason), python or "
        "codomyrmex." + _GATE,
        _RUNS,
        adapt=_start,
        reply_for=start_reply,
    ),
    Spec(
        "execute_in_shell",
        ExecuteInShell,
        Tool.SESSION,
        "Run a command in a shell",
        "Run a command in a shell start_interactive_shell started and wait for it (timeout_seconds, "
        "default 30; it keeps running after): {success, output, return_code, running, working_directory}." + _GATE,
        _RUNS,
        adapt=_exec,
        reply=exec_reply,
    ),
    Spec(
        "send_shell_input",
        SendShellInput,
        Tool.SESSION,
        "Type into a shell",
        "Send text to a shell as typed: input to the program running in it, or, to the idle shell, "
        "commands (each line decided like execute_in_shell). {success, sent, output, running}." + _GATE,
        _RUNS,
        adapt=_write,
        reply=write_reply,
    ),
    Spec(
        "read_shell_output",
        ShellOnly,
        Tool.SESSION,
        "Read a shell's output",
        "The shell's output since the last read: {success, output, running, alive, return_code}." + _GATE,
        _READS,
        adapt=_session("read"),
        reply=read_reply,
    ),
    Spec(
        "close_shell",
        ShellOnly,
        Tool.SESSION,
        "Close a shell",
        "End a shell and everything it started: {success, shell_id, status: closed}." + _GATE,
        _RUNS,
        adapt=_session("kill"),
        reply=close_reply,
    ),
    Spec(
        "list_shells",
        NoArgs,
        Tool.SESSION,
        "List your shells",
        "Your interactive shells: {success, shells: [{shell_id, status, working_directory, running, "
        "idle_seconds}]}." + _GATE,
        _READS,
        adapt=_list,
        reply=list_reply,
    ),
)
