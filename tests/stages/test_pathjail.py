"""Path jail decision table, on a real directory tree with real symlinks.

Layout (under a temporary directory T):
    T/ws/                 the workspace: read and write root
    T/ws/src/app.py
    T/ws/.git/hooks/      protected
    T/ws/out -> T/secret  a symlink pointing out of the jail
    T/ws/linkdir -> T/ws/src   a symlink staying inside
    T/ws2/                a sibling whose name starts with the workspace's
    T/secret/key
    T/docs/               an extra read-only root
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("jail")
    (t / "ws" / "src").mkdir(parents=True)
    (t / "ws" / "src" / "app.py").write_text("print(1)\n")
    (t / "ws" / ".git" / "hooks").mkdir(parents=True)
    (t / "ws2").mkdir()
    (t / "ws2" / "x").write_text("x")
    (t / "secret").mkdir()
    (t / "secret" / "key").write_text("k")
    (t / "docs").mkdir()
    (t / "docs" / "guide.md").write_text("g")
    (t / "ws" / "out").symlink_to(t / "secret")
    (t / "ws" / "linkdir").symlink_to(t / "ws" / "src")
    return t


@pytest.fixture(scope="module")
def policy(tree: Path) -> CompiledPolicy:
    raw = {
        "version": 1,
        "home": ".",
        "principals": {"agent": {"roles": ["dev"]}},
        "roles": {
            "dev": {
                "level": 1,
                "read_roots": ["../docs"],
                "write_roots": ["."],
                "protected": [".git/hooks"],
            }
        },
        "tools": {"run": {"allow_from": 0}},
        "second_opinion": {"unconfirmed": "allow"},
        "rules": [
            {
                "id": "read",
                "decision": "allow",
                "justification": "read",
                "programs": ["cat", "ls"],
                "path_args": {"read": "all"},
                "examples": {"match": ["cat x"]},
            },
            {
                "id": "write",
                "decision": "allow",
                "justification": "write",
                "programs": ["touch", "tee"],
                "path_args": {"write": "all"},
                "examples": {"match": ["touch x"]},
            },
            {
                "id": "cp",
                "decision": "allow",
                "justification": "cp",
                "programs": ["cp"],
                "path_args": {"read": "all_but_last", "write": "last"},
                "examples": {"match": ["cp a b"]},
            },
            {
                "id": "cd",
                "decision": "allow",
                "justification": "cd",
                "programs": ["cd"],
                "path_args": {"read": "first"},
                "examples": {"match": ["cd x"]},
            },
            {
                "id": "echo",
                "decision": "allow",
                "justification": "echo",
                "programs": ["echo"],
                "examples": {"match": ["echo x"]},
            },
        ],
    }
    return compile_policy(Policy.model_validate(raw), tree / "policy.yaml", tree / "ws")


# (command, cwd relative to the tree, expected verdict, reason code or None)
JAIL = [
    # --- plain reads and writes --------------------------------------------------------
    ("cat src/app.py", "ws", "allow", None),
    ("cat ./src/../src/app.py", "ws", "allow", None),
    ("cat ../secret/key", "ws", "deny", "outside_read_roots"),
    ("cat /etc/passwd", "ws", "deny", "outside_read_roots"),
    ("cat ../docs/guide.md", "ws", "allow", None),
    ("touch ../docs/new.md", "ws", "deny", "outside_write_roots"),
    ("touch src/new.py", "ws", "allow", None),
    ("touch src/", "ws", "allow", None),
    ("cat src//app.py", "ws", "allow", None),
    # --- sibling prefix: /T/ws2 is not inside /T/ws -------------------------------------
    ("cat ../ws2/x", "ws", "deny", "outside_read_roots"),
    ("touch ../ws2/y", "ws", "deny", "outside_write_roots"),
    # --- symlinks --------------------------------------------------------------------------
    ("cat out/key", "ws", "deny", "outside_read_roots"),
    ("touch out/new", "ws", "deny", "outside_write_roots"),
    ("cat linkdir/app.py", "ws", "allow", None),
    ("touch linkdir/new.py", "ws", "allow", None),
    # `..` after a symlink is physical, as the kernel resolves it: out/.. is T, not ws
    ("touch out/../x", "ws", "deny", "outside_write_roots"),
    ("touch out/../ws/x", "ws", "allow", None),
    # --- non-existent targets: the existing parent is resolved -----------------------------
    ("touch src/a/b/c.py", "ws", "allow", None),
    ("touch nope/../../secret/x", "ws", "deny", "outside_write_roots"),
    ("touch out/deep/new", "ws", "deny", "outside_write_roots"),
    # --- protected -----------------------------------------------------------------------
    ("touch .git/hooks/pre-commit", "ws", "deny", "protected_path"),
    ("tee .git/hooks/x", "ws", "deny", "protected_path"),
    ("cat .git/hooks", "ws", "allow", None),
    # --- ~ is the policy's home (the workspace here) ---------------------------------------
    ("cat ~/src/app.py", "ws", "allow", None),
    ("cat ~/../secret/key", "ws", "deny", "outside_read_roots"),
    # --- redirects are reads and writes -------------------------------------------------
    ("echo hi > src/log.txt", "ws", "allow", None),
    ("echo hi > ../secret/x", "ws", "deny", "outside_write_roots"),
    ("echo hi >> /tmp/x", "ws", "deny", "outside_write_roots"),
    ("echo hi 2> out/err", "ws", "deny", "outside_write_roots"),
    ("cat < ../secret/key", "ws", "deny", "outside_read_roots"),
    ("echo hi > /dev/null", "ws", "allow", None),
    ("> ../secret/trunc", "ws", "deny", "outside_write_roots"),
    ("echo $x > $f", "ws", "deny", "unknown_path"),
    # --- cwd and relative cwd ----------------------------------------------------------------
    ("cat app.py", "ws/src", "allow", None),
    ("cat ../../secret/key", "ws/src", "deny", "outside_read_roots"),
    ("cat key", "secret", "deny", "outside_read_roots"),  # the cwd itself is outside
    # --- cd moves the cwd of the commands after it ------------------------------------------
    ("cd src && cat app.py", "ws", "allow", None),
    ("cd src && cat ../../secret/key", "ws", "deny", "outside_read_roots"),
    ("(cd src); cat ../secret/key", "ws", "deny", "outside_read_roots"),
    ("cd ../secret", "ws", "deny", "outside_read_roots"),
    ("cd $dir && cat x", "ws", "deny", "unknown_path"),
    # --- globs are expanded and each match checked ---------------------------------------------
    ("cat src/*.py", "ws", "allow", None),
    ("cat out/*", "ws", "deny", "outside_read_roots"),
    ("cat ../secret/*", "ws", "deny", "outside_read_roots"),
    # --- cp: reads the sources, writes the last ------------------------------------------
    ("cp src/app.py src/copy.py", "ws", "allow", None),
    ("cp ../secret/key src/stolen", "ws", "deny", "outside_read_roots"),
    ("cp src/app.py ../secret/planted", "ws", "deny", "outside_write_roots"),
]


@pytest.mark.parametrize(("command", "cwd", "verdict", "code"), JAIL, ids=[f"{c[0]} @{c[1]}" for c in JAIL])
def test_jail(policy: CompiledPolicy, tree: Path, command: str, cwd: str, verdict: str, code: str | None) -> None:
    decision = evaluate(policy, command, "agent", tree / cwd).decision
    assert decision.verdict is Verdict.parse(verdict), decision
    if code is not None:
        assert code in [r.code for r in decision.reasons], decision.reasons
        assert any(r.stage == "pathjail" for r in decision.reasons)


def test_denial_names_the_path_and_the_roots(policy: CompiledPolicy, tree: Path) -> None:
    decision = evaluate(policy, "touch /etc/hosts", "agent", tree / "ws").decision
    (reason,) = decision.reasons
    assert reason.details["path"] == "/etc/hosts"
    assert reason.details["roots"] == [str((tree / "ws").resolve())]
    assert "outside the write roots" in reason.message


def test_an_allowed_decision_lists_the_jailed_paths(policy: CompiledPolicy, tree: Path) -> None:
    decision = evaluate(policy, "cp src/app.py src/copy.py > src/log", "agent", tree / "ws").decision
    (jail,) = [r for r in decision.reasons if r.stage == "pathjail"]
    ws = tree.resolve() / "ws"
    assert jail.code == "paths_checked"
    assert jail.details == {
        "read": [str(ws / "src" / "app.py")],
        "write": [str(ws / "src" / "copy.py"), str(ws / "src" / "log")],
    }
