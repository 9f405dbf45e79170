"""The `session` tool: persistent shells (pipe or PTY). Every command, whether sent with `exec`
or typed with `write` while the shell is idle, passes the whole pipeline; text written while a
command runs is input to that program and is audited as input. The mechanics, and why the
shell cannot run undecided text, are in gateway/executors/sessions.py."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import cancellation, envstore, runfiles, sandbox
from gateway.analysis import zsh
from gateway.calls import SessionCall
from gateway.decision import Decision, Reason, Verdict
from gateway.executors import shell
from gateway.executors.sessions import Session, SessionError, names_the_loop, reserved_message
from gateway.pipeline import (
    DEFAULT_SESSION_IDLE_S,
    DEFAULT_SESSIONS,
    Gated,
    error,
    limits,
    new_call_id,
    tool_decision,
)
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Tool
from gateway.stages.pathjail import PathRefused, check_path, real_path
from gateway.tools.replies import DEFAULT_REPLY_BYTES, fit_reply

if TYPE_CHECKING:
    from gateway.pipeline import Gateway

DEFAULT_EXEC_TIMEOUT_MS = 30_000
DEFAULT_WRITE_WAIT_MS = 1_000
INTERRUPT = "\x03"


def handle(gw: Gateway, call: SessionCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    try:
        if call.action == "start":
            return _start(gw, call, call_id, policy)
        if call.action == "list":
            gated = _gate_action(gw, call, call_id, policy)
            if not isinstance(gated, Gated):
                return gated
            return gw.record_result(
                gated, {"status": "ok", "sessions": [s.describe() for s in gw.sessions.of(call.principal)]}
            )
        assert call.session_id is not None
        session = gw.sessions.get(call.principal, call.session_id)
        session.touch()
        if call.action == "exec":
            assert call.command is not None
            return _exec(gw, call, call_id, policy, session, call.command, call.timeout_ms or DEFAULT_EXEC_TIMEOUT_MS)
        if call.action == "write":
            return _write(gw, call, call_id, policy, session)
        gated = _gate_action(gw, call, call_id, policy)
        if not isinstance(gated, Gated):
            return gated
        if call.action == "read":
            return gw.record_result(gated, _fit(gw, call.principal, call_id, policy, _output(session, False)))
        if call.action == "resize":
            if not session.pty:  # accepted, as a terminal size means nothing to pipes
                done = {"status": "ok", "rows": call.rows, "cols": call.cols, "resized": False}
                return gw.record_result(gated, done | {"notice": "a pipe session has no terminal: nothing to resize"})
            session.resize(call.rows, call.cols)
            return gw.record_result(gated, {"status": "ok", "rows": call.rows, "cols": call.cols})
        gw.sessions.kill(call.principal, session.id)  # kill
        return gw.record_result(gated, {"status": "ok", "session_id": session.id, "alive": False})
    except SessionError as exc:
        return error(call_id, "error", exc.code, exc.message)


def arguments(call: SessionCall) -> dict[str, Any]:
    """The call's arguments as the audit log keeps them (typed input as its size and digest)."""
    return _arguments(call)


def _arguments(call: SessionCall) -> dict[str, Any]:
    keep = {"action", "session_id", "cwd", "env", "pty", "rows", "cols", "shell_type", "startup_commands", "command",
            "timeout_ms"}  # fmt: skip
    out = {k: v for k, v in call.model_dump().items() if k in keep and v not in (None, [], {})}
    out |= {k: True for k in ("echo", "programs") if getattr(call, k)}
    return out | (_digest(call.input) if call.input is not None else {})


def _digest(text: str) -> dict[str, Any]:
    """Input typed to a program may be a password: the audit log keeps its size and hash only
    (the commands a write carries are recorded in full, each in its own decision)."""
    return {"input_bytes": len(text.encode()), "input_sha256": hashlib.sha256(text.encode()).hexdigest()}


def _gate_action(
    gw: Gateway, call: SessionCall, call_id: str, policy: CompiledPolicy, decision: Decision | None = None
) -> Gated | dict[str, Any]:
    """Decide and audit an action that runs no command: the tool family decides."""
    decision = decision or tool_decision(policy, call.principal, Tool.SESSION)
    subject = f"session {call.action} {call.session_id or ''}".strip()
    return gw.authorize(
        call_id, call.principal, "session", subject, policy.workspace, {}, decision, _arguments(call), policy
    )


