"""The files an asked command runs, and an approval bound to their content.

A supervisor who approves `make build` or `bash deploy.sh` approves what those files say at the
time they read them. `named()` finds the files of the principal's roots an analysed command
runs: a script given to a shell or an interpreter (`bash x.sh`, `sh x`, `python3 x.py`, `node
x.js`, `perl x.pl`, `ruby x.rb`, a script on the interpreter's stdin: `bash < x.sh`), a program
named by a path (`./x.sh`, `tools/gen`), make's makefile (`-f F`, else GNUmakefile, makefile,
Makefile in the directory make runs in, `-C` included: the ones before the one make would read
are bound as absent, so planting one voids the approval), a patch (`git apply P`, `git am P`,
`patch -i P`, `patch < P`, `patch FILE P`). `bind()` reads each as the sandbox's account would
(its file-system identity; opened with openat2 beneath the root it lies in, so a symlink the
agent planted cannot lead the read out of the roots) and keeps its SHA-256 and size; `changed()`
reads them again and names each file whose content is not what was approved.

A file that cannot be bound (named by an expansion, unreadable, leading out of its root, too
large) is listed with its `error`: an approval of that call is void, as the supervisor is told.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.analysis import Command, RedirectMode, Word

MAX_BYTES = 64 << 20
"""A file larger than this is not read whole: it cannot be bound."""
MAX_FILES = 32
"""Files bound per call at most; a call naming more cannot be bound (an error entry)."""
MAX_CWDS = 16
"""Directories a text's `cd`s may lead to that are followed; past them nothing can be bound."""
HEAD_CHARS = 4000
"""Characters of each file shown to the supervisor (`approvals show`)."""

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
# per interpreter: options taking a value (apart), and options whose value is the program text
_INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "shell": (frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}), frozenset({"-c"})),
    "python": (frozenset({"-W", "-X", "-Q"}), frozenset({"-c", "-m"})),
    "node": (frozenset({"-r", "--require", "--import", "--loader"}), frozenset({"-e", "--eval", "-p", "--print"})),
    "perl": (frozenset({"-I", "-M", "-m", "-x"}), frozenset({"-e", "-E"})),
    "ruby": (frozenset({"-I", "-r", "-C"}), frozenset({"-e"})),
}
MAKEFILES = ("GNUmakefile", "makefile", "Makefile")


@dataclass(frozen=True)
class BoundFile:
    """One file an asked command runs, as the sandbox's account read it."""

    path: str
    """Absolute, as the command names it (relative to its cwd)."""
    why: str
    """What runs it (`make's makefile`, `bash's script`, ...)."""
    sha256: str | None = None
    """None: absent (or unreadable: see `error`)."""
    bytes: int | None = None
    error: str = ""
    head: str = ""
    """The first HEAD_CHARS characters (shown to the supervisor; not part of the binding)."""

    @property
    def state(self) -> tuple[str | None, int | None, str]:
        """What the approval binds."""
        return (self.sha256, self.bytes, self.error)

    def describe(self) -> str:
        if self.error:
            return f"{self.path}: cannot be bound ({self.error})"
        if self.sha256 is None:
            return f"{self.path}: absent"
        return f"{self.path}: {self.bytes} bytes, sha256 {self.sha256}"

    def to_json(self, head: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "why": self.why, "sha256": self.sha256, "bytes": self.bytes}
        if self.error:
            out["error"] = self.error
        if head and self.head:
            out["head"] = self.head
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> BoundFile:
        return BoundFile(
            str(data.get("path", "?")), str(data.get("why", "")), data.get("sha256"), data.get("bytes"),
            str(data.get("error", "")), str(data.get("head", "")),
        )  # fmt: skip


def _interpreter(program: str) -> str | None:
    name = os.path.basename(program)
    if name in SHELLS:
        return "shell"
    for family in ("python", "node", "perl", "ruby"):
        if name == family or (name.startswith(family) and all(c.isdigit() or c == "." for c in name[len(family) :])):
            return family
    return None


def _stdin_of(cmd: Command) -> Word | None:
    return next((r.target for r in cmd.redirects if r.mode is RedirectMode.READ and r.fd in (None, 0)), None)


def _script(cmd: Command, family: str) -> list[Word]:
    """The script an interpreter runs: its first operand, else its stdin; none with -c/-e/-m."""
    takes, inline = _INTERPRETERS[family]
    words = list(cmd.argv[1:])
    k = 0
    while k < len(words):
        v = words[k].value
        if v == "--":
            k += 1
            break
        if not v.startswith(("-", "+")) or v in ("-", "+"):
            break
        flag = v.split("=", 1)[0]
        if flag in inline or (family == "shell" and v.startswith("-") and not v.startswith("--") and "c" in v[1:]):
            return []  # the program text is an argument: the analyser read it, no file runs it
        if family in ("python", "perl", "ruby") and len(v) > 2 and v[:2] in inline:
            return []  # -cTEXT, -eTEXT
        k += 2 if flag in takes and "=" not in v else 1
    if k < len(words):
        return [words[k]] if words[k].value != "-" else ([w] if (w := _stdin_of(cmd)) else [])
    stdin = _stdin_of(cmd)
    return [stdin] if stdin is not None else []


