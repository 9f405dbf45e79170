"""Approvals bound to the content of the files an asked command runs (gateway/runfiles.py): a
real gateway, a real sandbox, a real background process of the same principal as the attacker."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.analysis import analyze
from gateway.approval import ApprovalRequest, CallbackApprover
from gateway.approval_queue import QueueApprover
from gateway.audit import AuditLog, records, verify
from gateway.calls import EnvCall, ProcessCall, RunCall, SessionCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.runfiles import named
from gateway.sandbox.identity import hand_over, sandbox_identity
from tests.test_gateway import PERMISSIVE, approvals_cli

GOOD = "build:\n\techo good > built.txt\n"
EVIL = "build:\n\techo pwned > pwned.txt\n"
# the attacker: a background process of the same principal that waits for the approval, then
# rewrites the Makefile, and says so
REWRITER = f"""
import os, time
while not os.path.exists("go"):
    time.sleep(0.02)
with open("Makefile.new", "w") as f:
    f.write({EVIL!r})
os.rename("Makefile.new", "Makefile")
open("rewritten", "w").close()
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    (w / "Makefile").write_text(GOOD)
    (w / "bg.py").write_text(REWRITER)
    hand_over(w)
    return w


@pytest.fixture
def policy(ws: Path) -> CompiledPolicy:
    spec = copy.deepcopy(PERMISSIVE)
    spec["tools"] = {"run": {"allow_from": 1}, "processes": {"allow_from": 1}}
    spec["rules"].append(  # type: ignore[attr-defined]
        {
            "id": "make",
            "decision": "ask",
            "justification": "a build runs the project's makefile",
            "programs": ["make", "bash", "patch"],
            "accept_unknown": True,
            "accept_unknown_paths": True,
            "path_args": {"write": "all"},
            "examples": {"match": ["make build"]},
        }
    )
    return compile_policy(Policy.model_validate(spec), ws.parent / "p.yaml", ws, sha256="test")


class Supervisor:
    """Approves after reading the request; `then` runs once it has answered in its head (the
    attacker's move lands between the approval and the start)."""

    def __init__(self, then: object = None) -> None:
        self.seen: list[ApprovalRequest] = []
        self.then = then

    def __call__(self, request: ApprovalRequest) -> bool:
        self.seen.append(request)
        if callable(self.then):
            self.then()
        return True


def wait_for(path: Path) -> None:
    """Until the sandboxed process has done its part (no timing is asserted: it is a wait for an
    event, bounded only so a broken test ends)."""
    for _ in range(3000):
        if path.exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


@pytest.fixture
def gateway(policy: CompiledPolicy, tmp_path: Path) -> Iterator[tuple[Gateway, Supervisor]]:
    supervisor = Supervisor()
    gw = Gateway(policy, AuditLog(tmp_path / "audit"), CallbackApprover(supervisor, "alice"),
                 state_dir=tmp_path / "state")  # fmt: skip
    yield gw, supervisor
    gw.handle(ProcessCall(principal="agent", action="stop_all"))
    gw.close()
    assert verify(tmp_path / "audit").ok


def events(tmp_path: Path) -> list[dict[str, object]]:
    return [r for _, _, r, _ in records(tmp_path / "audit") if r]


def test_a_makefile_rewritten_after_the_approval_does_not_run(
    gateway: tuple[Gateway, Supervisor], ws: Path, tmp_path: Path
) -> None:
    gw, supervisor = gateway
    started = gw.handle(ProcessCall(principal="agent", action="start", command="python3 bg.py"))
    assert started["status"] == "ok", started

    def attacker_moves() -> None:  # the supervisor has read the Makefile and approves
        (ws / "go").touch()
        wait_for(ws / "rewritten")

    supervisor.then = attacker_moves
    out = gw.handle(RunCall(principal="agent", command="make build"))
    # the rewritten target never ran: the approval was void
    assert not (ws / "pwned.txt").exists()
    # the supervisor was shown the Makefile as it was, with its digest
    [request] = supervisor.seen
    [makefile] = [f for f in request.files if f.path == str(ws / "Makefile")]
    assert makefile.head == GOOD and makefile.bytes == len(GOOD)
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_VOID", out  # type: ignore[index]
    assert out["error"]["message"] == "approval_void: Makefile changed after approval"  # type: ignore[index]
    void = [r for r in events(tmp_path) if r["event"] == "approval_void"]
    assert len(void) == 1 and void[0]["call_id"] == out["call_id"] and void[0]["decision"] == "deny"
    assert void[0]["data"]["why"] == ["Makefile changed after approval"]  # type: ignore[index]
    approval = next(r for r in events(tmp_path) if r["event"] == "approval")
    assert approval["data"]["files"][2]["sha256"] == makefile.sha256  # type: ignore[index]


