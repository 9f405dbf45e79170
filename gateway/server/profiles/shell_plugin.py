"""The `shell-plugin` profile (seed 002): workspace file tools, one-shot `exec` and durable
processes, with the seed's names, arguments, limits and reply fields.

Every reply is one JSON object: `summary` (what the seed's model reads: the text of a read, the
output of an exec, one line for the rest), `action`, `isError`, the seed's typed fields
(camelCase, as the seed spells them), and `call_id`. A failure has `isError: true`, the message in
`summary` and the gateway's `error` object (code, message, and the deciding `rule` and `reasons`
for a denial). A call a supervisor must approve has `status: "pending"` and its `call_id`:
`await_call` answers in the same shape. What is returned is sent once (no text repeated in a
second field).

The seed's limits: `read` shows at most 2000 lines or 50 KB (whichever comes first) and says
where to continue; `exec` keeps the last 8000 characters of stdout and of stderr, each cut
announced as `... (12,345 chars truncated from stdout)`; `grep`, `find` and `ls` replies hold at
most 64 KB of rows. docs/tools.md ("shell-plugin") maps each tool to the gate and says what was
taken from the public plugin the seed describes and what was guessed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.calls import (
    Content,
    FileEdit,
    FilesCall,
    PathText,
    Pattern,
    ProcessCall,
    RunCall,
    ShellText,
)
from gateway.policy.schema import Tool
from gateway.server.specs import READS, RUNS, Spec

NAME = "shell-plugin"
READ_MAX_LINES = 2000
READ_MAX_BYTES = 50 * 1024
EXEC_STREAM_CHARS = 8000
TEXT_BLOCK_CHARS = 8000
"""The seed's "8000-char tail-biased safety limit per text block": exec's whole reply, as sent."""
EXEC_DEFAULT_TIMEOUT_MS = 30_000
EXEC_MAX_TIMEOUT_MS = 300_000
LISTING_MAX_BYTES = 64 * 1024
GREP_DEFAULT_LIMIT, GREP_MAX_LIMIT = 100, 500
FIND_DEFAULT_LIMIT, FIND_MAX_LIMIT = 1000, 5000
LS_DEFAULT_LIMIT, LS_MAX_LIMIT = 500, 2000
STOP_SIGNAL = "SIGTERM"

_PROCESS_LOG = re.compile(r"/(?:[^\0]*/)?processes/([0-9a-f]{16})/process\.log")
"""A process's `logPath` (under the gateway's state directory, which no sandbox and no files call
sees): `read` of it is the process's log tail, through the process family."""

_NOT_HERE = (
    "is not taken here: the gateway's policy decides network access, writable directories and "
    "HOME for every command (docs/tools.md, shell-plugin); leave it out"
)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


EnvValues = dict[str, str | int | float | bool]


def _env(values: EnvValues) -> dict[str, str]:
    """The seed's env values (string, number or boolean) as the strings a process gets."""
    return {k: (("true" if v else "false") if isinstance(v, bool) else str(v)) for k, v in values.items()}


class _Sandboxed(_Args):
    """The seed's per-call sandbox options, which the gateway does not take from the agent."""

    home: str | None = None
    """Not taken: HOME is the sandbox's private one."""
    packageManagers: list[str] | None = None
    """Not taken: network access is the policy's."""
    allowedDomains: list[str] | None = None
    """Not taken: network access is the policy's."""

    @model_validator(mode="after")
    def _refuse_grants(self) -> _Sandboxed:
        for name in ("home", "packageManagers", "allowedDomains", "permissions"):
            if getattr(self, name, None) is not None:
                raise ValueError(f"{name} {_NOT_HERE}")
        return self


class Read(_Args):
    """Arguments of `read`."""

    path: PathText = Field(min_length=1)
    """The file (relative: to the workspace). A process's logPath reads the tail of its log."""
    offset: int | None = Field(default=None, ge=1)
    """The first line, 1-indexed (default 1)."""
    limit: int | None = Field(default=None, ge=1)
    """How many lines (at most 2000 are shown, and at most 50 KB)."""


class ReadJson(_Args):
    """Arguments of `read_json`."""

    path: PathText = Field(min_length=1)
    """The JSON file (relative: to the workspace)."""


