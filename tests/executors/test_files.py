"""The files executor on real files: every action, every error code, and the symlink races.

Layout (under a real, resolved temporary directory T):
    T/ws/             the workspace: write root
    T/ws/protected/   protected
    T/ro/             a read-only root
    T/outside/        no root: nothing here may be read or written
    T/ws/outputs/     where write_output writes (created on first use)
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.calls import FilesCall
from gateway.executors import files
from gateway.executors.files import FileLimits, execute, paths_of
from gateway.policy.compile import Grant
from gateway.stages.pathjail import PathRefused, check_path

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(40))


@dataclass
class Env:
    base: Path
    ws: Path
    ro: Path
    outside: Path
    outputs: Path
    grant: Grant
    limits: FileLimits

    def call(self, action: str, **fields: Any) -> FilesCall:
        return FilesCall(principal="p", action=action, **fields)  # type: ignore[arg-type]

    def decide(self, call: FilesCall) -> None:
        """What the pipeline does first: the jail on every path the call touches."""
        for path, access in paths_of(call, self.ws, self.outputs):
            check_path(path, access, self.grant)

    def run(self, action: str, decide: bool = True, **fields: Any) -> dict[str, Any]:
        call = self.call(action, **fields)
        if decide:
            self.decide(call)
        result = execute(call, self.grant, self.ws, self.outputs, self.limits)
        json.dumps(result)  # the envelope goes out as JSON
        return result

    def ok(self, action: str, **fields: Any) -> dict[str, Any]:
        result = self.run(action, **fields)
        assert result["status"] == "ok", result
        return result

    def err(self, action: str, decide: bool = True, **fields: Any) -> str:
        result = self.run(action, decide=decide, **fields)
        assert result["status"] == "error", result
        assert set(result) == {"status", "error"} and result["error"]["message"]
        code: str = result["error"]["code"]
        return code


@pytest.fixture
def env(tmp_path: Path) -> Env:
    base = Path(os.path.realpath(tmp_path))
    ws, ro, outside = base / "ws", base / "ro", base / "outside"
    for d in (ws, ro, outside, ws / "protected"):
        d.mkdir()
    (outside / "secret").write_text("TOP SECRET\n")
    (ro / "doc.txt").write_text("read only\n")
    grant = Grant(principal="p", level=0, read_roots=(ro,), write_roots=(ws,), protected=(ws / "protected",))
    return Env(base, ws, ro, outside, ws / "outputs", grant, FileLimits())


# paths_of -----------------------------------------------------------------------------------------


def test_paths_of(env: Env) -> None:
    (env.ws / "a.txt").write_text("a")
    (env.ws / "link").symlink_to(env.outside / "secret")

    def p(action: str, **f: Any) -> list[tuple[str, str]]:
        return paths_of(env.call(action, **f), env.ws, env.outputs)

    assert p("read", path="a.txt") == [(str(env.ws / "a.txt"), "read")]
    assert p("read", path=str(env.ro / "doc.txt")) == [(str(env.ro / "doc.txt"), "read")]
    assert p("read", path="sub/../a.txt") == [(str(env.ws / "a.txt"), "read")]
    assert p("write", path="new.txt", content="") == [(str(env.ws / "new.txt"), "write")]
    assert p("edit", path="a.txt", old="a", new="b") == [
        (str(env.ws / "a.txt"), "read"),
        (str(env.ws / "a.txt"), "write"),
    ]
    assert p("mkdir", path="d") == [(str(env.ws / "d"), "write")]
    assert p("grep", pattern="x") == [(str(env.ws), "read")]
    assert p("find", pattern="*", path="ro") == [(str(env.ws / "ro"), "read")]
    assert p("write_output", content="x") == [(str(env.outputs), "write")]
    # a symlink resolves to its target (what a read would read) ...
    assert p("read", path="link") == [(str(env.outside / "secret"), "read")]
    # ... but delete removes the name itself, and stat looks at both
    assert p("delete", path="link") == [(str(env.ws / "link"), "write")]
    assert p("stat", path="link") == [(str(env.ws / "link"), "read"), (str(env.outside / "secret"), "read")]


def test_a_symlink_out_of_the_jail_is_refused_at_decision(env: Env) -> None:
    (env.ws / "link").symlink_to(env.outside / "secret")
    with pytest.raises(PathRefused):
        env.decide(env.call("read", path="link"))
    # and execute refuses it by itself too
    assert env.err("read", decide=False, path="link") == "PATH_OUTSIDE_JAIL"


# read ---------------------------------------------------------------------------------------------


def test_read_lines_with_continuation(env: Env) -> None:
    (env.ws / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    r = env.ok("read", path="f.txt")
    assert r["content"].startswith("line 1\n") and r["lines"] == 10 and r["truncated"] is False
    assert "next_offset" not in r
    r = env.ok("read", path="f.txt", offset=3, limit=4)
    assert r["content"] == "line 3\nline 4\nline 5\nline 6\n"
    assert r["truncated"] is True and r["next_offset"] == 7
    r = env.ok("read", path="f.txt", offset=r["next_offset"], limit=100)
    assert r["content"] == "line 7\nline 8\nline 9\nline 10\n" and r["truncated"] is False
    assert env.ok("read", path="f.txt", offset=50)["content"] == ""
    assert env.ok("read", path="f.txt", offset=0, limit=1)["content"] == "line 1\n"  # 0 reads as 1


def test_read_lines_cut_at_the_byte_limit(env: Env) -> None:
    env.limits = FileLimits(read_bytes=20)
    (env.ws / "f.txt").write_text("aaaaaaaa\nbbbbbbbb\ncccccccc\n")  # 9 bytes a line
    r = env.ok("read", path="f.txt")
    assert r["content"] == "aaaaaaaa\nbbbbbbbb\n" and r["truncated"] is True and r["next_offset"] == 3
    r = env.ok("read", path="f.txt", offset=3)
    assert r["content"] == "cccccccc\n" and r["truncated"] is False
    # a line longer than the limit comes cut, with where to go on
    (env.ws / "long.txt").write_text("x" * 50 + "\nnext\n")
    r = env.ok("read", path="long.txt")
    assert r["content"] == "x" * 20 and r["line_truncated"] is True and r["next_offset"] == 2
    assert env.ok("read", path="long.txt", offset=2)["content"] == "next\n"


def test_read_text_with_invalid_utf8_is_replaced(env: Env) -> None:
    (env.ws / "latin.txt").write_bytes(b"caf\xe9\n")
    r = env.ok("read", path="latin.txt")
    assert r["content"] == "caf\ufffd\n" and r["invalid_utf8_replaced"] is True


def test_read_bytes_utf8(env: Env) -> None:
    (env.ws / "u.txt").write_text("héllo wörld")  # é and ö are 2 bytes
    r = env.ok("read", path="u.txt", max_bytes=2, offset=0)
    assert r["content"] == "h" and r["bytes"] == 1 and r["next_offset"] == 1  # é is not cut
    r = env.ok("read", path="u.txt", max_bytes=100, offset=1)
    assert r["content"] == "éllo wörld" and r["truncated"] is False and r["size"] == 13
    (env.ws / "bin").write_bytes(b"ok\xff\xfe")
    assert env.err("read", path="bin", max_bytes=10) == "NOT_TEXT"


def test_base64_round_trip_of_every_byte(env: Env) -> None:
    data = bytes(range(256)) * 4 + random.Random(7).randbytes(4096)
    encoded = base64.b64encode(data).decode()
    assert env.ok("write", path="blob.bin", content=encoded, encoding="base64")["bytes"] == len(data)
    assert (env.ws / "blob.bin").read_bytes() == data
    r = env.ok("read", path="blob.bin", max_bytes=len(data), encoding="base64")
    assert base64.b64decode(r["content"]) == data and r["truncated"] is False
    # in two parts
    first = env.ok("read", path="blob.bin", max_bytes=1000, encoding="base64")
    rest = env.ok("read", path="blob.bin", max_bytes=len(data), offset=first["next_offset"], encoding="base64")
    assert base64.b64decode(first["content"]) + base64.b64decode(rest["content"]) == data
    assert env.err("write", path="x.bin", content="not base64!", encoding="base64") == "INVALID_INPUT"


def test_binary_file_in_line_mode_is_not_text(env: Env) -> None:
    (env.ws / "b.bin").write_bytes(b"abc\x00def")
    assert env.err("read", path="b.bin") == "NOT_TEXT"


def test_an_image_comes_as_an_image(env: Env) -> None:
    (env.ws / "pic.png").write_bytes(PNG)
    r = env.ok("read", path="pic.png")
    assert r["image"]["mime_type"] == "image/png"
    assert base64.b64decode(r["image"]["data"]) == PNG
    (env.ws / "pic.gif").write_bytes(b"GIF89a" + bytes(20))
    assert env.ok("read", path="pic.gif")["image"]["mime_type"] == "image/gif"
    (env.ws / "pic.webp").write_bytes(b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(8))
    assert env.ok("read", path="pic.webp")["image"]["mime_type"] == "image/webp"
    (env.ws / "pic.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(20))
    assert env.ok("read", path="pic.jpg")["image"]["mime_type"] == "image/jpeg"
    env.limits = FileLimits(read_bytes=10)
    assert env.err("read", path="pic.png") == "FILE_TOO_LARGE"


def test_read_errors(env: Env) -> None:
    assert env.err("read", path="missing.txt") == "FILE_NOT_FOUND"
    (env.ws / "d").mkdir()
    assert env.err("read", path="d") == "NOT_A_FILE"
    os.mkfifo(env.ws / "fifo")  # opened without blocking, refused as not a file
    assert env.err("read", path="fifo") == "NOT_A_FILE"
    with pytest.raises(ValidationError, match="path: a NUL byte"):  # the call model refuses it: INVALID_INPUT
        env.err("read", path="bad\0name")
    assert env.err("read", decide=False, path=str(env.outside / "secret")) == "PATH_OUTSIDE_JAIL"
    # a read root is readable
    assert env.ok("read", path=str(env.ro / "doc.txt"))["content"] == "read only\n"


def test_a_symlink_loop_is_refused(env: Env) -> None:
    (env.ws / "loop").symlink_to(env.ws / "loop")
    assert env.err("read", path="loop") == "SYMLINK_REFUSED"
    assert env.err("write", path="loop", content="x") == "SYMLINK_REFUSED"
    assert os.path.islink(env.ws / "loop")


# read_json ----------------------------------------------------------------------------------------


def test_read_json(env: Env) -> None:
    (env.ws / "a.json").write_text('{"a": [1, 2, {"b": null}]}')
    assert env.ok("read_json", path="a.json")["json"] == {"a": [1, 2, {"b": None}]}
    (env.ws / "bad.json").write_text('{\n  "a": 1,\n  "b": \n}')
    r = env.run("read_json", path="bad.json")
    assert r["error"]["code"] == "INVALID_JSON" and "line 4 column 1" in r["error"]["message"]
    (env.ws / "nan.json").write_text("[NaN]")
    assert env.err("read_json", path="nan.json") == "INVALID_JSON"
    (env.ws / "bin.json").write_bytes(b'"\xff"')
    assert env.err("read_json", path="bin.json") == "NOT_TEXT"
    env.limits = FileLimits(read_bytes=5)
    assert env.err("read_json", path="a.json") == "FILE_TOO_LARGE"


# write --------------------------------------------------------------------------------------------


def test_write_creates_and_replaces_atomically(env: Env) -> None:
    r = env.ok("write", path="new.txt", content="hello\n")
    assert r == {"status": "ok", "path": "new.txt", "bytes": 6, "created": True}
    target = env.ws / "new.txt"
    target.chmod(0o640)
    inode = target.stat().st_ino
    r = env.ok("write", path="new.txt", content="bye\n")
    assert r["created"] is False and target.read_text() == "bye\n"
    assert target.stat().st_mode & 0o777 == 0o640  # the mode is kept
    assert target.stat().st_ino != inode  # a new file was renamed over the name
    assert sorted(p.name for p in env.ws.iterdir()) == ["new.txt", "protected"]  # no temp file left


def test_write_does_not_write_through_a_hard_link(env: Env) -> None:
    (env.ws / "a").write_text("original")
    os.link(env.ws / "a", env.ws / "b")
    env.ok("write", path="b", content="changed")
    assert (env.ws / "a").read_text() == "original" and (env.ws / "b").read_text() == "changed"


def test_write_to_a_symlink_inside_writes_its_checked_target(env: Env) -> None:
    (env.ws / "real.txt").write_text("old")
    (env.ws / "link.txt").symlink_to("real.txt")
    r = env.ok("write", path="link.txt", content="new")
    assert r["path"] == "real.txt"
    assert (env.ws / "real.txt").read_text() == "new" and os.path.islink(env.ws / "link.txt")


def test_write_errors(env: Env) -> None:
    (env.ws / "d").mkdir()
    assert env.err("write", path="d", content="x") == "NOT_A_FILE"
    assert env.err("write", path="nodir/f.txt", content="x") == "FILE_NOT_FOUND"
    env.limits = FileLimits(write_bytes=3)
    assert env.err("write", path="big.txt", content="four") == "FILE_TOO_LARGE"
    assert not (env.ws / "big.txt").exists()
    with pytest.raises(ValidationError, match="content"):  # INVALID_INPUT, from the call model (its size cap)
        env.call("write", path="s.txt", content="\ud800")
    assert env.err("write", path="n" * 300, content="x") == "IO_ERROR"  # name too long


@pytest.mark.parametrize("where", ["protected/x.txt", ".git/config", "sub/.git/hooks/pre-commit"])
def test_write_into_protected_paths_is_refused(env: Env, where: str) -> None:
    for d in ("protected", ".git", "sub/.git/hooks"):
        (env.ws / d).mkdir(parents=True, exist_ok=True)
    with pytest.raises(PathRefused):
        env.decide(env.call("write", path=where, content="x"))
    assert env.err("write", decide=False, path=where, content="x") == "PATH_OUTSIDE_JAIL"
    assert not (env.ws / where).exists()
    assert os.listdir(env.ws / where.rsplit("/", 1)[0]) == []  # no temporary file either
    (env.ws / where).write_text("original")
    assert env.err("edit", decide=False, path=where, old="original", new="x") == "PATH_OUTSIDE_JAIL"
    assert env.err("delete", decide=False, path=where) == "PATH_OUTSIDE_JAIL"
    assert (env.ws / where).read_text() == "original"


def test_write_outside_the_write_roots_is_refused(env: Env) -> None:
    assert env.err("write", decide=False, path=str(env.ro / "doc.txt"), content="x") == "PATH_OUTSIDE_JAIL"
    assert env.err("write", decide=False, path=str(env.outside / "new"), content="x") == "PATH_OUTSIDE_JAIL"
    assert (env.ro / "doc.txt").read_text() == "read only\n" and not (env.outside / "new").exists()


# edit ---------------------------------------------------------------------------------------------


def test_edit(env: Env) -> None:
    f = env.ws / "code.py"
    f.write_text("def f():\n    return 1\n\ndef g():\n    return 1\n")
    f.chmod(0o755)
    r = env.ok("edit", path="code.py", old="def g():\n    return 1", new="def g():\n    return 2")
    assert r["line"] == 4
    assert f.read_text() == "def f():\n    return 1\n\ndef g():\n    return 2\n"
    assert f.stat().st_mode & 0o777 == 0o755
    result = env.run("edit", path="code.py", old="return", new="yield")
    assert result["error"]["code"] == "EDIT_NOT_UNIQUE" and "2 times" in result["error"]["message"]
    assert env.err("edit", path="code.py", old="absent", new="x") == "EDIT_NOT_FOUND"
    assert env.err("edit", path="code.py", old="", new="x") == "INVALID_INPUT"
    assert env.err("edit", path="nope.py", old="a", new="b") == "FILE_NOT_FOUND"
    (env.ws / "aaa").write_text("aaa")  # overlapping occurrences are not unique either
    assert env.err("edit", path="aaa", old="aa", new="b") == "EDIT_NOT_UNIQUE"
    (env.ws / "bin").write_bytes(b"\xff\xfe")
    assert env.err("edit", path="bin", old="a", new="b") == "NOT_TEXT"
    env.limits = FileLimits(write_bytes=60)
    assert env.err("edit", path="code.py", old="return 2", new="return " + "9" * 30) == "FILE_TOO_LARGE"


def test_edit_crlf_hint(env: Env) -> None:
    (env.ws / "w.txt").write_bytes(b"a\r\nb\r\n")
    r = env.run("edit", path="w.txt", old="a\nb", new="c")
    assert r["error"]["code"] == "EDIT_NOT_FOUND" and "CRLF" in r["error"]["message"]


# list, stat ---------------------------------------------------------------------------------------


def test_list(env: Env) -> None:
    (env.ws / "b.txt").write_text("bb")
    (env.ws / "a").mkdir()
    (env.ws / ".hidden").write_text("")
    (env.ws / "out").symlink_to(env.outside)
    r = env.ok("list", path=".")
    assert [e["name"] for e in r["entries"]] == ["a", "b.txt", "out", "protected"]
    by_name = {e["name"]: e for e in r["entries"]}
    assert by_name["b.txt"]["type"] == "file" and by_name["b.txt"]["size"] == 2
    assert by_name["a"]["type"] == "directory" and "T" in by_name["a"]["mtime"]
    assert by_name["out"] == {**by_name["out"], "type": "symlink", "target": str(env.outside)}
    assert ".hidden" in [e["name"] for e in env.ok("list", path=".", show_hidden=True)["entries"]]
    r = env.ok("list", path=".", max_results=2)
    assert len(r["entries"]) == 2 and r["total"] == 4 and r["truncated"] is True
    assert env.err("list", path="b.txt") == "NOT_A_DIRECTORY"
    assert env.err("list", path="missing") == "FILE_NOT_FOUND"
    assert env.err("list", decide=False, path="out") == "PATH_OUTSIDE_JAIL"


def test_stat(env: Env) -> None:
    f = env.ws / "f.txt"
    f.write_text("12345")
    f.chmod(0o640)
    r = env.ok("stat", path="f.txt")
    assert r["type"] == "file" and r["size"] == 5 and r["mode"] == "0640" and r["is_symlink"] is False
    assert r["mtime"].endswith("+00:00")
    assert env.ok("stat", path=".")["type"] == "directory"
    (env.ws / "in").symlink_to("f.txt")
    r = env.ok("stat", path="in")
    assert r["is_symlink"] is True and r["target"] == "f.txt" and r["target_type"] == "file"
    (env.ws / "dangling").symlink_to("nowhere")
    assert env.ok("stat", path="dangling")["target_type"] == "missing"
    assert env.err("stat", path="missing") == "FILE_NOT_FOUND"


# mkdir, delete ------------------------------------------------------------------------------------


def test_mkdir(env: Env) -> None:
    assert env.ok("mkdir", path="d")["created"] is True and (env.ws / "d").is_dir()
    assert env.err("mkdir", path="d") == "ALREADY_EXISTS"
    assert env.ok("mkdir", path="d", parents=True)["created"] is False
    assert env.err("mkdir", path="x/y/z") == "FILE_NOT_FOUND"
    assert env.ok("mkdir", path="x/y/z", parents=True)["created"] is True and (env.ws / "x/y/z").is_dir()
    (env.ws / "file").write_text("")
    assert env.err("mkdir", path="file", parents=True) == "ALREADY_EXISTS"
    assert env.err("mkdir", path="file/sub") == "NOT_A_DIRECTORY"
    assert env.err("mkdir", decide=False, path="protected/p", parents=True) == "PATH_OUTSIDE_JAIL"
    assert env.err("mkdir", decide=False, path=str(env.outside / "o")) == "PATH_OUTSIDE_JAIL"
    assert not (env.ws / "protected/p").exists() and not (env.outside / "o").exists()


def test_delete(env: Env) -> None:
    (env.ws / "f").write_text("x")
    assert env.ok("delete", path="f")["deleted"] == "file" and not (env.ws / "f").exists()
    (env.ws / "empty").mkdir()
    assert env.ok("delete", path="empty")["deleted"] == "directory"
    (env.ws / "full/sub").mkdir(parents=True)
    (env.ws / "full/sub/a").write_text("a")
    assert env.err("delete", path="full") == "DIRECTORY_NOT_EMPTY"
    assert (env.ws / "full/sub/a").exists()
    assert env.ok("delete", path="full", recursive=True)["entries"] == 2
    assert not (env.ws / "full").exists()
    assert env.err("delete", path="gone") == "FILE_NOT_FOUND"
    assert env.err("delete", decide=False, path=str(env.outside / "secret")) == "PATH_OUTSIDE_JAIL"
    assert env.err("delete", decide=False, path=".", recursive=True) == "PATH_OUTSIDE_JAIL"  # a root
    assert env.err("delete", decide=False, path="protected") == "PATH_OUTSIDE_JAIL"
    assert (env.outside / "secret").exists() and env.ws.is_dir() and (env.ws / "protected").is_dir()


def test_delete_a_symlink_removes_the_link_only(env: Env) -> None:
    (env.ws / "link").symlink_to(env.outside / "secret")
    assert env.ok("delete", path="link")["deleted"] == "symlink"
    assert not os.path.lexists(env.ws / "link") and (env.outside / "secret").read_text() == "TOP SECRET\n"


def test_recursive_delete_never_follows_symlinks(env: Env) -> None:
    (env.outside / "tree/deep").mkdir(parents=True)
    (env.outside / "tree/deep/keep").write_text("keep")
    (env.ws / "d/sub").mkdir(parents=True)
    (env.ws / "d/sub/x").write_text("x")
    (env.ws / "d/to_dir").symlink_to(env.outside / "tree")
    (env.ws / "d/sub/to_file").symlink_to(env.outside / "secret")
    r = env.ok("delete", path="d", recursive=True)
    assert r["entries"] == 4 and not os.path.lexists(env.ws / "d")
    assert (env.outside / "tree/deep/keep").read_text() == "keep"
    assert (env.outside / "secret").read_text() == "TOP SECRET\n"


def test_recursive_delete_of_a_tree_holding_protected_paths_removes_nothing(env: Env) -> None:
    (env.ws / "repo/.git").mkdir(parents=True)
    (env.ws / "repo/.git/config").write_text("[core]")
    (env.ws / "repo/a.txt").write_text("a")
    assert env.err("delete", path="repo", recursive=True) == "PATH_OUTSIDE_JAIL"
    assert (env.ws / "repo/a.txt").exists() and (env.ws / "repo/.git/config").exists()


# grep, find ---------------------------------------------------------------------------------------


def _tree(env: Env) -> None:
    (env.ws / "src/pkg").mkdir(parents=True)
    (env.ws / "src/app.py").write_text("import os\n# TODO: one\n")
    (env.ws / "src/pkg/mod.py").write_text("x = 1\n\n# TODO: two\n")
    (env.ws / "README.md").write_text("TODO in docs\r\n")
    (env.ws / ".git").mkdir()
    (env.ws / ".git/notes.py").write_text("# TODO: hidden in git\n")
    (env.ws / "blob.bin").write_bytes(b"TODO\x00\x01")
    (env.ws / "escape").symlink_to(env.outside)
    (env.outside / "TODO.py").write_text("# TODO outside\n")
    (env.ws / "secret_link").symlink_to(env.outside / "secret")
    (env.ws / "inner_link.py").symlink_to("src/app.py")


def test_grep(env: Env) -> None:
    _tree(env)
    (env.outside / "secret").write_text("TODO secret\n")
    r = env.ok("grep", pattern=r"TODO")
    got = [(m["path"], m["line"], m["text"]) for m in r["matches"]]
    assert got == [
        ("README.md", 1, "TODO in docs"),
        ("inner_link.py", 2, "# TODO: one"),  # a symlink inside the roots is read
        ("src/app.py", 2, "# TODO: one"),
        ("src/pkg/mod.py", 3, "# TODO: two"),
    ]
    assert r["truncated"] is False and r["binary_files_skipped"] == 1
    assert {"path": "secret_link", "reason": "symlink_outside_roots"} in r["skipped"]
    py = env.ok("grep", pattern="TODO", glob="*.py")
    assert [m["path"] for m in py["matches"]] == ["inner_link.py", "src/app.py", "src/pkg/mod.py"]
    assert [m["path"] for m in env.ok("grep", pattern="TODO", glob="**/*.py", path="src")["matches"]] == [
        "src/app.py",
        "src/pkg/mod.py",
    ]
    capped = env.ok("grep", pattern="TODO", max_results=2)
    assert len(capped["matches"]) == 2 and capped["truncated"] is True
    one = env.ok("grep", pattern="^x", path="src/pkg/mod.py")
    assert one["matches"] == [{"path": "src/pkg/mod.py", "line": 1, "text": "x = 1"}]
    result = env.run("grep", pattern="([unclosed")
    assert result["error"]["code"] == "INVALID_INPUT" and "([unclosed" in result["error"]["message"]
    assert env.err("grep", pattern="x", path="missing") == "FILE_NOT_FOUND"


def test_grep_skips_big_files(env: Env) -> None:
    env.limits = FileLimits(grep_file_bytes=10)
    (env.ws / "big.txt").write_text("needle " * 10)
    (env.ws / "small.txt").write_text("needle")
    r = env.ok("grep", pattern="needle")
    assert [m["path"] for m in r["matches"]] == ["small.txt"]
    assert r["skipped"] == [{"path": "big.txt", "reason": "too_large"}]


def test_find(env: Env) -> None:
    _tree(env)

    def paths(**f: Any) -> list[str]:
        return [m["path"] for m in env.ok("find", **f)["matches"]]

    assert paths(pattern="**/*.py") == ["inner_link.py", "src/app.py", "src/pkg/mod.py"]
    assert paths(pattern="*.py") == ["inner_link.py", "src/app.py", "src/pkg/mod.py"]  # a bare name: any depth
    assert paths(pattern="./*.py") == ["inner_link.py"]  # with a "/": from the search root
    assert paths(pattern="src/*") == ["src/app.py", "src/pkg"]
    assert paths(pattern="src/**") == ["src/app.py", "src/pkg", "src/pkg/mod.py"]
    assert paths(pattern="**/*.py", path="src") == ["src/app.py", "src/pkg/mod.py"]
    assert paths(pattern="escape") == ["escape"]  # the symlink is an entry, never walked into
    assert paths(pattern="**/TODO.py") == []
    r = env.ok("find", pattern="**")
    assert {"path": "escape", "type": "symlink"} in r["matches"]
    assert not any(".git" in m["path"] for m in r["matches"])
    capped = env.ok("find", pattern="**/*", max_results=2)
    assert len(capped["matches"]) == 2 and capped["truncated"] is True
    assert env.err("find", pattern="*", path="README.md") == "NOT_A_DIRECTORY"
    assert env.err("find", pattern="/etc/*") == "INVALID_INPUT"
    assert env.err("find", decide=False, pattern="*", path="escape") == "PATH_OUTSIDE_JAIL"


# write_output -------------------------------------------------------------------------------------


STAMPED = re.compile(r"outputs/(\d{14})-([a-z0-9-]+)\.(md|json)")


def test_write_output(env: Env) -> None:
    """Seed 002's names: `YYYYMMDDHHMMSS-name.md`, then `-1`, `-2`... when taken."""
    assert not env.outputs.exists()
    first = env.ok("write_output", content="# Report\n", name="My Report!")
    m = STAMPED.fullmatch(first["path"])
    assert m is not None and m.group(2) == "my-report" and m.group(3) == "md", first
    assert abs(datetime.strptime(m.group(1), "%Y%m%d%H%M%S") - datetime.now()) < timedelta(days=1)
    assert (env.ws / first["path"]).read_text() == "# Report\n"
    r = env.ok("write_output", content='{"a": 1}', format="json")
    assert STAMPED.fullmatch(r["path"]) and r["path"].endswith("-output.json")
    assert json.loads((env.ws / r["path"]).read_text()) == {"a": 1}
    assert env.err("write_output", content="{not json", format="json") == "INVALID_JSON"
    env.limits = FileLimits(write_bytes=2)
    assert env.err("write_output", content="too long") == "FILE_TOO_LARGE"