def _start(gw: Gateway, call: SessionCall, call_id: str, policy: CompiledPolicy) -> dict[str, Any]:
    cwd = gw.resolve_cwd(policy, call.cwd)
    decisions = [tool_decision(policy, call.principal, Tool.SESSION)]
    problems = [envstore.refusal(policy, k, v) for k, v in call.env.items()]
    if call.shell_type == "python":  # the interpreter is decided as the command that starts it
        decisions.append(gw.decide_command(call.principal, "session", PYTHON_REPL, cwd, {}, policy).decision)
        if not call.pty:
            problems.append("shell_type 'python' needs pty: true (the REPL reads a terminal)")
    elif call.shell_type not in policy.policy.shells:
        problems.append(f"shell {call.shell_type!r} is not in the policy's shells {policy.policy.shells}")
    try:
        real = real_path(str(cwd))
        check_path(real, "read", policy.grant(call.principal), "session")
    except PathRefused as exc:
        decisions.append(Decision(Verdict.DENY, None, (Reason("pathjail", exc.code, exc.message),)))
    for p in problems:
        if p:
            decisions.append(Decision(Verdict.DENY, None, (Reason("session", "start_refused", p),)))
    decision = Decision.merge(decisions)
    if decision.verdict is Verdict.ALLOW and call.shell_type == "python":  # the rule that allows the interpreter
        decision = Decision(Verdict.ALLOW, decisions[1].rule, decisions[1].reasons)
    elif decision.verdict is Verdict.ALLOW:
        decision = Decision(Verdict.ALLOW, None, ())
    else:  # only the reasons of the strictest verdict
        strictest = tuple(r for d in decisions if d.verdict is decision.verdict for r in d.reasons)
        decision = Decision(decision.verdict, decision.rule, strictest)
    gated = _gate_action(gw, call, call_id, policy, decision)
    if not isinstance(gated, Gated):
        return gated
    lim = limits(policy, call.principal)
    env = {**gw.env.effective(policy, call.principal), **call.env}
    try:
        session = gw.sessions.start(
            call.principal, Path(real_path(str(cwd))), env, gw.profile(policy, call.principal),
            pty=call.pty, rows=call.rows, cols=call.cols, posix=call.shell_type == "sh", prompt=call.prompt,
            max_sessions=lim.get("sessions", DEFAULT_SESSIONS),
            idle_seconds=lim.get("session_idle_seconds", DEFAULT_SESSION_IDLE_S),
            buffer_bytes=lim.get("output_bytes") or (1 << 20), python=call.shell_type == "python",
            zsh=call.shell_type == "zsh",
        )  # fmt: skip
    except sandbox.SandboxUnavailable as exc:
        return gw.record_result(gated, error(call_id, "error", "SANDBOX_UNAVAILABLE", str(exc)))
    except SessionError as exc:
        return gw.record_result(gated, error(call_id, "error", exc.code, exc.message))
    # what the shell starts with of the variables that make programs load files: bound when a
    # text runs such a program (gateway/runfiles.py); a text that names one makes it unknown
    session.loading_env = {k: v for k, v in env.items() if k in runfiles.LOADER_VARIABLES}
    session.echo = call.echo
    out: dict[str, Any] = {"status": "ok", **session.describe(), "output": session.initial_output,
                           "sandbox": session.sandbox}  # fmt: skip
    if call.programs:
        out["programs"] = runnable_programs(policy, call.principal)
    startup = []
    if call.startup_commands and session.python:
        startup.append(error(new_call_id(), "error", "INVALID_INPUT", "a python session takes no startup_commands"))
    for text in call.startup_commands if not session.python else ():
        result = _exec(gw, call, new_call_id(), policy, session, text, DEFAULT_EXEC_TIMEOUT_MS)
        startup.append(result)
        if result["status"] != "ok":
            out = {**out, "status": result["status"], "error": {
                "code": result.get("error", {}).get("code", "STARTUP_FAILED"),
                "message": f"startup command {text!r}: {result.get('error', {}).get('message', '')}",
            }}  # fmt: skip
            break
    if startup:
        out["startup"] = startup
    return gw.record_result(gated, out)