class Write(_Args):
    """Arguments of `write`."""

    path: PathText = Field(min_length=1)
    """The file; missing parent directories are created."""
    content: Content
    """UTF-8 text."""
    append: bool = False
    """Add to the end of the file instead of replacing it."""


class EditItem(_Args):
    """One find/replace of `edit`."""

    search: Content = Field(min_length=1)
    """The exact text to find."""
    replace: Content
    """Its replacement."""
    replaceAll: bool = False
    """Replace every occurrence (default: the first)."""


class Edit(_Args):
    """Arguments of `edit`."""

    path: PathText = Field(min_length=1)
    """The file to edit."""
    edits: list[EditItem] = Field(min_length=1, max_length=100)
    """Applied in order; each must match at least once, or nothing is changed."""


class WriteOutput(_Args):
    """Arguments of `write_output`."""

    name: str = Field(min_length=1, max_length=100)
    """A file name without extension (the file is `~/outputs/YYYYMMDDHHMMSS-name.md` or `.json`)."""
    content: Content
    """The document."""
    format: Literal["markdown", "json"] = "markdown"
    """`markdown` (.md) or `json` (.json: must parse)."""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        name = v.strip()
        if not name or name in (".", ".."):
            raise ValueError("must be a non-empty file name, not '.' or '..'")
        if "/" in name or "\\" in name:
            raise ValueError("must be a file name, not a path")
        if name.lower().endswith((".md", ".json")):
            raise ValueError("must not include a file extension (format chooses it)")
        return name


class Grep(_Args):
    """Arguments of `grep`."""

    pattern: Pattern = Field(min_length=1)
    """Regular expression (RE2: no backreferences or lookaround)."""
    path: PathText | None = None
    """Directory or file to search (default: the workspace)."""
    glob: Pattern | None = Field(default=None, min_length=1)
    """Only files matching this glob, e.g. `*.ts`."""
    ignoreCase: bool = False
    """Case-insensitive search."""
    context: int = Field(default=0, ge=0, le=10)
    """Lines of context around each match."""
    limit: int = Field(default=GREP_DEFAULT_LIMIT, ge=1, le=GREP_MAX_LIMIT)
    """Most matches returned."""


class Find(_Args):
    """Arguments of `find`."""

    pattern: Pattern = Field(min_length=1)
    """Glob, e.g. `*.ts` (any depth) or `src/**/*.ts`."""
    path: PathText | None = None
    """Directory to search (default: the workspace)."""
    limit: int = Field(default=FIND_DEFAULT_LIMIT, ge=1, le=FIND_MAX_LIMIT)
    """Most results."""


class Ls(_Args):
    """Arguments of `ls`."""

    path: PathText | None = None
    """Directory to list (default: the workspace)."""
    limit: int = Field(default=LS_DEFAULT_LIMIT, ge=1, le=LS_MAX_LIMIT)
    """Most entries."""


class Exec(_Sandboxed):
    """Arguments of `exec`."""

    command: ShellText
    """The shell command (bash)."""
    cwd: PathText | None = Field(default=None, min_length=1)
    """Directory to run in (default: the workspace); must lie in your roots."""
    timeoutMs: int = Field(default=EXEC_DEFAULT_TIMEOUT_MS, ge=100, le=EXEC_MAX_TIMEOUT_MS)
    """Milliseconds before the command is killed (default 30000; the policy may cap it lower)."""
    env: EnvValues = Field(default={}, max_length=256)
    """Variables for the command; each named by the policy's environment.allow, or allowed by the
    rules deciding it."""


class ProcessStart(_Sandboxed):
    """Arguments of `process_start`."""

    command: ShellText
    """The shell command (bash)."""
    name: str | None = Field(default=None, min_length=1, max_length=100)
    """A name to know it by."""
    cwd: PathText | None = Field(default=None, min_length=1)
    """Directory to run in (default: the workspace)."""
    env: EnvValues = Field(default={}, max_length=256)
    """Variables for the command; each named by the policy's environment.allow, or allowed by the
    rules deciding it."""
    keepAlive: bool = False
    """Restart it when it exits (with backoff) until stopped."""
    permissions: list[str] | None = None
    """Not taken: what a process may do is the policy's."""


