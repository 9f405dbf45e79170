"""Deciding an agent's hook call: the same policy, the same stages as `gateway check` and the
MCP tools, the decision record written before the answer leaves.

A shell command goes through `pipeline.evaluate` (parse, tool family, rules, second opinion,
path jail; the decision cache included); file tools through the files family's path decision
(`tools.files.decide_paths`). On top, as for the MCP tools: nothing the gateway keeps (its audit
log, keys, state) may be named, since here no sandbox hides it; and a setup whose write roots
hold the audit log or the policy is refused outright.

`~` means what the shell that runs the command takes it for (`Caller.homes`): the agent's HOME
(or, unset, its account's home) and this host's accounts for `~NAME`. Where the command runs in
the gateway's sandbox instead (below), `~NAME` is refused: the sandbox knows other accounts.

Who runs the call: where the agent lets a hook rewrite a shell call (Claude Code's and Codex's
`updatedInput`), an allowed `Bash` call (and, for Claude Code, one its user approves after an
`ask`) is answered with its command replaced by an `exec` of the gateway's client, naming the
call's id and the digest of what was decided. `execute` runs that decided command, and nothing
else, in the gateway's sandbox, once, for the uid that asked; anything else is refused. Elsewhere
(Gemini CLI, the file tools, `--no-sandbox`) the agent runs the call itself after the answer.

A decision not made within the deadline is answered with a denial (the agents read a hook they
kill for its time as no objection), recorded as such; the late decision is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import pwd
import shlex
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway import sandbox
from gateway.analysis.git_write import is_git_write
from gateway.audit import AuditUnavailable
from gateway.audit.sink import AuditSink
from gateway.decide import evaluate
from gateway.decision import Decision, Reason, Verdict
from gateway.executors import shell
from gateway.hooks import formats
from gateway.hooks.formats import Answer, HookCall, HookInputError, Paths, Shell
from gateway.log import log
from gateway.pipeline import limits, new_call_id, sandbox_profile, unsafe_setup
from gateway.policy.compile import CompiledPolicy
from gateway.policy.schema import Tool
from gateway.stages.pathjail import Homes, PathRefused, settled_realpath
from gateway.tools.files import decide_paths, private_refusal, secret_refusal

ADVICE = {
    "deny": "Do not retry it in another form: the policy decides the same way. If it is needed, ask the user.",
    "ask": "The policy asks a person to approve this call.",
}
DEADLINE_S = 10.0
"""A decision not made by then is a denial (the hook client's own bound is 30 s; docs/hooks.md)."""
MAX_DECIDING = 64
"""Decisions under way at once (a late one keeps running until it ends): beyond, calls are denied."""
PENDING_TTL_S = 24 * 3600.0
"""How long a rewritten call may wait for its exec (an `ask` waits for the agent's user)."""
MAX_PENDING = 4096
EXIT_NOT_RUN = 126
EXIT_TIMEOUT = 124
CLIENT = Path(__file__).resolve().parents[1] / "hook_client.py"
MAX_QUOTED_COMMAND = 32 << 10
"""A rewritten call shows its command (quoted) when it is at most this long; longer, only its digest."""


@dataclass(frozen=True)
class Caller:
    """Who asked: the peer's uid, and the HOME the agent's shell runs with (None: unset)."""

    uid: int
    home: str | None

    def homes(self, sandboxed: bool) -> Homes:
        """What `~` means to the shell that runs this caller's command: its HOME, else its
        account's home (as bash does); `~NAME` from this host's accounts unless the command runs
        in the gateway's sandbox, whose accounts are not the host's."""
        if self.home is not None:
            return Homes(self.home, not sandboxed, "the agent's HOME")
        try:
            home: str | None = pwd.getpwuid(self.uid).pw_dir
        except KeyError:
            home = None
        return Homes(home, not sandboxed, f"the agent's HOME (unset: the home of uid {self.uid})")


@dataclass(frozen=True)
class _Pending:
    """A decided shell call waiting for its exec."""

    call_id: str
    digest: str
    command: str
    cwd: str
    homes: Homes
    agent: str
    told: str
    uid: int
    timeout_ms: int | None
    made: float


class _Claim:
    """Who answers a call: its decision, or the deadline. The first to claim it; the other drops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken = False

    def take(self) -> bool:
        with self._lock:
            if self._taken:
                return False
            self._taken = True
            return True


class HookService:
    def __init__(
        self,
        policy: Callable[[], CompiledPolicy],
        audit: AuditSink,
        principal: str,
        private: tuple[Path, ...] = (),
        socket: Path | None = None,
        deadline_s: float = DEADLINE_S,
        executor: Callable[..., dict[str, Any]] | None = shell.run,
    ) -> None:
        """`socket`: the daemon's own (the rewritten calls name it); `executor`: what runs a
        rewritten call in the sandbox (None: no rewrite, the agent runs every call itself)."""
        self._policy = policy
        self.audit = audit
        self.principal = principal
        self.private = tuple(Path(p).resolve() for p in (audit.directory, *private))
        self.socket = socket
        self.deadline_s = deadline_s
        self.executor = executor if socket is not None else None
        self._deciding = threading.BoundedSemaphore(MAX_DECIDING)
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._pending_lock = threading.Lock()

    @property
    def sandboxed(self) -> bool:
        return self.executor is not None

    # --- deciding ---------------------------------------------------------------------------
    def handle(self, agent: str, raw: bytes, caller: Caller | None = None) -> Answer:
        """The answer to one hook call, in `agent`'s format, within the deadline. Never raises:
        any failure is a denial."""
        if agent not in formats.AGENTS:
            return formats.answer("", "deny", f"unknown agent {agent!r}")
        caller = caller or Caller(os.geteuid(), os.environ.get("HOME"))
        call_id = new_call_id()
        if not self._deciding.acquire(blocking=False):
            reason = Reason("hook", "gateway_busy", f"the gateway is deciding {MAX_DECIDING} calls already")
            return self._late_denial(call_id, agent, Decision(Verdict.DENY, None, (reason,)))
        claim = _Claim()
        done = threading.Event()
        answered: list[Answer] = []

        def work() -> None:
            try:
                reply = self._decide(call_id, agent, raw, caller, claim)
                if reply is not None:
                    answered.append(reply)
            except Exception as exc:  # never a crash: the waiting side denies
                log.error("hook_decision_failed", error=f"{type(exc).__name__}: {exc}")
            finally:
                self._deciding.release()
                done.set()

        threading.Thread(target=work, name="hook-decision", daemon=True).start()
        if done.wait(self.deadline_s) and answered:
            return answered[0]
        if claim.take():
            message = (
                f"the gate did not decide within its deadline ({self.deadline_s:g} s): a hook the agent stops "
                "for its time would read as no objection, so the call is denied"
            )
            reason = Reason("hook", "decision_deadline", message)
            return self._late_denial(call_id, agent, Decision(Verdict.DENY, None, (reason,)))
        done.wait()  # the decision claimed it first: its record is being written
        return answered[0] if answered else formats.answer(agent, "deny", "denied: the gate failed while deciding")

    def _late_denial(self, call_id: str, agent: str, decision: Decision) -> Answer:
        """A denial answered at once; its record is written after (a stalled audit log must not
        hold it past the agent's limit: a denial without its record is still a denial)."""

        def record() -> None:
            with contextlib.suppress(AuditUnavailable):
                self.audit.append(
                    "decision", call_id=call_id, principal=self.principal, tool="hook", arguments={},
                    decision="deny", rule=None, reasons=[r.to_json() for r in decision.reasons],
                    data={"hook": {"agent": agent, "told": "deny"}},
                )  # fmt: skip

        threading.Thread(target=record, name="hook-late-record", daemon=True).start()
        return formats.answer(agent, "deny", _message(decision))

    def _decide(self, call_id: str, agent: str, raw: bytes, caller: Caller, claim: _Claim) -> Answer | None:
        """Decide and record one call, or None when the deadline answered it first."""
        try:
            call = formats.parse(agent, raw)
        except HookInputError as exc:
            reason = Reason("hook", "hook_input_invalid", str(exc))
            decision = Decision(Verdict.DENY, None, (reason,))
            if not claim.take():
                return None
            return self._record(call_id, agent, None, decision, {}, caller, raw_bytes=len(raw))
        rewrite = self.sandboxed and agent in formats.REWRITES and isinstance(call.request, Shell)
        policy: CompiledPolicy | None = None
        try:
            policy = self._policy()
            decision, data = self.decide(policy, call, caller.homes(sandboxed=rewrite), sandboxed=rewrite)
        except Exception as exc:  # fail closed: a broken stage is a denial
            reason = Reason("pipeline", "internal_error", f"{type(exc).__name__}: {exc}")
            decision, data = Decision(Verdict.DENY, None, (reason,)), {}
        if not claim.take():
            log.warning("hook_decision_late", call_id=call_id, verdict=decision.verdict.label)
            return None
        return self._record(call_id, agent, call, decision, data, caller, policy=policy, rewrite=rewrite)

    def decide(
        self, policy: CompiledPolicy, call: HookCall, homes: Homes | None = None, sandboxed: bool = False
    ) -> tuple[Decision, dict[str, Any]]:
        """`sandboxed`: a shell call that will run in the gateway's sandbox (which masks the
        policy's deny_read paths); otherwise the agent runs it, and the jail refuses a search of
        a tree that holds one."""
        unsafe = unsafe_setup(policy, self.principal, self.private[0], self.private[1:])
        if unsafe:
            return Decision(Verdict.DENY, None, (Reason("setup", "unsafe_setup", unsafe),)), {}
        request = call.request
        if isinstance(request, Paths):
            who = f"{call.tool} ({request.action})"
            try:  # the jail checks real paths: a symlink is decided by where it leads
                paths = [(settled_realpath(p), access) for p, access in request.paths]
            except PathRefused as exc:
                reason = Reason("pathjail", exc.code, exc.message, None, exc.details)
                return Decision(Verdict.DENY, None, (reason,)), {}
            decision = decide_paths(policy, self.principal, who, paths)
            walks = request.action in ("grep", "find", "list")
            if decision.verdict is not Verdict.DENY:
                decision = private_refusal(self.private, who, walks, paths) or decision
            if decision.verdict is not Verdict.DENY and request.action in ("grep", "read"):
                decision = secret_refusal(policy, self.principal, who, paths) or decision  # no sandbox masks them
            return decision, {}
        result = evaluate(
            policy, request.command, self.principal, Path(request.cwd), None, Tool.RUN, homes, sandboxed=sandboxed
        )
        decision = result.decision
        commands = []
        if result.analysis is not None:
            commands = [{"argv": c.to_json()["argv"]} for c in result.analysis.commands]
        if decision.verdict is not Verdict.DENY:
            decision = self._private_paths(decision, request.cwd) or decision
        return decision, {"commands": commands, "home": homes.home if homes is not None else None}

    def _private_paths(self, decision: Decision, cwd: str) -> Decision | None:
        """Without a sandbox to hide the gateway's records, a command naming them is refused."""
        named: list[tuple[str, str]] = [(cwd, "read")]
        for r in decision.reasons:
            if r.code == "paths_checked":
                for access in ("read", "write"):
                    named += [(p, access) for p in r.details.get(access, [])]
        return private_refusal(self.private, "the command", False, named)

    def _record(
        self,
        call_id: str,
        agent: str,
        call: HookCall | None,
        decision: Decision,
        data: dict[str, Any],
        caller: Caller,
        policy: CompiledPolicy | None = None,
        raw_bytes: int | None = None,
        rewrite: bool = False,
    ) -> Answer:
        verdict = decision.verdict.label
        message = _message(decision)
        pending = None
        shell_call = rewrite and call is not None and isinstance(call.request, Shell)
        if shell_call and (verdict == "allow" or (verdict == "ask" and agent == "claude-code")):
            assert call is not None  # Codex cannot ask: its ask is a denial, never run
            pending = self._pending_for(call_id, agent, call, verdict, caller)
        updated = self._rewritten(call, pending) if pending is not None else None
        if pending is not None:
            message += (
                " (it runs in the gateway's sandbox)"
                if verdict == "allow"
                else " (approved, it runs in the gateway's sandbox)"
            )
        reply = formats.answer(agent, verdict, message, updated)
        hook: dict[str, Any] = {"agent": agent, "told": reply.told}
        if call is not None:
            hook.update(tool=call.tool, session_id=call.session_id, tool_use_id=call.tool_use_id)
        if pending is not None:
            hook["exec"] = {"sha256": pending.digest, "sandboxed": True}
        if raw_bytes is not None:
            hook["input_bytes"] = raw_bytes
        family = "files" if call is not None and isinstance(call.request, Paths) else "run"
        try:
            self.audit.append(
                "decision",
                call_id=call_id,
                principal=self.principal,
                tool=family if call is not None else "hook",
                policy_sha256=policy.sha256 if policy is not None else None,
                arguments=call.arguments if call is not None else {},
                decision=verdict,
                rule=decision.rule,
                reasons=[r.to_json() for r in decision.reasons],
                data={**data, "hook": hook},
            )
        except AuditUnavailable as exc:
            with contextlib.suppress(Exception):
                return formats.answer(agent, "deny", f"denied: the decision could not be recorded ({exc})")
            return formats.answer("", "deny", "denied: the decision could not be recorded")
        if pending is not None:  # only a recorded decision can be run
            self._remember(pending)
        return reply

    # --- the sandboxed run of a rewritten call --------------------------------------------
    def _pending_for(self, call_id: str, agent: str, call: HookCall, told: str, caller: Caller) -> _Pending:
        assert isinstance(call.request, Shell)
        homes = caller.homes(sandboxed=True)
        timeout = call.tool_input.get("timeout")  # Claude Code's Bash: milliseconds
        timeout_ms = int(timeout) if isinstance(timeout, int | float) and timeout > 0 else None
        what = [call_id, agent, self.principal, call.request.command, call.request.cwd, homes.home, caller.uid]
        digest = hashlib.sha256(json.dumps(what, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()
        return _Pending(
            call_id, digest, call.request.command, call.request.cwd, homes, agent, told, caller.uid, timeout_ms,
            time.monotonic(),
        )  # fmt: skip

    def _rewritten(self, call: HookCall | None, pending: _Pending) -> dict[str, Any]:
        """The tool input that runs `pending` through the gateway: the exec client, the call's
        id and digest, and (for the agent's user to read) the command itself."""
        assert call is not None and self.socket is not None
        words = [sys.executable, "-I", "-S", str(CLIENT), "exec", "--socket", str(self.socket)]
        words += ["--call", pending.call_id, "--sha256", pending.digest]
        line = shlex.join(words)
        quoted = shlex.quote(pending.command)
        if len(quoted) <= MAX_QUOTED_COMMAND:
            line += " -- " + quoted
        if call.agent == "codex":
            return {"command": line}
        return {**call.tool_input, "command": line}

    def _remember(self, pending: _Pending) -> None:
        with self._pending_lock:
            self._pending[pending.call_id] = pending
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    def execute(self, body: bytes, uid: int, cancel: threading.Event | None = None) -> Answer:
        """Run the decided call `body` names ({"call", "sha256", "command"?}) in the sandbox, once.
        Anything but a decided, recorded, allowed (or, in Claude Code, asked) call that is still
        unused, asked for by the uid it was decided for, is refused: nothing runs."""
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            request = None
        if not isinstance(request, dict) or not all(isinstance(request.get(k), str) for k in ("call", "sha256")):
            return self._refuse_exec(None, "the exec request is not {call, sha256[, command]}")
        call_id, digest = request["call"], request["sha256"]
        with self._pending_lock:
            pending = self._pending.pop(call_id, None)  # one attempt per call: used or refused, it is gone
        if pending is None:
            return self._refuse_exec(call_id, "no decided call with this id waits to run (unknown, used or expired)")
        if not hmac.compare_digest(pending.digest, digest):
            return self._refuse_exec(call_id, "the digest is not the decided call's")
        command = request.get("command")
        if command is not None and command != pending.command:
            return self._refuse_exec(call_id, "the command is not the decided one")
        if uid != pending.uid:
            return self._refuse_exec(call_id, f"uid {uid} did not ask for this call")
        if time.monotonic() - pending.made > PENDING_TTL_S:
            return self._refuse_exec(call_id, "the decision is too old: ask again")
        try:
            policy = self._policy()
            call = HookCall(pending.agent, "Bash", pending.cwd, Shell(pending.command, pending.cwd))
            decision, _ = self.decide(policy, call, pending.homes)
        except Exception as exc:
            return self._refuse_exec(call_id, f"it could not be decided again ({type(exc).__name__}: {exc})")
        now = decision.verdict.label
        if now == "deny" or (now == "ask" and pending.told == "allow"):
            return self._refuse_exec(call_id, f"decided again, it is no longer allowed: {_message(decision)}")
        assert self.executor is not None
        lim = limits(policy, self.principal)
        cap = lim.get("timeout_ms") or 120_000
        timeout = min(cap, max(1000, pending.timeout_ms - 2000)) if pending.timeout_ms else cap
        network = _HookNetwork(self, pending.call_id) if policy.network_of(self.principal)[1] is not None else None
        profile = sandbox_profile(policy, self.principal, self.private, pending.homes.home, self._report, network)
        analysis = evaluate(policy, pending.command, self.principal, Path(pending.cwd), None, Tool.RUN).analysis
        started = time.monotonic()
        try:
            outcome = self.executor(
                pending.command,
                Path(pending.cwd),
                profile,
                env={},
                timeout_ms=timeout,
                output_bytes=lim.get("output_bytes") or (1 << 20),
                git_write=is_git_write(analysis.commands if analysis else ()),
                cancel=cancel or threading.Event(),
            )
        except sandbox.SandboxUnavailable as exc:
            outcome = {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": str(exc)}}
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            outcome = {"status": "error", "error": {"code": "INTERNAL_ERROR", "message": why}}
        outcome.setdefault("duration_ms", int((time.monotonic() - started) * 1000))
        return self._exec_answer(pending, outcome, timeout)

    def _exec_answer(self, pending: _Pending, outcome: dict[str, Any], timeout_ms: int) -> Answer:
        stdout = str(outcome.get("stdout") or "").encode("utf-8", "surrogateescape")
        stderr = str(outcome.get("stderr") or "").encode("utf-8", "surrogateescape")
        code = outcome.get("exit_code")
        error = outcome.get("error") or {}
        gap = b"\n" if stderr and not stderr.endswith(b"\n") else b""
        if outcome.get("timed_out"):
            code = EXIT_TIMEOUT
            stderr += gap + f"agent-gateway: killed after {timeout_ms} ms (the policy's time limit)\n".encode()
        elif error.get("code") not in (None, "COMMAND_NOT_FOUND") or not isinstance(code, int):
            code = EXIT_NOT_RUN
            why = error.get("message") or "the command did not run"
            stderr += gap + f"agent-gateway: {why}\n".encode("utf-8", "replace")
        recorded = {k: v for k, v in outcome.items() if k not in ("stdout", "stderr", "sandbox")}
        recorded.update(stdout_bytes=len(stdout), stderr_bytes=len(stderr))
        recorded["hook"] = {"agent": pending.agent, "exec": True}
        with contextlib.suppress(AuditUnavailable):  # it ran: its output is the agent's either way
            self.audit.append("result", call_id=pending.call_id, principal=self.principal, tool="run", data=recorded)
        status = int(code)
        return Answer(status & 0xFF if status >= 0 else 128 + (-status & 0x7F), stdout, stderr, "exec")

    def _refuse_exec(self, call_id: str | None, why: str) -> Answer:
        with contextlib.suppress(AuditUnavailable):
            self.audit.append(
                "hook_exec_refused", principal=self.principal, tool="run", decision="deny",
                data={"asked_call_id": call_id, "why": why},
            )  # fmt: skip
        return Answer(EXIT_NOT_RUN, b"", f"agent-gateway: not run: {why}\n".encode("utf-8", "replace"), "refused")

    def _report(self, event: str, data: dict[str, object]) -> None:
        """The nested-repository watcher's reports (sandbox/nested.py), on the audit record."""
        with contextlib.suppress(AuditUnavailable):
            self.audit.append(event, principal=self.principal, data=dict(data))


class _HookNetwork:
    """What a policy network's resolver and proxy (sandbox/egress) use of the gate for one exec:
    the audit log; a host the policy would ask about is refused, since no supervisor answers in
    hook mode (the agent's user answers only the agent's own prompts)."""

    def __init__(self, service: HookService, call_id: str) -> None:
        self.service = service
        self.principal = service.principal
        self.call_id = call_id

    def current_call(self) -> str | None:
        return self.call_id

    def record(self, event: str, call_id: str | None, principal: str, data: dict[str, Any]) -> None:
        self.service.audit.append(event, call_id=call_id, principal=principal, tool="network", data=data)

    def ask(self, call_id: str | None, principal: str, host: str, port: int, command: str) -> tuple[bool, str, str]:
        return False, "nobody", "hook mode: no supervisor answers a network ask"


def _message(decision: Decision) -> str:
    verdict = decision.verdict.label
    rule = f" (rule: {decision.rule})" if decision.rule else ""
    why = "; ".join(r.message.rstrip(".") for r in decision.reasons if r.code != "paths_checked")
    if verdict == "allow":
        return f"allowed{rule}" + (f": {why}" if why else "")
    return f"{'denied' if verdict == 'deny' else 'needs approval'}{rule}: {why or 'no reason given'}. {ADVICE[verdict]}"