def _exec(
    gw: Gateway, call: SessionCall, call_id: str, policy: CompiledPolicy, session: Session, text: str, timeout_ms: int
) -> dict[str, Any]:
    # a startup command's (or a written line's) record names it alone, not the whole list again
    given = {k: v for k, v in _arguments(call).items() if k not in ("startup_commands", "input_bytes", "input_sha256")}
    arguments = {**given, "command": text, "session_id": session.id}
    if not session.alive:
        ended = error(call_id, "error", "SESSION_ENDED", f"session {session.id} has ended: start a new one")
        return gw.refuse(call_id, call.principal, "session", arguments, ended)
    if session.busy:
        busy = error(
            call_id, "error", "SESSION_BUSY",
            "a command is still running: read its output, write input to it, or kill the session",
        )  # fmt: skip
        return gw.refuse(call_id, call.principal, "session", arguments, busy)
    if session.python:
        return _python_line(gw, call, call_id, policy, session, text, timeout_ms, arguments)
    reserved = names_the_loop(text)
    if reserved is not None:  # the loop's own variables are not the commands' to set or clear
        return gw.refuse(call_id, call.principal, "session", arguments,
                         error(call_id, "error", "INVALID_INPUT", reserved_message(reserved)))  # fmt: skip
    if session.zsh:  # decided as bash text only where zsh reads it as bash does (analysis/zsh.py)
        differs = zsh.refusal(text)
        if differs is not None:
            return _zsh_refused(gw, call, call_id, policy, session, text, arguments, differs)
    # the policy's timeout bounds the wait, and the git write's own sandbox (red team O3: a day)
    timeout_ms = min(timeout_ms, limits(policy, call.principal).get("timeout_ms") or 120_000)
    cwd = Path(session.cwd() or policy.workspace)
    gated = gw.check_command(
        call_id, call.principal, "session", text, cwd, {}, arguments, policy, started_env=session.loading_env
    )
    if not isinstance(gated, Gated):
        return gated
    # a text that names a variable making programs load files may have exported it: from now on
    # its value in the shell is known only at run time (a later approval cannot bind its files)
    # (the name as the shell reads it: `MAKE\FILES`, `MAKE''FILES`, `MAKE{FILES,}` are MAKEFILES)
    flat = "".join(c for c in text if c.isalnum() or c == "_")
    session.loading_env.update({n: None for n in runfiles.LOADER_VARIABLES if n in flat})
    void = gw.still_bound(gated)  # the files an approval was bound to, as late as the shell allows
    if void is not None:
        return void
    if gated.git_write:
        # the session's sandbox keeps .git read-only for everything it runs; a command that is
        # git and nothing else runs in a sandbox of its own that may write .git (sandbox/git.py)
        done = _echoed(session, text, _git_write(gw, call, policy, session, text, cwd, timeout_ms))
        return gw.record_result(gated, _fit(gw, call.principal, call_id, policy, done))
    session.send_command(str(cwd), text)
    cancel = cancellation.current_cancel()
    session.wait_idle(timeout_ms / 1000, cancel)
    if session.exiting:  # the command ended the shell: answer once it is gone, its slot freed
        session.wait_closed(5.0)
        gw.sessions.forget_dead()
    out = _echoed(session, text, _output(session, finished_only=True))
    stopped = session.launch.disk_tripped if session.launch is not None else None
    if stopped is not None:  # the principal's disk budget stopped the session's sandbox (sandbox/disk.py)
        out["status"] = "error"
        out["error"] = {"code": "DISK_BUDGET", "message": f"the session was stopped: {stopped}"}
    if cancel is not None and cancel.is_set() and out["running"]:  # the caller left, or the server stops
        out["status"] = "error"
        out["error"] = {
            "code": "CALL_CANCELLED",
            "message": "stopped waiting: the call was cancelled (client gone or shutdown); the command runs on "
            "in the session",
        }
    return gw.record_result(gated, _fit(gw, call.principal, call_id, policy, out))


def _zsh_refused(
    gw: Gateway, call: SessionCall, call_id: str, policy: CompiledPolicy, session: Session, text: str,
    arguments: dict[str, Any], why: str,
) -> dict[str, Any]:  # fmt: skip
    """A zsh session's line that zsh reads otherwise than bash: denied with the reason, recorded."""
    reason = Reason("zsh", "zsh_reads_otherwise", f"{why}; in a zsh session only lines zsh reads as bash does run")
    decision = Decision(Verdict.DENY, None, (reason,))
    cwd = Path(session.cwd() or policy.workspace)
    refused = gw.authorize(call_id, call.principal, "session", text, cwd, {}, decision, arguments, policy)
    assert not isinstance(refused, Gated)  # a denial is never let through
    return refused


PYTHON_REPL = "python3"
"""The command a Python session is decided as: the interpreter with no script, reading its input."""