class ProcessId(_Args):
    """Arguments of `process_get`."""

    processId: str = Field(min_length=1, max_length=100)
    """The id process_start returned."""


_Signal = Literal["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL"]


class ProcessStop(ProcessId):
    """Arguments of `process_stop`."""

    signal: _Signal = "SIGTERM"
    """Accepted; the gateway always stops with SIGTERM, then SIGKILL to the whole sandbox after 2 s."""


class ProcessStopAll(_Args):
    """Arguments of `process_stop_all`."""

    signal: _Signal = "SIGTERM"
    """Accepted; the gateway always stops with SIGTERM, then SIGKILL to the whole sandbox after 2 s."""


class NoArgs(_Args):
    """`process_list` takes no arguments."""


# --- adapters: the seed's arguments -> the gateway's call ---------------------------------------


def _read(a: Read, principal: str) -> FilesCall | ProcessCall:
    log = _PROCESS_LOG.fullmatch(a.path)
    if log is not None:  # the id alone counts: the process family finds it among the caller's own
        return ProcessCall(principal=principal, action="output", process_id=log.group(1), max_bytes=READ_MAX_BYTES)
    limit = min(a.limit or READ_MAX_LINES, READ_MAX_LINES)
    return FilesCall(principal=principal, action="read", path=a.path, offset=a.offset or 1, limit=limit)


def _read_json(a: ReadJson, principal: str) -> FilesCall:
    return FilesCall(principal=principal, action="read_json", path=a.path)


def _write(a: Write, principal: str) -> FilesCall:
    return FilesCall(principal=principal, action="write", path=a.path, content=a.content, append=a.append, parents=True)


def _edit(a: Edit, principal: str) -> FilesCall:
    edits = [FileEdit(old=e.search, new=e.replace, replace="all" if e.replaceAll else "first") for e in a.edits]
    return FilesCall(principal=principal, action="edit", path=a.path, edits=edits)


def _write_output(a: WriteOutput, principal: str) -> FilesCall:
    return FilesCall(principal=principal, action="write_output", name=a.name, content=a.content, format=a.format)


def _grep(a: Grep, principal: str) -> FilesCall:
    pattern = f"(?i){a.pattern}" if a.ignoreCase else a.pattern
    return FilesCall(
        principal=principal, action="grep", pattern=pattern, path=a.path, glob=a.glob, context=a.context,
        max_results=a.limit,
    )  # fmt: skip


def _find(a: Find, principal: str) -> FilesCall:
    return FilesCall(principal=principal, action="find", pattern=a.pattern, path=a.path, max_results=a.limit)


def _ls(a: Ls, principal: str) -> FilesCall:
    return FilesCall(principal=principal, action="list", path=a.path or ".", show_hidden=True, max_results=a.limit)


def _exec(a: Exec, principal: str) -> RunCall:
    return RunCall(principal=principal, command=a.command, cwd=a.cwd, env=_env(a.env), timeout_ms=a.timeoutMs)


def _process_start(a: ProcessStart, principal: str) -> ProcessCall:
    return ProcessCall(
        principal=principal, action="start", command=a.command, cwd=a.cwd, env=_env(a.env), keep_alive=a.keepAlive,
        name=a.name,
    )  # fmt: skip


def _process_list(a: NoArgs, principal: str) -> ProcessCall:
    return ProcessCall(principal=principal, action="list")


def _process_get(a: ProcessId, principal: str) -> ProcessCall:
    return ProcessCall(principal=principal, action="get", process_id=a.processId)


def _process_stop(a: ProcessStop, principal: str) -> ProcessCall:
    return ProcessCall(principal=principal, action="stop", process_id=a.processId)


def _process_stop_all(a: ProcessStopAll, principal: str) -> ProcessCall:
    return ProcessCall(principal=principal, action="stop_all")


# --- replies: the gateway's envelope -> the seed's reply -------------------------------------------


