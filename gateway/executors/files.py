"""The `files` executor: the file tools, done by the gateway itself in pure Python (no program runs).

`paths_of` names every path a call touches, for the decision stage (the path jail checks them
before anything runs). `execute` then does the work, and checks again, because a path can change
between the decision and the use (a symlink swapped in):

- every open is `O_NOFOLLOW` on the last component, and the opened descriptor's real location
  (`/proc/self/fd/N`) must pass `pathjail.check_path` again; a swap shows up as `ELOOP`
  (SYMLINK_REFUSED) or as a location outside the roots (PATH_OUTSIDE_JAIL).
- reads resolve the path (`settled_realpath`, the value the jail checked) and open the result.
- writes never write through a symlink: the parent directory is opened (`O_DIRECTORY |
  O_NOFOLLOW`) and re-checked for write, the new content goes to a temporary file created in it
  (`O_EXCL | O_NOFOLLOW`, `dir_fd=`), is fsynced and renamed over the name (`os.replace` with
  `src_dir_fd`/`dst_dir_fd`), so a parent swapped for a symlink cannot redirect the write, and a
  symlink or hard link at the name is replaced, never written through. The temporary file and the
  final name both pass the jail (so protected paths and `.git` directories are refused).
- list, grep, find and recursive delete never follow symlinks: they walk with directory
  descriptors, report symlinks as entries and never descend into them; grep reads a symlinked
  file only when its real path passes the jail. `.git` directories are skipped by grep and find.
- a recursive delete checks every entry for write before removing anything (a tree holding a
  protected path or a `.git` directory is refused whole), and unlinks symlinks themselves.
- the roots themselves cannot be deleted.

Paths in results are relative to the workspace when inside it, else absolute.

Error codes (`{"status": "error", "error": {"code", "message"}}`):

| Code | When |
| --- | --- |
| `FILE_NOT_FOUND` | the path (or, for write/mkdir, its parent) does not exist |
| `NOT_A_FILE` | a file action on a directory or a special file (fifo, device, socket) |
| `NOT_A_DIRECTORY` | list/find on a file, or a path component that is not a directory |
| `FILE_TOO_LARGE` | content over `write_bytes` (write, edit, write_output); read_json or an image over `read_bytes` |
| `EDIT_NOT_FOUND` | edit: `old` does not occur |
| `EDIT_NOT_UNIQUE` | edit: `old` occurs more than once (the message gives the count) |
| `DIRECTORY_NOT_EMPTY` | delete of a non-empty directory without `recursive: true` |
| `ALREADY_EXISTS` | mkdir of an existing path without `parents`, or of an existing non-directory |
| `NOT_TEXT` | text wanted but the bytes are not UTF-8 (or hold NULs): read with `max_bytes`, `encoding: base64` |
| `INVALID_JSON` | read_json's file, or write_output's `json` document, does not parse (line and column given) |
| `INVALID_INPUT` | a bad value: invalid regex or glob, bad base64, empty `old`, a NUL byte in a path |
| `PATH_OUTSIDE_JAIL` | the check at open time failed (the path changed since the decision); deleting a root |
| `SYMLINK_REFUSED` | a symlink where none may be: at the name opened for write, or swapped in during the call |
| `IO_ERROR` | any other OS error (the message has its strerror) |
"""

from __future__ import annotations

import base64
import binascii
import codecs
import errno
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO, Any, NoReturn

import pathspec

from gateway.calls import FilesCall
from gateway.cancellation import cancelled
from gateway.policy.compile import Grant
from gateway.regex import safe_regex
from gateway.sandbox import masks
from gateway.sandbox.identity import sandbox_identity
from gateway.stages.pathjail import PathRefused, check_path, inside, settled_realpath


@dataclass(frozen=True)
class FileLimits:
    read_bytes: int = 1 << 20
    """Most bytes one read returns (line mode cuts there and says where to go on)."""
    write_bytes: int = 10 << 20
    """Largest content a write, edit or write_output may produce."""
    reply_bytes: int = 30_000
    """Most bytes a read returns when the call did not say how much (no `limit`, no
    `max_bytes`): what fits an agent's context; the reply says where to go on."""
    grep_file_bytes: int = 4 << 20
    """grep skips (and reports) files bigger than this."""


WRITES = frozenset({"write", "edit", "mkdir", "delete", "write_output"})
DEFAULT_LINES = 2000
SNIFF_BYTES = 8192  # how much of a file decides "binary" and "image"
MAX_DEPTH = 100  # walks go no deeper (each level holds one descriptor open)
MAX_MATCH_CHARS = 500  # grep: longest line text returned per match
MAX_SKIPPED = 50  # grep: most skipped files named
MAX_NAME_TRIES = 10_000  # write_output: NAME, NAME-1 ... NAME-N

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_IMAGES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