def test_write_output_takes_the_next_free_number_when_the_name_is_taken(env: Env) -> None:
    """The names of this second and the next minutes are taken (whenever the write happens, its
    own is): it writes NAME-1, then NAME-2."""
    env.outputs.mkdir(parents=True)
    now = datetime.now()
    for s in range(-5, 300):
        (env.outputs / f"{(now + timedelta(seconds=s)).strftime('%Y%m%d%H%M%S')}-same.md").write_text("old")
    first = env.ok("write_output", content="a", name="same")
    second = env.ok("write_output", content="b", name="same")
    one, two = STAMPED.fullmatch(first["path"]), STAMPED.fullmatch(second["path"])
    assert one is not None and two is not None
    assert one.group(2) == "same-1" and two.group(2) in ("same-2", "same-1"), (first, second)
    assert (env.ws / first["path"]).read_text() == "a" and (env.ws / second["path"]).read_text() == "b"


def test_write_output_names_never_collide(env: Env) -> None:
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        r = env.run("write_output", content=f"{i}", name="same")
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r["status"] == "ok" for r in results)
    assert len({r["path"] for r in results}) == 8
    assert sorted((env.ws / r["path"]).read_text() for r in results) == [str(i) for i in range(8)]


def test_write_output_outside_the_roots_is_refused(env: Env) -> None:
    env.outputs = env.outside / "outputs"
    assert env.err("write_output", decide=False, content="x") == "PATH_OUTSIDE_JAIL"
    assert not env.outputs.exists()