def test_an_unchanged_makefile_runs_as_approved(gateway: tuple[Gateway, Supervisor], ws: Path) -> None:
    gw, supervisor = gateway
    out = gw.handle(RunCall(principal="agent", command="make build"))
    assert out["status"] == "ok", out
    assert (ws / "built.txt").read_text() == "good\n"
    # make reads the first of GNUmakefile, makefile, Makefile: the two before it are bound absent
    assert [(Path(f.path).name, f.sha256 is None) for f in supervisor.seen[0].files] == [
        ("GNUmakefile", True),
        ("makefile", True),
        ("Makefile", False),
    ]


def test_a_makefile_planted_ahead_of_the_approved_one_voids_it(gateway: tuple[Gateway, Supervisor], ws: Path) -> None:
    gw, supervisor = gateway

    def plant() -> None:
        (ws / "GNUmakefile").write_text(EVIL)

    supervisor.then = plant
    out = gw.handle(RunCall(principal="agent", command="make build"))
    assert out["error"]["message"] == "approval_void: GNUmakefile appeared after approval"  # type: ignore[index]
    assert not (ws / "pwned.txt").exists()


def test_a_script_and_a_patch_are_bound_too(gateway: tuple[Gateway, Supervisor], ws: Path) -> None:
    gw, supervisor = gateway
    (ws / "x.sh").write_text("echo fine > fine.txt\n")
    (ws / "fix.diff").write_text("--- a/none\n+++ b/none\n")

    def edit() -> None:
        (ws / "x.sh").write_text("echo pwned > pwned.txt\n")

    supervisor.then = edit
    out = gw.handle(RunCall(principal="agent", command="bash x.sh"))
    assert out["error"]["message"] == "approval_void: x.sh changed after approval"  # type: ignore[index]
    assert not (ws / "pwned.txt").exists()
    supervisor.then = None
    gw.handle(RunCall(principal="agent", command="patch -p1 --dry-run < fix.diff"))
    assert [Path(f.path).name for f in supervisor.seen[-1].files] == ["fix.diff"]


def test_a_link_out_of_the_roots_is_not_followed_and_voids_the_approval(
    gateway: tuple[Gateway, Supervisor], ws: Path, tmp_path: Path
) -> None:
    gw, supervisor = gateway
    secret = tmp_path / "secret"
    secret.write_text("TOP SECRET\n")
    (ws / "Makefile").unlink()
    (ws / "Makefile").symlink_to(secret)
    out = gw.handle(RunCall(principal="agent", command="make build"))
    [linked] = [f for f in supervisor.seen[0].files if f.path.endswith("/Makefile")]
    assert "leads out of the root" in linked.error and linked.head == "" and linked.sha256 is None
    assert out["error"]["code"] == "APPROVAL_VOID"  # type: ignore[index]


def test_the_files_are_read_as_the_sandbox_account(gateway: tuple[Gateway, Supervisor], ws: Path) -> None:
    if not sandbox_identity().switch:
        pytest.skip("the gateway runs as the sandbox's account already")
    gw, supervisor = gateway
    private = ws / "Makefile"
    os.chown(private, 0, 0)
    private.chmod(0o600)  # root may read it; the sandbox's account may not
    gw.handle(RunCall(principal="agent", command="make build"))
    [makefile] = [f for f in supervisor.seen[0].files if f.path == str(private)]
    assert makefile.error == "Permission denied" and makefile.head == ""


def test_approvals_show_prints_the_files_escaped(policy: CompiledPolicy, tmp_path: Path, ws: Path) -> None:
    text = "build:\n\techo hi\x1b[2K\n"
    (ws / "Makefile").write_text(text)
    state = tmp_path / "approvals"
    gw = Gateway(policy, AuditLog(tmp_path / "audit"), QueueApprover(state, (ws,)), approval_timeout_s=60)
    result: dict[str, object] = {}
    worker = threading.Thread(target=lambda: result.update(gw.handle(RunCall(principal="agent", command="make"))))
    worker.start()
    call_id = ""
    for _ in range(300):
        listed = approvals_cli(state, "list").stdout
        if "make" in listed:
            call_id = listed.split()[0]
            break
        time.sleep(0.05)
    shown = approvals_cli(state, "show", call_id).stdout
    approvals_cli(state, "deny", call_id, "--reason", "read it")
    worker.join(60)
    assert "runs:" in shown and f"{ws / 'Makefile'}: {len(text)} bytes, sha256 " in shown
    assert "    | \\techo hi\\u{001b}[2K" in shown and "\x1b" not in shown
    assert f"{ws / 'GNUmakefile'}: absent" in shown


