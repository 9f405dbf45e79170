"""The sandbox as a value: everything a command will see, decided before anything launches.

`build()` is a pure function of the principal's `Profile` (from the policy), the call (argv,
cwd, environment, whether it is a git write) and a few facts read off the host (which system
directories exist, what each write root's `.git` holds). It returns a `SandboxPlan`: each mount
with its source, target and mode, the uid, the Landlock rules, the quotas, the environment.
Tests assert on plans without launching ("no host path outside the allowlist", "every
protected path read-only"); `launch.py` applies a plan and nothing else.

What a command sees (docs/sandbox.md says it for admins):

    /usr /bin /sbin /lib* (what exists)     the system runtime, read-only
    /etc                                    a curated few entries (ETC), read-only; passwd and
                                            group list only root, the sandbox user and nobody
    /dev /proc                              a minimal /dev, the sandbox's own /proc
    /tmp /dev/shm HOME                      private tmpfs, `size=` capped, gone at exit
    read roots                              read-only
    write roots                             read-write; their protected paths and `.git`
                                            read-only (git.py), pinned so they cannot be moved
    the gateway's private directories       absent, or an empty read-only directory where a
                                            wide root would show them
    /run/agent-gateway                      the helper and git's global config, read-only

Nothing else of the host exists inside: no /home, /root, /run, /var, host /tmp, /srv, /mnt, /opt,
unless a root names it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from gateway.sandbox import git, masks
from gateway.sandbox.egress.rules import Egress
from gateway.sandbox.quotas import Quotas

RUNTIME = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "gai.conf", "host.conf",
    "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias", "locale.conf", "localtime",
    "lsb-release", "magic", "magic.mime", "mime.types", "networks", "nsswitch.conf", "os-release", "perl",
    "protocols", "python3", "python3.11", "python3.12", "python3.13", "services", "shells", "ssl/certs",
    "ssl/openssl.cnf", "terminfo", "timezone",
)  # fmt: skip
"""/etc entries a command needs (dynamic linking, locale, time zones, CA certificates, name lookup,
interpreters' own settings). Nothing secret: no shadow, ssh, ssl/private, sudoers, pip or npm
credentials, gitconfig."""
NETWORK_ETC = ("resolv.conf", "hosts")
"""Name lookup, only when the policy lets commands reach the network."""
RESOLV_CONF = b"nameserver 127.0.0.1\noptions timeout:5 attempts:2\n"
"""A sandbox whose network is a policy asks its own resolver (sandbox/egress/proxy.py)."""
LOCAL_HOSTS = b"127.0.0.1 localhost\n::1 localhost\n"
HIDDEN_SYSTEM = ("/run", "/var/run", "/var/tmp", "/sys", "/home", "/tmp", "/dev/shm", "/proc", "/dev")
REPLACED = ("/tmp", "/dev/shm", "/dev")
"""Of HIDDEN_SYSTEM, those the sandbox replaces with private ones: only roots inside them show."""
"""Host directories never shown through a wide read root (host sockets and other users' homes
live there): each is replaced by the sandbox's own (/tmp, /dev, /proc) or an empty read-only
directory. A root that names one (or lies inside one) shows it."""

HOME = "/home/agent"
RUN_DIR = "/run/agent-gateway"
CA_BUNDLE = "/run/agent-gateway/ca-bundle.pem"
"""With intercepted hosts: the system's CAs and the gateway's own (sandbox/egress/broker.py)."""
HELPER = f"{RUN_DIR}/init"
GITCONFIG = f"{RUN_DIR}/gitconfig"
LOOP_SHELL = f"{RUN_DIR}/bash"
"""A session's loop shell: the system's bash, copied in executable and unreadable (mode 0111).
The kernel makes a process that execs a file it cannot read non-dumpable, so the commands the
loop runs (the same account, the same sandbox) can neither ptrace it nor open its /proc/PID/mem
or /proc/PID/fd: they cannot answer its read of the control pipe with a record of their own."""

READONLY = (
    "PATH", "HOME", "CDPATH", "LANG", "LANGUAGE", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS0", "PS1",
    "PS2", "PS3", "PS4", "PROMPT_COMMAND", "BASH_LOADABLES_PATH", "EXECIGNORE", "HISTFILE", "BASH_XTRACEFD",
    "BASH_COMPAT", "POSIXLY_CORRECT", "GLOBIGNORE", "INPUTRC", "BASH_CMDS", "BASH_ALIASES",
)  # fmt: skip
"""Variables every shell the gateway starts makes read-only before the agent's text runs. The
gate refuses any text that assigns them by name (analysis/hazards.py, PROTECTED_VARIABLES), but
bash evaluates a variable's value as arithmetic: `y=PATH=5; (( y ))` set PATH to 5 through a
name the text never wrote as an assignment, and `ls` then ran ./5/ls. Read-only, the assignment
fails ("readonly variable") and the command the gate decided is the one that runs. (An unset
one stays unset: `readonly POSIXLY_CORRECT` does not turn POSIX mode on.)"""

READONLY_PREFIX = f"builtin readonly {' '.join(READONLY)}; "
"""Put before the text on its first line: line numbers in bash's messages stay the text's own."""
LOOP_ZSH = f"{RUN_DIR}/zsh"
"""A zsh session's loop shell: the system's zsh, copied in the same way (mode 0111)."""

Kind = Literal[
    "ro-bind", "bind", "copy", "protect", "pin", "tmpfs", "hide", "dir", "symlink", "proc", "dev", "data", "helper",
    "shell", "mask",
]  # fmt: skip


@dataclass(frozen=True)
class Mount:
    """One entry of the sandbox's filesystem, applied in plan order (parents first)."""

    target: str
    kind: Kind
    source: str | None = None
    """The host path bound (ro-bind, bind, protect, pin) or copied (copy: a small system file,
    read by descriptor into the read-only root): opened by descriptor at launch."""
    beneath: str | None = None
    """For protect/pin/mask: the root the source lies in; opened beneath it, no symlinks."""
    size: int | None = None
    """A tmpfs's size; for a mask, set when it covers a directory (an empty read-only tmpfs of
    this size), unset for a file (an empty read-only file)."""
    link: str | None = None
    data: bytes | None = None

    @property
    def read_only(self) -> bool:
        return self.kind not in ("bind", "pin", "tmpfs", "dev", "proc")


@dataclass(frozen=True)
class Profile:
    """What the policy gives one principal's sandboxes."""

    principal: str
    read_roots: tuple[Path, ...]
    write_roots: tuple[Path, ...]
    protected: tuple[Path, ...]
    private: tuple[Path, ...]
    """The gateway's own directories (audit, approvals, state, its user's home): never shown."""
    quotas: Quotas
    network: bool = False
    egress: Egress | None = None
    """The network as a policy (sandbox.network as a mapping): hosts through the gateway's
    resolver and proxy. None with `network`: everything; None without: nothing."""
    egress_hooks: Any = field(default=None, compare=False)
    """What records and asks for the sandbox's connections (the gateway's audit and approvals)."""
    landlock: Literal["required", "optional"] = "optional"
    etc: tuple[str, ...] = ()
    """More /etc entries the policy asks for (sandbox.etc)."""
    path: tuple[str, ...] = ()
    """Directories PATH adds after the system ones (roles' `path`). The policy's load checked
    that each lies in the system runtime or a read root, outside every write root, so each is
    already mounted read-only here: the plan adds no mount for them, only their names."""
    report: Callable[[str, dict[str, object]], None] | None = field(default=None, compare=False)
    """Where the nested-repository watcher reports a quarantine (the gateway's audit log)."""
    home: str | None = None
    """HOME inside: what `~` means to the path jail and the files tool for these commands (the
    policy's `home`, or for an agent's hook call the agent's own HOME), shown only where a root
    shows it. None: the private HOME tmpfs."""
    deny_read: masks.Patterns | None = None
    """Paths masked in every sandbox (roles' `deny_read`): each match under the roots when the
    sandbox starts is covered by an empty read-only file or directory."""
    deny_write: masks.Patterns | None = None
    """Paths read-only in every sandbox (roles' `deny_write`): each match present when it starts."""


@dataclass(frozen=True)
class HostFacts:
    """What the host's system directories look like (read once; the admin's, not the agent's)."""

    runtime: tuple[tuple[str, str | None], ...]
    """(path, symlink target or None for a directory) for each RUNTIME path that exists."""
    etc: tuple[tuple[str, str | None], ...]
    """(name under /etc, symlink target or None) for each ETC/NETWORK_ETC entry that exists."""
    hideable: frozenset[str] = frozenset()
    """The HIDDEN_SYSTEM directories that exist here as directories (not symlinks)."""
    etc_files: frozenset[str] = frozenset()
    """The `etc` names that are regular files: copied in rather than bound (a mount each would
    cost more than the copy; measured in docs/performance.md)."""


@functools.lru_cache(maxsize=4)
def host_facts(extra_etc: tuple[str, ...] = ()) -> HostFacts:
    def entry(path: str) -> tuple[bool, str | None]:
        if os.path.islink(path):
            return True, os.readlink(path)
        return os.path.exists(path), None

    runtime = []
    for p in RUNTIME:
        exists, link = entry(p)
        if exists:
            runtime.append((p, link))
    etc = []
    for name in (*ETC, *NETWORK_ETC, *extra_etc):
        exists, link = entry(f"/etc/{name}")
        if exists:
            etc.append((name, link))
    hideable = frozenset(p for p in HIDDEN_SYSTEM if os.path.isdir(p) and not os.path.islink(p))
    files = frozenset(n for n, link in etc if link is None and os.path.isfile(f"/etc/{n}"))
    return HostFacts(tuple(runtime), tuple(etc), hideable, files)


@dataclass(frozen=True)
class SandboxPlan:
    """Everything a command will see and be held to."""

    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str] = field(hash=False)
    mounts: tuple[Mount, ...]
    uid: int
    gid: int
    landlock: tuple[tuple[str, str], ...]
    """(path inside, access letters: r read, w write, c create/remove/rename, x execute, d ioctl)."""
    landlock_mode: Literal["required", "optional"]
    quotas: Quotas
    network: bool
    git_write: bool
    die_with_parent: bool = True
    keep_fds: tuple[int, ...] = ()
    egress: Egress | None = None
    egress_hooks: Any = field(default=None, compare=False)

    def describe(self) -> dict[str, Any]:
        """The plan as JSON (audit records, `gateway doctor`, tests)."""
        return {
            "uid": self.uid,
            "gid": self.gid,
            "network": self.network if self.egress is None else "policy",
            "git_write": self.git_write,
            "mounts": [
                {
                    "target": m.target,
                    "kind": m.kind,
                    "mode": "ro" if m.read_only else "rw",
                    **({"source": m.source} if m.source else {}),
                }
                for m in self.mounts
            ],
            "landlock": [{"path": p, "access": a} for p, a in self.landlock],
            "quotas": {k: v for k, v in vars(self.quotas).items() if v is not None},
        }