# the races: a symlink swapped in between the decision and the use ---------------------------------


def test_read_refuses_a_file_swapped_for_a_symlink_after_the_decision(env: Env) -> None:
    (env.ws / "notes.txt").write_text("harmless")
    call = env.call("read", path="notes.txt")
    env.decide(call)  # the jail passes a regular file ...
    (env.ws / "notes.txt").unlink()
    (env.ws / "notes.txt").symlink_to(env.outside / "secret")  # ... then it is swapped
    result = execute(call, env.grant, env.ws, env.outputs, env.limits)
    assert result["status"] == "error"
    assert result["error"]["code"] in ("PATH_OUTSIDE_JAIL", "SYMLINK_REFUSED")
    assert "TOP SECRET" not in json.dumps(result)


def test_write_refuses_a_parent_swapped_for_a_symlink_after_the_decision(env: Env) -> None:
    (env.ws / "sub").mkdir()
    call = env.call("write", path="sub/f.txt", content="pwned")
    env.decide(call)
    (env.ws / "sub").rmdir()
    (env.ws / "sub").symlink_to(env.outside)
    before = sorted(os.listdir(env.outside))
    result = execute(call, env.grant, env.ws, env.outputs, env.limits)
    assert result["status"] == "error" and result["error"]["code"] in ("PATH_OUTSIDE_JAIL", "SYMLINK_REFUSED")
    assert sorted(os.listdir(env.outside)) == before and (env.outside / "secret").read_text() == "TOP SECRET\n"