@pytest.mark.parametrize(
    ("text", "files"),
    [
        ("bash x.sh", ["x.sh"]),
        ("env A=1 bash -x ./x.sh arg", ["x.sh"]),
        ("bash -c 'ls'", []),
        ("./run.sh", ["run.sh"]),
        ("python3 -u tool.py", ["tool.py"]),
        ("python3 -c 'import x'", []),
        ("make -f build.mk all", ["build.mk"]),
        ("make -C sub", ["sub/GNUmakefile", "sub/makefile", "sub/Makefile"]),
        ("cd sub && make -fM", ["M", "sub/M"]),
        ("git -C sub apply --check a.patch", ["sub/a.patch"]),
        ("git am < mail.mbox", ["mail.mbox"]),
        ("patch -p1 -i fix.diff", ["fix.diff"]),
        ("patch -p1 < fix.diff", ["fix.diff"]),
        ("patch src.c fix.diff", ["fix.diff"]),
        ("ls -la && git status", []),
        ("ruby -C sub x.rb", ["sub/x.rb"]),
        ("ruby -wC sub -r ./pre.rb x.rb", ["sub/pre.rb", "sub/x.rb"]),
        ("perl -lne 'print' f", []),
        ("perl -Mre s.pl", ["s.pl"]),
        ("python3 -c 'import x'", []),
        ("python3 -Z x.py", ["?python3 python option -Z (in -Z) is not one the gateway knows"]),
        ("popd && make", ["?Makefile"]),
        (
            "pushd sub && make",
            ["GNUmakefile", "makefile", "Makefile", "sub/GNUmakefile", "sub/makefile", "sub/Makefile"],
        ),
        ("env MAKEFILES=m.mk make -f x.mk", ["m.mk", "x.mk"]),
        ("make --fi=x.mk --directory sub", ["sub/x.mk"]),  # long options by a prefix, a value apart
        ("make --d=sub", ["GNUmakefile", "makefile", "Makefile"]),  # ambiguous: make refuses to start
        # a wrapper's own options that take a value are skipped before its directory is found
        ("sudo --user bob --chdir sub make", ["sub/GNUmakefile", "sub/makefile", "sub/Makefile"]),
    ],
)
def test_which_files_a_command_runs(text: str, files: list[str]) -> None:
    analysis = analyze(text, second_opinion_enabled=False)
    assert analysis.denial is None
    got = [p if p.startswith("?") else os.path.relpath(p, "/ws") for p, *_ in named(analysis.commands, Path("/ws"))]
    assert got == files


