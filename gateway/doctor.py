"""`gateway doctor`: what this host enforces, one item at a time.

Each item says yes or no and why. Some items are required (without them no command can run
sandboxed: bubblewrap, unprivileged user namespaces, an unprivileged uid, the C helper, seccomp
filters, and what a given policy demands); the others (Landlock, cgroups) say how strong the sandbox is and
what stands in when they are missing. `Report.ok` is false when a required item fails.

Doctor looks and never changes the host's configuration, with two exceptions that the gateway
would make on its first command anyway: the C helper is built if it is not yet, and probing
cgroups creates (and removes) a group (on cgroup v2 this may move this process into a leaf of
its own; see sandbox/quotas.py). A missing sandbox account is not created: doctor says it will be.
It reads a policy's demands, so it is a face's report above the sandbox, not part of it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pwd
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

from gateway.policy.compile import CompiledPolicy
from gateway.sandbox import disk, identity, landlock, quotas

NOBODY = 65534
TIMEOUT = 20


@dataclass(frozen=True)
class Item:
    key: str
    """The item's key in the JSON output (bubblewrap, user_namespaces, ...)."""
    label: str
    ok: bool
    detail: str
    required: bool
    """Commands cannot run sandboxed while this is not ok."""
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    items: tuple[Item, ...]

    @property
    def blocked_by(self) -> list[str]:
        return [i.label for i in self.items if i.required and not i.ok]

    @property
    def ok(self) -> bool:
        return not self.blocked_by

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "blocked_by": self.blocked_by,
            "items": {
                i.key: {"label": i.label, "ok": i.ok, "required": i.required, "detail": i.detail, **i.facts}
                for i in self.items
            },
        }

    def text(self) -> str:
        width = max(len(i.label) for i in self.items)
        lines = []
        for i in self.items:
            answer = "yes" if i.ok else ("NO " if i.required else "no ")
            lines.append(f"{i.label:{width}}  {answer}  {i.detail}")
        if self.ok:
            lines.append("=> commands can run sandboxed here")
        else:
            lines.append(f"=> commands cannot run sandboxed here: blocked by {', '.join(self.blocked_by)}")
        return "\n".join(lines)


def run(policy: CompiledPolicy | None = None) -> Report:
    """Check everything (with `policy`: also what that policy requires)."""
    bwrap = _bubblewrap()
    account = _identity()
    items = [_own_proc(), bwrap, _user_namespaces(bwrap.facts.get("path"), account), account]
    items += [_landlock(policy), _cgroups(account)]
    helper_item = _helper()
    items.append(helper_item)
    items.append(_seccomp(helper_item))
    items.append(_nested())
    items.append(_hook_mode(bwrap.ok and account.ok))
    if policy is not None:
        items.append(_policy(policy))
        items.append(_network(policy))
        items.append(_disk_budget(policy))
    return Report(tuple(items))


def _disk_budget(policy: CompiledPolicy) -> Item:
    """How the principals' disk budgets hold on their write roots' filesystems (never a block)."""
    roots = sorted({str(r) for grant in policy.grants.values() for r in grant.write_roots})
    found = {root: disk.project_quotas(root) for root in roots}
    how = "; ".join(f"{root}: {what}" for root, what in found.items()) or "no write roots"
    detail = (
        f"watched: a sandbox that takes its principal's write roots past limits.disk_bytes is stopped "
        f"(overshooting by what one look misses), fallocate refused ({how})"
    )
    return Item("disk_budget", "disk budget", True, detail, False, {"roots": found})


NETWORK_TRUE_WARNING = (
    "sandbox.network is true: commands reach every host the gateway's machine reaches, UDP included, and no "
    "connection is recorded; name the hosts instead (sandbox.network: {presets, allow, ask, deny}: docs/sandbox.md)"
)