def _reply(action: str, envelope: dict[str, Any], ok: Any) -> dict[str, Any]:
    """The seed's reply: `ok(envelope)` for a call that went through (summary and fields), the
    error's message and object for one that did not, `pending` for one a supervisor holds."""
    status = envelope.get("status")
    if status == "pending":
        out: dict[str, Any] = {"summary": str(envelope.get("next", "")), "action": action, "isError": False}
        out |= {"status": "pending"} | {k: envelope[k] for k in ("approval", "next") if k in envelope}
    elif status == "ok":
        out = {"action": action, "isError": False, **ok(envelope)}
    else:
        err = envelope.get("error") or {}
        out = {"summary": str(err.get("message", status)), "action": action, "isError": True}
        out["error"] = {k: v for k, v in err.items() if k in ("code", "message")}
        out["error"] |= {k: envelope[k] for k in ("rule", "reasons") if envelope.get(k) is not None}
    out["call_id"] = envelope.get("call_id")
    return out


def _size(n: int) -> str:
    if n < 1024:
        return f"{n}B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f}KB"
    return f"{n / (1024 * 1024):.1f}MB"


def _fit_lines(text: str, first: int) -> tuple[str, int, bool]:
    """At most READ_MAX_BYTES of whole lines of `text`: (kept, lines kept, cut by bytes)."""
    if len(text.encode()) <= READ_MAX_BYTES:
        return text, text.count("\n") + (0 if text.endswith("\n") or not text else 1), False
    kept, used, n = [], 0, 0
    for line in text.splitlines(keepends=True):
        size = len(line.encode())
        if used + size > READ_MAX_BYTES:
            break
        kept.append(line)
        used += size
        n += 1
    return "".join(kept), n, True


def read_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    if "output" in envelope and "process_id" in envelope:
        return _reply("read", envelope, _log_tail)
    return _reply("read", envelope, _read_ok)


def _log_tail(e: dict[str, Any]) -> dict[str, Any]:
    text = str(e.get("output", ""))
    note = f"[the last {_size(READ_MAX_BYTES)} of the log]\n" if e.get("truncated") else ""
    return {
        "summary": f"Log of process {e.get('process_id')} ({e.get('state')})",
        "content": note + text,
        "processId": e.get("process_id"),
        "truncated": bool(e.get("truncated")),
    }


def _read_ok(e: dict[str, Any]) -> dict[str, Any]:
    path = str(e.get("path", ""))
    image = e.get("image")
    if isinstance(image, dict):  # the image itself is the reply's image content
        mime = image.get("mime_type")
        return {"summary": f"Read image file: {path} [{mime}]", "path": path, "mimeType": mime, "bytes": e.get("size")}
    first = int(e.get("offset") or 1)
    text, shown, by_bytes = _fit_lines(str(e.get("content", "")), first)
    lines = int(e.get("lines") or 0)
    if e.get("line_truncated") or (by_bytes and shown == 0):
        hint = (
            f"[Line {first} exceeds the {_size(READ_MAX_BYTES)} limit. Use exec: "
            f"sed -n '{first}p' {path} | head -c {READ_MAX_BYTES}]"
        )
        return {
            "summary": f"Read {path}: line {first} is too long to show",
            "content": hint,
            "path": path,
            "offset": first,
            "lines": 0,
            "truncated": True,
            "truncatedBy": "bytes",
            "nextOffset": first + 1,
        }
    if lines == 0 and first > 1:
        return {
            "summary": f"Offset {first} is beyond the end of {path}",
            "content": "",
            "path": path,
            "offset": first,
            "lines": 0,
            "truncated": False,
            "truncatedBy": None,
        }
    shown = shown if by_bytes else lines
    more = by_bytes or bool(e.get("truncated"))
    last = first + shown - 1
    out: dict[str, Any] = {"path": path, "offset": first, "lines": shown, "truncated": more}
    if by_bytes:
        out["truncatedBy"] = "bytes"
        hint = f"[Showing lines {first}-{last} ({_size(READ_MAX_BYTES)} limit). Use offset={last + 1} to continue.]"
    elif more and shown >= READ_MAX_LINES:
        out["truncatedBy"] = "lines"
        hint = f"[Showing lines {first}-{last}. Use offset={last + 1} to continue.]"
    elif more:
        out["truncatedBy"] = None
        hint = f"[More lines in file. Use offset={last + 1} to continue.]"
    else:
        out["truncatedBy"] = None
        hint = ""
    if more:
        out["nextOffset"] = last + 1
    out["content"] = f"{text.removesuffix(chr(10))}\n\n{hint}" if hint else text
    out["summary"] = f"Read {path}: lines {first}-{last}" if shown else f"Read {path}: empty"
    return out