# --- red team (issue 15): ways to make the asked program read a file the approval did not bind --
# each: the command, the files before the approval, the file rewritten after it (its new text
# writes pwned.txt at the workspace's top). On the code before, each ran the rewritten file.
MK_GOOD = "build:\n\techo good > built.txt\n"
MK_EVIL = "build:\n\techo pwned > {ws}/pwned.txt\n"
SH_EVIL = "echo pwned > {ws}/pwned.txt\n"
NEW_FILE = "--- /dev/null\n+++ {name}\n@@ -0,0 +1 @@\n+x\n"
ATTACKS: list[tuple[str, dict[str, str], str, str]] = [
    ("make -kC sub build", {"sub/Makefile": MK_GOOD}, "sub/Makefile", MK_EVIL),  # -C in a group
    ("make --dir=sub build", {"sub/Makefile": MK_GOOD}, "sub/Makefile", MK_EVIL),  # a long option's prefix
    ("make -C a -C b build", {"a/b/Makefile": MK_GOOD}, "a/b/Makefile", MK_EVIL),  # -C relative to -C
    ("make -sf x.mk build", {"x.mk": MK_GOOD}, "x.mk", MK_EVIL),  # -f in a group
    ("make -C link/.. build", {"real/Makefile": MK_GOOD, "real/x/.keep": ""}, "real/Makefile", MK_EVIL),
    ("cd sub && make build", {"sub/Makefile": MK_GOOD}, "sub/Makefile", MK_EVIL),  # a cd before
    ("find sub -name Makefile -execdir make build ';'", {"sub/Makefile": MK_GOOD}, "sub/Makefile", MK_EVIL),
    ("MAKEFILES=inc.mk make build", {"inc.mk": "X = 1\n"}, "inc.mk", "$(shell echo pwned > {ws}/pwned.txt)\n"),
    ("bash -xo posix s.sh", {"s.sh": "echo good\n"}, "s.sh", SH_EVIL),  # -o in a group
    ("perl -x s.pl", {"s.pl": "#!perl\nprint 1;\n"}, "s.pl", '#!perl\nopen(F, ">", "{ws}/pwned.txt");\n'),
    ("python3 -m tool", {"tool.py": "print(1)\n"}, "tool.py", 'open("{ws}/pwned.txt", "w")\n'),
    ("python3 -Bm tool", {"tool.py": "print(1)\n"}, "tool.py", 'open("{ws}/pwned.txt", "w")\n'),
    ("node -r ./hook.js app.js", {"hook.js": "1;\n", "app.js": "1;\n"}, "hook.js",
     'require("fs").writeFileSync("{ws}/pwned.txt", "x");\n'),
    # the file on the program's standard input, by name or through a pipe
    ("bash /dev/stdin < s.sh", {"s.sh": "echo good\n"}, "s.sh", SH_EVIL),
    ("make -f - build < x.mk", {"x.mk": MK_GOOD}, "x.mk", MK_EVIL),
    ("cat x.py | python3", {"x.py": "print(1)\n"}, "x.py", 'open("{ws}/pwned.txt", "w")\n'),
    ("cat fix.diff | patch -p0", {"fix.diff": NEW_FILE.format(name="good.txt")}, "fix.diff", NEW_FILE),
    # patch's options as getopt reads them: -N then -i; -d first
    ("patch -Ni fix.diff", {"fix.diff": NEW_FILE.format(name="good.txt")}, "fix.diff", NEW_FILE),
    ("patch -d sub -i fix.diff", {"sub/fix.diff": NEW_FILE.format(name="good.txt")}, "sub/fix.diff", NEW_FILE),
]  # fmt: skip


@pytest.fixture
def asking(ws: Path, tmp_path: Path) -> Iterator[tuple[Gateway, Supervisor]]:
    spec = copy.deepcopy(PERMISSIVE)
    spec["roles"]["dev"]["read_roots"] = ["."]  # type: ignore[index]
    spec["tools"] = {"run": {"allow_from": 1}, "session": {"allow_from": 1}, "env": {"allow_from": 1}}
    spec["environment"] = {"allow": ["MAKEFILES"]}
    spec["rules"].append(  # type: ignore[attr-defined]
        {
            "id": "runs-files",
            "decision": "ask",
            "justification": "these run files of the workspace",
            "programs": ["make", "bash", "perl", "node", "env", "find", "patch", "cd", "export", str(ws / "run.sh")],
            "accept_unknown": True,
            "accept_unknown_paths": True,
            "path_args": {"write": "all"},
            "examples": {"match": ["make build"]},
            "env": ["MAKEFILES", "MAKEFLAGS", "NODE_OPTIONS"],
        }
    )
    for rule in spec["rules"]:  # type: ignore[attr-defined]
        if rule["id"] == "anything":
            rule["programs"] = [p for p in rule["programs"] if p != "python3"]
    spec["rules"][-1]["programs"].append("python3")  # type: ignore[index]
    policy = compile_policy(Policy.model_validate(spec), ws.parent / "p.yaml", ws, sha256="test")
    supervisor = Supervisor()
    gw = Gateway(policy, AuditLog(tmp_path / "audit"), CallbackApprover(supervisor, "alice"),
                 state_dir=tmp_path / "state")  # fmt: skip
    yield gw, supervisor
    gw.close()