def _python_line(
    gw: Gateway, call: SessionCall, call_id: str, policy: CompiledPolicy, session: Session, text: str,
    timeout_ms: int, arguments: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """A statement for a Python session: recorded in full as the REPL's input (the interpreter was
    decided when the session started; Python is no text the analyser reads, and the sandbox is its
    boundary), typed to it, and answered when the REPL prompts again."""
    reason = Reason("session", "python_line", "a line of the Python session's REPL: recorded, run in its sandbox")
    decision = tool_decision(policy, call.principal, Tool.SESSION)
    if decision.verdict is Verdict.ALLOW:
        decision = Decision(Verdict.ALLOW, None, (reason,))
    gated = gw.authorize(
        call_id, call.principal, "session", text, Path(session.cwd() or policy.workspace), {}, decision,
        {**arguments, "as": "python"}, policy,
    )  # fmt: skip
    if not isinstance(gated, Gated):
        return gated
    line = text if text.endswith("\n") else text + "\n"
    if session.send_line(line) < len(line.encode()):
        out = error(call_id, "error", "INPUT_NOT_READ", "the REPL is not reading: read its output, or kill the session")
        return gw.record_result(gated, out)
    session.wait_idle(timeout_ms / 1000, cancellation.current_cancel())
    return gw.record_result(gated, _fit(gw, call.principal, call_id, policy, _output(session, finished_only=True)))


def runnable_programs(policy: CompiledPolicy, principal: str) -> list[str]:
    """The programs a rule allows (or asks about) for `principal`, by name: what can be typed in a
    shell, as far as the rules say (a rule's arguments, the path jail and the sandbox still decide
    each command)."""
    return sorted(
        program
        for program, rules in policy.by_program.items()
        if any(r.decision.value in ("allow", "ask") and policy.may_use(principal, r) for r in rules)
    )


def _echoed(session: Session, text: str, out: dict[str, Any]) -> dict[str, Any]:
    """The output as a terminal shows it when the session echoes (`echo`): the command, then
    what it printed (a terminal ends each echoed line with CR LF)."""
    if not session.echo:
        return out
    typed = text.replace("\n", "\r\n" if session.pty else "\n") + ("\r\n" if session.pty else "\n")
    return {**out, "output": typed + out.get("output", "")}


def _fit(gw: Gateway, principal: str, call_id: str, policy: CompiledPolicy, out: dict[str, Any]) -> dict[str, Any]:
    """The output bounded as a run's stdout is (`limits.reply_bytes`, the whole saved for the files tool)."""
    limit = limits(policy, principal).get("reply_bytes") or DEFAULT_REPLY_BYTES
    return fit_reply(gw, principal, call_id, out, limit, ("output",))


def _git_write(
    gw: Gateway, call: SessionCall, policy: CompiledPolicy, session: Session, text: str, cwd: Path, timeout_ms: int
) -> dict[str, Any]:
    """Run a git write from a session as its own sandboxed command, in the session's cwd."""
    env = gw.env.effective(policy, call.principal)
    try:
        done = shell.run(text, cwd, gw.profile(policy, call.principal), env=env, timeout_ms=timeout_ms,
                         git_write=True, cancel=cancellation.current_cancel())  # fmt: skip
    except sandbox.SandboxUnavailable as exc:
        return {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": str(exc)}}
    out: dict[str, Any] = {
        "status": done["status"], "session_id": session.id, "output": done["stdout"] + done["stderr"],
        "dropped_bytes": sum(done["dropped_bytes"].values()), "running": False, "alive": session.alive,
        "exit_code": done["exit_code"], "cwd": str(cwd),
    }  # fmt: skip
    if "error" in done:
        out["error"] = done["error"]
    return out


def _output(session: Session, finished_only: bool) -> dict[str, Any]:
    running = session.busy and session.alive
    text, dropped = session.take_output(finished_only=finished_only and not running)
    out: dict[str, Any] = {
        "status": "ok",
        "session_id": session.id,
        "output": text,
        "dropped_bytes": dropped,
        "running": running,
        "alive": session.alive,
        "exit_code": None if running else session.last_exit,
        "cwd": session.cwd(),
    }
    if running:
        out["notice"] = "still running: session read for more output, session write to answer it, session kill to stop"
    return out


def _write(gw: Gateway, call: SessionCall, call_id: str, policy: CompiledPolicy, session: Session) -> dict[str, Any]:
    """Text typed to a session. To a running program it is input: this call is that input,
    decided and audited as such. To the idle shell each line is a command: this call is
    recorded first (the tool family decides whether the text may be split), then each line is
    decided, run and recorded as a call of its own whose records name this one as `parent`
    (so is input that follows once a line's program runs); this call's result lists them."""
    assert call.input is not None
    if not session.alive:
        return error(call_id, "error", "SESSION_ENDED", f"session {session.id} has ended: start a new one")
    if session.busy or session.python:  # all of it is input to the running program (the REPL)
        result = _input(gw, call, call_id, policy, session, call.input)
        if result["status"] != "ok":
            return result
        out = _output(session, finished_only=False)
        typed = [{"as": "input", "bytes": len(call.input.encode()), "call_id": call_id}]
        signalled = {"interrupted": result["interrupted"]} if "interrupted" in result else {}  # ^C: how many
        return {**_fit(gw, call.principal, call_id, policy, out), "call_id": call_id, "sent": typed, **signalled}
    family = tool_decision(policy, call.principal, Tool.SESSION)
    if family.verdict is Verdict.DENY:
        split = family
    else:  # the lines are each decided (and asked about, if the family asks) as calls of their own
        why = "the commands it carries are decided one by one, each as a call of its own (parent: this call)"
        split = Decision(Verdict.ALLOW, None, (*family.reasons, Reason("session", "lines", why)))
    outer = _gate_action(gw, call, call_id, policy, split)
    if not isinstance(outer, Gated):
        return outer
    text = call.input
    sent: list[dict[str, Any]] = []
    shown: list[str] = []  # the output of the commands run, in order
    while text:
        if session.busy:  # a program runs: the rest is its input
            part = new_call_id()
            result = _input(gw, call, part, policy, session, text)
            sent.append({"as": "input", "bytes": len(text.encode()), "status": result["status"], "call_id": part})
            if result["status"] != "ok":
                return gw.record_result(outer, {**result, "output": "".join(shown), "sent": sent})
            break
        line, newline, rest = text.partition("\n")
        if not newline:
            refused = error(
                call_id, "error", "INVALID_INPUT",
                "text written to the idle shell is a command and must end with a newline (or use exec)",
            )  # fmt: skip
            return gw.record_result(outer, {**refused, "sent": sent} if sent else refused)
        if line.strip():
            result = _exec(gw, call, new_call_id(), policy, session, line, call.timeout_ms or DEFAULT_WRITE_WAIT_MS)
            sent.append({"as": "command", "command": line, "status": result["status"], "call_id": result["call_id"]})
            shown.append(result.get("output", ""))
            if result["status"] != "ok":  # the lines after it are not sent; what ran before shows
                failed = {**result, "output": "".join(shown)}
                return gw.record_result(outer, {**_fit(gw, call.principal, call_id, policy, failed), "sent": sent})
        text = rest
    out = _output(session, finished_only=False)
    out = {**out, "output": "".join(shown) + out["output"]}
    return gw.record_result(outer, {**_fit(gw, call.principal, call_id, policy, out), "sent": sent})


def _input(
    gw: Gateway, call: SessionCall, call_id: str, policy: CompiledPolicy, session: Session, text: str
) -> dict[str, Any]:
    """Text for the running program: decided by the tool family, audited as input, sent."""
    reason = Reason("session", "input", "input to the program running in the session, not a command")
    decision = tool_decision(policy, call.principal, Tool.SESSION)
    if decision.verdict is Verdict.ALLOW:
        decision = Decision(Verdict.ALLOW, None, (reason,))
    # a Python session's input is its code: kept in full (other input may be a password: its digest)
    typed = {"as": "python", "input": text} if session.python else {"as": "input", **_digest(text)}
    gated = gw.authorize(
        call_id, call.principal, "session", "session input", policy.workspace, {}, decision,
        {"action": "write", "session_id": session.id, **typed}, policy,
    )  # fmt: skip
    if not isinstance(gated, Gated):
        return gated
    if text == INTERRUPT and not session.python:  # (a REPL's terminal turns ^C into its SIGINT itself)
        n = session.interrupt()
        return gw.record_result(gated, {"status": "ok", "interrupted": n})
    sent = session.send_input(text)
    if sent < len(text.encode()):
        why = f"the program took {sent} of {len(text.encode())} bytes and is not reading more"
        out = error(call_id, "error", "INPUT_NOT_READ", f"{why}: read its output, or kill the session")
        return gw.record_result(gated, out)
    return gw.record_result(gated, {"status": "ok"})
