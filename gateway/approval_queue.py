"""The durable approvals queue: a supervisor answers from another terminal.

The gateway writes each pending request as `<state>/<id>.request.json` and waits. A supervisor
runs `gateway approvals list | show ID | approve ID | deny ID [--reason ...]`, which writes
`<id>.answer.json` (atomically: a temporary file, then rename) with their identity and the
request's digest. The gateway reads the answer once (it is renamed to `.used`: single use),
checks the digest against the call it is holding, and records the result.

The agent must never be able to answer its own request, so the state directory must lie outside
every write root of the policy: the sandbox binds only write roots writable, and the gateway
refuses a state directory inside one. Requests expire with the approval timeout; an expired
request cannot be answered.

Each request names the gateway process waiting for it (`owner`: pid and start time). A request
whose owner is gone (killed before it could withdraw it) can never run: it is not listed, cannot
be answered, and the next gateway on the same queue and audit log removes it and records an
`approval_withdrawn` (`orphans`, `withdraw`). A live gateway withdraws its own requests when
their call can no longer complete (its client left over stdio, the server stops).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.approval import Approval, ApprovalRequest
from gateway.cancellation import cancelled
from gateway.stages.pathjail import inside

POLL_SECONDS = 0.2


class QueueError(Exception):
    """The queue cannot be used as asked (the message says why)."""


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, json.dumps(data, ensure_ascii=False, indent=1).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _now() -> float:
    return time.time()


def _started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), or None if it is gone.
    With the pid, it names one process: a pid reused by another process has another start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return "?"  # cannot tell: treat it as alive
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else "?"


def owner_gone(req: dict[str, Any]) -> str | None:
    """Why the gateway that wrote `req` can no longer act on an answer (None: it still can, or
    the request names no owner, as before owners were recorded)."""
    owner = req.get("owner")
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return None
    now = _started(owner["pid"])
    if now == "?" or now == owner.get("start"):
        return None
    return f"the gateway that asked (pid {owner['pid']}) ended without withdrawing it"


class QueueApprover:
    """An Approver that waits for `gateway approvals approve|deny`."""

    def __init__(
        self,
        state_dir: Path,
        write_roots: tuple[Path, ...],
        on_wait: Callable[[ApprovalRequest, float], None] | None = None,
    ) -> None:
        self.on_wait = on_wait  # told when a request is queued (`gateway serve` prints a line)
        self.audit_dir: str | None = None  # the asking gateway's audit log, written into each request
        self.state_dir = Path(os.path.realpath(state_dir))
        for root in write_roots:
            if inside(str(self.state_dir), root) or inside(str(root), self.state_dir):
                raise QueueError(
                    f"the approvals directory {self.state_dir} overlaps the write root {root}: "
                    "the agent could answer its own requests; put it outside the workspace"
                )
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def decide(self, request: ApprovalRequest, timeout: float) -> Approval | None:
        rid = request.call_id
        pending = self.state_dir / f"{rid}.request.json"
        answer_path = self.state_dir / f"{rid}.answer.json"
        owner = {"pid": os.getpid(), "start": _started(os.getpid())}
        body = {**asdict(request), "created": _now(), "expires": _now() + timeout, "owner": owner}
        _write_atomically(pending, {**body, **({"audit_dir": self.audit_dir} if self.audit_dir else {})})
        deadline = time.monotonic() + timeout
        try:
            if self.on_wait is not None:
                with contextlib.suppress(Exception):  # a notice that fails must not fail the call
                    self.on_wait(request, timeout)
            while time.monotonic() < deadline and not cancelled():
                if answer_path.exists():
                    used = answer_path.with_suffix(".used")
                    os.replace(answer_path, used)  # single use: nobody reads it twice
                    answer = json.loads(used.read_text())
                    approved = bool(answer.get("approved"))
                    # approve for the session: this exact call (its digest) for the rest of the
                    # gateway's life (pipeline.py keeps it); a denial is never remembered
                    session = approved and answer.get("scope") == "session"
                    return Approval(
                        approved,
                        str(answer.get("by", "?")),
                        str(answer.get("digest", "")),
                        "queue-session" if session else "queue",
                        str(answer.get("reason", "")),
                    )
                time.sleep(POLL_SECONDS)
            return None
        finally:
            pending.unlink(missing_ok=True)
            self.state_dir.joinpath(f"{rid}.claim.json").unlink(missing_ok=True)


def _requests(state_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(Path(state_dir).glob("*.request.json")):
        try:
            req = json.loads(path.read_text())
            if isinstance(req, dict) and isinstance(req["call_id"], str) and isinstance(req["expires"], int | float):
                out.append((path, req))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a request we wrote
    return out


def pending(state_dir: Path) -> list[dict[str, Any]]:
    """Requests waiting for an answer, oldest first (expired ones, and ones whose gateway is
    gone, are left out)."""
    out = [
        req
        for path, req in _requests(state_dir)
        if req["expires"] > _now()
        and not (path.parent / f"{req['call_id']}.answer.json").exists()
        and not (path.parent / f"{req['call_id']}.claim.json").exists()
        and owner_gone(req) is None
    ]
    return sorted(out, key=lambda r: r.get("created", 0))


def orphans(state_dir: Path, audit_dir: Path) -> list[tuple[dict[str, Any], str]]:
    """Requests written by a gateway on this audit log that is gone, with why. The caller
    records each (`approval_withdrawn`) and then removes it (`withdraw`)."""
    mine = os.path.realpath(audit_dir)
    out = []
    for _, req in _requests(state_dir):
        why = owner_gone(req)
        if why is not None and req.get("audit_dir") == mine:
            out.append((req, why))
    return out


def withdraw(state_dir: Path, call_id: str) -> None:
    for suffix in (".request.json", ".answer.json", ".claim.json"):
        (Path(state_dir) / f"{call_id}{suffix}").unlink(missing_ok=True)


SCOPES = ("once", "session")


def answer(
    state_dir: Path,
    call_id: str,
    approved: bool,
    by: str,
    reason: str = "",
    scope: str = "once",
    record: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Answer a pending request. Raises QueueError if there is none or it expired. `scope`
    "session" approves this exact call (principal, tool, command, cwd, environment, policy) again
    without asking for as long as the gateway that asked runs.

    Two supervisors may race (a terminal and the console). The answer is first *claimed*
    (`<id>.claim.json`, made with `link`: exactly one claimant wins); only the winner calls
    `record(answer)` (the console audits its answer there) and then publishes it as
    `<id>.answer.json`, which is what the gateway reads. So a record written by `record` is
    always of the answer that took; a loser gets QueueError and was never recorded as having
    answered. If `record` raises, the claim is released and nothing is answered."""
    if scope not in SCOPES:
        raise QueueError(f"scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if scope == "session" and not approved:
        raise QueueError("scope 'session' is for approvals: a denial is for this call only")
    path = Path(state_dir) / f"{call_id}.request.json"
    try:
        req = json.loads(path.read_text())
    except (OSError, ValueError):
        raise QueueError(f"no pending request {call_id}") from None
    if req.get("expires", 0) <= _now():
        raise QueueError(f"request {call_id} has expired")
    gone = owner_gone(req)
    if gone is not None:
        raise QueueError(f"request {call_id} was withdrawn: {gone}; nothing would run")
    out = {
        "call_id": call_id,
        "approved": approved,
        "by": by,
        "reason": reason,
        **({"scope": scope} if scope != "once" else {}),
        "digest": req["digest"],
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    target = Path(state_dir) / f"{call_id}.answer.json"
    claim = Path(state_dir) / f"{call_id}.claim.json"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    _write_atomically(tmp, out)
    try:
        if target.exists():
            raise QueueError(f"request {call_id} already has an answer")
        try:
            os.link(tmp, claim)  # fails if someone claimed it: the first supervisor's answer stands
        except FileExistsError:
            raise QueueError(f"request {call_id} already has an answer") from None
        try:
            # the gateway may have given up on it (timed out, withdrawn) since it was read above:
            # then no answer is recorded or published (an approval nothing would act on)
            if not path.exists() or req.get("expires", 0) <= _now():
                raise QueueError(f"request {call_id} has expired or was withdrawn")
            if record is not None:
                record(out)  # raises: released, nothing answered
            os.link(tmp, target)  # what the gateway reads: published after the record
        except BaseException:
            claim.unlink(missing_ok=True)
            raise
    finally:
        tmp.unlink(missing_ok=True)
    return out
