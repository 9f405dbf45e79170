"""`gateway serve --profile shell-plugin` (seed 002) driven through the official SDK client
against the real `gateway serve --stdio` (real sandbox, real audit log): every tool with the
seed's examples and error cases, replies checked field by field, the seed's limits exactly
(2000 lines or 50 KB per read, 8000-character stream tails with the seed's notice), and a denied
command or path denied and recorded as through the gateway's own tools."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import yaml
from mcp import Client
from mcp.types import CallToolResult, ImageContent, TextContent

from gateway.audit import verify
from gateway.sandbox.plan import READONLY_PREFIX
from gateway.server.profiles import shell_plugin
from gateway.server.profiles.shell_plugin import exec_output
from tests.server.conftest import audit_records
from tests.server.test_profiles import profile_policy, serve

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def reply(r: CallToolResult) -> dict[str, Any]:
    """The seed's reply: its JSON in the first (text) block."""
    return json.loads(text_of(r))  # type: ignore[no-any-return]


def text_of(r: CallToolResult) -> str:
    first = r.content[0]
    assert isinstance(first, TextContent)
    return first.text


def plugin_policy(tmp_path: Path, ws: Path) -> Path:
    """The profile tests' policy, plus `seq` (to make long outputs)."""
    f = profile_policy(tmp_path, ws)
    p = yaml.safe_load(f.read_text())
    p["rules"].insert(0, {
        "id": "seq", "decision": "allow", "justification": "numbers", "programs": ["seq"],
        "accept_unknown": True, "examples": {"match": ["seq 1 3"]},
    })  # fmt: skip
    f.write_text(yaml.safe_dump(p, sort_keys=False))
    return f


def calls(tmp_path: Path, ws: Path, script: list[tuple[str, str, dict[str, Any]]]) -> dict[str, CallToolResult]:
    async def scenario() -> dict[str, CallToolResult]:
        async with Client(serve(tmp_path, plugin_policy(tmp_path, ws), ws, "shell-plugin")) as c:
            out: dict[str, CallToolResult] = {}
            for key, tool, args in script:
                until: Any = None
                if tool == "@wait":  # a step that needs an earlier reply's field (and may repeat until it holds)
                    until = args.get("until")
                    args = args["make"](out)
                    tool = args.pop("tool")
                out[key] = await c.call_tool(tool, args)
                for _ in range(6000 if until else 0):  # no timing assumed: repeat until it holds (a bound: 120 s+)
                    if until(reply(out[key])):
                        break
                    await asyncio.sleep(0.02)
                    out[key] = await c.call_tool(tool, args)
            return out

    return asyncio.run(scenario())


def test_lists_the_seeds_tools_and_arguments(tmp_path: Path, ws: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(serve(tmp_path, profile_policy(tmp_path, ws), ws, "shell-plugin")) as c:
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}

    tools = asyncio.run(scenario())
    assert set(tools) == {
        "read", "read_json", "write", "edit", "write_output", "grep", "find", "ls", "exec", "process_start",
        "process_list", "process_get", "process_stop", "process_stop_all", "await_call",
    }  # fmt: skip
    props = {k: set(v["properties"]) for k, v in tools.items()}
    assert props["read"] == {"path", "offset", "limit"} and tools["read"]["required"] == ["path"]
    assert props["write"] == {"path", "content", "append"}
    assert props["edit"] == {"path", "edits"}
    assert props["write_output"] == {"name", "content", "format"}
    assert props["grep"] == {"pattern", "path", "glob", "ignoreCase", "context", "limit"}
    assert props["find"] == {"pattern", "path", "limit"} and props["ls"] == {"path", "limit"}
    assert props["exec"] == {"command", "cwd", "timeoutMs", "env", "home", "packageManagers", "allowedDomains"}
    assert tools["exec"]["properties"]["timeoutMs"]["default"] == 30000
    assert props["process_start"] >= {"command", "name", "cwd", "env", "keepAlive"}
    assert props["process_get"] == {"processId"} and props["process_stop"] == {"processId", "signal"}
    assert all(t["additionalProperties"] is False for k, t in tools.items())