def read_json_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    return _reply(
        "read_json",
        envelope,
        lambda e: {"summary": f"Read JSON from {e['path']}", "path": e["path"], "json": e.get("json")},
    )


def write_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        appended = "appended" in e
        n = int(e["appended"] if appended else e["bytes"])
        verb = "Appended" if appended else "Wrote"
        return {"summary": f"{verb} {n} bytes to {e['path']}.", "path": e["path"], "bytes": n, "append": appended}

    return _reply("write", envelope, ok)


def edit_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        counts = list(e.get("replacements") or [])
        told = ", ".join(f"edit {i}: {n} replacement{'' if n == 1 else 's'}" for i, n in enumerate(counts, 1))
        return {"summary": f"Updated {e['path']} ({told}).", "path": e["path"], "edits": counts, "bytes": e["bytes"]}

    return _reply("edit", envelope, ok)


def write_output_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        path = str(e["path"])
        fmt = "json" if path.endswith(".json") else "markdown"
        summary = f"Wrote {e['bytes']} bytes to {path}. Use this path to read the file back."
        return {"summary": summary, "path": path, "bytes": e["bytes"], "format": fmt}

    return _reply("write_output", envelope, ok)


def _rows(rows: list[str], total: int, empty: str, more_hint: str) -> tuple[str, int, bool]:
    """`rows` joined, within LISTING_MAX_BYTES: (text, rows shown, cut here)."""
    kept, used = [], 0
    for row in rows:
        size = len(row.encode()) + 1
        if used + size > LISTING_MAX_BYTES:
            break
        kept.append(row)
        used += size
    cut = len(kept) < len(rows)
    text = "\n".join(kept) if kept else empty
    if cut or total > len(kept):
        text += f"\n\n[{more_hint}]"
    return text, len(kept), cut


def grep_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        # each line once, in order, as rg prints overlapping context: a match as `path:N:text`,
        # a context line as `path-N-text` (a line that is both is a match)
        lines: dict[str, dict[int, tuple[str, bool]]] = {}
        for m in e.get("matches", []):
            line, shown = int(m["line"]), lines.setdefault(str(m["path"]), {})
            for i, text in enumerate(m.get("before", []), line - len(m.get("before", []))):
                shown.setdefault(i, (text, False))
            shown[line] = (m["text"], True)
            for i, text in enumerate(m.get("after", []), line + 1):
                shown.setdefault(i, (text, False))
        rows = [
            f"{path}{':' if match else '-'}{n}{':' if match else '-'}{text}"
            for path, shown in lines.items()
            for n, (text, match) in sorted(shown.items())
        ]
        count = len(e.get("matches", []))
        full = bool(e.get("truncated"))
        hint = "more matches: narrow pattern, path or glob, or raise limit (at most 500)"
        text, _, cut = _rows(rows, len(rows) + (1 if full else 0), "No matches found.", hint)
        if e.get("skipped_count"):
            text += f"\n[{e['skipped_count']} files not searched: {json.dumps(e.get('skipped', []))}]"
        return {"summary": text, "count": count, "truncated": full or cut}

    return _reply("grep", envelope, ok)


def find_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        paths = [str(m["path"]) for m in e.get("matches", [])]
        full = bool(e.get("truncated"))
        hint = "more results: narrow pattern or path, or raise limit (at most 5000)"
        text, shown, cut = _rows(paths, len(paths) + (1 if full else 0), "No files found.", hint)
        return {"summary": text, "count": shown, "truncated": full or cut}

    return _reply("find", envelope, ok)