def _network(policy: CompiledPolicy) -> Item:
    """What the policy lets commands reach (a warning, never a block: the admin chose it)."""
    setting = policy.policy.sandbox.network
    if setting is True:
        return Item("network", "network", False, NETWORK_TRUE_WARNING, False, {"mode": "everything"})
    if policy.egress is None:
        return Item("network", "network", True, "off: commands have no network", False, {"mode": "off"})
    e = policy.egress
    facts = {"mode": "hosts", "allow": [p.text for p in e.allow], "ask": [p.text for p in e.ask],
             "deny": [p.text for p in e.deny], "presets": dict(e.preset_hosts), "ports": list(e.ports())}  # fmt: skip
    detail = (
        f"hosts by policy: {len(e.allow)} allowed, {len(e.ask)} asked, {len(e.deny)} denied pattern(s), ports "
        f"{', '.join(map(str, e.ports())) or 'none'}; every connection through the gateway's proxy, recorded"
    )
    return Item("network", "network", True, detail, False, facts)


def _run(argv: list[str], **kwargs: Any) -> tuple[int | None, str]:
    """(exit status, the first line of what it printed); status None if it did not start.

    In a process group of its own, killed whole when it takes too long: a bwrap whose monitor
    alone were killed would leave its first process waiting for ever (as in launch.check)."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kwargs)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, str(exc)
    out = (stderr or stdout).decode(errors="replace").strip()
    return proc.returncode, out.splitlines()[0][:200] if out else ""


def _bubblewrap() -> Item:
    # lazy: startup (`gateway check` imports NETWORK_TRUE_WARNING from here, not the launcher)
    from gateway.sandbox import launch  # the launcher's own binary and self-check

    label = "bubblewrap"
    try:
        path = launch.bwrap_binary()
    except launch.SandboxUnavailable as exc:
        return Item("bubblewrap", label, False, str(exc), True)
    status, version = _run([path, "--version"])
    facts: dict[str, Any] = {"path": path, "version": version if status == 0 else None}
    try:
        launch.check()
    except launch.SandboxUnavailable as exc:
        return Item("bubblewrap", label, False, f"{path}: {exc}", True, {**facts, "starts": False})
    shown = version if status == 0 else "version unknown"
    return Item(
        "bubblewrap", label, True, f"{path} ({shown}): a minimal sandbox starts", True, facts | {"starts": True}
    )


def _own_proc() -> Item:
    """bwrap names processes by their pid in the gateway's pid namespace, through /proc."""
    # lazy: startup (`gateway check` imports NETWORK_TRUE_WARNING from here, not the launcher)
    from gateway.sandbox import launch

    foreign = launch.foreign_proc()
    if foreign is not None:
        return Item("own_proc", "own /proc", False, foreign, True)
    return Item("own_proc", "own /proc", True, "/proc shows this process's own pid namespace", True)