def test_file_tools_examples_and_errors(tmp_path: Path, ws: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("import os\nimport sys\nprint(os.name)\n")
    (ws / "big.txt").write_text("".join(f"line {i}\n" for i in range(1, 3001)))
    (ws / "wide.txt").write_text("".join(f"{i:05d}" + "x" * 94 + "\n" for i in range(1, 1001)))  # 100 B a line
    (ws / "long.txt").write_text("y" * 60_000 + "\nshort\n")
    (ws / "pic.png").write_bytes(PNG)
    (ws / "conf.json").write_text('{"a": [1, 2]}')
    (ws / "bad.json").write_text("{nope")
    (ws / "many.txt").write_text("a a a\nb\na\n")
    script: list[tuple[str, str, dict[str, Any]]] = [
        ("read", "read", {"path": "src/app.py"}),
        ("read_page", "read", {"path": "src/app.py", "offset": 2, "limit": 1}),
        ("read_lines", "read", {"path": "big.txt"}),
        ("read_lines_2", "read", {"path": "big.txt", "offset": 2001}),
        ("read_limit_over", "read", {"path": "big.txt", "limit": 5000}),
        ("read_bytes", "read", {"path": "wide.txt"}),
        ("read_long_line", "read", {"path": "long.txt"}),
        ("read_past_end", "read", {"path": "src/app.py", "offset": 50}),
        ("read_image", "read", {"path": "pic.png"}),
        ("read_missing", "read", {"path": "nope.txt"}),
        ("read_outside", "read", {"path": "/etc/passwd"}),
        ("read_zero", "read", {"path": "src/app.py", "offset": 0}),
        ("json", "read_json", {"path": "conf.json"}),
        ("json_bad", "read_json", {"path": "bad.json"}),
        ("write", "write", {"path": str(ws / "notes" / "deep" / "a.txt"), "content": "one\n"}),
        ("append", "write", {"path": str(ws / "notes" / "deep" / "a.txt"), "content": "two\n", "append": True}),
        ("write_outside", "write", {"path": "/etc/x.conf", "content": "x"}),
        ("edit", "edit", {"path": "many.txt", "edits": [{"search": "a", "replace": "A"},
                                                         {"search": "a", "replace": "z", "replaceAll": True}]}),
        ("edit_missing", "edit", {"path": "many.txt", "edits": [{"search": "b", "replace": "B"},
                                                                 {"search": "nothere", "replace": "x"}]}),
        ("edit_empty", "edit", {"path": "many.txt", "edits": []}),
        ("out1", "write_output", {"name": "report", "content": "# R\n"}),
        ("out2", "write_output", {"name": "report", "content": "# R2\n"}),
        ("out_json", "write_output", {"name": "data", "content": '{"k": 1}', "format": "json"}),
        ("out_bad_json", "write_output", {"name": "data", "content": "{", "format": "json"}),
        ("out_ext", "write_output", {"name": "report.md", "content": "x"}),
        ("out_path", "write_output", {"name": "../x", "content": "x"}),
    ]  # fmt: skip
    r = calls(tmp_path, ws, script)
    out = {k: reply(v) for k, v in r.items()}

    read = out["read"]
    assert set(read) == {"summary", "action", "isError", "path", "offset", "lines", "truncated", "truncatedBy",
                         "content", "call_id"}  # fmt: skip
    assert read["action"] == "read" and read["isError"] is False and read["path"] == "src/app.py"
    assert read["content"] == "import os\nimport sys\nprint(os.name)\n" and read["lines"] == 3
    assert read["truncated"] is False and read["truncatedBy"] is None and read["offset"] == 1
    page = out["read_page"]
    assert page["content"] == "import sys\n\n[More lines in file. Use offset=3 to continue.]"
    assert page["nextOffset"] == 3 and page["truncated"] is True

    # 2000 lines, exactly, then the hint
    rl = out["read_lines"]
    body, hint = rl["content"].rsplit("\n\n", 1)
    assert body.split("\n") == [f"line {i}" for i in range(1, 2001)]
    assert hint == "[Showing lines 1-2000. Use offset=2001 to continue.]"
    assert rl["lines"] == 2000 and rl["truncatedBy"] == "lines" and rl["nextOffset"] == 2001
    rl2 = out["read_lines_2"]
    assert rl2["content"].split("\n")[0] == "line 2001" and rl2["lines"] == 1000 and rl2["truncated"] is False
    assert rl2["content"].endswith("line 3000\n")
    assert out["read_limit_over"]["lines"] == 2000 and out["read_limit_over"]["truncatedBy"] == "lines"

    # 50 KB, exactly: 512 lines of 100 bytes are 51200 bytes
    rb = out["read_bytes"]
    body, hint = rb["content"].rsplit("\n\n", 1)
    assert len((body + "\n").encode()) == 51200 and rb["lines"] == 512
    assert hint == "[Showing lines 1-512 (50.0KB limit). Use offset=513 to continue.]"
    assert rb["truncatedBy"] == "bytes" and rb["nextOffset"] == 513

    lng = out["read_long_line"]
    assert lng["lines"] == 0 and lng["truncatedBy"] == "bytes" and lng["nextOffset"] == 2
    assert lng["content"] == "[Line 1 exceeds the 50.0KB limit. Use exec: sed -n '1p' long.txt | head -c 51200]"
    assert out["read_past_end"]["lines"] == 0 and "beyond the end" in out["read_past_end"]["summary"]

    img = r["read_image"]
    assert [c.type for c in img.content] == ["text", "image"]
    picture = img.content[1]
    assert isinstance(picture, ImageContent)
    assert picture.data == base64.b64encode(PNG).decode() and picture.mime_type == "image/png"
    iv = out["read_image"]
    assert iv["summary"] == "Read image file: pic.png [image/png]" and iv["mimeType"] == "image/png"
    assert iv["bytes"] == len(PNG)

    for key, code in (("read_missing", "FILE_NOT_FOUND"), ("read_outside", "PATH_OUTSIDE_JAIL")):
        assert out[key]["isError"] is True and r[key].is_error and out[key]["error"]["code"] == code, out[key]
        assert out[key]["summary"] == out[key]["error"]["message"]
    assert out["read_zero"]["error"]["code"] == "INVALID_INPUT" and "offset" in out["read_zero"]["summary"]

    assert out["json"].get("json") == {"a": [1, 2]} and out["json"]["path"] == "conf.json", out["json"]
    assert out["json_bad"]["error"]["code"] == "INVALID_JSON"

    w = out["write"]
    assert w == {"summary": "Wrote 4 bytes to notes/deep/a.txt.", "action": "write", "isError": False,
                 "path": "notes/deep/a.txt", "bytes": 4, "append": False, "call_id": w["call_id"]}  # fmt: skip
    assert out["append"]["summary"] == "Appended 4 bytes to notes/deep/a.txt." and out["append"]["append"] is True
    assert (ws / "notes" / "deep" / "a.txt").read_text() == "one\ntwo\n"
    assert out["write_outside"]["error"]["code"] == "PATH_OUTSIDE_JAIL" and r["write_outside"].is_error
    assert not Path("/etc/x.conf").exists()

    e = out["edit"]
    assert e["summary"] == "Updated many.txt (edit 1: 1 replacement, edit 2: 3 replacements)." and e["edits"] == [1, 3]
    assert out["edit_missing"]["error"]["code"] == "EDIT_NOT_FOUND" and "edits[1]" in out["edit_missing"]["summary"]
    assert (ws / "many.txt").read_text() == "A z z\nb\nz\n"  # the failed edit changed nothing, b included
    assert out["edit_empty"]["error"]["code"] == "INVALID_INPUT" and "edits" in out["edit_empty"]["summary"]

    o1, o2 = out["out1"], out["out2"]
    # ~/outputs/YYYYMMDDHHMMSS-name.md, then -1 in the same second (collision-safe)
    stamped = re.compile(r"outputs/(\d{14})-report(-1)?\.md")
    m1, m2 = stamped.fullmatch(o1["path"]), stamped.fullmatch(o2["path"])
    assert m1 is not None and m2 is not None and m1.group(2) is None and o1["format"] == "markdown", (o1, o2)
    assert o2["path"] != o1["path"] and (m2.group(2) == "-1") == (m1.group(1) == m2.group(1))
    assert o1["summary"] == f"Wrote 4 bytes to {o1['path']}. Use this path to read the file back." and o1["bytes"] == 4
    assert (ws / o2["path"]).read_text() == "# R2\n"
    assert out["out_json"]["path"].endswith("-data.json") and out["out_json"]["format"] == "json"
    assert out["out_bad_json"]["error"]["code"] == "INVALID_JSON"
    for key in ("out_ext", "out_path"):
        assert out[key]["error"]["code"] == "INVALID_INPUT" and "name" in out[key]["summary"], out[key]

    records = audit_records(tmp_path / "audit")
    decisions = {x["call_id"]: x for x in records if x["event"] == "decision"}
    denied = decisions[out["read_outside"]["call_id"]]
    assert denied["tool"] == "files" and denied["decision"] == "deny"
    edit = decisions[out["edit"]["call_id"]]["arguments"]
    assert edit["edits"] == [{"old_bytes": 1, "new_bytes": 1, "replace": "first"},
                             {"old_bytes": 1, "new_bytes": 1, "replace": "all"}]  # fmt: skip
    assert verify(tmp_path / "audit").ok


def test_search_tools_honour_ignore_rules_and_bounds(tmp_path: Path, ws: Path) -> None:
    (ws / ".gitignore").write_text("build/\n*.log\n")
    for rel in ("src/a.py", "src/b.ts", ".hidden/c.py", "build/d.py", "node_modules/m/e.py", "x.log", "A.TXT"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("TODO one\nctx\nnothing\ntodo two\n")
    (ws / ".git").mkdir()
    (ws / ".git" / "f.py").write_text("TODO\n")
    (ws / "dir").mkdir()
    for i in range(30):
        (ws / "dir" / f"f{i:02}").write_text("")
    script: list[tuple[str, str, dict[str, Any]]] = [
        ("grep", "grep", {"pattern": "TODO"}),
        ("grep_i", "grep", {"pattern": "todo", "ignoreCase": True, "glob": "*.py"}),
        ("grep_ctx", "grep", {"pattern": "one", "path": "src/a.py", "context": 1}),
        ("grep_limit", "grep", {"pattern": "o", "limit": 2}),
        ("grep_none", "grep", {"pattern": "zzz"}),
        ("grep_bad", "grep", {"pattern": "(a)\\1"}),
        ("find", "find", {"pattern": "*.py"}),
        ("find_limit", "find", {"pattern": "*", "path": "dir", "limit": 5}),
        ("ls", "ls", {}),
        ("ls_limit", "ls", {"path": "dir", "limit": 3}),
        ("ls_outside", "ls", {"path": "/root"}),
    ]
    r = calls(tmp_path, ws, script)
    out = {k: reply(v) for k, v in r.items()}

    g = out["grep"]
    assert set(g) == {"summary", "action", "isError", "count", "truncated", "call_id"}
    assert sorted(g["summary"].split("\n")) == [".hidden/c.py:1:TODO one", "A.TXT:1:TODO one", "src/a.py:1:TODO one",
                                                 "src/b.ts:1:TODO one"]  # fmt: skip
    assert g["count"] == 4 and g["truncated"] is False  # no build/, x.log, node_modules, .git
    assert sorted(out["grep_i"]["summary"].split("\n")) == [
        ".hidden/c.py:1:TODO one", ".hidden/c.py:4:todo two", "src/a.py:1:TODO one", "src/a.py:4:todo two"]  # fmt: skip
    assert out["grep_ctx"]["summary"] == "src/a.py:1:TODO one\nsrc/a.py-2-ctx"
    lim = out["grep_limit"]
    assert lim["count"] == 2 and lim["truncated"] is True and lim["summary"].endswith("raise limit (at most 500)]")
    assert out["grep_none"]["summary"] == "No matches found." and out["grep_none"]["count"] == 0
    assert out["grep_bad"]["error"]["code"] == "INVALID_INPUT"

    f = out["find"]
    assert sorted(f["summary"].split("\n")) == [".hidden/c.py", "src/a.py"] and f["count"] == 2
    fl = out["find_limit"]
    assert fl["count"] == 5 and fl["truncated"] is True and len(fl["summary"].split("\n\n")[0].split("\n")) == 5

    ls = out["ls"]["summary"].split("\n")
    assert ls == sorted(ls) and {".gitignore", ".hidden/", "dir/", "src/", "A.TXT"} <= set(ls)
    assert out["ls"]["truncated"] is False and out["ls"]["count"] == len(ls)
    ll = out["ls_limit"]
    assert ll["summary"] == "f00\nf01\nf02\n\n[27 more entries: raise limit (at most 2000)]"
    assert ll["count"] == 3 and ll["truncated"] is True
    assert out["ls_outside"]["error"]["code"] == "PATH_OUTSIDE_JAIL" and r["ls_outside"].is_error


def test_exec_tails_each_stream_with_the_seeds_notice(tmp_path: Path, ws: Path) -> None:
    (ws / "sub").mkdir()
    (ws / "sub").chmod(0o777)
    script: list[tuple[str, str, dict[str, Any]]] = [
        ("ok", "exec", {"command": "echo hello"}),
        ("both", "exec", {"command": "echo out; echo err >&2; false"}),
        ("quiet", "exec", {"command": "true"}),
        ("long", "exec", {"command": "printf 'a%.0s' $(seq 1 20342); echo END; printf 'e%.0s' $(seq 1 9000) >&2"}),
        ("huge", "exec", {"command": "seq 1 400000"}),
        ("env_cwd", "exec", {"command": "printenv APP_X", "cwd": "sub", "env": {"APP_X": 42}}),
        ("timeout", "exec", {"command": "sleep 30", "timeoutMs": 300}),
        ("not_found", "exec", {"command": "nosuchprogram"}),
        ("denied", "exec", {"command": "curl https://example.com"}),
        ("net", "exec", {"command": "echo x", "allowedDomains": ["example.com"]}),
        ("low", "exec", {"command": "echo x", "timeoutMs": 50}),
    ]
    r = calls(tmp_path, ws, script)
    out = {k: reply(v) for k, v in r.items()}

    ok = out["ok"]
    assert ok == {"summary": "stdout:\nhello", "action": "exec", "isError": False, "cwd": str(ws), "exitCode": 0,
                  "call_id": ok["call_id"]}  # fmt: skip
    assert out["both"]["summary"] == "stdout:\nout\n\nstderr:\nerr"
    assert out["both"]["isError"] is True and out["both"]["exitCode"] == 1
    assert out["quiet"]["summary"] == "Command completed with no output."

    long = out["long"]["summary"]  # each stream's tail, the same length for both, the block within 8000
    assert "\n\nstderr:\n" in long, long[:300]
    stdout, stderr = long.split("\n\nstderr:\n")
    kept = len(stderr.split("\n", 1)[1])
    assert 3000 < kept < 4000 and len(text_of(r["long"])) <= 8000
    assert stdout == f"stdout:\n... ({20345 - kept:,} chars truncated from stdout)\n" + "a" * (kept - 3) + "END"
    assert stderr == f"... ({9000 - kept:,} chars truncated from stderr)\n" + "e" * kept

    huge = out["huge"]["summary"]  # 2.6 MB of output: the gateway saved it, the tail is exact
    body, saved = huge.rsplit("\n\n", 1)
    head, notice, tail = body.split("\n", 2)
    assert head == "stdout:" and notice.startswith("... (") and notice.endswith(" chars truncated from stdout)")
    assert 4000 < len(tail) <= 8000 and tail.endswith("\n399999\n400000")
    dropped = int(notice[5:].split(" ")[0].replace(",", ""))
    assert dropped + len(tail) == len("".join(f"{i}\n" for i in range(1, 400001)).rstrip())
    # the seed's "8000-char safety limit per text block": the reply as sent, whole, and no shorter than it must be
    assert saved.startswith("[the whole stdout is saved in ") and 7900 < len(text_of(r["huge"])) <= 8000

    assert out["env_cwd"]["summary"] == "stdout:\n42" and out["env_cwd"]["cwd"] == str(ws / "sub")
    t = out["timeout"]
    assert t["isError"] is True and t["error"]["code"] == "COMMAND_TIMEOUT" and t["signal"] == "SIGTERM"
    nf = out["not_found"]
    assert nf["exitCode"] == 127 and nf["error"]["code"] == "COMMAND_NOT_FOUND" and "not found" in nf["summary"]
    d = out["denied"]
    assert d["isError"] is True and r["denied"].is_error and d["error"]["code"] == "POLICY_DENIED"
    assert d["error"]["rule"] == "no-curl" and "no network" in d["summary"] and "exitCode" not in d
    assert out["net"]["error"]["code"] == "INVALID_INPUT" and "allowedDomains" in out["net"]["summary"]
    assert out["low"]["error"]["code"] == "INVALID_INPUT" and "timeoutMs" in out["low"]["summary"]

    records = audit_records(tmp_path / "audit")
    decision = next(x for x in records if x["event"] == "decision" and x["call_id"] == d["call_id"])
    assert decision["tool"] == "run" and decision["decision"] == "deny" and decision["rule"] == "no-curl"
    allowed = next(x for x in records if x["event"] == "decision" and x["call_id"] == ok["call_id"])
    assert allowed["arguments"]["timeout_ms"] == 30000  # the seed's default
    assert verify(tmp_path / "audit").ok


def test_exec_notice_counts_characters() -> None:
    env = {"status": "ok", "exit_code": 0, "stdout": "x" * 20_345, "stderr": ""}
    assert exec_output(env) == "stdout:\n... (12,345 chars truncated from stdout)\n" + "x" * 8000


def test_processes_examples_and_errors(tmp_path: Path, ws: Path) -> None:
    def pid_of(out: dict[str, CallToolResult]) -> str:
        found: str = reply(out["start"])["processId"]
        return found

    script: list[tuple[str, str, dict[str, Any]]] = [
        ("start", "process_start", {"command": "echo started; sleep 300", "name": "web", "keepAlive": True}),
        ("list", "process_list", {}),
        ("get", "@wait", {"make": lambda o: {"tool": "process_get", "processId": pid_of(o)}}),
        (
            "log",
            "@wait",
            {
                "make": lambda o: {"tool": "read", "path": reply(o["get"])["logPath"]},
                "until": lambda x: "started" in x.get("content", ""),
            },
        ),
        ("stop", "@wait", {"make": lambda o: {"tool": "process_stop", "processId": pid_of(o)}}),
        ("stop_again", "@wait", {"make": lambda o: {"tool": "process_stop", "processId": pid_of(o)}}),
        ("start2", "process_start", {"command": "sleep 300"}),
        ("stop_all", "process_stop_all", {}),
        ("missing", "process_get", {"processId": "0123456789abcdef"}),
        ("denied", "process_start", {"command": "curl https://example.com"}),
        ("perm", "process_start", {"command": "sleep 1", "permissions": ["@network"]}),
        ("empty", "process_list", {}),
    ]
    r = calls(tmp_path, ws, script)
    out = {k: reply(v) for k, v in r.items()}

    s = out["start"]
    pid = s["processId"]
    folder = tmp_path / "state" / "processes" / pid
    assert s["logPath"] == str(folder / "process.log") and Path(s["logPath"]).is_absolute()
    assert s["summary"].split("\n") == [f"Process started: {pid}", "name: web", f"pid: {s['pid']}", "keepAlive: true",
                                        "status: running", f"logPath: {s['logPath']}"]  # fmt: skip
    assert s["keepAlive"] is True and s["status"] == "running" and isinstance(s["pid"], int)
    assert sorted(p.name for p in folder.iterdir()) == ["process.log", "record.json", "sandbox.json"]
    sandbox = json.loads((folder / "sandbox.json").read_text())
    # the argv as run: the shell's read-only preamble (sandbox/plan.py READONLY_PREFIX), then the text
    assert sandbox["command"][-1] == READONLY_PREFIX + "echo started; sleep 300" and sandbox["cwd"] == str(ws)
    assert sandbox["network"] is False and any(m["target"] == str(ws) for m in sandbox["mounts"])
    assert sandbox["die_with_parent"] is False and sandbox["landlock"] and "launched_at" in sandbox

    lst = out["list"]
    assert lst["count"] == 1 and lst["summary"] == "1 managed process."
    assert lst["processes"] == [{
        "id": pid, "name": "web", "pid": s["pid"], "status": "running", "keepAlive": True, "restartCount": 0,
        "logPath": s["logPath"], "command": "echo started; sleep 300",
    }]  # fmt: skip
    g = out["get"]
    assert g["processId"] == pid and g["logPath"] == s["logPath"] and g["status"] == "running"
    assert g["summary"] == f"Process {pid} (web): running, pid {s['pid']}; log: {s['logPath']}"
    log = out["log"]
    assert log["processId"] == pid and "started" in log["content"] and log["isError"] is False
    st = out["stop"]
    assert st["summary"].split("\n") == [f"Process stopped: {pid}", "name: web", "signal: SIGTERM", "status: stopped"]
    assert st["status"] == "stopped" and st["signal"] == "SIGTERM"
    again = out["stop_again"]
    assert again["isError"] is True and again["error"]["code"] == "DAEMON_NOT_RUNNING" and again["status"] == "stopped"
    sa = out["stop_all"]
    assert sa["count"] == 1 and sa["summary"] == "Stopped 1 process with SIGTERM." and sa["signal"] == "SIGTERM"
    assert sa["processIds"] == [out["start2"]["processId"]]
    assert out["missing"]["error"]["code"] == "PROCESS_NOT_FOUND" and r["missing"].is_error
    dn = out["denied"]
    assert dn["error"]["code"] == "POLICY_DENIED" and dn["error"]["rule"] == "no-curl" and r["denied"].is_error
    assert out["perm"]["error"]["code"] == "INVALID_INPUT" and "permissions" in out["perm"]["summary"]
    assert out["empty"]["summary"] == "2 managed processes."  # stopped ones stay listed

    records = audit_records(tmp_path / "audit")
    decision = next(x for x in records if x["event"] == "decision" and x["call_id"] == dn["call_id"])
    assert decision["tool"] == "process" and decision["decision"] == "deny"
    assert verify(tmp_path / "audit").ok


def test_a_log_path_reads_only_the_callers_own_process(tmp_path: Path, ws: Path) -> None:
    """The logPath form of `read` goes by the id alone, through the process family: another
    principal's id is PROCESS_NOT_FOUND, and a path that only looks like one is a plain read."""
    script: list[tuple[str, str, dict[str, Any]]] = [
        ("foreign", "read", {"path": "/var/lib/x/processes/0123456789abcdef/process.log"}),
        ("plain", "read", {"path": "processes/0123456789abcdef/process.log"}),
    ]
    out = {k: reply(v) for k, v in calls(tmp_path, ws, script).items()}
    assert out["foreign"]["error"]["code"] == "PROCESS_NOT_FOUND"
    assert out["plain"]["error"]["code"] == "FILE_NOT_FOUND"
    assert shell_plugin.NAME == "shell-plugin"


def test_read_json_works_under_serve(tmp_path: Path, ws: Path) -> None:
    """files read_json through `gateway serve` (the gateway profile): it failed with INTERNAL_ERROR
    ("unknown encoding: utf-8-sig") before, the BOM now stripped without a codec lookup."""
    (ws / "c.json").write_bytes(b'\xef\xbb\xbf{"k": true}')

    async def scenario() -> CallToolResult:
        async with Client(serve(tmp_path, plugin_policy(tmp_path, ws), ws, "gateway")) as c:
            return await c.call_tool("files", {"action": "read_json", "path": "c.json"})

    r = asyncio.run(scenario())
    body = json.loads(text_of(r).partition("\n")[2])
    assert body["status"] == "ok" and body["json"] == {"k": True}, body
