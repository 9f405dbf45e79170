"""The `files` tool: file operations done by the gateway itself (no program runs). Every path
passes the path jail with the access the action needs; the executor checks again at open time,
on the opened file, so a symlink swapped in after the decision is refused
(gateway/executors/files.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gateway.executors.files as files
from gateway.calls import FilesCall
from gateway.decision import Decision, Reason, Verdict
from gateway.pipeline import Gated, limits, tool_decision
from gateway.policy.compile import CompiledPolicy, Grant
from gateway.policy.schema import Tool
from gateway.sandbox import identity
from gateway.sandbox import plan as sandbox_plan
from gateway.stages.pathjail import PathRefused, check_path, settled_realpath

if TYPE_CHECKING:
    from gateway.pipeline import Gateway

OUTPUTS = "outputs"  # write_output's directory, inside the workspace


def decide(policy: CompiledPolicy, call: FilesCall) -> tuple[Decision, list[tuple[str, str]]]:
    """The tool family's decision, then the jail for every path the call touches."""
    try:
        paths = files.paths_of(call, policy.workspace, policy.workspace / OUTPUTS)
    except PathRefused as exc:  # a path that would not hold still while it was resolved
        given = call.path or OUTPUTS
        return _refused(exc, given, "read"), [(given, "read")]
    return decide_paths(policy, call.principal, f"files {call.action}", paths), paths


def decide_paths(policy: CompiledPolicy, principal: str, who: str, paths: list[tuple[str, str]]) -> Decision:
    """May `principal` use the files tool family, and read or write each real, absolute path
    (`paths`: (path, "read" | "write") each). `who` names the action in the reasons. The agents'
    file-tool hooks (gateway/hooks/) are decided here too."""
    decision = tool_decision(policy, principal, Tool.FILES)
    if decision.verdict is Verdict.DENY:
        return decision
    grant = seen_as_by_commands(policy.grant(principal))
    for path, access in paths:
        try:
            check_path(path, access, grant, who)
        except PathRefused as exc:
            return _refused(exc, path, access)
    if decision.verdict is Verdict.ALLOW:
        checked = {"read": [p for p, a in paths if a == "read"], "write": [p for p, a in paths if a == "write"]}
        reason = Reason("pathjail", "paths_checked", f"{len(paths)} path(s) inside the roots", None, checked)
        decision = Decision(Verdict.ALLOW, None, (reason,))
    return decision


def seen_as_by_commands(grant: Grant) -> Grant:
    """`grant` narrowed to what a command in the sandbox sees: no host directory the sandbox
    hides although a wide root covers it (/home, /run, /var/tmp, host /tmp: sandbox.plan.unseen)."""
    roots = [str(r) for r in (*grant.read_roots, *grant.write_roots)]
    return replace(grant, unseen=tuple(Path(p) for p in sandbox_plan.unseen(roots)))


def _refused(exc: PathRefused, path: str, access: str) -> Decision:
    reason = Reason("pathjail", exc.code, exc.message, None, {"path": path, "access": access})
    return Decision(Verdict.DENY, None, (reason,))


def _keep_out_of_private(gw: Gateway, call: FilesCall, paths: list[tuple[str, str]]) -> Decision | None:
    """A denial when a path is inside the gateway's own records, or a search would walk into them."""
    return private_refusal(gw.private_dirs(), f"files {call.action}", call.action in ("grep", "find"), paths)


def private_refusal(private: tuple[Path, ...], who: str, walks: bool, paths: list[tuple[str, str]]) -> Decision | None:
    """A denial when a path lies inside one of the `private` directories (the gateway's records),
    or, for a tool that `walks` a tree (grep, find), holds one."""
    for path, access in paths:
        try:
            real = Path(settled_realpath(path))
        except PathRefused as exc:
            return _refused(exc, path, access)
        inside = any(real == d or d in real.parents for d in private)
        walks_in = walks and any(real in d.parents for d in private)
        if inside or walks_in:
            what = "lies inside" if inside else "holds"
            message = f"{who}: {path} {what} the gateway's own records (audit log, state): refused"
            reason = Reason("pathjail", "gateway_private", message, None, {"path": path})
            return Decision(Verdict.DENY, None, (reason,))
    return None


def handle(gw: Gateway, call: FilesCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    decision, paths = decide(policy, call)
    # content and edit text may hold secrets: the audit log keeps their sizes
    arguments = call.model_dump(exclude={"tool", "principal", "content", "old", "new"}, exclude_none=True)
    for name in ("content", "old", "new"):
        value = getattr(call, name)
        if value is not None:
            arguments[f"{name}_bytes"] = len(value.encode())
    subject = f"files {call.action} " + " ".join(p for p, _ in paths)
    if decision.verdict is not Verdict.DENY:
        decision = _keep_out_of_private(gw, call, paths) or decision
    gated = gw.authorize(call_id, call.principal, "files", subject, policy.workspace, {}, decision, arguments, policy)
    if not isinstance(gated, Gated):
        return gated
    lim = limits(policy, call.principal)
    file_limits = files.FileLimits(
        read_bytes=lim.get("output_bytes") or files.FileLimits.read_bytes,
        write_bytes=lim.get("file_bytes") or files.FileLimits.write_bytes,
    )
    # the executor checks every file it opens again, the gateway's records included: a link
    # flipped after the decision must not lead the read into them
    grant = replace(seen_as_by_commands(policy.grant(call.principal)), private=gw.private_dirs())
    # and it opens them as the sandbox's account would: a file no command could read (/etc/shadow,
    # /root under a read root of /) it cannot read either, and what it writes is that account's
    try:
        with identity.acting_as_sandbox():
            outcome = files.execute(call, grant, policy.workspace, policy.workspace / OUTPUTS, file_limits)
    except identity.ActAsUnavailable as exc:
        outcome = {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": str(exc)}}
    return gw.record_result(gated, outcome)
