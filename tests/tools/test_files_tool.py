"""The files tool through the gateway: the jail decides before anything opens, the audit log
records the paths and never the content."""

from __future__ import annotations

import base64
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog, records, verify
from gateway.calls import FilesCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from gateway.stages.pathjail import MAX_LINKS, PathRefused, real_path, settled_realpath

POLICY: dict[str, Any] = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}, "reader": {"roles": ["ro"]}, "nobody": {"roles": ["none"]}},
    "roles": {
        "dev": {
            "level": 2,
            "read_roots": ["."],
            "write_roots": ["."],
            "protected": ["locked"],
            "limits": {"file_bytes": 1000},
        },
        "ro": {"level": 1, "read_roots": ["."]},
        "none": {"level": 0, "read_roots": ["."]},
    },
    "tools": {"files": {"allow_from": 1}},
    "rules": [],
}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    w.mkdir()
    (w / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    hand_over(w)  # sandboxed commands run as the sandbox's account (docs/sandbox.md)
    return w


@pytest.fixture
def gw(ws: Path, tmp_path: Path) -> Iterator[Gateway]:
    policy: CompiledPolicy = compile_policy(Policy.model_validate(POLICY), tmp_path / "p.yaml", ws, sha256="t")
    g = Gateway(policy, AuditLog(tmp_path / "audit"))
    yield g
    g.close()
    assert verify(tmp_path / "audit").ok


def files(gw: Gateway, action: str, principal: str = "agent", **kw: Any) -> dict[str, Any]:
    return gw.handle(FilesCall(principal=principal, action=action, **kw))  # type: ignore[arg-type]


def test_read_write_edit_inside_the_jail(gw: Gateway, ws: Path) -> None:
    assert files(gw, "read", path="a.txt")["content"] == "one\ntwo\n"
    assert files(gw, "write", path="b.txt", content="hello world")["status"] == "ok"
    assert files(gw, "edit", path="b.txt", old="world", new="there")["status"] == "ok"
    assert (ws / "b.txt").read_text() == "hello there"
    blob = bytes(range(256))
    assert files(gw, "write", path="bin", content=base64.b64encode(blob).decode(), encoding="base64")["status"] == "ok"
    back = files(gw, "read", path="bin", max_bytes=1000, encoding="base64")
    assert base64.b64decode(back["content"]) == blob


@pytest.mark.parametrize(
    ("action", "kw", "code"),
    [
        ("read", {"path": "../outside.txt"}, "PATH_OUTSIDE_JAIL"),
        ("read", {"path": "/etc/passwd"}, "PATH_OUTSIDE_JAIL"),
        ("write", {"path": "../new.txt", "content": "x"}, "PATH_OUTSIDE_JAIL"),
        ("write", {"path": "locked/x", "content": "x"}, "PATH_OUTSIDE_JAIL"),
        ("write", {"path": ".git/config", "content": "x"}, "PATH_OUTSIDE_JAIL"),
        ("delete", {"path": "..", "recursive": True}, "PATH_OUTSIDE_JAIL"),
        ("grep", {"pattern": "secret", "path": ".."}, "PATH_OUTSIDE_JAIL"),
    ],
)
def test_the_jail_decides_before_anything_opens(gw: Gateway, action: str, kw: dict[str, Any], code: str) -> None:
    out = files(gw, action, **kw)
    assert out["status"] == "denied" and out["error"]["code"] == code, out


def test_roles_and_levels(gw: Gateway, ws: Path) -> None:
    assert files(gw, "read", principal="reader", path="a.txt")["status"] == "ok"
    out = files(gw, "write", principal="reader", path="a.txt", content="x")
    assert out["error"]["code"] == "PATH_OUTSIDE_JAIL"
    out = files(gw, "read", principal="nobody", path="a.txt")
    assert out["error"]["code"] == "POLICY_DENIED" and "files tool" in out["error"]["message"]


def test_write_limit_comes_from_the_policy(gw: Gateway) -> None:
    assert files(gw, "write", path="big", content="x" * 1001)["error"]["code"] == "FILE_TOO_LARGE"


def test_audit_records_paths_not_content(gw: Gateway, ws: Path, tmp_path: Path) -> None:
    files(gw, "write", path="c.txt", content="TOP-SECRET-CONTENT")
    files(gw, "read", path="c.txt")
    recs = [r for _, _, r, _ in records(tmp_path / "audit") if r]
    text = "".join(p.read_text() for p in (tmp_path / "audit").iterdir())
    assert "TOP-SECRET-CONTENT" not in text
    decided = [r for r in recs if r["event"] == "decision"]
    assert decided[0]["arguments"]["content_bytes"] == len("TOP-SECRET-CONTENT")
    assert str(ws / "c.txt") in decided[0]["reasons"][0]["details"]["write"]


def test_write_output_lands_in_outputs(gw: Gateway, ws: Path) -> None:
    out = files(gw, "write_output", content='{"ok": true}', format="json", name="report")
    assert out["status"] == "ok", out
    assert (ws / "outputs").is_dir() and any(p.name.endswith("-report.json") for p in (ws / "outputs").iterdir())


def test_an_audit_log_inside_a_write_root_stops_the_files_tool_too(ws: Path, tmp_path: Path) -> None:
    policy = compile_policy(Policy.model_validate(POLICY), tmp_path / "p.yaml", ws, sha256="t")
    g = Gateway(policy, AuditLog(ws / "audit"))
    out = files(g, "write", path="audit/forged.jsonl", content="{}")
    assert out["error"]["code"] == "UNSAFE_SETUP"
    assert not (ws / "audit" / "forged.jsonl").exists()
    g.close()


# --- a tree that changes while a call is decided ---------------------------------------------------
class Flipper:
    """Renames `d` between a directory, a plain file and a symlink out of the jail, as fast as it
    can, from another thread: every lstat-then-readlink in a resolver races it."""

    def __init__(self, ws: Path) -> None:
        (ws / "d" / "sub").mkdir(parents=True)
        for i in range(5):
            (ws / "d" / "sub" / f"f{i}.txt").write_text("x\n")
        (ws / "f").write_text("plain\n")
        (ws / "l").symlink_to("/etc")
        self.ws, self.stop = ws, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        w = self.ws
        moves = [("d", "e"), ("f", "d"), ("d", "f"), ("l", "d"), ("d", "l"), ("e", "d")]
        while not self.stop.is_set():
            for a, b in moves:
                with contextlib.suppress(OSError):
                    os.rename(w / a, w / b)

    def __enter__(self) -> Flipper:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


RACED_CALLS: list[dict[str, Any]] = [
    {"action": "read", "path": "d/sub/f1.txt"},
    {"action": "list", "path": "d/sub"},
    {"action": "find", "path": "d", "pattern": "*.txt"},
    {"action": "grep", "path": "d", "pattern": "x"},
    {"action": "stat", "path": "d/sub/f2.txt"},
    {"action": "write", "path": "d/sub/new.txt", "content": "y"},
    {"action": "edit", "path": "d/sub/f3.txt", "old": "x", "new": "x"},
    {"action": "delete", "path": "d/sub/new.txt"},
]


def test_a_concurrent_rename_gets_a_clear_answer_never_an_internal_error(gw: Gateway, ws: Path) -> None:
    """Before: os.path.realpath raised when a link it had seen was renamed away before it read it
    (about one call in seven here), and the call failed with INTERNAL_ERROR."""
    seen: dict[str, int] = {}
    with Flipper(ws):
        for _ in range(150):
            for c in RACED_CALLS:
                out = files(gw, **c)
                code = out["error"]["code"] if out["status"] != "ok" else "ok"
                seen[code] = seen.get(code, 0) + 1
                assert code != "INTERNAL_ERROR", out
    assert seen.get("ok", 0) > 0 and not (ws.parent / "etc").exists()


def test_a_long_chain_of_links_is_an_answer_never_an_internal_error_nor_unbounded_work(gw: Gateway, ws: Path) -> None:
    """Attack (red team, issue 12): os.path.realpath follows any number of links, recursing once
    per link. A chain of 3,000 links (any command in a write root makes one) made every files
    action on it an INTERNAL_ERROR (RecursionError); 900 links of 4 KB texts cost 1.7 s of the
    gateway's CPU per resolution, once per link entry in a grep. Now at most MAX_LINKS links are
    followed, as the kernel does, and what is left is opened as a link: SYMLINK_REFUSED."""
    chain = ws / "chain"
    chain.mkdir()
    (chain / "target").write_text("x\n")
    for i in range(3000):
        (chain / f"l{i}").symlink_to(f"l{i + 1}" if i < 2999 else "target")
    calls = [{**c, "path": c["path"].replace("d/sub", "chain/l0")} for c in RACED_CALLS]
    for c in [*calls, {"action": "grep", "path": "chain", "pattern": "x"}]:
        out = files(gw, **c)
        assert out["status"] == "ok" or out["error"]["code"] != "INTERNAL_ERROR", (c, out)
    assert files(gw, action="read", path="chain/l0")["error"]["code"] == "SYMLINK_REFUSED"
    assert files(gw, action="read", path="chain/l2990")["content"] == "x\n"  # a short chain is followed
    long = ws / "long"
    (long / "x").mkdir(parents=True)
    for i in range(100):
        (long / f"l{i}").symlink_to("x/../" * 800 + (f"l{i + 1}" if i < 99 else "x"))
    assert settled_realpath(os.fspath(long / "l0")) == os.fspath(long / f"l{MAX_LINKS}")  # followed no further


def test_a_cancelled_grep_find_or_delete_stops_walking(gw: Gateway, ws: Path) -> None:
    """Attack (red team, issue 12): grep, find and a recursive delete walked on after their call
    was cancelled (the client left, or SIGTERM's grace ran out): a grep over /usr under a read
    root of / ran 65 s with the cancel set at 1 s, so shutdown waited past its grace, lost the
    reply and counted the call unfinished. Now each walk looks at the cancel between entries
    (a cancelled delete stops in its checking pass: nothing is gone)."""
    for i in range(50):
        (ws / "tree" / f"d{i}").mkdir(parents=True)
        (ws / "tree" / f"d{i}" / "f.txt").write_text("needle\n")
    cancel = threading.Event()
    cancel.set()  # the client left after the decision
    searches = [
        {"action": "grep", "path": "tree", "pattern": "needle"},
        {"action": "find", "path": "tree", "pattern": "**/f.txt"},
        {"action": "delete", "path": "tree", "recursive": True},
    ]
    for c in searches:
        out = gw.handle(FilesCall(principal="agent", **c), cancel=cancel)  # type: ignore[arg-type]
        assert out["status"] == "error" and out["error"]["code"] == "CALL_CANCELLED", out
    assert len(files(gw, "grep", path="tree", pattern="needle")["matches"]) == 50  # uncancelled: all of it, all there


def test_the_commands_resolver_holds_under_a_concurrent_rename(ws: Path) -> None:
    with Flipper(ws):
        for _ in range(20000):
            try:
                real = real_path(os.fspath(ws / "d" / "sub" / "f1.txt"))
            except PathRefused as exc:
                assert exc.code == "path_changed"
                continue
            assert real.startswith(("/etc/", os.fspath(ws))), real


# --- the files tool sees what a command sees (red team O1: it read as root) ------------------------


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[tuple[Gateway, Path]]:
    """A principal whose read root is / and whose write root is its workspace."""
    ws = tmp_path / "ws"
    ws.mkdir()
    hand_over(ws)
    raw = {**POLICY, "roles": {**POLICY["roles"], "dev": {"level": 2, "read_roots": ["/"], "write_roots": ["."]}}}
    g = Gateway(
        compile_policy(Policy.model_validate(raw), tmp_path / "p.yaml", ws, sha256="t"), AuditLog(tmp_path / "a")
    )
    yield g, ws
    g.close()


def test_a_wide_read_root_does_not_let_the_files_tool_read_what_no_command_can(
    wide: tuple[Gateway, Path], tmp_path: Path
) -> None:
    gw, _ = wide
    root_only = Path("/root") / f".agw-test-secret-{os.getpid()}"
    root_only.write_text("ROOT ONLY\n")
    root_only.chmod(0o600)
    try:
        for path in ("/etc/shadow", str(root_only)):
            out = gw.handle(FilesCall(principal="agent", action="read", path=path))
            assert out["status"] != "ok" and "ROOT ONLY" not in str(out), out
        # a command under the same policy cannot either: the tool and the sandbox agree
        assert gw.handle(FilesCall(principal="agent", action="read", path="/etc/hostname"))["status"] == "ok"
    finally:
        root_only.unlink()


@pytest.mark.parametrize("hidden", ["/var/tmp", "/run", "/home", "/tmp"])
def test_a_wide_read_root_does_not_show_what_the_sandbox_hides(wide: tuple[Gateway, Path], hidden: str) -> None:
    gw, _ = wide
    if not os.path.isdir(hidden):
        pytest.skip(f"{hidden} does not exist here")
    out = gw.handle(FilesCall(principal="agent", action="list", path=hidden))
    assert out["status"] == "denied" and out["error"]["code"] == "PATH_OUTSIDE_JAIL", out
    assert "hides" in out["error"]["message"]


def test_what_the_files_tool_writes_belongs_to_the_sandbox_account(wide: tuple[Gateway, Path]) -> None:
    gw, ws = wide
    assert gw.handle(FilesCall(principal="agent", action="write", path="new.txt", content="x"))["status"] == "ok"
    from gateway.sandbox.identity import sandbox_identity

    assert (ws / "new.txt").stat().st_uid == sandbox_identity().uid
