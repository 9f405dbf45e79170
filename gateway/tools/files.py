"""The `files` tool: file operations done by the gateway itself (no program runs). Every path
passes the path jail with the access the action needs; the executor checks again at open time,
on the opened file, so a symlink swapped in after the decision is refused
(gateway/executors/files.py)."""

from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gateway.executors.files as files
from gateway.analysis import analyze
from gateway.calls import FilesCall
from gateway.decision import Decision, Reason, Verdict
from gateway.pipeline import DEFAULT_DISK_BYTES, Gated, limit_source, limits, tool_decision
from gateway.policy.compile import CompiledPolicy, Grant
from gateway.policy.schema import Tool
from gateway.sandbox import disk, identity, masks
from gateway.sandbox import plan as sandbox_plan
from gateway.stages import permissions
from gateway.stages.pathjail import PathRefused, check_path, settled_realpath
from gateway.tools.replies import saved_outputs_dir

if TYPE_CHECKING:
    from gateway.pipeline import Gateway

OUTPUTS = "outputs"  # write_output's directory: `~/outputs` (the policy's home; without one, the workspace's)


def outputs_dir(policy: CompiledPolicy) -> Path:
    """Where write_output writes: `~/outputs` (seed 002), in the workspace when the policy has no home."""
    return (policy.home or policy.workspace) / OUTPUTS


READS = frozenset({"read", "read_json", "list", "stat", "grep", "find"})


def with_saved_outputs(gw: Gateway, grant: Grant, call: FilesCall) -> Grant:
    """A read sees the principal's own saved outputs (the whole output of a `run` whose reply
    was cut, in the gateway's state: gateway/tools/run.py) as one more read root. Nothing may
    write there but the gateway, and no other principal's outputs are shown."""
    own = saved_outputs_dir(gw, call.principal)
    if own is None or call.action not in READS:
        return grant
    return replace(grant, read_roots=(*grant.read_roots, own), outputs=own)


def decide(
    policy: CompiledPolicy, call: FilesCall, grant: Grant | None = None
) -> tuple[Decision, list[tuple[str, str]]]:
    """The tool family's decision, then the jail for every path the call touches; a delete is
    also decided as the `rm` that would do it."""
    try:
        paths = files.paths_of(call, policy.workspace, outputs_dir(policy))
    except PathRefused as exc:  # a path that would not hold still while it was resolved
        given = call.path or OUTPUTS
        return _refused(exc, given, "read"), [(given, "read")]
    decision = decide_paths(policy, call.principal, f"files {call.action}", paths, grant)
    if decision.verdict is not Verdict.DENY and call.action == "delete":
        deleting = _as_rm(policy, call, paths[0][0])
        if deleting is not None and deleting.verdict is not Verdict.ALLOW:
            return deleting, paths
    return decision, paths


def decide_paths(
    policy: CompiledPolicy, principal: str, who: str, paths: list[tuple[str, str]], grant: Grant | None = None
) -> Decision:
    """May `principal` use the files tool family, and read or write each real, absolute path
    (`paths`: (path, "read" | "write") each). `who` names the action in the reasons. The agents'
    file-tool hooks (gateway/hooks/) are decided here too."""
    decision = tool_decision(policy, principal, Tool.FILES)
    if decision.verdict is Verdict.DENY:
        return decision
    grant = seen_as_by_commands(grant or policy.grant(principal))
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


def _as_rm(policy: CompiledPolicy, call: FilesCall, path: str) -> Decision | None:
    """A delete is decided as the command that would do it, `rm -- PATH` (`rm -r -- PATH` when
    recursive): the rule that asks about (or denies) `rm` asks about (or denies) the delete
    too, so the files tool is no way around it. None when no rule concerns `rm` (the tool
    family decides alone). An ask or a deny is at least as strict as the family's verdict."""
    command = f"rm {'-r ' if call.recursive else ''}-- {shlex.quote(path)}"
    analysis = analyze(command)
    if analysis.denial is not None or len(analysis.commands) != 1:
        reason = Reason("files", "delete_unchecked", f"files delete {path}: could not be decided as `{command}`")
        return Decision(Verdict.DENY, None, (reason,))
    decided, _ = permissions.decide_command(policy, call.principal, analysis.commands[0])
    if any(r.code == "no_rule" for r in decided.reasons):
        return None
    family = tool_decision(policy, call.principal, Tool.FILES)
    return Decision.merge([family, decided]) if family.verdict is not Verdict.ALLOW else decided