@pytest.mark.parametrize(("command", "files", "target", "evil"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_no_file_an_approved_command_runs_can_change_unseen(
    asking: tuple[Gateway, Supervisor], ws: Path, command: str, files: dict[str, str], target: str, evil: str
) -> None:
    gw, supervisor = asking
    _lay_out(ws, command, files)

    def rewrite() -> None:  # the supervisor has read the files and approves; then the agent moves
        (ws / target).write_text(evil.format(ws=ws, name="pwned.txt"))

    supervisor.then = rewrite
    out = gw.handle(RunCall(principal="agent", command=command.format(ws=ws)))
    assert supervisor.seen, out  # it was asked
    assert not list(ws.rglob("pwned.txt")), out
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_VOID", out  # type: ignore[index]


def test_env_changing_directory_never_reaches_a_supervisor(asking: tuple[Gateway, Supervisor], ws: Path) -> None:
    """`env -C DIR make` (the wrapper's own cd) is refused by the analysis before anyone is asked:
    its paths would mean something else where they are checked (gateway/analysis/wrappers.py)."""
    gw, supervisor = asking
    (ws / "sub").mkdir()
    (ws / "sub" / "Makefile").write_text(MK_GOOD)
    for command in ("env -C sub make build", "env --chdir=sub make build"):
        out = gw.handle(RunCall(principal="agent", command=command))
        assert out["status"] == "denied" and out["error"]["code"] == "POLICY_DENIED", out  # type: ignore[index]
    assert supervisor.seen == [] and not (ws / "sub" / "built.txt").exists()


@pytest.mark.parametrize("index", [0, 4, 5, 11, 12, 14, 17, 18])
def test_an_unchanged_file_still_runs_as_approved(asking: tuple[Gateway, Supervisor], ws: Path, index: int) -> None:
    command, files, _, _ = ATTACKS[index]
    gw, supervisor = asking
    _lay_out(ws, command, files)
    out = gw.handle(RunCall(principal="agent", command=command.format(ws=ws)))
    assert supervisor.seen and out["status"] == "ok", out
    assert all(f.sha256 or not f.error for f in supervisor.seen[0].files), supervisor.seen[0].files


# --- issue 15, left open: the files those files load (make's includes, a script's sourced files)
# and the files the environment the command starts with names (MAKEFILES, NODE_OPTIONS, ...). On
# main each ran the rewritten file after the approval.
INC_GOOD = "build:\n\techo good > built.txt\n"
LOADS: list[tuple[str, dict[str, str], str, str]] = [
    ("make build", {"Makefile": "include rules.mk\n", "rules.mk": INC_GOOD}, "rules.mk", MK_EVIL),
    ("make build", {"Makefile": "-include a.mk\n", "a.mk": "sinclude b.mk # more\n", "b.mk": INC_GOOD},
     "b.mk", MK_EVIL),  # included by an included makefile
    ("make -I inc build", {"Makefile": "include r.mk\n", "inc/r.mk": INC_GOOD}, "inc/r.mk", MK_EVIL),
    # make reads r.mk of its own directory before inc/r.mk: planting it voids the approval
    ("make --include-dir=inc build", {"Makefile": "include r.mk\n", "inc/r.mk": INC_GOOD}, "r.mk", MK_EVIL),
    ("make -C sub build", {"sub/Makefile": "include \\\n  r.mk\n", "sub/r.mk": INC_GOOD}, "sub/r.mk", MK_EVIL),
    # named by a function: what it includes is known only when make runs, so nothing can be bound
    ("make build", {"Makefile": "include $(wildcard *.mk)\n", "r.mk": INC_GOOD}, "r.mk", MK_EVIL),
    ("make build", {"Makefile": "include *.mk\n", "r.mk": INC_GOOD}, "r.mk", MK_EVIL),
    ("bash x.sh", {"x.sh": "source lib.sh\n", "lib.sh": "echo good\n"}, "lib.sh", SH_EVIL),
    ("bash x.sh", {"x.sh": "if true; then . ./lib.sh; fi\n", "lib.sh": ". 'deep.sh'\n", "deep.sh": "echo good\n"},
     "deep.sh", SH_EVIL),  # sourced by a sourced file, inside a compound command
    ("{ws}/run.sh", {"run.sh": "#!/usr/bin/env bash\nsource lib.sh\n", "lib.sh": "echo good\n"}, "lib.sh", SH_EVIL),
    ("bash x.sh", {"x.sh": 'source "$(dirname "$0")/lib.sh"\n', "lib.sh": "echo good\n"}, "lib.sh", SH_EVIL),
    ("bash x.sh", {"x.sh": "cd sub\nsource lib.sh\n", "sub/lib.sh": "echo good\n"}, "sub/lib.sh", SH_EVIL),
    # a loading variable the text exports before the program runs
    ("export NODE_OPTIONS=--require=./hook.js; node app.js", {"hook.js": "1;\n", "app.js": "1;\n"}, "hook.js",
     'require("fs").writeFileSync("{ws}/pwned.txt", "x");\n'),
]  # fmt: skip


def _lay_out(ws: Path, command: str, files: dict[str, str]) -> None:
    """The workspace files an ATTACKS or LOADS row's command runs (a `link/` it goes through, an
    executable run.sh it names), handed to the sandbox's account."""
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    if "link/" in command:
        (ws / "link").symlink_to("real/x")
    if command.startswith("{ws}/"):
        (ws / "run.sh").chmod(0o755)
    hand_over(ws)


def _attack(
    gw: Gateway, supervisor: Supervisor, ws: Path, command: str, files: dict[str, str], target: str, evil: str,
    env: dict[str, str] | None = None,
) -> dict[str, object]:  # fmt: skip
    _lay_out(ws, command, files)

    def rewrite() -> None:  # the supervisor has read the files and approves; then the agent moves
        (ws / target).parent.mkdir(parents=True, exist_ok=True)
        (ws / target).write_text(evil.format(ws=ws, name="pwned.txt"))

    supervisor.then = rewrite
    return gw.handle(RunCall(principal="agent", command=command.format(ws=ws), env=env or {}))


@pytest.mark.parametrize(("command", "files", "target", "evil"), LOADS, ids=[f"{a[0]}|{a[2]}" for a in LOADS])
def test_no_file_an_approved_file_loads_can_change_unseen(
    asking: tuple[Gateway, Supervisor], ws: Path, command: str, files: dict[str, str], target: str, evil: str
) -> None:
    gw, supervisor = asking
    out = _attack(gw, supervisor, ws, command, files, target, evil)
    assert supervisor.seen, out  # it was asked
    assert not list(ws.rglob("pwned.txt")), out
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_VOID", out  # type: ignore[index]


@pytest.mark.parametrize("index", [0, 1, 2, 4, 7, 8, 9])
def test_an_unchanged_loaded_file_still_runs_as_approved(
    asking: tuple[Gateway, Supervisor], ws: Path, index: int
) -> None:
    command, files, _, _ = LOADS[index]
    gw, supervisor = asking
    supervisor.then = None
    _lay_out(ws, command, files)
    out = gw.handle(RunCall(principal="agent", command=command.format(ws=ws)))
    assert supervisor.seen and out["status"] == "ok", out
    shown = {os.path.relpath(f.path, ws): f for f in supervisor.seen[0].files}
    assert all(f.sha256 or not f.error for f in shown.values()), shown
    assert all(shown[name].sha256 for name in files), shown  # every file it loads is shown and bound


ENV_LOADS = [
    ("make build", {"MAKEFILES": "inc.mk"}, {"inc.mk": "X = 1\n"}, "inc.mk", "$(shell echo pwned > {ws}/pwned.txt)\n"),
    ("make build", {"MAKEFLAGS": "-I inc"}, {"Makefile": "include r.mk\n", "inc/r.mk": INC_GOOD}, "inc/r.mk",
     MK_EVIL),
    ("make build", {"MAKEFLAGS": "--eval=include r.mk"}, {"r.mk": "X = 1\n"}, "r.mk",
     "$(shell echo pwned > {ws}/pwned.txt)\n"),
    ("node app.js", {"NODE_OPTIONS": "--require ./hook.js"}, {"hook.js": "1;\n", "app.js": "1;\n"}, "hook.js",
     'require("fs").writeFileSync("{ws}/pwned.txt", "x");\n'),
]  # fmt: skip


@pytest.mark.parametrize(("command", "env", "files", "target", "evil"), ENV_LOADS, ids=[str(e[1]) for e in ENV_LOADS])
def test_the_files_the_environment_names_are_bound(
    asking: tuple[Gateway, Supervisor], ws: Path, command: str, env: dict[str, str], files: dict[str, str],
    target: str, evil: str,
) -> None:  # fmt: skip
    """The variables come with the call (`run`'s env), as the supervisor sees them; the env tool's
    stored ones are merged the same way (Gateway.check_command)."""
    gw, supervisor = asking
    (ws / "Makefile").write_text(MK_GOOD)
    out = _attack(gw, supervisor, ws, command, files, target, evil, env)
    assert supervisor.seen, out
    assert not list(ws.rglob("pwned.txt")), out
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_VOID", out  # type: ignore[index]


@pytest.mark.parametrize("how", ["stored", "exported", "exported, the name quoted"])
def test_a_session_binds_the_makefiles_its_shell_names(asking: tuple[Gateway, Supervisor], ws: Path, how: str) -> None:
    """A session's shell starts with the principal's stored variables (the env tool) and keeps
    what its texts export: MAKEFILES set either way reaches the `make` of a later text. Stored:
    the file it names is bound; exported: its value is known only at run time, so the approval
    is void. On main inc.mk was bound in neither, and its rewritten text ran."""
    gw, supervisor = asking
    (ws / "inc.mk").write_text("X = 1\n")
    hand_over(ws)
    if how == "stored":
        assert gw.handle(EnvCall(principal="agent", action="set", name="MAKEFILES", value="inc.mk"))["status"] == "ok"
    sid = gw.handle(SessionCall(principal="agent", action="start"))["session_id"]
    try:
        if how.startswith("exported"):
            # `MAKE\\FILES` is MAKEFILES to the shell, but not as text (review of the third session)
            text = "export MAKE\\FILES=inc.mk" if "quoted" in how else "export MAKEFILES=inc.mk"
            done = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command=text))
            assert done["status"] == "ok", done

        def rewrite() -> None:
            (ws / "inc.mk").write_text(f"$(shell echo pwned > {ws}/pwned.txt)\n")

        supervisor.then = rewrite
        out = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="make build"))
        assert not (ws / "pwned.txt").exists(), out
        assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_VOID", out  # type: ignore[index]
        assert "inc.mk" in out["error"]["message"] or "$MAKEFILES" in out["error"]["message"], out  # type: ignore[index]
    finally:
        gw.handle(SessionCall(principal="agent", action="kill", session_id=sid))