def _make(cmd: Command) -> tuple[list[Word], Word | None]:
    """make's `-f` files and its `-C` directory (the last one given)."""
    files: list[Word] = []
    directory: Word | None = None
    words = list(cmd.argv[1:])
    k = 0
    while k < len(words):
        v = words[k].value
        nxt = words[k + 1] if k + 1 < len(words) else None
        if v in ("-f", "--file", "--makefile", "-C", "--directory") and nxt is not None:
            if v in ("-C", "--directory"):
                directory = nxt
            else:
                files.append(nxt)
            k += 2
            continue
        if v.startswith(("--file=", "--makefile=")):
            files.append(Word(v.split("=", 1)[1], words[k].expansions))
        elif v.startswith("-f") and not v.startswith("--") and len(v) > 2:
            files.append(Word(v[2:], words[k].expansions))
        elif v.startswith("--directory="):
            directory = Word(v.split("=", 1)[1], words[k].expansions)
        elif v.startswith("-C") and len(v) > 2:
            directory = Word(v[2:], words[k].expansions)
        k += 1
    return files, directory


def _git_patches(cmd: Command) -> tuple[list[Word], list[Word]]:
    """git apply's / git am's patches, and the `-C` directories they are relative to."""
    args = list(cmd.argv[1:])
    k = 0
    dirs: list[Word] = []
    while k < len(args) and args[k].value.startswith("-"):
        if args[k].value == "-C" and k + 1 < len(args):
            dirs.append(args[k + 1])
        k += 2 if args[k].value in ("-C", "-c", "--git-dir", "--work-tree", "--namespace") else 1
    if k >= len(args) or args[k].value not in ("apply", "am"):
        return [], dirs
    operands = [w for w in args[k + 1 :] if not w.value.startswith("-")]
    stdin = _stdin_of(cmd)
    return operands or ([stdin] if stdin is not None else []), dirs


def _patches(cmd: Command) -> list[Word]:
    """patch's patch files: -i, its second operand, else its stdin."""
    args = list(cmd.argv[1:])
    out: list[Word] = []  # patch
    operands: list[Word] = []
    k = 0
    while k < len(args):
        v = args[k].value
        if v in ("-i", "--input") and k + 1 < len(args):
            out.append(args[k + 1])
            k += 2
            continue
        if v.startswith("--input="):
            out.append(Word(v[len("--input=") :], args[k].expansions))
        elif v.startswith("-i") and len(v) > 2:
            out.append(Word(v[2:], args[k].expansions))
        elif v in ("-o", "--output", "-r", "--reject-file", "-d", "--directory", "-B", "-D", "-p", "-F", "-V", "-z"):
            k += 2
            continue
        elif not v.startswith("-"):
            operands.append(args[k])
        k += 1
    if len(operands) >= 2:
        out.append(operands[1])
    stdin = _stdin_of(cmd)
    if not out and stdin is not None:
        out.append(stdin)
    return out


def named(commands: Iterable[Command], cwd: Path, home: Path | None = None) -> list[tuple[str, str]]:
    """(path, why) for every file of the text's commands that a program runs, paths absolute
    (relative ones against every directory a `cd` of the text may have led to). A word with an
    expansion is kept as its text, prefixed with `?` (it cannot be bound)."""
    cwds = [cwd]
    out: dict[str, str] = {}

    def add(word: Word, why: str, bases: list[Path] | None = None) -> None:
        if not word.literal:
            out.setdefault(f"?{word.raw or word.value}", why)
            return
        for base in cwds if bases is None else bases:
            joined = os.path.join(str(base), word.value)
            # `..` is left to the kernel: resolved beneath the root, where a link on the way leads
            path = joined if ".." in Path(word.value).parts else os.path.normpath(joined)
            out.setdefault(path, why)

    for cmd in commands:
        if not cmd.argv:
            continue
        program = cmd.program
        name = os.path.basename(program)
        if name in ("cd", "pushd"):
            target = next((w for w in cmd.argv[1:] if not w.value.startswith("-")), None)
            if target is None and home is not None:
                cwds = [*cwds, home]
            elif target is not None and target.literal:
                cwds = [*cwds, *(Path(os.path.normpath(os.path.join(str(c), target.value))) for c in cwds)]
            else:
                out.setdefault(f"?{target.raw if target is not None else name}", f"{name}'s directory")
            cwds = list(dict.fromkeys(cwds))
            if len(cwds) > MAX_CWDS:
                out.setdefault("?cd", f"more than {MAX_CWDS} directories the text may cd to")
                cwds = cwds[:MAX_CWDS]
            continue
        if "/" in program:
            add(cmd.argv[0], "the program itself")
        family = _interpreter(program)
        if family is not None:
            for word in _script(cmd, family):
                add(word, f"{name}'s script")
        elif name in ("make", "gmake"):
            files, directory = _make(cmd)
            bases = cwds
            if directory is not None:
                if not directory.literal:
                    add(directory, "make -C's directory")
                    continue
                bases = [Path(os.path.normpath(os.path.join(str(c), directory.value))) for c in cwds]
            for word in files:
                add(word, "make's makefile", bases)
            if not files:
                for base in bases:
                    for candidate in MAKEFILES:
                        add(Word(candidate), "make's makefile", [base])
                        if os.path.lexists(os.path.join(base, candidate)):
                            break  # make reads the first that exists: the ones before it bound as absent
        elif name == "patch":
            for word in _patches(cmd):
                add(word, "patch's patch")
        elif name == "git":
            patches, dirs = _git_patches(cmd)
            bases = cwds
            for d in dirs:  # each -C is relative to the one before
                if not d.literal:
                    add(d, "git -C's directory")
                    bases = []
                    break
                bases = [Path(os.path.normpath(os.path.join(str(b), d.value))) for b in bases]
            for word in patches:
                add(word, "git's patch", bases)
    return list(out.items())


