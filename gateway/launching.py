"""Launching, one of the gate's jobs (gateway/pipeline.py composes them): the sandbox each
principal's commands get from the policy (roots, protected paths, the gateway's private
directories, quotas, network, Landlock, HOME), whether this setup may launch anything at all
(`unsafe_setup`), the sessions and durable processes the gateway keeps, and what happens to them
when the nested-repository watcher trips.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway import sandbox
from gateway.audit import AuditUnavailable
from gateway.audit.sink import AuditSink
from gateway.executors.sessions import SessionManager
from gateway.log import log
from gateway.policy.compile import CompiledPolicy

DEFAULT_SESSIONS = 8
DEFAULT_PROCESSES = 8
DEFAULT_SESSION_IDLE_S = 1800
DEFAULT_MEMORY_BYTES = 2 << 30
DEFAULT_PIDS = 512
DEFAULT_TMPFS_BYTES = 256 << 20
DEFAULT_CPU_SECONDS = 600
DEFAULT_FILE_BYTES = 1 << 30
DEFAULT_OPEN_FILES = 1024
DEFAULT_DISK_BYTES = 10 << 30


class Launcher:
    """What the gate's executors start things in: the sandbox profile of each principal, the
    sessions and durable processes it keeps (a tool family makes the process manager: `processes`)."""

    def __init__(self, audit: AuditSink, hidden: tuple[Path, ...], policy: Callable[[], CompiledPolicy]) -> None:
        self.audit = audit
        self.hidden = hidden
        self.current_policy = policy
        self.sessions = SessionManager(on_event=self._session_event)
        self.sessions.start_reaper()
        self.processes: Any = None
        self.processes_lock = threading.Lock()

    def private_dirs(self) -> tuple[Path, ...]:
        """The gateway's own records: the audit log, the approvals queue, its state (every
        principal's process logs). No agent reads them, whatever its read roots say."""
        return tuple(Path(os.path.realpath(p)) for p in (self.audit.directory, *self.hidden))

    def profile(self, policy: CompiledPolicy, principal: str, network_hooks: Any) -> sandbox.Profile:
        """What every executor's sandbox gets from the policy (`network_hooks`: what records a
        policy network's connections and answers its asks; None without such a network)."""
        home = str(policy.home) if policy.home is not None else None
        return sandbox_profile(policy, principal, self.private_dirs(), home, self._quarantined, network_hooks)

    def unsafe_setup(self, policy: CompiledPolicy, principal: str) -> str:
        """Why this setup must not execute: the agent could rewrite the audit log, the policy,
        the approvals queue or the gateway's state if one lies inside its write roots."""
        return unsafe_setup(policy, principal, self.audit.directory, self.hidden)

    def _quarantined(self, event: str, data: dict[str, object]) -> None:
        """The nested-repository watcher moved one aside, tripped, or failed (sandbox/nested.py).
        On a trip (nested repositories put back again and again in one root: something running
        keeps planting them), every session and durable process of each principal that may write there
        is stopped."""
        log.warning(event, **data)
        with contextlib.suppress(AuditUnavailable):
            self.audit.append(event, tool="sandbox", data=data)
        if event != "nested_repository_tripwire":
            return
        where = Path(str(data.get("path", "")))

        def stop() -> None:  # on its own thread: the watcher's lock is held here, and stopping takes others
            with contextlib.suppress(Exception):
                policy = self.current_policy()
                for principal in policy.grants:
                    if any(root == where or root in where.parents for root in policy.grant(principal).write_roots):
                        self._stop_everything_of(principal)

        threading.Thread(target=stop, name="nested-tripwire", daemon=True).start()

    def _stop_everything_of(self, principal: str) -> None:
        for session in self.sessions.of(principal):
            with contextlib.suppress(Exception):
                self.sessions.kill(principal, session.id)
        if self.processes is not None:
            with contextlib.suppress(Exception):
                self.processes.stop_all(principal)
        with contextlib.suppress(AuditUnavailable):
            self.audit.append("principal_stopped", principal=principal, tool="sandbox",
                              data={"why": "nested_repository_tripwire"})  # fmt: skip

    def _session_event(self, event: str, session: Any, data: dict[str, Any]) -> None:
        with contextlib.suppress(AuditUnavailable):
            self.audit.append(
                event, principal=session.principal, tool="session", data={"session_id": session.id, **data}
            )

    def close(self) -> None:
        """Kill the sessions; leave durable processes running (the next gateway adopts them)."""
        self.sessions.close()
        if self.processes is not None:
            self.processes.close()