def ls_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        names = [f"{x['name']}/" if x.get("type") == "directory" else str(x["name"]) for x in e.get("entries", [])]
        names.sort()
        total = int(e.get("total", len(names)))
        hint = f"{total - len(names)} more entries: raise limit (at most 2000)"
        text, shown, cut = _rows(names, total, "(empty directory)", hint)
        if cut:
            text = text.rsplit("\n\n[", 1)[0] + f"\n\n[{total - shown} more entries: list a subdirectory]"
        return {"summary": text, "path": e.get("path"), "count": shown, "truncated": total > shown}

    return _reply("ls", envelope, ok)


def _tail(envelope: dict[str, Any], stream: str, keep: int = EXEC_STREAM_CHARS) -> tuple[str, str | None]:
    """One stream as the seed shows it: trailing blanks trimmed, the last `keep` (EXEC_STREAM_CHARS)
    characters kept, the cut announced; and where the whole of it is saved, if it was cut."""
    text = str(envelope.get(stream) or "")
    cut = (envelope.get("reply_cut") or {}).get(stream)
    dropped = 0
    if cut:  # the gateway kept a head and a tail: only the tail is the stream's end
        text = text.rsplit(f" bytes of {stream} not shown ...]\n", 1)[-1]
        dropped = int(cut.get("bytes", 0)) - len(text.encode())
    lost = int((envelope.get("dropped_bytes") or {}).get(stream) or 0)
    if lost:  # the executor's own cut: what it dropped, less the marker it put in the stream's place
        dropped += lost - (len(f"\n[... {lost} bytes dropped ...]\n") if cut else 0)
    text = text.rstrip()
    if len(text) > keep:
        dropped += len(text) - keep
        text = text[len(text) - keep :]
    if dropped:
        text = f"... ({dropped:,} chars truncated from {stream})\n{text}"
    return text, (cut or {}).get("saved")


def exec_output(envelope: dict[str, Any], keep: int = EXEC_STREAM_CHARS) -> str:
    """stdout and stderr as the seed's model reads them (each stream's last `keep` characters)."""
    parts, saved = [], []
    for stream in ("stdout", "stderr"):
        text, where = _tail(envelope, stream, keep)
        if text.strip():
            parts.append(f"{stream}:\n{text}")
        if where:
            saved.append(f"[the whole {stream} is saved in {where}: read it with read (offset/limit)]")
    failed = envelope.get("status") != "ok" or envelope.get("exit_code") not in (0, None)
    if not parts:
        parts.append("Command failed with no output." if failed else "Command completed with no output.")
    return "\n\n".join(parts + saved)


def exec_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The seed's exec reply, whose text block (the reply as sent) holds at most TEXT_BLOCK_CHARS:
    each stream keeps its last EXEC_STREAM_CHARS characters, fewer (the same for both) where the
    block would be longer, every cut announced in the seed's words."""
    out = _exec_reply(envelope, EXEC_STREAM_CHARS)
    if _block(out) <= TEXT_BLOCK_CHARS:
        return out
    low, high = 0, EXEC_STREAM_CHARS  # the most each stream may keep for the block to fit
    while low < high:
        mid = (low + high + 1) // 2
        if _block(_exec_reply(envelope, mid)) <= TEXT_BLOCK_CHARS:
            low = mid
        else:
            high = mid - 1
    return _exec_reply(envelope, low)


def _block(reply: dict[str, Any]) -> int:
    """The characters of a reply's text block, as the server sends it (gateway/server/app.py)."""
    return len(json.dumps(reply, ensure_ascii=False, default=str))


def _exec_reply(envelope: dict[str, Any], keep: int) -> dict[str, Any]:
    ran = "exit_code" in envelope or "stdout" in envelope
    if envelope.get("status") in ("ok", "error", "timeout") and ran:
        code = envelope.get("exit_code")
        out: dict[str, Any] = {
            "summary": exec_output(envelope, keep),
            "action": "exec",
            "isError": envelope.get("status") != "ok" or code != 0,
            "cwd": envelope.get("cwd"),
        }
        if code is not None:
            out["exitCode"] = code
        if envelope.get("status") == "timeout":
            out["signal"] = STOP_SIGNAL
        if envelope.get("error"):
            out["error"] = {k: v for k, v in envelope["error"].items() if k in ("code", "message")}
        out["call_id"] = envelope.get("call_id")
        return out
    return _reply("exec", envelope, lambda e: {"summary": exec_output(e, keep), "cwd": e.get("cwd")})