# --- issue 23, point 7: an approval binds the script, and what it imports. On main, approved
# `python3 x.py` ran the helper.py x.py imports as the agent rewrote it after the approval, or a
# module the agent planted ahead of the one python would have found.
PY_EVIL = 'open("{ws}/pwned.txt", "w").write("x")\n'
JS_EVIL = 'require("fs").writeFileSync("{ws}/pwned.txt", "x");\n'
IMPORTS: list[tuple[str, dict[str, str], str, str]] = [
    ("python3 x.py", {"x.py": "import helper\nhelper.run()\n", "helper.py": "def run(): print(1)\n"}, "helper.py",
     PY_EVIL + "def run(): pass\n"),
    # a module of the standard library, shadowed by one planted beside the script
    ("python3 x.py", {"x.py": "import json\nprint(json.dumps(1))\n"}, "json.py", PY_EVIL + "def dumps(x): return ''\n"),
    ("python3 x.py", {"x.py": "def f():\n    import helper\nf()\n", "helper.py": "X = 1\n"}, "helper.py", PY_EVIL),
    ("python3 x.py", {"x.py": "from pkg import mod\n", "pkg/__init__.py": "", "pkg/mod.py": "X = 1\n"},
     "pkg/mod.py", PY_EVIL),
    ("python3 x.py", {"x.py": "import pkg.sub.deep\n", "pkg/__init__.py": "", "pkg/sub/__init__.py": "",
                      "pkg/sub/deep.py": "X = 1\n"}, "pkg/sub/deep.py", PY_EVIL),
    # a package planted ahead of the module python would have loaded: pkg/ beats pkg.py
    ("python3 x.py", {"x.py": "import helper\n", "helper.py": "X = 1\n"}, "helper/__init__.py", PY_EVIL),
    # what the imported module imports, and its relative imports
    ("python3 x.py", {"x.py": "import helper\n", "helper.py": "import inner\n", "inner.py": "X = 1\n"},
     "inner.py", PY_EVIL),
    ("python3 -m pkg.main", {"pkg/__init__.py": "", "pkg/main.py": "from . import util\n", "pkg/util.py": "X = 1\n"},
     "pkg/util.py", PY_EVIL),
    ("python3 -m tool", {"tool/__init__.py": "", "tool/__main__.py": "print(1)\n"}, "tool/__main__.py", PY_EVIL),
    ("python3 tools/run.py", {"tools/run.py": "import lib\n", "tools/lib.py": "X = 1\n"}, "tools/lib.py", PY_EVIL),
    # node: a relative require, one planted ahead of it (lib.js beats lib/index.js), an import's
    ("node app.js", {"app.js": "require('./lib');\n", "lib.js": "1;\n"}, "lib.js", JS_EVIL),
    ("node app.js", {"app.js": "require('./lib');\n", "lib/index.js": "1;\n"}, "lib.js", JS_EVIL),
    ("node app.mjs", {"app.mjs": "import x from './dep.mjs';\n", "dep.mjs": "export default 1;\n"}, "dep.mjs",
     'import fs from "fs"; fs.writeFileSync("{ws}/pwned.txt", "x"); export default 1;\n'),
]  # fmt: skip