def _sysctl(name: str) -> str | None:
    try:
        with open(f"/proc/sys/{name}", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _user_namespaces(bwrap: str | None, account: Item) -> Item:
    """Sandboxed code starts bwrap as an unprivileged uid, so the kernel must let an
    unprivileged user create a user namespace; try exactly that."""
    label = "user namespaces"
    limit = _sysctl("user/max_user_namespaces")
    facts: dict[str, Any] = {"max_user_namespaces": int(limit) if limit and limit.isdigit() else None}
    knobs = {  # distribution switches that also refuse unprivileged ones, when present
        "kernel.unprivileged_userns_clone": _sysctl("kernel/unprivileged_userns_clone"),
        "kernel.apparmor_restrict_unprivileged_userns": _sysctl("kernel/apparmor_restrict_unprivileged_userns"),
    }
    facts["sysctls"] = {k: v for k, v in knobs.items() if v is not None}
    if limit == "0":
        return Item(
            "user_namespaces", label, False, "user.max_user_namespaces is 0: set it above 0 (sysctl)", True, facts
        )
    if bwrap is None:
        return Item("user_namespaces", label, False, "not tried: no bubblewrap", True, facts)
    uid, gid = account.facts.get("uid"), account.facts.get("gid")
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
    elif not isinstance(uid, int) or not isinstance(gid, int):
        uid, gid = NOBODY, NOBODY  # the account does not exist yet: any unprivileged uid shows the same
    facts["tried_as_uid"] = uid
    argv = [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--unshare-user", "--disable-userns", "--", "true"]
    switch: dict[str, Any] = {}
    if os.geteuid() == 0:
        switch = {"user": uid, "group": gid, "extra_groups": []}
    status, why = _run(argv, cwd="/", env={"PATH": "/usr/bin:/bin"}, **switch)
    facts["unprivileged_starts"] = status == 0
    head = f"max_user_namespaces {limit or 'unknown'}"
    extra = "".join(f", {k} = {v}" for k, v in facts["sysctls"].items())
    if status != 0:
        hint = " (see the sysctls above)" if extra else ""
        return Item(
            "user_namespaces", label, False, f"{head}{extra}; as uid {uid} bwrap fails: {why}{hint}", True, facts
        )
    return Item(
        "user_namespaces", label, True, f"{head}{extra}; an unprivileged one starts (as uid {uid})", True, facts
    )


def _identity() -> Item:
    label = "sandbox uid"
    wanted = os.environ.get("AGW_SANDBOX_USER", identity.ACCOUNT)
    if os.geteuid() == 0 and wanted == identity.ACCOUNT:
        try:
            pwd.getpwnam(wanted)
        except KeyError:  # sandbox_identity() would create it: doctor only says so
            facts: dict[str, Any] = {"uid": None, "name": wanted, "how": "dedicated account (not created yet)"}
            if shutil.which("useradd") is None:
                why = f"the account {wanted!r} does not exist and there is no useradd to create it"
                return Item(
                    "sandbox_uid", label, False, f"{why}: create it, or name one with AGW_SANDBOX_USER", True, facts
                )
            detail = f"the account {wanted!r} does not exist yet: it will be created on first run (useradd --system)"
            return Item("sandbox_uid", label, True, detail, True, facts)
    try:
        ident = identity.sandbox_identity()
    except identity.IdentityUnavailable as exc:
        return Item("sandbox_uid", label, False, str(exc), True, {"uid": None})
    facts = {"uid": ident.uid, "gid": ident.gid, "name": ident.name, "how": ident.how}
    return Item("sandbox_uid", label, True, f"uid {ident.uid} ({ident.name}, {ident.how})", True, facts)


def _requires_landlock(policy: CompiledPolicy | None) -> bool:
    if policy is None:
        return False
    return bool(getattr(policy.policy.sandbox, "require_landlock", False))


def _landlock(policy: CompiledPolicy | None) -> Item:
    version = landlock.abi()
    required = _requires_landlock(policy)
    detail = landlock.describe()
    if version == 0:
        detail += ": the policy requires it" if required else ": file and network access rest on the mounts alone"
    return Item("landlock", "Landlock", version > 0, detail, required, {"abi": version})


def _cgroups(account: Item) -> Item:
    support = quotas.cgroup_support()
    facts: dict[str, Any] = {
        "version": support.version,
        "controllers": list(support.controllers),
        "base": support.base or None,
    }
    missing = [c for c in quotas.WANTED if c not in support.controllers]
    fallback = []
    if "memory" in missing:
        fallback.append("memory by RLIMIT_AS, per process (not for the whole sandbox: N processes may use N times it)")
    if "pids" in missing:
        shared = (
            "the gateway user's own processes too" if account.facts.get("how") == "gateway user" else "all sandboxes"
        )
        fallback.append(f"processes by RLIMIT_NPROC, per uid (one budget shared by {shared})")
    facts["fallback"] = fallback
    if support.version is None:
        detail = f"no ({support.reason}); instead: {'; '.join(fallback)}"
        return Item("cgroups", "cgroups", False, detail, False, facts)
    detail = support.reason + (f"; instead: {'; '.join(fallback)}" if fallback else "")
    return Item("cgroups", "cgroups", True, detail, False, facts)


def _helper() -> Item:
    label = "C helper"
    try:
        # lazy: doctor reports a helper module that does not import, rather than failing itself
        module = importlib.import_module("gateway.sandbox.helper")
    except ModuleNotFoundError as exc:
        if exc.name != "gateway.sandbox.helper":
            return Item("helper", label, False, f"gateway.sandbox.helper does not import: {exc}", True)
        return Item("helper", label, False, "not built yet (this installation has no gateway.sandbox.helper)", False)
    except ImportError as exc:
        return Item("helper", label, False, f"gateway.sandbox.helper does not import: {exc}", True)
    try:
        path = str(module.helper_path())
    except module.HelperUnavailable as exc:
        return Item("helper", label, False, str(exc), True, {"path": None})
    return Item("helper", label, True, f"built: {path}", True, {"path": path})


def _seccomp(helper_item: Item) -> Item:
    """The helper refuses set-id modes inside every sandbox with a seccomp filter (a set-id file
    made in a write root stays on the host), and runs no command where the kernel cannot filter:
    the helper installs the filter in a process of its own and checks that it holds."""
    label = "seccomp"
    path = helper_item.facts.get("path")
    if not isinstance(path, str):
        return Item("seccomp", label, False, "not tried: no helper; without it no command runs", True)
    status, said = _run([path, "seccomp-check"])
    if status != 0:
        why = said or f"status {status}"
        detail = f"the set-id filter does not hold here ({why}): no command runs (a set-id file would reach the host)"
        return Item("seccomp", label, False, detail, True, {"setid_refused": False})
    detail = "a filter refuses set-user-ID and set-group-ID modes (chmod, open, mkdir, mknod) in every sandbox"
    return Item("seccomp", label, True, detail, True, {"setid_refused": True})


def _nested() -> Item:
    """The nested-repository watcher (sandbox/nested.py) needs inotify, one watch per directory
    of the write roots."""
    label = "nested repos"
    watches = _sysctl("fs/inotify/max_user_watches")
    facts: dict[str, Any] = {"max_user_watches": int(watches) if watches and watches.isdigit() else None}
    try:
        fd = _inotify_probe()
    except OSError as exc:
        return Item("nested", label, False, f"inotify unavailable ({exc}): no command can run", True, facts)
    os.close(fd)
    detail = (
        f"watched with inotify (up to {watches or '?'} directories across write roots; fs.inotify.max_user_watches)"
    )
    return Item("nested", label, True, detail, True, facts)


HOOK_AGENTS = {
    "claude-code": "sandboxed: an allowed or approved Bash call is rewritten into a run in this sandbox",
    "codex": "sandboxed: an allowed Bash call is rewritten into a run in this sandbox (Codex's own sandbox must "
    "let it reach the gateway: sandbox_workspace_write.network_access = true); apply_patch is applied by Codex",
    "gemini": "NOT sandboxed: Gemini CLI runs each call itself after the answer (the hook decides only)",
    "file tools": "NOT sandboxed: every agent's own file tools read and write as the user (decided only)",
}


def _hook_mode(sandbox_ok: bool) -> Item:
    """What `gateway hook` holds here, agent by agent (docs/hooks.md): where an agent lets the
    hook rewrite a shell call it runs in this sandbox; elsewhere the hook is the only barrier."""
    facts: dict[str, Any] = {"agents": dict(HOOK_AGENTS)}
    if not sandbox_ok:
        detail = (
            "the sandbox cannot start here: the hook's gateway starts only with --no-sandbox, and then every "
            "agent runs every call itself (the hook decides only)"
        )
        return Item("hook_mode", "hook mode", False, detail, False, facts)
    detail = "; ".join(f"{agent}: {what}" for agent, what in HOOK_AGENTS.items())
    return Item("hook_mode", "hook mode", True, detail, False, facts)


def _inotify_probe() -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.inotify_init1(os.O_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def _policy(policy: CompiledPolicy) -> Item:
    label = "policy"
    needs = _requires_landlock(policy)
    facts: dict[str, Any] = {"path": str(policy.source), "require_landlock": needs}
    if needs and landlock.abi() == 0:
        return Item("policy", label, False, f"{policy.source} requires Landlock, which this kernel lacks", True, facts)
    if needs:
        return Item(
            "policy", label, True, f"{policy.source}: requires Landlock ({landlock.describe()}): met", True, facts
        )
    return Item("policy", label, True, f"{policy.source}: no host requirement beyond the above", True, facts)
