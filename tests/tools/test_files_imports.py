"""The files tool works under the sandbox's file-system identity (setfsuid): a module Python
imports lazily while the thread has that identity is read as the sandbox's account, which may
not reach the interpreter's own files (a Python under /root, as here). `files read_json` failed
under `gateway serve` with "unknown encoding: utf-8-sig" because of it. This test runs every
files action in a fresh interpreter, with a finder first on `sys.meta_path` that records each
import attempted while the thread acts as the sandbox, and wants none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json, sys, tempfile
from pathlib import Path

from gateway.sandbox import identity

seen = []


class Watch:
    def find_spec(self, name, path=None, target=None):
        if identity._libc.setfsuid(-1) != 0:  # -1 only reports the thread's fsuid
            seen.append(name)
        return None


sys.meta_path.insert(0, Watch())

from gateway.audit import AuditLog
from gateway.calls import FilesCall
from gateway.pipeline import Gateway
import gateway.tools  # the tool families register with the gate, as in every face
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over

tmp = Path(tempfile.mkdtemp())
tmp.chmod(0o755)
ws = tmp / "ws"
ws.mkdir()
(ws / "a.txt").write_text("one\ntwo\nthree\n")
(ws / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"k": [1, 2]}).encode())
(ws / "bin").write_bytes(bytes(range(256)))
(ws / ".gitignore").write_text("ignored/\n*.log\n")
(ws / "src").mkdir()
(ws / "src" / "m.py").write_text("# TODO here\nprint('x')\n")
(ws / "x.log").write_text("TODO in a log\n")
hand_over(ws)
policy = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}},
    "roles": {"dev": {"level": 2, "read_roots": ["."], "write_roots": ["."]}},
    "tools": {"files": {"allow_from": 1}},
    "rules": [],
}
gw = Gateway(compile_policy(Policy.model_validate(policy), tmp / "p.yaml", ws, sha256="t"), AuditLog(tmp / "audit"))
calls = [
    dict(action="read", path="a.txt"),
    dict(action="read", path="a.txt", offset=2, limit=1),
    dict(action="read", path="bin", max_bytes=100, encoding="base64"),
    dict(action="read", path="bin", max_bytes=100),
    dict(action="read_json", path="bom.json"),
    dict(action="write", path="b.txt", content="hello world"),
    dict(action="write", path="b.txt", content="more", append=True),
    dict(action="write", path="c.bin", content="AAEC", encoding="base64"),
    dict(action="write", path="deep/er/d.txt", content="x", parents=True),
    dict(action="edit", path="b.txt", old="world", new="there"),
    dict(action="list", path=".", show_hidden=True),
    dict(action="stat", path="a.txt"),
    dict(action="mkdir", path="newdir"),
    dict(action="grep", pattern="TODO", context=1),
    dict(action="grep", pattern="TODO", glob="**/*.py"),
    dict(action="find", pattern="*.py"),
    dict(action="find", pattern="**/*.log", ignored=True),
    dict(action="write_output", content="# notes", name="n"),
    dict(action="delete", path="deep", recursive=True),
    dict(action="delete", path="b.txt"),
]
statuses = []
for c in calls:
    out = gw.handle(FilesCall(principal="agent", **c))
    statuses.append([c["action"], out.get("status"), (out.get("error") or {}).get("message")])
gw.close()
print(json.dumps({"seen": seen, "statuses": statuses}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the identity switch happens only when the gateway is root")
def test_no_module_is_imported_while_the_files_tool_acts_as_the_sandbox(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2]
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert [s for s in out["statuses"] if s[1] != "ok"] == []
    assert out["seen"] == [], f"imported while acting as the sandbox: {out['seen']}"