def _refused(exc: PathRefused, path: str, access: str) -> Decision:
    reason = Reason("pathjail", exc.code, exc.message, None, {"path": path, "access": access})
    return Decision(Verdict.DENY, None, (reason,))


def _keep_out_of_private(gw: Gateway, call: FilesCall, paths: list[tuple[str, str]]) -> Decision | None:
    """A denial when a path is inside the gateway's own records, or a search would walk into them
    (the principal's own saved outputs excepted, for reads)."""
    own = saved_outputs_dir(gw, call.principal) if call.action in READS else None
    walks = call.action in ("grep", "find")
    return private_refusal(gw.private_dirs(), f"files {call.action}", walks, paths, own)


def private_refusal(
    private: tuple[Path, ...], who: str, walks: bool, paths: list[tuple[str, str]], readable: Path | None = None
) -> Decision | None:
    """A denial when a path lies inside one of the `private` directories (the gateway's records),
    or, for a tool that `walks` a tree (grep, find), holds one. `readable`: a directory inside
    them the caller may read all the same (a principal's own saved outputs)."""
    for path, access in paths:
        try:
            real = Path(settled_realpath(path))
        except PathRefused as exc:
            return _refused(exc, path, access)
        if readable is not None and (real == readable or readable in real.parents):
            continue
        inside = any(real == d or d in real.parents for d in private)
        walks_in = walks and any(real in d.parents for d in private)
        if inside or walks_in:
            what = "lies inside" if inside else "holds"
            message = f"{who}: {path} {what} the gateway's own records (audit log, state): refused"
            reason = Reason("pathjail", "gateway_private", message, None, {"path": path})
            return Decision(Verdict.DENY, None, (reason,))
    return None


def secret_refusal(policy: CompiledPolicy, principal: str, who: str, paths: list[tuple[str, str]]) -> Decision | None:
    """A denial when a tool that reads a tree whole (an agent's own Grep, read_many_files) would
    read what the principal's deny_read patterns deny below a directory it names. For the tools
    an agent runs itself (hooks): no sandbox masks those files, and the files tool's own search
    skips them as it opens each file."""
    grant = policy.grant(principal)
    if grant.deny_read is None:
        return None
    roots = [str(r) for r in (*grant.read_roots, *grant.write_roots)]
    for path, access in paths:
        if access != "read" or not os.path.isdir(path):
            continue
        try:
            found = masks.find([path], grant.deny_read, sandbox_plan.unseen(roots))
        except (masks.TooManyToSearch, OSError) as exc:
            reason = Reason("pathjail", "deny_read_unchecked", f"{who}: {exc}: search narrower directories")
            return Decision(Verdict.DENY, None, (reason,))
        if found:
            hit = found[0]
            message = (
                f"{who} reads every file below {path}, and {hit.path} matches the policy's deny_read pattern "
                f"{hit.pattern!r}: search the directories that hold no secret, or name the files"
            )
            reason = Reason("pathjail", "deny_read", message, None, {"path": hit.path, "tree": path})
            return Decision(Verdict.DENY, None, (reason,))
    return None


def with_home(gw: Gateway, policy: CompiledPolicy, call: FilesCall) -> FilesCall:
    """`~` and `~/...` in the call's path mean the policy's `home`, as in a command's paths and a
    cwd. Raises PathRefused for `~` without a home, and for `~user`."""
    if not call.path or not call.path.startswith("~"):
        return call
    return call.model_copy(update={"path": str(gw.resolve_cwd(policy, call.path, "path"))})


def arguments(call: FilesCall) -> dict[str, Any]:
    """The call's arguments as the audit log keeps them: content and edit text may hold secrets,
    so their sizes."""
    out = call.model_dump(exclude={"tool", "principal", "content", "old", "new", "edits"}, exclude_none=True)
    for name in ("content", "old", "new"):
        value = getattr(call, name)
        if value is not None:
            out[f"{name}_bytes"] = len(value.encode())
    if call.edits is not None:
        out["edits"] = [
            {"old_bytes": _size(e.old), "new_bytes": _size(e.new), "replace": e.replace} for e in call.edits
        ]
    return out