def unseen(roots: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The host directories no command sees although one of `roots` covers them (a wide read
    root such as `/`): the sandbox hides them (`hide` mounts) or puts private ones in their
    place (/tmp, /dev/shm, /dev). A root at or inside one names it: then it is seen. The files
    tool, which opens files itself, refuses the same ones (docs/sandbox.md)."""
    out = []
    for path in HIDDEN_SYSTEM:
        if path == "/proc" or not any(_under(path, r) for r in roots):
            continue  # /proc: the jail refuses it outright
        if path in REPLACED or not any(_under(r, path) for r in roots):
            out.append(path)  # (a root inside a replaced one is bound into the private copy: still seen)
    return tuple(out)


def _under(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def _depth(target: str) -> int:
    return 0 if target == "/" else target.count("/")


def build(
    profile: Profile,
    argv: tuple[str, ...],
    cwd: Path,
    env: dict[str, str],
    *,
    uid: int,
    gid: int,
    user: str,
    repositories: tuple[git.Repository, ...],
    host: HostFacts,
    git_write: bool = False,
    die_with_parent: bool = True,
    keep_fds: tuple[int, ...] = (),
    loop_shell: bool | Literal["zsh"] = False,
    masked: tuple[masks.Hit, ...] = (),
    read_only: tuple[masks.Hit, ...] = (),
) -> SandboxPlan:
    """The plan for running `argv` in `cwd` as `profile`'s principal. Pure: no I/O. (Everything
    but the command and its environment is the same for every call of a principal in one place:
    that part is remembered.) `loop_shell`: a session's sandbox, which holds LOOP_SHELL (LOOP_ZSH
    for "zsh").
    `masked`: the deny_read matches under the roots (masks.find), each covered; `read_only`: the
    deny_write matches, each bound read-only."""
    skeleton = _skeleton(
        profile, cwd, uid, gid, user, repositories, host, git_write, die_with_parent, keep_fds, loop_shell,
        masked, read_only,
    )  # fmt: skip
    full_env = {**env, "HOME": profile.home or HOME, **git.environment(GITCONFIG)}
    if profile.path:
        full_env["PATH"] = ":".join([p for p in full_env.get("PATH", "").split(":") if p] + list(profile.path))
    if profile.egress is not None:
        full_env.update(proxy_environment(profile.egress))
    return replace(skeleton, argv=argv, env=full_env, egress_hooks=profile.egress_hooks)


def proxy_environment(egress: Egress) -> dict[str, str]:
    """What a sandbox whose network is a policy is told: the proxy for programs that honour
    HTTP_PROXY (the others are caught by the resolver and listeners all the same), and what the
    policy's presets pass (index URLs, registries, the CA bundle)."""
    proxy = f"http://127.0.0.1:{egress.http_proxy_port}"
    out = {name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    out["NO_PROXY"] = out["no_proxy"] = "localhost,127.0.0.1,::1"
    out.update(dict(egress.env))
    if egress.intercepts:  # the gateway's CA, for the hosts whose requests the proxy reads
        for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT",
                     "NODE_EXTRA_CA_CERTS"):  # fmt: skip
            out[name] = CA_BUNDLE
    for secret in egress.secrets:  # a placeholder: the real value never enters the sandbox
        out[secret.name] = secret.placeholder
    return out