def test_delete_refuses_a_parent_swapped_for_a_symlink_after_the_decision(env: Env) -> None:
    (env.ws / "sub").mkdir()
    (env.ws / "sub/secret").write_text("mine")
    call = env.call("delete", path="sub/secret")
    env.decide(call)
    (env.ws / "sub/secret").unlink()
    (env.ws / "sub").rmdir()
    (env.ws / "sub").symlink_to(env.outside)
    result = execute(call, env.grant, env.ws, env.outputs, env.limits)
    assert result["status"] == "error" and (env.outside / "secret").read_text() == "TOP SECRET\n"


def test_open_refuses_a_symlink_swapped_in_after_resolving(env: Env) -> None:
    """The window execute cannot show from outside: after realpath, before open."""
    (env.ws / "link").symlink_to(env.ws / "protected")  # even a symlink to inside the roots
    with pytest.raises(files._Fail) as raised, files._open(str(env.ws / "link"), files._READ, "read", env.grant):
        pass
    assert raised.value.code == "SYMLINK_REFUSED"
    with pytest.raises(files._Fail) as raised, files._open(str(env.ws / "link"), files._DIR, "read", env.grant):
        pass
    assert raised.value.code == "SYMLINK_REFUSED"


def test_open_rechecks_where_the_descriptor_really_is(env: Env) -> None:
    """A parent swapped for a symlink: O_NOFOLLOW passes (the last name is a file), the
    re-check of /proc/self/fd catches it."""
    (env.ws / "sub").symlink_to(env.outside)
    with pytest.raises(files._Fail) as raised, files._open(str(env.ws / "sub/secret"), files._READ, "read", env.grant):
        pass
    assert raised.value.code == "PATH_OUTSIDE_JAIL"
    (env.outside / "deeper").mkdir()
    with pytest.raises(files._Fail) as raised, files._parent(str(env.ws / "sub/deeper/new"), "write", env.grant):
        pass
    assert raised.value.code == "PATH_OUTSIDE_JAIL"
    # the parent itself a symlink: O_DIRECTORY | O_NOFOLLOW refuses it
    with pytest.raises(files._Fail) as raised, files._parent(str(env.ws / "sub/new"), "write", env.grant):
        pass
    assert raised.value.code == "SYMLINK_REFUSED"
    assert sorted(os.listdir(env.outside)) == ["deeper", "secret"] and not os.listdir(env.outside / "deeper")


def test_no_descriptors_leak(env: Env) -> None:
    _tree(env)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        env.run("grep", pattern="TODO", max_results=1)
        env.run("find", pattern="**")
        env.run("read", path="src/app.py")
        env.run("write", path="w.txt", content="x")
        env.run("edit", path="w.txt", old="x", new="y")
        env.run("read", decide=False, path="escape/secret")
    assert len(os.listdir("/proc/self/fd")) == before