class _Fail(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


# --- paths ---------------------------------------------------------------------------------------


def paths_of(call: FilesCall, workspace: Path, outputs_dir: Path) -> list[tuple[str, str]]:
    """Every (real absolute path, "read" | "write") the call touches, for the path jail.

    Relative paths resolve against `workspace`; grep and find default to it; write_output writes
    under `outputs_dir`. delete removes a name, never what a symlink there points to, so its path is
    the name in its real parent; stat looks at both the name and what it resolves to.
    """
    if call.action == "write_output":
        return [(_resolve(os.fspath(outputs_dir)), "write")]
    given = _absolute(call.path, workspace)
    if call.action == "delete":
        return [(_location(given), "write")]
    real = _resolve(given)
    if call.action == "edit":
        return [(real, "read"), (real, "write")]
    if call.action == "stat":
        loc = _location(given)
        return [(loc, "read")] + ([(real, "read")] if real != loc else [])
    return [(real, "write" if call.action in WRITES else "read")]


def _absolute(path: str | None, workspace: Path) -> str:
    return os.path.join(os.fspath(workspace), path or "")


def _resolve(path: str) -> str:
    if "\0" in path:  # realpath cannot take it; execute refuses it (INVALID_INPUT)
        return os.path.normpath(path)
    return settled_realpath(path)


def _location(path: str) -> str:
    """The real parent joined with the last name, unresolved: what lstat, unlink and rename see."""
    head, name = os.path.split(path)
    if name in ("", ".", "..") or "\0" in path:
        return _resolve(path)
    return os.path.join(settled_realpath(head), name)


def _checked_input(path: str) -> str:
    if "\0" in path:
        raise _Fail("INVALID_INPUT", "path: contains a NUL byte")
    return path


# --- opening, with the re-check ------------------------------------------------------------------


def _fd_path(fd: int) -> str:
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        raise _Fail(
            "PATH_OUTSIDE_JAIL", f"cannot verify where an opened file lies (/proc/self/fd: {exc.strerror})"
        ) from None
    if not real.startswith("/"):
        raise _Fail("PATH_OUTSIDE_JAIL", f"an opened file is not a path in the filesystem ({real})")
    return real


def _verify(fd: int, access: str, grant: Grant) -> str:
    """The real location of an opened descriptor, which must pass the jail for `access`; a file
    with more than one name must not be a deny_read match under another (a hard link)."""
    real = _fd_path(fd)
    try:
        check_path(real, access, grant)
    except PathRefused as r:
        raise _Fail("PATH_OUTSIDE_JAIL", f"{r.message} (the path changed after it was checked)") from None
    if grant.deny_read is not None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            roots = [str(r) for r in (*grant.read_roots, *grant.write_roots)]
            if (st.st_dev, st.st_ino) in masks.denied_files(roots, grant.deny_read, map(str, grant.unseen)):
                raise _Fail("PATH_OUTSIDE_JAIL", f"{real} is another name (a hard link) of a file the policy denies")
    return real


@contextmanager
def _open(
    path: str, flags: int, access: str | None, grant: Grant, dir_fd: int | None = None
) -> Iterator[tuple[int, str]]:
    """Open without following a final symlink, re-check the real location for `access`, yield
    (fd, real path). `access` None: a directory only used to reach a name in it, which the caller
    checks (joined to the real path yielded)."""
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        _open_failed(exc, path, flags, dir_fd)
    try:
        yield fd, (_fd_path(fd) if access is None else _verify(fd, access, grant))
    finally:
        os.close(fd)


def _open_failed(exc: OSError, path: str, flags: int, dir_fd: int | None) -> NoReturn:
    if exc.errno == errno.ELOOP:
        raise _Fail("SYMLINK_REFUSED", f"{path} is a symlink where none may be (swapped in after the check?)") from None
    if exc.errno == errno.ENOTDIR and flags & os.O_DIRECTORY:
        # O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR, not ELOOP
        with suppress(OSError):
            if stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise _Fail(
                    "SYMLINK_REFUSED", f"{path} is a symlink where none may be (swapped in after the check?)"
                ) from None
        raise _Fail("NOT_A_DIRECTORY", f"{path} is not a directory") from None
    raise _failure(exc, path) from None


def _failure(exc: OSError, path: str) -> _Fail:
    codes = {
        errno.ENOENT: "FILE_NOT_FOUND",
        errno.ELOOP: "SYMLINK_REFUSED",
        errno.ENOTDIR: "NOT_A_DIRECTORY",
        errno.EISDIR: "NOT_A_FILE",
        errno.EEXIST: "ALREADY_EXISTS",
        errno.ENOTEMPTY: "DIRECTORY_NOT_EMPTY",
    }
    code = codes.get(exc.errno or 0, "IO_ERROR")
    return _Fail(code, f"{path}: {exc.strerror or exc}")


@contextmanager
def _parent(path: str, access: str, grant: Grant) -> Iterator[tuple[int, str, str]]:
    """Open the directory holding `path`, checked for `access`: yield (dir fd, its real path, name)."""
    head, name = os.path.split(path)
    if not name:
        raise _Fail("INVALID_INPUT", f"{path}: the filesystem root")
    with _open(head, _DIR, access, grant) as (dfd, dpath):
        check_path(os.path.join(dpath, name), access, grant)
        yield dfd, dpath, name


def _read_all(fd: int, cap: int, what: str) -> bytes:
    """All of an open file, from its current offset; FILE_TOO_LARGE past `cap` bytes."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, cap + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            raise _Fail("FILE_TOO_LARGE", f"{what} is larger than {cap} bytes")


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _regular(fd: int, shown: str) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise _Fail("NOT_A_FILE", f"{shown} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise _Fail("NOT_A_FILE", f"{shown} is not a regular file")
    return st


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat()


# --- execute -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    call: FilesCall
    grant: Grant
    workspace: str
    outputs_dir: Path
    limits: FileLimits

    def target(self) -> str:
        """The call's path made absolute and resolved, as the jail checked it."""
        return settled_realpath(_checked_input(_absolute(self.call.path, Path(self.workspace))))

    def check(self, path: str, access: str) -> None:
        check_path(path, access, self.grant)

    def show(self, path: str) -> str:
        return os.path.relpath(path, self.workspace) if inside(path, Path(self.workspace)) else path


def execute(call: FilesCall, grant: Grant, workspace: Path, outputs_dir: Path, limits: FileLimits) -> dict[str, Any]:
    """Do one files call: `{"status": "ok", ...}` or `{"status": "error", "error": {code, message}}`."""
    ctx = _Ctx(call, grant, os.path.realpath(workspace), outputs_dir, limits)
    try:
        return {"status": "ok", **_ACTIONS[call.action](ctx)}
    except _Fail as f:
        return _error(f.code, f.message)
    except PathRefused as r:
        return _error("PATH_OUTSIDE_JAIL", r.message)
    except OSError as exc:
        where = exc.filename if isinstance(exc.filename, str) and exc.filename.startswith("/") else call.path
        failure = _failure(exc, where or "(workspace)")
        return _error(failure.code, failure.message)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"status": "error", "error": {"code": code, "message": message}}


# read ---------------------------------------------------------------------------------------------