def sandbox_profile(
    policy: CompiledPolicy,
    principal: str,
    private: tuple[Path, ...],
    home: str | None,
    report: Callable[[str, dict[str, object]], None] | None = None,
    egress_hooks: Any = None,
) -> sandbox.Profile:
    """The sandbox `principal`'s commands run in: its roots, protected paths, the gateway's
    `private` directories and its user's home (never shown), quotas, network (`egress_hooks`:
    what records a policy network's connections and answers its asks; without, such a network
    stays closed), Landlock; HOME is `home` (None: the sandbox's private one)."""
    grant = policy.grant(principal)
    lim = limits(policy, principal)
    settings = policy.policy.sandbox
    everything, egress = policy.network_of(principal)
    return sandbox.Profile(
        principal=principal,
        read_roots=grant.read_roots,
        write_roots=grant.write_roots,
        protected=grant.protected,
        private=private + (Path(os.path.realpath(Path.home())),),
        quotas=sandbox.Quotas(
            memory_bytes=lim.get("memory_bytes", DEFAULT_MEMORY_BYTES),
            pids=lim.get("pids", DEFAULT_PIDS),
            cpu_seconds=lim.get("cpu_seconds", DEFAULT_CPU_SECONDS),
            file_bytes=lim.get("file_bytes", DEFAULT_FILE_BYTES),
            open_files=lim.get("open_files", DEFAULT_OPEN_FILES),
            tmpfs_bytes=lim.get("tmpfs_bytes", DEFAULT_TMPFS_BYTES),
            disk_bytes=lim.get("disk_bytes", DEFAULT_DISK_BYTES),
            disk_source=limit_source(policy, principal, "disk_bytes"),
        ),
        network=everything,
        egress=egress,
        egress_hooks=egress_hooks,
        landlock="required" if settings.require_landlock else "optional",
        etc=tuple(settings.etc),
        path=tuple(str(p) for p in grant.path),
        report=report,
        home=home,
        deny_read=grant.deny_read,
        deny_write=grant.deny_write,
    )


def unsafe_setup(policy: CompiledPolicy, principal: str, audit_dir: Path, hidden: tuple[Path, ...]) -> str:
    """Why a gateway with this audit log and these private directories (`hidden`: the approvals
    queue, its state, ...) must not decide for `principal`: one of them, or the policy, lies
    inside the principal's write roots, so the agent could rewrite it. Empty when none does."""
    roots = [(root, str(root), os.path.join(str(root), "")) for root in policy.grant(principal).write_roots]
    sensitive = [("the audit log", audit_dir)]
    sensitive += [("the policy", f.parent) for f in policy.files]  # included files too
    sensitive += [("the approvals queue or the gateway's state", p) for p in hidden]
    for what, path in sensitive:
        real = os.path.realpath(path)  # resolved on every call: a link changed since counts
        for root, name, inside in roots:  # strings: Path.parents cost more than the check (every call)
            if real == name or real.startswith(inside):
                return f"{what} ({real}) lies inside the write root {root}: the agent could rewrite it"
    return ""


def limits(policy: CompiledPolicy, principal: str) -> dict[str, int]:
    """The principal's limits: for each, the largest any of its roles sets."""
    out: dict[str, int] = {}
    for name in policy.policy.principals[principal].roles:
        for key, value in policy.policy.roles[name].limits.model_dump().items():
            if value is not None:
                out[key] = max(out.get(key, 0), value)
    return out


def limit_source(policy: CompiledPolicy, principal: str, key: str) -> str:
    """Where the principal's limit `key` comes from, for a message: the role that sets the
    largest (as `limits` takes it), or the gateway's default."""
    best: tuple[int, str] | None = None
    for name in policy.policy.principals[principal].roles:
        value = getattr(policy.policy.roles[name].limits, key)
        if value is not None and (best is None or value > best[0]):
            best = (value, name)
    return f"limits.{key} of role {best[1]}" if best else f"the default limits.{key} (no role of {principal} sets it)"