def _root_of(path: str, roots: tuple[Path, ...]) -> Path | None:
    """The deepest root `path` lies in (lexically)."""
    best: Path | None = None
    for root in roots:
        r = str(root)
        if (path == r or path.startswith(r.rstrip("/") + "/")) and (best is None or len(r) > len(str(best))):
            best = root
    return best


def _read(path: str, why: str, root: Path) -> BoundFile:
    """`path` read beneath `root` (never leaving it, whatever links lie on the way), hashed."""
    from gateway.sandbox.descriptors import RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, open_absolute, openat2

    relative = os.path.relpath(path, root)
    try:
        top = open_absolute(str(root))
    except OSError as exc:
        return BoundFile(path, why, error=f"its root {root} cannot be opened: {exc.strerror or exc}")
    try:
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        fd = openat2(top.fd, relative, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return BoundFile(path, why)
        if exc.errno == errno.EXDEV:
            return BoundFile(path, why, error=f"a link on the way leads out of the root {root}")
        return BoundFile(path, why, error=exc.strerror or str(exc))
    finally:
        os.close(top.fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return BoundFile(path, why, error="not a regular file")
        if st.st_size > MAX_BYTES:
            return BoundFile(path, why, error=f"{st.st_size} bytes: larger than {MAX_BYTES} to bind")
        digest = hashlib.sha256()
        head = b""
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_BYTES:
                return BoundFile(path, why, error=f"grew past {MAX_BYTES} bytes while read")
            digest.update(chunk)
            if len(head) < HEAD_CHARS * 4:
                head += chunk[: HEAD_CHARS * 4 - len(head)]
        return BoundFile(path, why, digest.hexdigest(), size, head=head.decode("utf-8", "replace")[:HEAD_CHARS])
    except OSError as exc:
        return BoundFile(path, why, error=exc.strerror or str(exc))
    finally:
        os.close(fd)


def bind(found: list[tuple[str, str]], roots: tuple[Path, ...]) -> tuple[BoundFile, ...]:
    """Read each file of `found` that lies in one of `roots` as the sandbox's account would.
    Files outside every root (a system program) are not the workspace's: not bound."""
    from gateway.sandbox import identity

    todo: list[tuple[str, str, Path | None]] = []
    for path, why in found:
        if path.startswith("?"):
            todo.append((path[1:], why, None))
            continue
        root = _root_of(path, roots)
        if root is not None:
            todo.append((path, why, root))
    if len(todo) > MAX_FILES:
        return (BoundFile(f"{len(todo)} files", "the command", error=f"more than {MAX_FILES} files to bind"),)
    out: list[BoundFile] = []
    try:
        with identity.acting_as_sandbox():
            for path, why, root in todo:
                if root is None:
                    out.append(BoundFile(path, why, error="named by an expansion: known only at run time"))
                else:
                    out.append(_read(path, why, root))
    except identity.ActAsUnavailable as exc:
        return tuple(BoundFile(p, w, error=f"cannot read as the sandbox's account: {exc}") for p, w, _ in todo)
    return tuple(out)


def changed(bound: tuple[BoundFile, ...], roots: tuple[Path, ...], base: Path | None = None) -> list[str]:
    """Each bound file whose content is not what was approved now (read again the same way), as
    `PATH changed after approval` (or `appeared`, `is gone`, `cannot be bound`); paths inside
    `base` are named relative to it."""
    if not bound:
        return []

    def shown(path: str) -> str:
        if base is not None and path.startswith(str(base).rstrip("/") + "/"):
            return os.path.relpath(path, base)
        return path

    now = {f.path: f for f in bind([(f.path, f.why) for f in bound if f.sha256 is not None or not f.error], roots)}
    out = []
    for was in bound:
        if was.error:
            out.append(f"{shown(was.path)} cannot be bound ({was.error})")
            continue
        new = now.get(was.path)
        if new is None or new.state == was.state:
            continue
        if new.error:
            out.append(f"{shown(was.path)} cannot be read any more ({new.error})")
        elif was.sha256 is None:
            out.append(f"{shown(was.path)} appeared after approval")
        elif new.sha256 is None:
            out.append(f"{shown(was.path)} is gone after approval")
        else:
            out.append(f"{shown(was.path)} changed after approval")
    return out