def _process(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": p.get("id"),
        "name": p.get("name") or p.get("id"),  # the seed's plugin names an unnamed process by its id
        "pid": p.get("pid"),
        "status": p.get("state"),
        "keepAlive": p.get("keep_alive"),
        "restartCount": p.get("restarts"),
        "logPath": p.get("log_path"),
        "command": p.get("command"),
    }


def _shown(value: Any) -> str:
    """A value in a summary line as the seed's (TypeScript) plugin prints it: true, false, unknown."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "unknown" if value is None else str(value)


def process_start_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    """The seed's summary (id, name, pid, keepAlive, status, logPath), and as fields what its
    record holds (pid, the restart policy: keepAlive and restartCount, the state: desiredState and
    status) with the absolute logPath."""

    def ok(e: dict[str, Any]) -> dict[str, Any]:
        p = _process(e["process"])
        lines = [f"Process started: {p['id']}"] + [
            f"{k}: {_shown(p[k])}" for k in ("name", "pid", "keepAlive", "status", "logPath")
        ]
        return {
            "summary": "\n".join(lines),
            "processId": p["id"],
            "name": p["name"],
            "pid": p["pid"],
            "keepAlive": p["keepAlive"],
            "restartCount": p["restartCount"],
            "desiredState": e["process"].get("desired"),
            "status": p["status"],
            "logPath": p["logPath"],
        }

    return _reply("start", envelope, ok)


def process_list_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        items = [_process(p) for p in e.get("processes", [])]
        n = len(items)
        summary = f"{n} managed process{'' if n == 1 else 'es'}." if items else "No managed processes."
        return {"summary": summary, "count": n, "processes": items}

    return _reply("list", envelope, ok)


def process_get_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        raw = e["process"]
        p = _process(raw)
        summary = f"Process {p['id']} ({p['name'] or 'unnamed'}): {p['status']}, pid {p['pid']}; log: {p['logPath']}"
        extra = {"exitCode": raw.get("exit_code"), "startedAt": raw.get("started_at"), "endedAt": raw.get("ended_at")}
        return {"summary": summary, "processId": p["id"], **p, **extra}

    return _reply("get", envelope, ok)


def process_stop_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        p = _process(e["process"])
        lines = [
            f"Process stopped: {p['id']}",
            f"name: {p['name']}",
            f"signal: {STOP_SIGNAL}",
            f"status: {p['status']}",
        ]
        return {"summary": "\n".join(lines), "processId": p["id"], "signal": STOP_SIGNAL, "status": p["status"]}

    out = _reply("stop", envelope, ok)
    if out["isError"] and isinstance(envelope.get("process"), dict):  # e.g. DAEMON_NOT_RUNNING: what it is now
        out["processId"], out["status"] = envelope["process"].get("id"), envelope["process"].get("state")
    return out


def process_stop_all_reply(envelope: dict[str, Any]) -> dict[str, Any]:
    def ok(e: dict[str, Any]) -> dict[str, Any]:
        ids = list(e.get("stopped", []))
        n = len(ids)
        summary = f"Stopped {n} process{'' if n == 1 else 'es'} with {STOP_SIGNAL}."
        return {"summary": summary, "count": n, "signal": STOP_SIGNAL, "processIds": ids}

    return _reply("stop_all", envelope, ok)


# --- the tools ----------------------------------------------------------------------------------

_GATE = (
    " Decided by the gateway's policy and recorded: a refusal is isError with error.code (POLICY_DENIED, "
    "PATH_OUTSIDE_JAIL, ...) and the rule's justification (follow it, do not retry unchanged). A call "
    "a supervisor must approve returns status `pending` and a call_id: call `await_call` with it."
)
_READS = READS
_WRITES = RUNS


def _spec(name: str, model: type[BaseModel], family: Tool, title: str, text: str, hints: ToolAnnotations,
          adapt: Any, reply: Any, resolver: Literal["client"] | None = None) -> Spec:  # fmt: skip
    return Spec(name, model, family, title, text + _GATE, hints, resolver=resolver, adapt=adapt, reply=reply)


SPECS: tuple[Spec, ...] = (
    _spec(
        "read",
        Read,
        Tool.FILES,
        "Read a file",
        "Read a text file (or an image, returned as image content). offset (1-indexed line) and limit "
        "page through it; at most 2000 lines or 50KB are shown, with a hint saying which offset continues. "
        "A process's logPath reads the tail of its log.",
        _READS,
        _read,
        read_reply,
    ),
    _spec(
        "read_json",
        ReadJson,
        Tool.FILES,
        "Read a JSON file",
        "Read a file and parse it as JSON: the value is in `json`.",
        _READS,
        _read_json,
        read_json_reply,
    ),
    _spec(
        "write",
        Write,
        Tool.FILES,
        "Write a file",
        "Write UTF-8 text to a file (atomically), creating missing parent directories; append adds to the end.",
        _WRITES,
        _write,
        write_reply,
    ),
    _spec(
        "edit",
        Edit,
        Tool.FILES,
        "Edit a file",
        "Apply find/replace edits in order: each `search` must occur (its first occurrence is replaced, or "
        "every one with replaceAll); if one does not match, nothing is changed.",
        _WRITES,
        _edit,
        edit_reply,
    ),
    _spec(
        "write_output",
        WriteOutput,
        Tool.FILES,
        "Save a report",
        "Save markdown or JSON under ~/outputs with a time-stamped name that never overwrites "
        "(outputs/20261125143000-name.md, then -1, -2...). Returns the path: print it.",
        _WRITES,
        _write_output,
        write_output_reply,
    ),
    _spec(
        "grep",
        Grep,
        Tool.FILES,
        "Search file contents",
        "Search files for a regular expression; returns file:line:content rows (context lines as "
        "file-line-content). Honours .gitignore, skips .git and node_modules and files over 4 MB.",
        _READS,
        _grep,
        grep_reply,
    ),
    _spec(
        "find",
        Find,
        Tool.FILES,
        "Find files",
        "Find files and directories by glob (`*.ts` at any depth), hidden ones included; honours "
        ".gitignore and leaves out .git and node_modules.",
        _READS,
        _find,
        find_reply,
    ),
    _spec(
        "ls",
        Ls,
        Tool.FILES,
        "List a directory",
        "List a directory's entries (hidden ones too), sorted, directories marked with a trailing /.",
        _READS,
        _ls,
        ls_reply,
    ),
    _spec(
        "exec",
        Exec,
        Tool.RUN,
        "Run a shell command",
        "Run one bash command in a sandbox (cwd: the workspace or a directory in it) and return its "
        "stdout and stderr, each cut to its last 8000 characters with a notice of how much was dropped. "
        "timeoutMs defaults to 30000 (100 to 300000). Network and writable directories are the policy's.",
        _WRITES,
        _exec,
        exec_reply,
        resolver="client",
    ),
    _spec(
        "process_start",
        ProcessStart,
        Tool.PROCESSES,
        "Start a durable process",
        "Start a sandboxed background process that survives the call (and the gateway); keepAlive "
        "restarts it when it exits. Returns its processId and logPath.",
        _WRITES,
        _process_start,
        process_start_reply,
        resolver="client",
    ),
    _spec(
        "process_list",
        NoArgs,
        Tool.PROCESSES,
        "List durable processes",
        "Your durable processes and their state.",
        _READS,
        _process_list,
        process_list_reply,
    ),
    _spec(
        "process_get",
        ProcessId,
        Tool.PROCESSES,
        "Get a durable process",
        "One durable process by id, with the absolute logPath (read it with read).",
        _READS,
        _process_get,
        process_get_reply,
    ),
    _spec(
        "process_stop",
        ProcessStop,
        Tool.PROCESSES,
        "Stop a durable process",
        "Stop a durable process for good (SIGTERM, then SIGKILL to its whole sandbox).",
        _WRITES,
        _process_stop,
        process_stop_reply,
    ),
    _spec(
        "process_stop_all",
        ProcessStopAll,
        Tool.PROCESSES,
        "Stop all durable processes",
        "Stop all your durable processes.",
        _WRITES,
        _process_stop_all,
        process_stop_all_reply,
    ),
)