def handle(gw: Gateway, call: FilesCall, call_id: str) -> dict[str, Any]:
    policy = gw.policy
    try:
        call = with_home(gw, policy, call)
    except PathRefused as exc:
        given = call.model_dump(include={"action", "path"})
        refused = _refused(exc, call.path or "", "write" if call.action in files.WRITES else "read")
        subject = f"files {call.action} {call.path}"
        denied = gw.authorize(call_id, call.principal, "files", subject, policy.workspace, {}, refused, given, policy)
        if isinstance(denied, Gated):  # a denial is never let through: fail closed all the same
            return gw.record_result(denied, {"status": "denied", "error": {"code": exc.code, "message": exc.message}})
        return denied
    decision, paths = decide(policy, call, with_saved_outputs(gw, policy.grant(call.principal), call))
    recorded = arguments(call)
    subject = f"files {call.action} " + " ".join(p for p, _ in paths)
    if decision.verdict is not Verdict.DENY:
        decision = _keep_out_of_private(gw, call, paths) or decision
    gated = gw.authorize(call_id, call.principal, "files", subject, policy.workspace, {}, decision, recorded, policy)
    if not isinstance(gated, Gated):
        return gated
    lim = limits(policy, call.principal)
    file_limits = files.FileLimits(
        read_bytes=lim.get("output_bytes") or files.FileLimits.read_bytes,
        write_bytes=lim.get("file_bytes") or files.FileLimits.write_bytes,
        reply_bytes=lim.get("reply_bytes") or files.FileLimits.reply_bytes,
    )
    # the executor checks every file it opens again, the gateway's records included: a link
    # flipped after the decision must not lead the read into them
    grant = with_saved_outputs(gw, seen_as_by_commands(policy.grant(call.principal)), call)
    grant = replace(grant, private=gw.private_dirs())
    # and it opens them as the sandbox's account would: a file no command could read (/etc/shadow,
    # /root under a read root of /) it cannot read either, and what it writes is that account's.
    # The one exception: a read of the principal's own saved outputs, which only the gateway
    # writes, in its own state (no account but the gateway's may enter it)
    own = grant.outputs
    reading_own = own is not None and all(
        Path(settled_realpath(p)) == own or own in Path(settled_realpath(p)).parents for p, _ in paths
    )
    if reading_own:  # done as root: only the path decided, and only inside the saved outputs, whatever
        # a link of the agent's on the way (`lnk` -> the outputs when decided, -> the workspace when
        # opened) says by the time the executor resolves the path again (red team 16)
        assert own is not None
        grant = replace(grant, read_roots=(own,), write_roots=(), protected=())
        call = call.model_copy(update={"path": paths[0][0]})
    over = _over_budget(policy, call, lim)
    if over is not None:  # the principal's write roots are at their disk budget (sandbox/disk.py)
        return gw.record_result(gated, {"status": "error", "error": {"code": "DISK_BUDGET", "message": over}})
    try:
        with contextlib.nullcontext() if reading_own else identity.acting_as_sandbox():
            outcome = files.execute(call, grant, policy.workspace, outputs_dir(policy), file_limits)
    except identity.ActAsUnavailable as exc:
        outcome = {"status": "error", "error": {"code": "SANDBOX_UNAVAILABLE", "message": str(exc)}}
    return gw.record_result(gated, outcome)


def _over_budget(policy: CompiledPolicy, call: FilesCall, lim: dict[str, int]) -> str | None:
    """Why a write or edit would take the principal's write roots past its disk budget, as a
    command's would be stopped: the content it adds counts (at most `file_bytes` a call)."""
    if call.action not in ("write", "edit", "mkdir"):
        return None
    roots = tuple(str(r) for r in policy.grant(call.principal).write_roots)
    if not roots:
        return None
    adding = sum(_size(t) for t in (call.content or "", call.new or "", *(e.new for e in call.edits or ())))
    budget = lim.get("disk_bytes", DEFAULT_DISK_BYTES)
    return disk.watch().check(roots, budget, limit_source(policy, call.principal, "disk_bytes"), adding)


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