def _read(ctx: _Ctx) -> dict[str, Any]:
    call = ctx.call
    real = ctx.target()
    ctx.check(real, "read")
    shown = ctx.show(real)
    # a read that does not say how much gets what fits a reply; one that does, up to the read limit
    asked = call.max_bytes is not None or call.limit is not None
    cap = ctx.limits.read_bytes if asked else min(ctx.limits.read_bytes, ctx.limits.reply_bytes)
    with _open(real, _READ, "read", ctx.grant) as (fd, _):
        st = _regular(fd, shown)
        if call.max_bytes is not None or call.encoding == "auto":
            cut = call.max_bytes is None or call.max_bytes > cap
            return {"path": shown, **_bounded(_read_range(fd, call, cap), ctx.limits, asked, cut)}
        head = os.pread(fd, SNIFF_BYTES, 0)
        mime = _image_type(head)
        if mime is not None:
            if st.st_size > ctx.limits.read_bytes:
                raise _Fail(
                    "FILE_TOO_LARGE",
                    f"{shown}: an image of {st.st_size} bytes is over the {ctx.limits.read_bytes}-byte read "
                    "limit; read it in parts with max_bytes and encoding base64",
                )
            data = _read_all(fd, ctx.limits.read_bytes, shown)
            image = {"mime_type": mime, "data": base64.b64encode(data).decode("ascii")}
            return {"path": shown, "size": len(data), "image": image}
        if b"\0" in head:
            raise _Fail("NOT_TEXT", f"{shown} is binary: read it with max_bytes and encoding base64")
        first = max(call.offset or 1, 1)
        with os.fdopen(fd, "rb", closefd=False) as f:
            lines = _read_lines(f, first, call.limit or DEFAULT_LINES, cap)
        cut = lines.pop("bytes_cut")
        return {"path": shown, "size": st.st_size, **_bounded(lines, ctx.limits, asked, cut)}


def _bounded(result: dict[str, Any], limits: FileLimits, asked: bool, cut: bool) -> dict[str, Any]:
    """A read that a byte limit cut short (`cut`) says so in `notice`: which limit, and how to read on."""
    if not cut or not result.get("truncated"):
        return result
    cap = limits.read_bytes if asked else min(limits.read_bytes, limits.reply_bytes)
    shown = result.get("bytes", len(result["content"].encode()))
    on = f"offset {result['next_offset']}" if "next_offset" in result else "byte mode (offset and max_bytes)"
    how = f"{on} and max_bytes" if "bytes" in result else f"{on} and limit (lines) or max_bytes"
    which = (
        f"the read limit (limits.output_bytes: {limits.read_bytes})"
        if asked
        else f"the reply limit of a read that names no limit or max_bytes (limits.reply_bytes: {cap})"
    )
    size = f" of {result['size']}" if "size" in result else ""
    notice = f"{shown}{size} bytes returned, cut at {which}; read on with {how} (up to {limits.read_bytes} a read)"
    return {**result, "notice": notice}


def _image_type(head: bytes) -> str | None:
    for magic, mime in _IMAGES:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _read_lines(f: IO[bytes], first: int, count: int, cap: int) -> dict[str, Any]:
    line_no = 1
    while line_no < first:
        chunk = f.readline(1 << 16)
        if not chunk:
            break
        if chunk.endswith(b"\n"):
            line_no += 1
    out = bytearray()
    n = 0
    cut_line = False  # the first line alone is longer than the read limit
    stopped = False  # the next line did not fit
    while line_no == first and n < count:
        room = cap - len(out)
        line = f.readline(room + 1)
        if not line:
            break
        if len(line) > room:
            if n == 0:
                out += line[:room]
                cut_line, n = True, 1
                while not line.endswith(b"\n"):
                    line = f.readline(1 << 16)
                    if not line:
                        break
            else:
                stopped = True
            break
        out += line
        n += 1
    more = stopped or (line_no == first and bool(f.read(1)))
    content, replaced = _decode_text(bytes(out), final=not cut_line)
    result: dict[str, Any] = {"content": content, "offset": first, "lines": n, "truncated": more}
    result["bytes_cut"] = stopped or cut_line
    if more:
        result["next_offset"] = first + n
    if cut_line:
        result["line_truncated"] = True
        result["hint"] = f"line {first} is longer than {cap} bytes: read it in byte mode (max_bytes)"
    if replaced:
        result["invalid_utf8_replaced"] = True
    return result


def _decode_text(data: bytes, final: bool) -> tuple[str, bool]:
    try:
        return codecs.getincrementaldecoder("utf-8")("strict").decode(data, final), False
    except UnicodeDecodeError:
        return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final), True


def _read_range(fd: int, call: FilesCall, read_bytes: int) -> dict[str, Any]:
    start = call.offset or 0
    want = min(call.max_bytes or read_bytes, read_bytes)
    size = os.fstat(fd).st_size
    # at or past the end there is nothing to read: an offset past what the kernel takes (2**63 and
    # up, or one the count would carry past it) is the same empty read, not an OverflowError
    data = _pread_all(fd, want, start) if start < size else b""
    end = start + len(data)
    encoding = call.encoding
    if encoding == "auto":
        encoding = "utf-8" if _is_text(data, final=end >= size) else "base64"
    if encoding == "base64":
        content = base64.b64encode(data).decode("ascii")
    else:
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        try:
            content = decoder.decode(data, final=end >= size)
        except UnicodeDecodeError as exc:
            raise _Fail(
                "NOT_TEXT",
                f"byte {start + exc.start} is not UTF-8 text ({exc.reason}): read with encoding base64",
            ) from None
        held = len(decoder.getstate()[0])  # a character cut at the end: left for the next read
        if held and held == len(data):
            raise _Fail("NOT_TEXT", f"max_bytes {want} is too small to hold the character at byte {start}")
        end -= held
    result: dict[str, Any] = {
        "content": content,
        "encoding": encoding,
        "offset": start,
        "bytes": end - start,
        "size": size,
        "truncated": end < size,
    }
    if end < size:
        result["next_offset"] = end
    return result


def _is_text(data: bytes, final: bool) -> bool:
    """UTF-8 without NUL bytes (a character cut at the end of a part counts as text)."""
    if b"\0" in data:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(data, final)
    except UnicodeDecodeError:
        return False
    return True