@pytest.mark.parametrize(("command", "files", "target", "evil"), IMPORTS, ids=[f"{a[0]}|{a[2]}" for a in IMPORTS])
def test_no_module_an_approved_script_imports_can_change_unseen(
    asking: tuple[Gateway, Supervisor], ws: Path, command: str, files: dict[str, str], target: str, evil: str
) -> None:
    gw, supervisor = asking
    out = _attack(gw, supervisor, ws, command, files, target, evil)
    assert supervisor.seen, out  # it was asked
    assert not list(ws.rglob("pwned.txt")), out
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_VOID", out  # type: ignore[index]


@pytest.mark.parametrize("index", [0, 1, 3, 4, 7, 8, 10])
def test_an_unchanged_import_still_runs_as_approved(asking: tuple[Gateway, Supervisor], ws: Path, index: int) -> None:
    command, files, _, _ = IMPORTS[index]
    gw, supervisor = asking
    supervisor.then = None
    _lay_out(ws, command, files)
    out = gw.handle(RunCall(principal="agent", command=command))
    assert supervisor.seen and out["status"] == "ok", out
    shown = {os.path.relpath(f.path, ws): f for f in supervisor.seen[0].files if f.kind == "file"}
    assert all(shown[name].sha256 for name in files if name in shown), shown
    assert not any(f.error for f in supervisor.seen[0].files), supervisor.seen[0].files
    # run again: python has written __pycache__ meanwhile, and the same approval binds it now
    again = gw.handle(RunCall(principal="agent", command=command))
    assert again["status"] == "ok", again