@functools.lru_cache(maxsize=256)
def _skeleton(
    profile: Profile,
    cwd: Path,
    uid: int,
    gid: int,
    user: str,
    repositories: tuple[git.Repository, ...],
    host: HostFacts,
    git_write: bool,
    die_with_parent: bool,
    keep_fds: tuple[int, ...],
    loop_shell: bool | Literal["zsh"] = False,
    masked: tuple[masks.Hit, ...] = (),
    read_only: tuple[masks.Hit, ...] = (),
) -> SandboxPlan:
    q = profile.quotas
    read_roots = sorted({str(r) for r in profile.read_roots} - {str(w) for w in profile.write_roots})
    write_roots = sorted({str(w) for w in profile.write_roots})
    roots = [*read_roots, *write_roots]

    def covered(path: str) -> bool:
        return any(_under(path, r) for r in roots)

    mounts: list[Mount] = []
    # the system runtime, unless a read root already shows it
    for path, link in host.runtime:
        if link is not None:
            mounts.append(Mount(path, "symlink", link=link))
        elif not covered(path):
            mounts.append(Mount(path, "ro-bind", source=path))
    if not covered("/etc"):
        mounts.append(Mount("/etc", "dir"))
        shared = profile.network and profile.egress is None  # the host's own resolver: everything
        wanted = {*ETC, *profile.etc, *(NETWORK_ETC if shared else ())}
        for name, link in host.etc:
            if name not in wanted:
                continue
            target = f"/etc/{name}"
            if link:
                mounts.append(Mount(target, "symlink", link=link))
            else:
                mounts.append(Mount(target, "copy" if name in host.etc_files else "ro-bind", source=target))
        mounts.append(Mount("/etc/passwd", "data", data=_passwd(uid, gid, user)))
        mounts.append(Mount("/etc/group", "data", data=_group(gid, user)))
        mounts.append(Mount("/etc/hostname", "data", data=b"sandbox\n"))
        if not shared:
            mounts.append(Mount("/etc/hosts", "data", data=LOCAL_HOSTS))
        if profile.egress is not None:
            mounts.append(Mount("/etc/resolv.conf", "data", data=RESOLV_CONF))
        mounts.append(Mount("/etc/mtab", "symlink", link="../proc/self/mounts"))
    # the roots: read-only, then read-write
    mounts += [Mount(r, "ro-bind", source=r) for r in read_roots]
    mounts += [Mount(w, "bind", source=w) for w in write_roots]
    # the sandbox's own /dev, /proc and private tmpfs; host directories with sockets hidden
    mounts += [Mount("/dev", "dev"), Mount("/proc", "proc"), Mount("/tmp", "tmpfs", size=q.tmpfs_bytes),
               Mount("/dev/shm", "tmpfs", size=q.tmpfs_bytes), Mount(HOME, "tmpfs", size=q.tmpfs_bytes)]  # fmt: skip
    for path in HIDDEN_SYSTEM:
        named = any(_under(r, path) for r in roots)  # a root at or inside it: the admin asked
        if path not in ("/tmp", "/dev/shm", "/proc", "/dev") and path in host.hideable and covered(path) and not named:
            mounts.append(Mount(path, "hide"))
    for private in sorted({str(p) for p in profile.private}):
        if covered(private):
            mounts.append(Mount(private, "hide"))
    # protected paths and .git inside the write roots: read-only, their parents pinned; then the
    # deny_read matches masked and the deny_write ones read-only (their parents pinned as well)
    mounts += _protections(profile, write_roots, repositories, git_write, roots, masked, read_only)
    mounts += [Mount(RUN_DIR, "dir"), Mount(HELPER, "helper"),
               Mount(GITCONFIG, "data", data=git.global_config(profile.principal))]  # fmt: skip
    if profile.egress is not None and profile.egress.ca_bundle:
        mounts.append(Mount(CA_BUNDLE, "data", data=profile.egress.ca_bundle))
    if loop_shell:
        mounts.append(Mount(LOOP_ZSH, "shell", "zsh") if loop_shell == "zsh" else Mount(LOOP_SHELL, "shell", "bash"))
    ordered = sorted(enumerate(mounts), key=lambda im: (_depth(im[1].target), im[0]))
    rules: list[tuple[str, str]] = []
    for m in (m for _, m in ordered):
        if m.kind == "ro-bind" and m.source in read_roots:
            rules.append((m.target, "rx"))
        elif m.kind == "bind" and m.source in write_roots:
            rules.append((m.target, "rwcx"))
        elif m.kind == "ro-bind" and (m.target in RUNTIME or m.target == "/etc"):
            rules.append((m.target, "rx"))
    rules += [("/etc", "r"), ("/dev", "rwd"), ("/proc", "rw"), ("/tmp", "rwcx"), ("/dev/shm", "rwc"),
              (HOME, "rwcx"), (RUN_DIR, "rx")]  # fmt: skip
    return SandboxPlan(
        argv=(),
        cwd=str(cwd),
        env={},
        mounts=tuple(m for _, m in ordered),
        uid=uid,
        gid=gid,
        landlock=tuple(dict.fromkeys(rules)),
        landlock_mode=profile.landlock,
        quotas=q,
        network=profile.network,
        egress=profile.egress,
        git_write=git_write,
        die_with_parent=die_with_parent,
        keep_fds=keep_fds,
    )


