"""The sandbox as a value: plans asserted on without launching anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.analysis import analyze
from gateway.analysis.git_write import is_git_write as git_write_of
from gateway.sandbox import git, masks
from gateway.sandbox.plan import HOME, RUNTIME, HostFacts, Mount, Profile, SandboxPlan, build
from gateway.sandbox.quotas import Quotas

WS = Path("/srv/ws")
Q = Quotas(memory_bytes=2 << 30, pids=512, cpu_seconds=600, file_bytes=1 << 30, open_files=1024, tmpfs_bytes=256 << 20)
HOST = HostFacts(
    runtime=(("/usr", None), ("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/sbin", "usr/sbin")),
    etc=(("ld.so.cache", None), ("localtime", "/usr/share/zoneinfo/UTC"), ("ssl/certs", None), ("resolv.conf", None)),
    hideable=frozenset({"/run", "/var/tmp", "/sys", "/tmp", "/dev/shm", "/proc", "/dev"}),
)


def profile(**kw: object) -> Profile:
    base: dict[str, object] = {
        "principal": "agent", "read_roots": (WS,), "write_roots": (WS,),
        "protected": (WS / ".git/hooks", WS / ".git/config"), "private": (Path("/var/lib/gw/audit"), Path("/root")),
        "quotas": Q,
    }  # fmt: skip
    base.update(kw)
    return Profile(**base)  # type: ignore[arg-type]


def repo(kind: str = "dir", initialised: bool = True, sensitive: tuple[str, ...] = (".git/config", ".git/hooks"),
         linked: tuple[Path, ...] = ()) -> git.Repository:  # fmt: skip
    return git.Repository(WS, kind, initialised, sensitive if kind == "dir" else (), linked)


def plan_of(p: Profile | None = None, repos: tuple[git.Repository, ...] | None = None, git_write: bool = False,
            command: str = "make") -> SandboxPlan:  # fmt: skip
    return build(
        p or profile(), ("bash", "-c", command), WS, {"PATH": "/usr/bin"}, uid=990, gid=990, user="agw-sandbox",
        repositories=repo_tuple if (repo_tuple := repos) is not None else (repo(),), host=HOST, git_write=git_write,
    )  # fmt: skip


def sources(plan: SandboxPlan) -> set[str]:
    return {m.source for m in plan.mounts if m.source}


def by_target(plan: SandboxPlan) -> dict[str, Mount]:
    return {m.target: m for m in plan.mounts}


# --- the allowlist -------------------------------------------------------------------------------


def test_no_host_path_outside_the_allowlist() -> None:
    plan = plan_of()
    allowed = {"/usr", "/etc/ld.so.cache", "/etc/ssl/certs", str(WS)}
    assert sources(plan) <= allowed | {f"{WS}/.git"}, sources(plan) - allowed
    targets = {m.target for m in plan.mounts}
    for absent in ("/home", "/root", "/run/user", "/var", "/srv", "/mnt", "/opt", "/sys", "/etc/shadow",
                   "/etc/resolv.conf", "/var/lib/gw/audit"):  # fmt: skip
        assert absent not in targets, absent


def test_system_symlinks_are_recreated_not_followed() -> None:
    t = by_target(plan_of())
    assert t["/bin"] == Mount("/bin", "symlink", link="usr/bin")
    assert t["/etc/localtime"].kind == "symlink"
    assert t["/etc/mtab"].link == "../proc/self/mounts"


def test_identity_files_name_only_root_the_sandbox_user_and_nobody() -> None:
    t = by_target(plan_of())
    passwd = (t["/etc/passwd"].data or b"").decode()
    assert [line.split(":")[0] for line in passwd.splitlines()] == ["root", "agw-sandbox", "nobody"]
    assert f":990:990:agent-gateway sandbox:{HOME}:" in passwd


def test_private_tmpfs_are_size_capped_and_home_is_private() -> None:
    plan = plan_of()
    t = by_target(plan)
    for path in ("/tmp", "/dev/shm", HOME):
        assert t[path].kind == "tmpfs" and t[path].size == 256 << 20
    assert plan.env["HOME"] == HOME
    assert plan.env["GIT_CONFIG_NOSYSTEM"] == "1"


def test_a_wide_read_root_hides_sockets_and_the_gateways_directories() -> None:
    plan = plan_of(profile(read_roots=(Path("/"),)))
    t = by_target(plan)
    for hidden in ("/run", "/var/tmp", "/sys", "/var/lib/gw/audit", "/root"):
        assert t[hidden].kind == "hide" and t[hidden].read_only, hidden
    assert t["/tmp"].kind == "tmpfs" and t["/proc"].kind == "proc"
    order = [m.target for m in plan.mounts]
    assert order.index("/") < order.index("/run") < order.index("/var/lib/gw/audit")


def test_network_off_means_no_resolver_and_a_loopback_hosts_file() -> None:
    t = by_target(plan_of())
    assert "/etc/resolv.conf" not in t and t["/etc/hosts"].kind == "data"
    t = by_target(plan_of(profile(network=True)))
    assert t["/etc/resolv.conf"].kind == "ro-bind"


# --- protected paths and git ------------------------------------------------------------------


def test_every_protected_path_is_read_only_and_git_is_whole() -> None:
    plan = plan_of()
    t = by_target(plan)
    assert t[f"{WS}/.git"] == Mount(f"{WS}/.git", "protect", source=f"{WS}/.git", beneath=str(WS))
    assert t[f"{WS}/.git"].read_only
    assert f"{WS}/.git/hooks" not in t  # covered by .git
    assert t[str(WS)].kind == "bind" and not t[str(WS)].read_only


def test_a_missing_git_is_still_protected_for_a_placeholder() -> None:
    t = by_target(plan_of(repos=(repo("missing"),)))
    assert t[f"{WS}/.git"].kind == "protect"


def test_a_git_write_opens_git_but_not_its_sensitive_parts() -> None:
    sensitive = (".git/config", ".git/hooks", ".git/info", ".git/modules/lib/config")
    plan = plan_of(repos=(repo(sensitive=sensitive),), git_write=True)
    t = by_target(plan)
    assert t[f"{WS}/.git"].kind == "pin" and not t[f"{WS}/.git"].read_only
    for s in sensitive:
        assert t[f"{WS}/{s}"].kind == "protect" and t[f"{WS}/{s}"].read_only, s
    assert t[f"{WS}/.git/modules/lib"].kind == "pin"


def test_git_init_may_create_a_repository_that_does_not_exist() -> None:
    for r in (repo("missing"), repo("dir", initialised=False, sensitive=())):
        t = by_target(plan_of(repos=(r,), git_write=True))
        assert not any(k.startswith(f"{WS}/.git") for k in t), t.keys()


def test_include_and_hooks_path_targets_in_a_write_root_are_read_only() -> None:
    linked = (WS / "tools/git-hooks", WS / "shared.gitconfig", Path("/etc/elsewhere"))
    t = by_target(plan_of(repos=(repo(linked=linked),), git_write=True))
    assert t[f"{WS}/tools/git-hooks"].kind == "protect" and t[f"{WS}/tools"].kind == "pin"
    assert t[f"{WS}/shared.gitconfig"].kind == "protect"
    assert "/etc/elsewhere" not in t


@pytest.mark.parametrize(
    ("command", "git_write"),
    [
        ("git add -A && git commit -m 'x'", True),
        ("git init", True),
        ("cd sub && git checkout -b topic", True),
        ("GIT_AUTHOR_NAME=a git commit -m x", True),
        ("git status", True),
        ("make && git commit -m x", False),  # make runs the agent's code
        ("git -c core.hooksPath=x commit", False),  # a global option
        ("git rebase -x 'make' main", False),  # runs a program
        ("git rebase --exec=make main", False),
        ("git bisect run make", False),  # not a write subcommand
        ("git log > .git/rebase-merge/git-rebase-todo", False),  # writes into .git by redirect
        ("GIT_DIR=/x git commit", False),
        ("timeout 9 git commit", False),  # a wrapper
        ("git $x", False),  # not literal
        ("echo hi", False),  # no git at all
    ],
)
def test_which_calls_are_git_writes(command: str, git_write: bool) -> None:
    analysis = analyze(command)
    assert analysis.denial is None
    assert git_write_of(analysis.commands) is git_write


def test_git_runs_no_hook_editor_or_pager_in_any_sandbox() -> None:
    env = plan_of().env
    overrides = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(int(env["GIT_CONFIG_COUNT"]))}
    assert overrides["core.hooksPath"] == "/dev/null" and overrides["core.fsmonitor"] == "false"
    assert overrides["core.pager"] == "cat" and overrides["core.editor"] == "false"
    # signing and verifying run a program of their own (log --show-signature on a signed commit)
    assert overrides["gpg.program"] == overrides["gpg.ssh.program"] == overrides["gpg.x509.program"] == "false"


# --- Landlock and quotas ----------------------------------------------------------------------------


def test_landlock_allows_exactly_the_mounted_trees() -> None:
    plan = plan_of(profile(read_roots=(WS, Path("/data")), write_roots=(WS,)))
    rules = dict(plan.landlock)
    assert rules[str(WS)] == "rwcx" and rules["/data"] == "rx" and rules["/usr"] == "rx"
    assert rules["/etc"] == "r" and rules["/tmp"] == "rwcx"
    assert not any(p in rules for p in ("/", "/home", "/root", "/var"))
    assert all(p in RUNTIME or p.startswith(("/etc", "/dev", "/proc", "/tmp", HOME, "/run/agent-gateway", "/data"))
               or p == str(WS) for p in rules)  # fmt: skip


def test_quotas_and_uid_travel_in_the_plan() -> None:
    plan = plan_of()
    assert (plan.uid, plan.gid) == (990, 990)
    described = plan.describe()
    assert described["quotas"]["memory_bytes"] == 2 << 30 and described["quotas"]["pids"] == 512
    assert all(m["mode"] == "ro" for m in described["mounts"] if m["kind"] in ("protect", "ro-bind", "hide"))


def test_tool_directories_add_names_to_path_and_no_mount() -> None:
    tools = Path("/opt/tools")
    without = plan_of(profile(read_roots=(WS, tools)))
    plan = plan_of(profile(read_roots=(WS, tools), path=(f"{tools}/bin", "/usr/local/go/bin")))
    assert plan.env["PATH"] == f"/usr/bin:{tools}/bin:/usr/local/go/bin"  # after the system ones
    assert plan.mounts == without.mounts and plan.landlock == without.landlock  # nothing else appears
    assert sources(plan) <= {"/usr", "/etc/ld.so.cache", "/etc/ssl/certs", str(WS), f"{WS}/.git", str(tools)}
    for d in plan.env["PATH"].split(":"):  # each is seen through a read-only mount
        holder = max((m for m in plan.mounts if m.source and (d == m.target or d.startswith(m.target + "/"))),
                     key=lambda m: len(m.target))  # fmt: skip
        assert holder.read_only, (d, holder)


# --- the policy's denied paths ----------------------------------------------------------------


def test_denied_paths_are_masked_and_cannot_be_moved_from_under_their_mask() -> None:
    """Each deny_read match: an empty read-only file (a directory: an empty read-only tmpfs),
    every directory between the write root and it pinned (a mount point cannot be renamed), and
    nothing of the host shown inside a masked directory; a deny_write match is read-only."""
    masked = (
        masks.Hit(f"{WS}/app/conf/.env", str(WS), False, ".env"),
        masks.Hit(f"{WS}/.ssh", str(WS), True, ".ssh"),
        masks.Hit(f"{WS}/.git/x.pem", str(WS), False, "*.pem"),  # under .git: read-only already, no pin
    )
    read_only = (masks.Hit(f"{WS}/.envrc", str(WS), False, ".envrc"),)
    plan = build(
        profile(protected=(WS / ".git/hooks", WS / ".ssh/sub")), ("make",), WS, {}, uid=990, gid=990,
        user="agw-sandbox", repositories=(repo(),), host=HOST, masked=masked, read_only=read_only,
    )  # fmt: skip
    t = by_target(plan)
    assert t[f"{WS}/app/conf/.env"] == Mount(f"{WS}/app/conf/.env", "mask", f"{WS}/app/conf/.env", str(WS))
    assert t[f"{WS}/.ssh"].kind == "mask" and t[f"{WS}/.ssh"].size == 4096 and t[f"{WS}/.ssh"].read_only
    assert t[f"{WS}/app"].kind == "pin" and t[f"{WS}/app/conf"].kind == "pin"
    assert f"{WS}/.ssh/sub" not in t  # a protected path inside a masked directory would show the host's
    assert t[f"{WS}/.git/x.pem"].kind == "mask" and t[f"{WS}/.git"].kind == "protect"
    assert t[f"{WS}/.envrc"].kind == "protect"
    order = [m.target for m in plan.mounts]
    assert order.index(f"{WS}/app/conf") < order.index(f"{WS}/app/conf/.env") and order.index(str(WS)) < order.index(
        f"{WS}/.ssh"
    )
