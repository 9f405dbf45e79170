"""The sandbox every executor goes through. No sandbox, no execution.

A sandbox is a value first and a launch second:

    plan.py         `build()`: the pure plan of what a command sees (mounts, uid, Landlock
                    rules, quotas, environment), from the policy's Profile and the call
    git.py          which calls are git writes; what each .git holds; git's environment
    descriptors.py  openat2: every source opened by descriptor, no name resolved twice
    launch.py       `prepare()`: applies a plan (agw-init outer -> bwrap -> agw-init inner)
    helper.py       builds agw_init.c, the helper that joins the cgroup and drops to the sandbox
                    uid outside, and verifies mounts, applies Landlock and rlimits inside
    identity.py     the unprivileged uid sandboxed code runs as (never host root)
    nested.py       quarantines nested repositories (sub/.git) the moment they appear
    masks.py        the policy's deny_read/deny_write patterns, and their matches under the roots
                    (kept up to date by inotify), which every sandbox masks
    quotas.py       memory and process caps by cgroup (v1 or v2), rlimits otherwise
    disk.py         the principal's disk budget on its write roots, watched while sandboxes run
    reaper.py       the gateway as subreaper: reaps killed sandboxes' orphaned namespace inits
    landlock.py     the kernel's Landlock ABI
    doctor.py       `gateway doctor`: what this host enforces

Callers use `start()` (a plan and its prepared launch) and hand `Launch.argv`/`pass_fds` to
Popen. docs/sandbox.md says what a command sees and what the sandbox guarantees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from gateway.log import log
from gateway.sandbox import git, identity, masks, nested
from gateway.sandbox.launch import DiskBudgetRefused, Launch, SandboxUnavailable, check, is_setup_failure, prepare
from gateway.sandbox.plan import HOME, LOOP_SHELL, LOOP_ZSH, RUNTIME, Profile, SandboxPlan, build, host_facts, unseen
from gateway.sandbox.quotas import Quotas

__all__ = [
    "HOME",
    "LOOP_SHELL",
    "LOOP_ZSH",
    "DiskBudgetRefused",
    "Launch",
    "Profile",
    "Quotas",
    "SandboxPlan",
    "SandboxUnavailable",
    "check",
    "is_setup_failure",
    "plan_for",
    "start",
]


def plan_for(
    profile: Profile,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    *,
    git_write: bool = False,
    die_with_parent: bool = True,
    keep_fds: tuple[int, ...] = (),
    loop_shell: bool | Literal["zsh"] = False,
) -> SandboxPlan:
    """The plan for running `argv` in `cwd` (facts read off the host here). Raises
    SandboxUnavailable when there is no unprivileged identity to run as."""
    try:
        ident = identity.sandbox_identity()
    except identity.IdentityUnavailable as exc:
        raise SandboxUnavailable(str(exc)) from exc
    masked, read_only = secrets_of(profile)
    return build(
        profile, tuple(argv), cwd, env,
        uid=ident.uid, gid=ident.gid, user=ident.name,
        repositories=git.survey(profile.write_roots), host=host_facts(profile.etc),
        git_write=git_write, die_with_parent=die_with_parent, keep_fds=keep_fds, loop_shell=loop_shell,
        masked=masked, read_only=read_only,
    )  # fmt: skip


def secrets_of(profile: Profile) -> tuple[tuple[masks.Hit, ...], tuple[masks.Hit, ...]]:
    """The deny_read matches under the profile's roots (masked) and the deny_write ones under
    its write roots (read-only), as they are now. The directories the sandbox hides or replaces
    and the system's own are not searched. Raises SandboxUnavailable where the roots are too
    large to search: a sandbox is never started with its secrets unmasked."""
    roots = [str(r) for r in (*profile.read_roots, *profile.write_roots)]
    skip = (*unseen(roots), *map(str, profile.private), *RUNTIME, "/etc", "/proc", "/sys", "/dev")
    try:  # as the sandbox's account: what it cannot list, it cannot read, and bwrap mounts as it
        with identity.acting_as_sandbox():
            masked = masks.find(roots, profile.deny_read, skip)
            writable = [str(w) for w in profile.write_roots]
            read_only = masks.find(writable, profile.deny_write, skip) if profile.deny_write is not None else ()
    except (masks.TooManyToSearch, identity.ActAsUnavailable, OSError) as exc:
        raise SandboxUnavailable(f"the roots cannot be searched for the policy's denied paths: {exc}") from exc
    return masked, read_only


def start(
    profile: Profile, argv: list[str], cwd: Path, env: dict[str, str], *, hold: bool = False, **options: Any
) -> tuple[SandboxPlan, Launch]:
    """Plan (`plan_for`, with the same options) and prepare one sandbox. Raises
    SandboxUnavailable (callers refuse to run). `hold`: the command runs only after
    `Launch.go()` (launch.py)."""
    plan = plan_for(profile, argv, cwd, env, **options)
    try:  # nested repositories the command makes are quarantined as they appear (nested.py)
        nested.guard(plan.uid).watch(profile.write_roots, profile.report or _unreported)
    except nested.GuardUnavailable as exc:
        raise SandboxUnavailable(str(exc)) from exc
    return plan, prepare(plan, check(), hold=hold)


def _unreported(event: str, data: dict[str, object]) -> None:
    log.warning(event, **data)