def _protections(
    profile: Profile,
    write_roots: list[str],
    repositories: tuple[git.Repository, ...],
    git_write: bool,
    roots: list[str] | None = None,
    masked: tuple[masks.Hit, ...] = (),
    read_only: tuple[masks.Hit, ...] = (),
) -> list[Mount]:
    """Read-only mounts for the protected paths, each write root's .git and the deny_write
    matches, masks over the deny_read matches, and a pin (the directory bound onto itself: a
    mount point cannot be renamed or removed) for every directory between a write root and one
    of them: no command can move a secret out from under its mask."""
    wanted: list[tuple[str, str]] = []  # (absolute path, its write root)

    def root_of(path: str) -> str | None:
        inside = [w for w in write_roots if _under(path, w)]
        return max(inside, key=len) if inside else None

    hidden = [h.path for h in masked]
    for hit in read_only:
        r = root_of(hit.path)
        if r is not None and hit.path != r and not any(_under(hit.path, m) for m in hidden):
            wanted.append((hit.path, r))
    for protected in profile.protected:
        r = root_of(str(protected))
        if r is not None and str(protected) != r:
            wanted.append((str(protected), r))
    fresh: list[str] = []  # a git write into a repository not initialised yet: git init makes it
    for repo in repositories:
        r = str(repo.root)
        if r not in write_roots:
            continue
        gitdir = f"{r}/.git"
        if git_write and (repo.kind == "missing" or (repo.kind == "dir" and not repo.initialised)):
            fresh.append(gitdir)
        elif git_write and repo.kind == "dir":
            wanted += [(f"{r}/{s}", r) for s in repo.sensitive]
        else:
            wanted.append((gitdir, r))  # all of it, or a placeholder where there is none
        for linked in repo.linked:
            lr = root_of(str(linked))
            if lr is not None and str(linked) != lr:
                wanted.append((str(linked), lr))
    wanted = [(p, r) for p, r in wanted if not any(_under(p, f) for f in fresh)]
    # drop what a wider protected path already covers
    paths = sorted(set(wanted), key=lambda pr: (pr[0].count("/"), pr[0]))
    kept: list[tuple[str, str]] = []
    for p, r in paths:
        if not any(_under(p, k) for k, _ in kept):
            kept.append((p, r))
    # nothing of a masked directory shows through a mount inside it
    kept = [(p, r) for p, r in kept if not any(_under(p, m) for m in hidden)]
    out: list[Mount] = []
    pinned: set[str] = set()

    def pin_to(p: str, r: str) -> None:
        parent = os.path.dirname(p)
        chain: list[str] = []
        while parent != r and _under(parent, r):
            chain.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(chain):
            if any(_under(d, k) for k, _ in kept):
                break  # read-only from here down (a protected path): nothing below can be moved
            if d not in pinned:
                pinned.add(d)
                out.append(Mount(d, "pin", source=d, beneath=r))

    for p, r in kept:
        pin_to(p, r)
        out.append(Mount(p, "protect", source=p, beneath=r))
    every = roots if roots is not None else write_roots
    for hit in masked:
        if any(_under(hit.path, m) and hit.path != m for m in hidden):
            continue  # inside a masked directory already
        inside = [r for r in every if _under(hit.path, r)]
        if not inside or hit.path in inside:
            continue  # not shown (a root itself is never denied: the policy's load refuses that)
        r = max(inside, key=len)
        if r in write_roots:
            pin_to(hit.path, r)
        out.append(Mount(hit.path, "mask", source=hit.path, beneath=r, size=4096 if hit.directory else None))
    return out


def _passwd(uid: int, gid: int, user: str) -> bytes:
    lines = ["root:x:0:0:root:/root:/usr/sbin/nologin"]
    if uid != 0:
        lines.append(f"{user}:x:{uid}:{gid}:agent-gateway sandbox:{HOME}:/bin/bash")
    lines.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
    return ("\n".join(lines) + "\n").encode()


def _group(gid: int, user: str) -> bytes:
    lines = ["root:x:0:"]
    if gid != 0:
        lines.append(f"{user}:x:{gid}:")
    lines.append("nogroup:x:65534:")
    return ("\n".join(lines) + "\n").encode()