def test_a_compiled_module_planted_in_pycache_voids_the_approval(asking: tuple[Gateway, Supervisor], ws: Path) -> None:
    """python runs `__pycache__/helper.cpython-3X.pyc` instead of helper.py when the source time
    and size it records match: a planted one runs code the supervisor never saw."""
    gw, supervisor = asking
    files = {"x.py": "import helper\n", "helper.py": "X = 1\n"}

    def plant() -> None:
        source = ws / "helper.py"
        code = compile(PY_EVIL.format(ws=ws), str(source), "exec")
        import importlib._bootstrap_external as external
        import importlib.util

        st = source.stat()
        data = external._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)  # type: ignore[attr-defined]
        tag = importlib.util.cache_from_source(str(source))
        Path(tag).parent.mkdir(exist_ok=True)
        Path(tag).write_bytes(data)

    _lay_out(ws, "python3 x.py", files)
    supervisor.then = plant
    out = gw.handle(RunCall(principal="agent", command="python3 x.py"))
    assert supervisor.seen and not (ws / "pwned.txt").exists(), out
    assert out["status"] == "denied" and out["error"]["code"] == "APPROVAL_VOID", out  # type: ignore[index]
    assert "helper: what python finds there changed" in out["error"]["message"], out  # type: ignore[index]


def test_what_cannot_be_bound_is_told_to_the_supervisor(asking: tuple[Gateway, Supervisor], ws: Path) -> None:
    """An import by a name known only at run time, or a package from the workspace's node_modules,
    cannot be bound: the supervisor reads it in the request (it voids nothing)."""
    gw, supervisor = asking
    files = {"x.py": "import importlib\nmod = importlib.import_module('hel' + 'per')\n", "helper.py": "X = 1\n"}
    _lay_out(ws, "python3 x.py", files)
    out = gw.handle(RunCall(principal="agent", command="python3 x.py"))
    assert out["status"] == "ok", out
    notices = [f.describe() for f in supervisor.seen[-1].files if f.kind == "notice"]
    assert any("NOT BOUND" in n and "import_module()" in n for n in notices), notices
    (ws / "node_modules" / "left-pad").mkdir(parents=True)
    (ws / "node_modules" / "left-pad" / "index.js").write_text("module.exports = 1;\n")
    (ws / "app.js").write_text("require('left-pad');\n")
    hand_over(ws)
    out = gw.handle(RunCall(principal="agent", command="node app.js"))
    assert out["status"] == "ok", out
    notices = [f.describe() for f in supervisor.seen[-1].files if f.kind == "notice"]
    assert any("left-pad from a node_modules of the workspace" in n for n in notices), notices