def _read_json(ctx: _Ctx) -> dict[str, Any]:
    real = ctx.target()
    ctx.check(real, "read")
    shown = ctx.show(real)
    with _open(real, _READ, "read", ctx.grant) as (fd, _):
        st = _regular(fd, shown)
        cap = ctx.limits.read_bytes
        if st.st_size > cap:
            raise _Fail("FILE_TOO_LARGE", f"{shown} is {st.st_size} bytes, over the {cap}-byte read limit")
        data = _read_all(fd, cap, shown)
    try:
        text = data.removeprefix(codecs.BOM_UTF8).decode(
            "utf-8"
        )  # no codec lookup: "utf-8-sig" may not import under serve
    except UnicodeDecodeError as exc:
        raise _Fail("NOT_TEXT", f"{shown}: byte {exc.start} is not UTF-8") from None
    return {"path": shown, "json": _parse_json(text, shown)}


def _parse_json(text: str, what: str) -> Any:
    def constant(name: str) -> NoReturn:
        raise _Fail("INVALID_JSON", f"{what}: {name} is not JSON")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise _Fail("INVALID_JSON", f"{what}: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise _Fail("INVALID_JSON", f"{what}: nested too deeply") from None


# write, edit ------------------------------------------------------------------------------------


def _content(call: FilesCall, limit: int) -> bytes:
    text = call.content or ""
    if call.encoding == "base64":
        try:
            data = base64.b64decode("".join(text.split()), validate=True)
        except binascii.Error as exc:
            raise _Fail("INVALID_INPUT", f"content: not base64 ({exc})") from None
    else:
        data = _encode(text, "content")
    if len(data) > limit:
        raise _Fail("FILE_TOO_LARGE", f"content is {len(data)} bytes, over the {limit}-byte write limit")
    return data


def _encode(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Fail("INVALID_INPUT", f"{what}: not valid Unicode (a lone surrogate)") from None


def _existing(dfd: int, name: str, shown: str) -> os.stat_result | None:
    """The file at `name` (never a symlink, directory or special file), or None."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise _Fail("SYMLINK_REFUSED", f"{shown} is a symlink where none may be (swapped in after the check?)")
    if stat.S_ISDIR(st.st_mode):
        raise _Fail("NOT_A_FILE", f"{shown} is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise _Fail("NOT_A_FILE", f"{shown} is not a regular file")
    return st


def _replace(dfd: int, dpath: str, name: str, data: bytes, mode: int | None, grant: Grant) -> None:
    """Atomically put `data` at `name` in the directory `dfd`: temp file, fsync, rename."""
    tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    check_path(os.path.join(dpath, tmp), "write", grant)
    # an existing file's content may be private: the temp file starts owner-only, then takes its mode
    fd = os.open(tmp, _NEW, 0o666 if mode is None else 0o600, dir_fd=dfd)
    try:
        try:
            _verify(fd, "write", grant)
            _give(fd, dfd, name)
            _write_all(fd, data)
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    _sync_dir(dfd)


def _give(fd: int, dfd: int, name: str) -> None:
    """What the gateway writes for the agent belongs to the sandbox's account, even where it
    replaces a file of someone else's: the content is the agent's, and an owner is what tells
    the nested-repository watcher (sandbox/nested.py) who made a file. (The gateway may run as
    root; without this a command could not change later what the files tool wrote.)"""
    ident = sandbox_identity()
    if ident.switch:
        os.fchown(fd, ident.uid, ident.gid)


def _sync_dir(dfd: int) -> None:
    with suppress(OSError):  # some filesystems cannot fsync a directory; the data is written
        os.fsync(dfd)


def _kept_mode(st: os.stat_result | None) -> int | None:
    # set-id bits are dropped, as the kernel drops them when a file's content changes
    return None if st is None else stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)


def _write(ctx: _Ctx) -> dict[str, Any]:
    call = ctx.call
    limit = ctx.limits.write_bytes
    data = _content(call, limit)
    real = ctx.target()
    ctx.check(real, "write")
    shown = ctx.show(real)
    if call.parents:  # each missing directory made in its verified parent, checked for write
        parent = os.path.dirname(real)
        _make_dirs(parent, ctx.grant, True, ctx.show(parent))
    with _parent(real, "write", ctx.grant) as (dfd, dpath, name):
        st = _existing(dfd, name, shown)
        added = len(data)
        if call.append and st is not None:  # the old content, read from the same verified directory
            with _open(name, _READ, "read", ctx.grant, dir_fd=dfd) as (fd, _):
                _regular(fd, shown)
                data = _read_all(fd, limit, shown) + data
            if len(data) > limit:
                raise _Fail("FILE_TOO_LARGE", f"{shown} would be {len(data)} bytes, over the {limit}-byte write limit")
        _replace(dfd, dpath, name, data, _kept_mode(st), ctx.grant)
    out: dict[str, Any] = {"path": shown, "bytes": len(data), "created": st is None}
    if call.append:
        out["appended"] = added
    return out


def _edit(ctx: _Ctx) -> dict[str, Any]:
    call = ctx.call
    if call.edits is not None:
        steps = [(e.old, e.new, e.replace) for e in call.edits]
    else:
        steps = [(call.old or "", call.new or "", "once")]
    for i, (old, new, _) in enumerate(steps):
        where = f"edits[{i}]." if call.edits is not None else ""
        if not old:
            raise _Fail("INVALID_INPUT", f"{where}old: must not be empty")
        _encode(old, f"{where}old")
        _encode(new, f"{where}new")
    real = ctx.target()
    ctx.check(real, "write")
    shown = ctx.show(real)
    limit = ctx.limits.write_bytes
    with _parent(real, "write", ctx.grant) as (dfd, dpath, name):
        st = _existing(dfd, name, shown)
        if st is None:
            raise _Fail("FILE_NOT_FOUND", f"{shown}: no such file")
        with _open(name, _READ, "read", ctx.grant, dir_fd=dfd) as (fd, _):
            _regular(fd, shown)
            data = _read_all(fd, limit, shown)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Fail("NOT_TEXT", f"{shown}: byte {exc.start} is not UTF-8, so it cannot be edited as text") from None
        first_line = 0
        counts: list[int] = []
        for i, (old, new, how) in enumerate(steps):
            which = f" (edits[{i}])" if call.edits is not None else ""
            at = text.find(old)
            if at < 0:
                hint = ""
                if "\n" in old and "\r\n" not in old and old.replace("\n", "\r\n") in text:
                    hint = " (the file has CRLF line endings)"
                raise _Fail("EDIT_NOT_FOUND", f"{shown}: the text to replace{which} was not found{hint}")
            if how == "once" and text.find(old, at + 1) >= 0:
                count = max(2, text.count(old))
                raise _Fail(
                    "EDIT_NOT_UNIQUE",
                    f"{shown}: the text to replace{which} occurs {count} times; include more context so it occurs once",
                )
            if not first_line:
                first_line = text.count("\n", 0, at) + 1
            n = text.count(old) if how == "all" else 1
            if len(text) + n * (len(new) - len(old)) > limit:  # characters, before any is made: no
                raise _Fail("FILE_TOO_LARGE", f"the edited file would be over the {limit}-byte limit")  # blow-up
            counts.append(n)
            text = text.replace(old, new) if how == "all" else text[:at] + new + text[at + len(old) :]
        out = _encode(text, "new")
        if len(out) > limit:
            raise _Fail("FILE_TOO_LARGE", f"the edited file would be {len(out)} bytes, over the {limit}-byte limit")
        _replace(dfd, dpath, name, out, _kept_mode(st), ctx.grant)
    result: dict[str, Any] = {"path": shown, "bytes": len(out), "line": first_line}
    if call.edits is not None:
        result["replacements"] = counts
    return result


# list, stat -------------------------------------------------------------------------------------


def _scan(fd: int) -> list[tuple[str, os.stat_result]]:
    """A directory's entries (lstat), sorted by name."""
    out: list[tuple[str, os.stat_result]] = []
    with os.scandir(fd) as it:
        for entry in it:
            try:
                out.append((entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue  # gone meanwhile
    out.sort(key=lambda e: e[0])
    return out


def _list(ctx: _Ctx) -> dict[str, Any]:
    call = ctx.call
    real = ctx.target()
    ctx.check(real, "read")
    entries: list[dict[str, Any]] = []
    with _open(real, _DIR, "read", ctx.grant) as (fd, dpath):
        for name, st in _scan(fd):
            if not call.show_hidden and name.startswith("."):
                continue
            entry: dict[str, Any] = {
                "name": name,
                "type": _kind(st.st_mode),
                "size": st.st_size,
                "mtime": _iso(st.st_mtime),
            }
            if stat.S_ISLNK(st.st_mode):
                with suppress(OSError):
                    entry["target"] = os.readlink(name, dir_fd=fd)
            entries.append(entry)
    total = len(entries)
    return {
        "path": ctx.show(dpath),
        "entries": entries[: call.max_results],
        "total": total,
        "truncated": total > call.max_results,
    }


def _stat(ctx: _Ctx) -> dict[str, Any]:
    given = _checked_input(_absolute(ctx.call.path, Path(ctx.workspace)))
    loc = _location(given)
    ctx.check(loc, "read")
    head, name = os.path.split(loc)
    if not name:
        head, name = "/", "."
    with _open(head, _PATH_DIR, None, ctx.grant) as (dfd, dpath):
        where = os.path.join(dpath, name) if name != "." else dpath
        check_path(where, "read", ctx.grant)
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        result: dict[str, Any] = {
            "path": ctx.show(where),
            "type": _kind(st.st_mode),
            "size": st.st_size,
            "mode": f"{stat.S_IMODE(st.st_mode):04o}",
            "mtime": _iso(st.st_mtime),
            "atime": _iso(st.st_atime),
            "is_symlink": stat.S_ISLNK(st.st_mode),
        }
        if stat.S_ISLNK(st.st_mode):
            result["target"] = os.readlink(name, dir_fd=dfd)
    if result["is_symlink"]:
        result["target_type"] = _target_type(settled_realpath(given), ctx.grant)
    return result


def _target_type(real: str, grant: Grant) -> str:
    """What a symlink resolves to: a kind, "missing", or "outside_roots" (not looked at)."""
    try:
        check_path(real, "read", grant)
    except PathRefused:
        return "outside_roots"
    try:
        with _open(real, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, "read", grant) as (fd, _):
            return _kind(os.fstat(fd).st_mode)
    except _Fail as f:
        return "missing" if f.code == "FILE_NOT_FOUND" else "unknown"


# mkdir, delete ----------------------------------------------------------------------------------


def _make_dirs(real: str, grant: Grant, parents: bool, shown: str) -> bool:
    """Create the directory `real` (and its missing parents), each checked for write as it is made
    in its verified parent. True if it was created, False if it already was a directory."""
    missing: list[str] = []
    base = real
    while not os.path.lexists(base):
        head, name = os.path.split(base)
        if head == base:
            break
        missing.append(name)
        base = head
    if not missing:
        st = os.lstat(real)
        if stat.S_ISDIR(st.st_mode) and parents:
            return False
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a directory"
        raise _Fail("ALREADY_EXISTS", f"{shown} already exists ({what})")
    if len(missing) > 1 and not parents:
        raise _Fail("FILE_NOT_FOUND", f"{os.path.dirname(real)} does not exist (set parents: true to create it)")
    try:
        fd = os.open(base, _PATH_DIR)
    except OSError as exc:
        _open_failed(exc, base, _PATH_DIR, None)
    try:
        dpath = _fd_path(fd)
        for name in reversed(missing):
            check_path(os.path.join(dpath, name), "write", grant)
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
                # to the sandbox's account, so commands can use it (a link put there is re-owned itself)
                ident = sandbox_identity()
                if ident.switch:
                    os.chown(name, ident.uid, ident.gid, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                if not parents:
                    raise _Fail("ALREADY_EXISTS", f"{shown} already exists") from None
            try:
                child = os.open(name, _PATH_DIR, dir_fd=fd)
            except OSError as exc:
                _open_failed(exc, os.path.join(dpath, name), _PATH_DIR, fd)
            os.close(fd)
            fd = child
            dpath = _verify(fd, "write", grant)
    finally:
        os.close(fd)
    return True


def _mkdir(ctx: _Ctx) -> dict[str, Any]:
    real = ctx.target()
    ctx.check(real, "write")
    shown = ctx.show(real)
    created = _make_dirs(real, ctx.grant, ctx.call.parents, shown)
    return {"path": shown, "created": created}


def _delete(ctx: _Ctx) -> dict[str, Any]:
    loc = _location(_checked_input(_absolute(ctx.call.path, Path(ctx.workspace))))
    ctx.check(loc, "write")
    with _parent(loc, "write", ctx.grant) as (dfd, dpath, name):
        where = os.path.join(dpath, name)
        shown = ctx.show(where)
        roots = {str(r) for r in (*ctx.grant.read_roots, *ctx.grant.write_roots)}
        if where in roots:
            raise _Fail("PATH_OUTSIDE_JAIL", f"{shown} is a root of the jail and cannot be deleted")
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dfd)  # a symlink goes itself; what it points to stays
            _sync_dir(dfd)
            return {"path": shown, "deleted": _kind(st.st_mode), "entries": 0}
        try:
            os.rmdir(name, dir_fd=dfd)
            _sync_dir(dfd)
            return {"path": shown, "deleted": "directory", "entries": 0}
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if not ctx.call.recursive:
            raise _Fail("DIRECTORY_NOT_EMPTY", f"{shown} is not empty: set recursive: true to delete it all")
        with _open(name, _DIR, "write", ctx.grant, dir_fd=dfd) as (cfd, cpath):
            _tree(cfd, cpath, ctx.grant, remove=False, depth=0)  # refuse before anything is gone
            count = _tree(cfd, cpath, ctx.grant, remove=True, depth=0)
        os.rmdir(name, dir_fd=dfd)
        _sync_dir(dfd)
    return {"path": shown, "deleted": "directory", "entries": count}


def _tree(fd: int, dpath: str, grant: Grant, remove: bool, depth: int) -> int:
    """Check every entry under the directory `fd` for write; with `remove`, delete them. Never
    follows a symlink: directories are opened O_NOFOLLOW by name in their verified parent."""
    count = 0
    for name, st in _scan(fd):
        if cancelled():  # the client left, the server stops: a tree half checked or half gone
            raise _Fail("CALL_CANCELLED", "the call was cancelled (client gone or shutdown): the delete stopped")
        check_path(os.path.join(dpath, name), "write", grant)
        if stat.S_ISDIR(st.st_mode):
            if depth >= MAX_DEPTH:
                raise _Fail("IO_ERROR", f"{dpath}/{name}: nested deeper than {MAX_DEPTH} directories")
            with _open(name, _DIR, "write", grant, dir_fd=fd) as (cfd, cpath):
                count += _tree(cfd, cpath, grant, remove, depth + 1)
            if remove:
                os.rmdir(name, dir_fd=fd)
        elif remove:
            os.unlink(name, dir_fd=fd)
        count += 1
    return count


# grep, find -------------------------------------------------------------------------------------


ALWAYS_IGNORED = frozenset({"node_modules"})
"""Directories grep and find leave out unless the call sets `ignored` (`.git` always)."""
IGNORE_FILE = ".gitignore"
MAX_IGNORE_BYTES = 256 << 10  # a larger .gitignore is not read (its rules do not apply)


class _Ignore:
    """git's ignore rules, with git's own pattern semantics (`pathspec`'s GitIgnoreSpec): each
    directory's `.gitignore` speaks for what lies below it, a deeper file's rules before a
    shallower one's, the last matching pattern of a file decides (`!` re-includes), and an
    ignored directory is not entered (so nothing under it is re-included, as in git). The
    `.gitignore` files above the search root count too, up to the repository's top (the
    directory holding `.git`) or the root of the jail, whichever comes first."""

    def __init__(self) -> None:
        self.specs: list[tuple[str, pathspec.GitIgnoreSpec]] = []  # (directory's real path, its rules)

    def load(self, fd: int, dpath: str) -> None:
        """Read the `.gitignore` of the open directory `fd` (never through a symlink, never a
        special file), if it has one."""
        try:
            gfd = os.open(IGNORE_FILE, _READ, dir_fd=fd)
        except OSError:
            return
        try:
            st = os.fstat(gfd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_IGNORE_BYTES:
                return
            text = _pread_all(gfd, st.st_size, 0).decode("utf-8", "replace")
        except OSError:
            return
        finally:
            os.close(gfd)
        spec = pathspec.GitIgnoreSpec.from_lines(text.splitlines())
        self.specs.append((dpath, spec))

    def ignored(self, path: str, is_dir: bool) -> bool:
        if is_dir and os.path.basename(path) in ALWAYS_IGNORED:
            return True
        for base, spec in reversed(self.specs):
            if not path.startswith(base.rstrip("/") + "/"):
                continue
            result = spec.check_file(path[len(base.rstrip("/")) + 1 :] + ("/" if is_dir else ""))
            if result.include is not None:
                return bool(result.include)
        return False


def _ignore_rules(root_fd: int, root: str, grant: Grant) -> _Ignore:
    """The ignore rules in force at the search root: its ancestors' inside the jail, then its own."""
    rules = _Ignore()
    roots = [str(r) for r in (*grant.read_roots, *grant.write_roots)]
    above: list[str] = []
    here = root
    while True:
        if os.path.exists(os.path.join(here, ".git")) or here in roots or here == "/":
            break
        parent = os.path.dirname(here)
        if not any(parent == r or parent.startswith(r.rstrip("/") + "/") for r in roots):
            break
        above.append(parent)
        here = parent
    for d in reversed(above):
        with suppress(_Fail, OSError), _open(d, _DIR, "read", grant) as (dfd, real):
            rules.load(dfd, real)
    rules.load(root_fd, root)
    return rules


@dataclass
class _Walk:
    grant: Grant
    skipped: list[dict[str, str]]
    skipped_count: int = 0
    ignore: _Ignore | None = None

    def skip(self, path: str, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < MAX_SKIPPED:
            self.skipped.append({"path": path, "reason": reason})


@dataclass(frozen=True)
class _Entry:
    dir_fd: int
    dir_path: str
    name: str
    rel: str  # relative to the walk's root
    st: os.stat_result

    @property
    def path(self) -> str:
        return os.path.join(self.dir_path, self.name)


def _walk(walk: _Walk, fd: int, dpath: str, rel: str = "", depth: int = 0) -> Generator[_Entry, None, None]:
    """Every entry under a directory, depth first, by name; `.git` is skipped, symlinks are
    entries but never descended into, and each directory's real location is re-checked. Ends
    with CALL_CANCELLED once the call is cancelled (the client left, the server stops)."""
    for name, st in _scan(fd):
        if cancelled():
            raise _Fail("CALL_CANCELLED", "the call was cancelled (client gone or shutdown): the search stopped")
        if name == ".git":
            continue
        entry = _Entry(fd, dpath, name, f"{rel}/{name}" if rel else name, st)
        if walk.ignore is not None and walk.ignore.ignored(entry.path, stat.S_ISDIR(st.st_mode)):
            continue
        yield entry
        if not stat.S_ISDIR(st.st_mode):
            continue
        if depth >= MAX_DEPTH:
            walk.skip(entry.path, "too_deep")
            continue
        try:
            cfd = os.open(name, _DIR, dir_fd=fd)
        except OSError as exc:
            walk.skip(entry.path, exc.strerror or "unreadable")
            continue
        try:
            try:
                cpath = _verify(cfd, "read", walk.grant)
            except _Fail:
                denied = walk.grant.deny_read is not None and walk.grant.deny_read.match(entry.path) is not None
                walk.skip(entry.path, "deny_read" if denied else "outside_roots")
                continue
            if walk.ignore is not None:
                walk.ignore.load(cfd, cpath)
            yield from _walk(walk, cfd, cpath, entry.rel, depth + 1)
        finally:
            os.close(cfd)


@contextmanager
def _search_root(ctx: _Ctx) -> Iterator[tuple[int, str, os.stat_result]]:
    real = ctx.target()
    ctx.check(real, "read")
    with _open(real, _READ, "read", ctx.grant) as (fd, rpath):
        st = os.fstat(fd)
        yield fd, rpath, st


def _grep(ctx: _Ctx) -> dict[str, Any]:
    call = ctx.call
    pattern = call.pattern or ""
    try:  # RE2: linear time, so no pattern can freeze the gateway (backreferences and lookaround are refused)
        regex = safe_regex(pattern)
    except ValueError as exc:
        raise _Fail("INVALID_INPUT", f"pattern: {exc}") from None
    glob = call.glob
    if glob is not None and not glob:
        raise _Fail("INVALID_INPUT", "glob: must not be empty")
    cap = call.max_results
    matches: list[dict[str, Any]] = []
    walk = _Walk(ctx.grant, [])
    searched = binary = 0
    budget = ctx.limits.read_bytes  # the text of all matches (paths, lines, context): the reply's bound

    def search(fd: int, shown: str) -> bool:
        """Grep one open file; False once the results are full."""
        nonlocal searched, binary, budget
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return True
        if st.st_size > ctx.limits.grep_file_bytes:
            walk.skip(shown, "too_large")
            return True
        try:
            data = _read_all(fd, ctx.limits.grep_file_bytes, shown)
        except _Fail:
            walk.skip(shown, "too_large")
            return True
        if b"\0" in data[:SNIFF_BYTES]:
            binary += 1
            return True
        searched += 1
        lines = data.decode("utf-8", "replace").split("\n")
        if len(lines) > 1 and not lines[-1]:  # the newline that ends the last line begins no other
            lines.pop()
        around = call.context
        for number, line in enumerate(lines, 1):
            line = line.removesuffix("\r")
            if regex.search(line):
                if len(matches) == cap:
                    return False
                match: dict[str, Any] = {"path": shown, "line": number, "text": line[:MAX_MATCH_CHARS]}
                if around:
                    match["before"] = [
                        x.removesuffix("\r")[:MAX_MATCH_CHARS] for x in lines[max(0, number - 1 - around) : number - 1]
                    ]
                    match["after"] = [x.removesuffix("\r")[:MAX_MATCH_CHARS] for x in lines[number : number + around]]
                # max_results alone does not bound the reply: 10,000 matches with 10 lines of context
                # each were 100 MB (serialised for minutes while every other call waited)
                size = sum(len(t.encode()) + 8 for t in (shown, match["text"], *match.get("before", ()),
                                                         *match.get("after", ())))  # fmt: skip
                if size > budget:
                    return False
                budget -= size
                matches.append(match)
        return True

    with _search_root(ctx) as (rfd, rpath, rst):
        if stat.S_ISREG(rst.st_mode):
            full = not search(rfd, ctx.show(rpath))
        elif stat.S_ISDIR(rst.st_mode):
            full = False
            walk.ignore = None if call.ignored else _ignore_rules(rfd, rpath, ctx.grant)
            with closing(_walk(walk, rfd, rpath)) as entries:
                for entry in entries:
                    if glob is not None and not _glob_filter(entry.rel, entry.name, glob):
                        continue
                    if not _grep_entry(ctx, walk, entry, search):
                        full = True
                        break
        else:
            raise _Fail("NOT_A_FILE", f"{ctx.show(rpath)} is not a regular file or directory")
    result: dict[str, Any] = {"matches": matches, "truncated": full, "files_searched": searched}
    if binary:
        result["binary_files_skipped"] = binary
    if walk.skipped_count:
        result["skipped"] = walk.skipped
        result["skipped_count"] = walk.skipped_count
    return result


def _grep_entry(ctx: _Ctx, walk: _Walk, entry: _Entry, search: Callable[[int, str], bool]) -> bool:
    shown = ctx.show(entry.path)
    mode = entry.st.st_mode
    if ctx.grant.deny_read is not None and ctx.grant.deny_read.match(entry.path) is not None:
        walk.skip(shown, "deny_read")  # a secret of the policy's: never searched
        return True
    try:
        if stat.S_ISREG(mode):
            with _open(entry.name, _READ, "read", ctx.grant, dir_fd=entry.dir_fd) as (fd, _):
                return search(fd, shown)
        if stat.S_ISLNK(mode):
            try:
                real = settled_realpath(entry.path)
                check_path(real, "read", ctx.grant)
            except PathRefused:
                walk.skip(shown, "symlink_outside_roots")
                return True
            with _open(real, _READ, "read", ctx.grant) as (fd, _):
                return search(fd, shown)
    except _Fail as f:
        walk.skip(shown, f.code.lower())
    except OSError as exc:
        walk.skip(shown, exc.strerror or "unreadable")
    return True


def _glob_filter(rel: str, name: str, glob: str) -> bool:
    """grep's `glob`: fnmatch on the path relative to the search root (`*` crosses `/`), or on
    the file name; a leading `**/` also matches at the top."""
    if fnmatchcase(rel, glob) or fnmatchcase(name, glob):
        return True
    return glob.startswith("**/") and fnmatchcase(rel, glob[3:])


def _glob_parts(pattern: str) -> list[str]:
    if not pattern or "\0" in pattern:
        raise _Fail("INVALID_INPUT", "pattern: a non-empty glob such as **/*.py")
    if pattern.startswith("/"):
        raise _Fail("INVALID_INPUT", f"pattern: {pattern!r} must be relative to path")
    if "/" not in pattern.rstrip("/"):
        pattern = "**/" + pattern  # a bare name matches at any depth, as in git
    parts: list[str] = []
    for part in pattern.split("/"):
        if part in ("", "."):
            continue
        if part == "**" and parts and parts[-1] == "**":
            continue
        parts.append(part)
    return parts


def _glob_match(pat: list[str], parts: list[str]) -> bool:
    """Path glob matching by components: `*`, `?` and `[...]` stay within one, `**` spans any
    number (zero included, but a trailing `**` at least one). Memoised, so it is linear in len(pat) * len(parts)."""
    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        key = (i, j)
        if key not in memo:
            if i == len(pat):
                found = j == len(parts)
            elif pat[i] == "**" and i == len(pat) - 1:
                found = j < len(parts)  # a trailing ** is everything under, not the directory itself
            elif pat[i] == "**":
                found = match(i + 1, j) or (j < len(parts) and match(i, j + 1))
            else:
                found = j < len(parts) and fnmatchcase(parts[j], pat[i]) and match(i + 1, j + 1)
            memo[key] = found
        return memo[key]

    return match(0, 0)


def _find(ctx: _Ctx) -> dict[str, Any]:
    call = ctx.call
    pat = _glob_parts(call.pattern or "")
    found: list[dict[str, Any]] = []
    full = False
    walk = _Walk(ctx.grant, [])
    with _search_root(ctx) as (rfd, rpath, rst):
        if not stat.S_ISDIR(rst.st_mode):
            raise _Fail("NOT_A_DIRECTORY", f"{ctx.show(rpath)} is not a directory")
        walk.ignore = None if call.ignored else _ignore_rules(rfd, rpath, ctx.grant)
        with closing(_walk(walk, rfd, rpath)) as entries:
            for entry in entries:
                if not _glob_match(pat, entry.rel.split("/")):
                    continue
                if len(found) == call.max_results:
                    full = True
                    break
                found.append({"path": ctx.show(entry.path), "type": _kind(entry.st.st_mode)})
    result: dict[str, Any] = {"matches": found, "truncated": full}
    if walk.skipped_count:
        result["skipped"] = walk.skipped
        result["skipped_count"] = walk.skipped_count
    return result


# write_output -----------------------------------------------------------------------------------


def _slug(name: str | None) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", (name or "").lower()).strip("-")[:64].strip("-")
    return slug or "output"


def _write_output(ctx: _Ctx) -> dict[str, Any]:
    call = ctx.call
    text = call.content or ""
    if call.format == "json":
        _parse_json(text, "content")
    data = _encode(text, "content")
    limit = ctx.limits.write_bytes
    if len(data) > limit:
        raise _Fail("FILE_TOO_LARGE", f"content is {len(data)} bytes, over the {limit}-byte write limit")
    out_real = settled_realpath(os.fspath(ctx.outputs_dir))
    ctx.check(out_real, "write")
    _make_dirs(out_real, ctx.grant, True, ctx.show(out_real))
    stem = f"{datetime.now().strftime('%Y%m%d%H%M%S')}-{_slug(call.name)}"  # seed 002's names: local time
    ext = ".json" if call.format == "json" else ".md"
    with _open(out_real, _DIR, "write", ctx.grant) as (dfd, dpath):
        for n in range(MAX_NAME_TRIES):
            fname = f"{stem}{ext}" if n == 0 else f"{stem}-{n}{ext}"
            check_path(os.path.join(dpath, fname), "write", ctx.grant)
            try:
                fd = os.open(fname, _NEW, 0o666, dir_fd=dfd)
            except FileExistsError:
                continue  # taken, by an earlier output or a concurrent call
            try:
                try:
                    where = _verify(fd, "write", ctx.grant)
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except BaseException:
                with suppress(OSError):
                    os.unlink(fname, dir_fd=dfd)
                raise
            _sync_dir(dfd)
            return {"path": ctx.show(where), "bytes": len(data)}
    raise _Fail("IO_ERROR", f"no free name for {stem}{ext} in {ctx.show(out_real)}")


_ACTIONS: dict[str, Callable[[_Ctx], dict[str, Any]]] = {
    "read": _read,
    "read_json": _read_json,
    "write": _write,
    "edit": _edit,
    "list": _list,
    "stat": _stat,
    "mkdir": _mkdir,
    "delete": _delete,
    "grep": _grep,
    "find": _find,
    "write_output": _write_output,
}
