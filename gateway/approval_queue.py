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
"""

from __future__ import annotations

import json
import os
import time
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


class QueueApprover:
    """An Approver that waits for `gateway approvals approve|deny`."""

    def __init__(self, state_dir: Path, write_roots: tuple[Path, ...]) -> None:
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
        _write_atomically(pending, {**asdict(request), "created": _now(), "expires": _now() + timeout})
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and not cancelled():
                if answer_path.exists():
                    used = answer_path.with_suffix(".used")
                    os.replace(answer_path, used)  # single use: nobody reads it twice
                    answer = json.loads(used.read_text())
                    return Approval(
                        bool(answer.get("approved")),
                        str(answer.get("by", "?")),
                        str(answer.get("digest", "")),
                        "queue",
                        str(answer.get("reason", "")),
                    )
                time.sleep(POLL_SECONDS)
            return None
        finally:
            pending.unlink(missing_ok=True)


def pending(state_dir: Path) -> list[dict[str, Any]]:
    """Requests waiting for an answer, oldest first (expired ones are left out)."""
    out = []
    for path in sorted(Path(state_dir).glob("*.request.json")):
        try:
            req = json.loads(path.read_text())
            if req["expires"] > _now() and not (path.parent / f"{req['call_id']}.answer.json").exists():
                out.append(req)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a request we wrote
    return sorted(out, key=lambda r: r.get("created", 0))


def answer(state_dir: Path, call_id: str, approved: bool, by: str, reason: str = "") -> dict[str, Any]:
    """Answer a pending request. Raises QueueError if there is none or it expired."""
    path = Path(state_dir) / f"{call_id}.request.json"
    try:
        req = json.loads(path.read_text())
    except (OSError, ValueError):
        raise QueueError(f"no pending request {call_id}") from None
    if req.get("expires", 0) <= _now():
        raise QueueError(f"request {call_id} has expired")
    out = {
        "call_id": call_id,
        "approved": approved,
        "by": by,
        "reason": reason,
        "digest": req["digest"],
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    target = Path(state_dir) / f"{call_id}.answer.json"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    _write_atomically(tmp, out)
    try:
        os.link(tmp, target)  # fails if an answer exists: the first supervisor's answer stands
    except FileExistsError:
        raise QueueError(f"request {call_id} already has an answer") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out
