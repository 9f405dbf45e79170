"""Every model against the real program: each option that can lead to an allow is run, in the
gateway's sandbox, under `strace -f`, and every file the program opens, creates, renames or
removes (outside the system runtime) and every program it execs must be one its model reported.

A model is data someone wrote from a man page; this is what keeps it honest. A value-taking
option modelled as a flag, a file option modelled as a pattern, an operand taken for a pattern:
each shows up here as a file the program opened that the model did not report, which the path
jail would never have checked.

Options whose use the model refuses, or which run code (so no rule relying on the model ever
allows them), are not run. Each option is run in every spelling, with its value as a separate
word and attached, so a getopt detail the model got wrong (a short spelling taking a value the
long one does not) shows too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway import sandbox
from gateway.analysis import analyze
from gateway.executors import shell
from gateway.programs import model_for, read
from gateway.programs.schema import Kind, Option, ProgramModel
from gateway.sandbox.identity import hand_over
from gateway.sandbox.quotas import Quotas

STRACE = shutil.which("strace")
pytestmark = pytest.mark.skipif(STRACE is None, reason="needs strace (make test installs it)")

Q = Quotas(memory_bytes=1 << 30, pids=256, cpu_seconds=120, file_bytes=1 << 30, open_files=256, tmpfs_bytes=64 << 20)
SYSTEM = ("/usr/", "/lib/", "/lib64/", "/etc/", "/proc/", "/sys/", "/dev/")
"""The system runtime the sandbox shows every command (docs/sandbox.md)."""
SYSTEM_DIRS = frozenset({"/", *(d.rstrip("/") for d in SYSTEM), "/run"})
NSS = ("/run/userdb", "/run/systemd/userdb", "/run/host/userdb", "/run/host")
SYSCALLS = "open,openat,openat2,creat,execve,execveat,rename,renameat,renameat2,unlink,unlinkat,rmdir,mkdir,mkdirat"

# A value for each option whose value the model calls `other` (a number, a name, a format): the
# model does not say what it must look like, so the test does. A new `other` option needs a row.
OTHER = {
    "grep": {"-X": "grep", "-m": "1", "--label": "x", "--binary-files": "text", "-d": "read", "-D": "read",
             "-B": "1", "-A": "1", "-C": "1", "--group-separator": "--", "--color": "never"},
    "sort": {"--sort": "numeric", "--batch-size": "2", "--check": "quiet", "-k": "1", "-S": "1M", "-t": ",",
             "--parallel": "1"},
    "head": {"-c": "5", "-n": "1"},
    "tail": {"-c": "5", "--follow": "name", "-n": "1", "--max-unchanged-stats": "1", "--pid": "99999", "-s": "0.01"},
    "sed": {"-i": ".bak", "-l": "5"},
    "find": {"-D": "stat", "-regextype": "posix-extended", "-maxdepth": "1", "-mindepth": "0", "-amin": "-1",
             "-atime": "-1", "-cmin": "-1", "-ctime": "-1", "-mmin": "-1", "-mtime": "-1", "-used": "1", "-gid": "0",
             "-uid": "0", "-inum": "1", "-links": "1", "-size": "-1M", "-perm": "-000", "-type": "f", "-xtype": "f",
             "-user": "root", "-group": "root", "-fstype": "ext4", "-context": "x",
             "-printf": "%p\\n", "-fprintf": "%p\\n",
             "-newerat": "2020-01-01", "-newerct": "2020-01-01", "-newermt": "2020-01-01", "-newerBt": "2020-01-01"},
    "awk": {"-F": ",", "-v": "x=1", "-L": "fatal", "-D": "x"},
    "uniq": {"--all-repeated": "separate", "-f": "1", "--group": "append", "-s": "1", "-w": "2"},
    "jq": {"--indent": "2", "--arg": "a", "--argjson": "a", "--slurpfile": "a", "--argfile": "a", "--rawfile": "a"},
    "rg": {"-A": "1", "--after-context": "1", "-B": "1", "--before-context": "1", "-C": "1", "--context": "1",
           "--color": "never", "--colors": "match:fg:red", "--context-separator": "--", "--dfa-size-limit": "10M",
           "-E": "utf-8", "--encoding": "utf-8", "--engine": "default", "--field-context-separator": "-",
           "--field-match-separator": ":", "-M": "100", "--max-columns": "100", "-m": "1", "--max-count": "1",
           "--max-depth": "1", "--max-filesize": "1M", "--path-separator": "/", "--regex-size-limit": "10M",
           "-r": "x", "--replace": "x", "--sort": "path", "--sortr": "path", "-j": "1", "--threads": "1", "-t": "py",
           "--type": "py", "--type-add": "foo:*.foo", "--type-clear": "py", "-T": "py", "--type-not": "py"},
    "tar": {"--hole-detection": "seek", "--level": "0", "--sparse-version": "1.0", "--group": "root", "--mode": "644",
            "--owner": "root", "--sort": "name", "--xattrs-exclude": "x", "--xattrs-include": "x", "-L": "1000",
            "--tape-length": "1000", "-b": "20", "--blocking-factor": "20", "--record-size": "10240", "-H": "gnu",
            "--format": "gnu", "--pax-option": "delete=x", "-V": "x", "--label": "x", "-K": "x", "--starting-file": "x",
            "--newer-mtime": "2020-01-01", "--suffix": "~", "--strip-components": "1", "--transform": "s/a/b/",
            "--xform": "s/a/b/", "--no-quote-chars": "x", "--quote-chars": "x", "--quoting-style": "literal",
            "--warning": "all", "--occurrence": "1", "--atime-preserve": "system", "--backup": "simple",
            "--checkpoint": "1", "--totals": "SIGUSR1"},
    "printf": {"-v": "x"},
    "base64": {"-w": "76", "--wrap": "76"},
    "comm": {"--output-delimiter": ","},
    "man": {"--warnings": "w", "-R": "UTF-8", "--recode": "UTF-8", "-L": "C", "--locale": "C", "-m": "x",
            "--systems": "x", "-S": "1", "-s": "1", "--sections": "1", "-e": "x", "--extension": "x", "-r": "x",
            "--prompt": "x", "-E": "ascii", "--encoding": "ascii", "-p": "t", "--preprocessor": "t", "-T": "utf8",
            "--troff-device": "utf8"},
    "zip": {"-ds": "10m", "--dot-size": "10m", "-n": ".gz", "--suffixes": ".gz", "-t": "2020-01-01",
            "--from-date": "2020-01-01", "-tt": "2030-01-01", "--before-date": "2030-01-01", "-Z": "deflate",
            "--compression-method": "deflate", "-UN": "warn", "--unicode": "warn", "-P": "pw", "--password": "pw"},
    "unzip": {"-P": "pw"},
}  # fmt: skip
# what each program is given besides the option (its pattern or script first, where it has one)
OPERANDS = {
    "grep": ["pat", "in.txt"],
    "sed": ["p", "in.txt"],
    "awk": ["{print}", "in.txt"],
    "find": ["dir"],
    "uniq": ["in.txt", "w0.out"],
    "jq": [".", "in.txt"],
    "rg": ["pat", "in.txt"],
    "tar": ["-f", "a.tar", "in.txt"],
    "printf": ["%s\\n", "in.txt"],
    "comm": ["in.txt", "in2.txt"],
    "man": ["ls"],
    "zip": ["a.zip", "in.txt"],
    "unzip": ["a.zip"],
}
# programs that do nothing without a mode: each option is run in each of these (and a mode
# option on its own)
MODES = {"tar": [["-c"], ["-x"]]}
MODE_OPTIONS = frozenset({"-A", "-c", "--delete", "-d", "-r", "--test-label", "-t", "-u", "-x"})
# programs whose every word is a value (grammar: words): forms to run, each word also a file
WORDS = {
    "ps": [["ps", "aux"], ["ps", "-ef"], ["ps", "-eo", "pid,comm", "--sort=-pid"], ["ps", "-p", "1", "-o", "comm="],
           ["ps", "--forest", "-e"], ["ps", "axjf"], ["ps", "-u", "root", "u"]],
    "kill": [["kill", "-l"], ["kill", "-0", "1"], ["kill", "-s", "0", "1"], ["kill", "-l", "9"], ["kill", "-L"]],
    "echo": [["echo", "in.txt"], ["echo", "-n", "in.txt", "--help"], ["echo", "-e", "in.txt\\n"], ["echo", "--", "-E"]],
}  # fmt: skip
# programs a model's options make the program run that are not the agent's choice: the fixed
# compressors tar runs for -z, -j, -J...
EXECS = {
    "tar": ("gzip", "bzip2", "xz", "lzip", "lzma", "lzop", "zstd", "compress", "gunzip", "uncompress"),
    # man formats with groff and its helpers, and pages through PAGER (cat: executors/shell.py)
    "man": ("man", "groff", "nroff", "troff", "grotty", "preconv", "tbl", "eqn", "neqn", "pic", "refer", "vgrind",
            "grap", "col", "cat", "zsoelim", "manconv", "gtbl", "geqn", "gpic", "grefer", "iconv", "gzip", "mandb",
            "locale"),
}  # fmt: skip
# files a program reads by its own lookup, never named by a word: rg's ignore files, in the
# directories it searches and their parents, and git's global ignore file in HOME
LOOKUPS = {"rg": (".gitignore", ".ignore", ".rgignore", "exclude", "ignore")}
# scripts: what their parsers (gateway/programs/sed.py, awk.py) say they read and write
SCRIPTS = {
    "sed": [["sed", "-n", "w w1.out", "in.txt"], ["sed", "1r r2.txt", "in.txt"], ["sed", "s/pat/x/w w3.out", "in.txt"],
            ["sed", "-n", "/pat/W w4.out", "in.txt"], ["sed", "1R r5.txt", "in.txt"],
            ["sed", "-n", "w w6.out; p", "in.txt"],
            ["sed", "1a r7.txt; w w7.out", "in.txt"], ["sed", "-e", "1{r r8.txt", "-e", "}", "in.txt"],
            ["sed", "-s", "-n", "$w w9.out", "in.txt", "r10.txt"]],
    "awk": [["awk", '{print > "w1.out"}', "in.txt"], ["awk", '{print $1 >> "w2.out"}', "in.txt"],
            ["awk", '$1 > 0 {print ($1 > 2) > "w3.out"}', "in.txt"],
            ["awk", "-F,", "{print $2}", "in.txt", "x=1", "r4.txt"],
            ["awk", '{printf("%s\\n", $0) > "/dev/stderr"}', "in.txt"]],
}  # fmt: skip
# tail's following options stop at once: the process --pid names does not exist in the sandbox
FOLLOW = ["--pid=99999", "-s", "0.01"]


@dataclass
class Case:
    argv: list[str]
    trace: str


def _value(model: ProgramModel, opt: Option, name: str, kind: Kind, n: int) -> str | None:
    if kind is Kind.READ:
        return f"r{n}.txt"
    if kind is Kind.WRITE:
        return f"w{n}.out"
    if kind is Kind.PATTERN:
        return "pat"
    if kind is Kind.SCRIPT:
        return "p" if model.language == "sed" else "{print}"
    if kind is Kind.OTHER:
        values = OTHER.get(model.program, {})
        for spelling in (name, *opt.names):
            if spelling in values:
                return values[spelling]
        raise AssertionError(f"{model.program} {name}: no test value for this option in OTHER")
    return None  # program, script file, command: never allowed through the model


def cases(model: ProgramModel) -> list[list[str]]:
    if model.grammar == "words":
        return WORDS[model.program]
    out: list[list[str]] = []
    n = 0
    for opt in (*model.options, *model.primaries):
        never_allowed = any(k in (Kind.PROGRAM, Kind.SCRIPT_FILE, Kind.COMMAND) for k in opt.kinds)
        if opt.runs_code or opt.unsupported or never_allowed or opt.first_operand is Kind.SCRIPT_FILE:
            continue
        if opt.names[0] in ("--help", "-help", "--version", "-version", "-V", "-h") and model.program != "grep":
            continue
        for name in opt.names:
            n += 1
            operands = list(OPERANDS.get(model.program, ["in.txt"]))
            if opt.replaces_first:
                operands = operands[1:]
            extra = FOLLOW if model.program == "tail" and name in ("-f", "-F", "--follow", "--retry") else []
            values = [_value(model, opt, name, k, n + i) for i, k in enumerate(opt.kinds)]
            if any(v is None for v in values):
                continue
            words = [str(v) for v in values]
            if model.grammar == "find":  # leading options before the starting points, primaries after
                lead = opt in model.options
                before, after = ([name, *words], []) if lead else ([], [name, *words])
                out.append([model.program, *before, *operands, *after])
                continue
            if not words:
                forms = [[name]]
            elif opt.optional:
                forms = [[name], [name + ("=" if name.startswith("--") else "") + words[0]]]
            elif opt.separate_only or len(words) > 1:
                forms = [[name, *words]]
            else:
                forms = [[name, *words], [name + ("=" if name.startswith("--") else "") + words[0]]]
            modes = MODES.get(model.program, [[]])
            if any(n in MODE_OPTIONS for n in opt.names):
                modes = [[]]
            out += [[model.program, *mode, *f, *extra, *operands] for f in forms for mode in modes]
    return out + SCRIPTS.get(model.program, [])


def _prepare(ws: Path, argv: list[str]) -> None:
    """Every word is also a file (a pattern, a number, a name): if the program opens a word the
    model took for something else, the trace shows it."""
    (ws / "in.txt").write_text("pat\nb,2\na,1\n")
    (ws / "dir").mkdir(exist_ok=True)
    (ws / "dir" / "inner.txt").write_text("pat\n")
    if argv[0] == "tar" and not (ws / "a.tar").exists():
        with tarfile.open(ws / "a.tar", "w") as t:
            t.add(ws / "in.txt", "in.txt")
    if argv[0] in ("zip", "unzip"):  # a fresh archive each time: zip -m, -d change it
        with zipfile.ZipFile(ws / "a.zip", "w") as z:
            z.write(ws / "in.txt", "in.txt")
    if argv[0] == "comm":
        (ws / "in2.txt").write_text("b,2\npat\n")
    for w in argv[1:]:
        plain = w and "/" not in w and w not in (".", "..") and w[0] != "-"
        if plain and not re.fullmatch(r"w\d+\.out", w) and not (ws / w).exists():
            (ws / w).write_text("pat\n")


_CALL = re.compile(r"^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+|\?)")
_ARG = re.compile(r'(?:(\d+|AT_FDCWD)(?:<([^>]*)>)?,\s*)?"((?:[^"\\]|\\.)*)"')


def _events(trace: str, cwd: str) -> list[tuple[str, list[str], str]]:
    """(syscall, its absolute paths, its arguments) for each call in the trace, failed ones
    included: an attempt to open a file the model did not report is the model's error too."""
    out: list[tuple[str, list[str], str]] = []
    for line in trace.splitlines():
        m = _CALL.match(line)
        if not m:
            continue
        call, args = m.group(2), m.group(3)
        paths = []
        for _fd, dirpath, path in _ARG.findall(args):
            path = bytes(path, "utf-8").decode("unicode_escape")
            paths.append(os.path.normpath(os.path.join(dirpath or cwd, path)))
        if paths:
            out.append((call, paths if call.startswith("rename") else paths[:1], args))
    return out


def _explained(path: str, allowed: list[str]) -> bool:
    return any(path == a or path.startswith(a.rstrip("/") + "/") for a in allowed)


MODELLED = [
    "grep",
    "sort",
    "sed",
    "head",
    "tail",
    "cat",
    "wc",
    "find",
    "awk",
    "uniq",
    "jq",
    "rg",
    "tar",
    "ps",
    "kill",
    "echo",
    "printf",
    "base64",
    "comm",
    "man",
    "zip",
    "unzip",
]


@pytest.mark.parametrize("program", MODELLED)
def test_the_program_opens_only_what_its_model_reports(tmp_path: Path, program: str) -> None:
    model = model_for(program)
    assert model is not None
    ws = tmp_path / "ws"
    ws.mkdir()
    all_cases = cases(model)
    assert all_cases, program
    lines = []
    for i, argv in enumerate(all_cases):
        _prepare(ws, argv)
        lines.append(f"strace -f -qq -y -o .t{i} -e trace={SYSCALLS} {shlex.join(argv)} </dev/null >/dev/null 2>&1")
    hand_over(ws)
    profile = sandbox.Profile(
        principal="agent", read_roots=(ws,), write_roots=(ws,), protected=(), private=(), quotas=Q
    )
    out = shell.run("\n".join(lines), ws, profile, timeout_ms=300_000)
    assert out["exit_code"] is not None and not out["timed_out"], out
    problems: list[str] = []
    binary = os.path.realpath(shutil.which(program) or program)
    for i, argv in enumerate(all_cases):
        trace = (ws / f".t{i}").read_text()
        (cmd,) = analyze(shlex.join(argv), second_opinion_enabled=False).commands
        reading = read(model, cmd)
        if reading.refused or reading.runs:
            why = reading.refused or reading.runs
            problems.append(f"{shlex.join(argv)}: the model refuses it or says it runs code ({why})")
            continue
        unknown = any(not w.literal for w in reading.reads)  # --files0-from: the sandbox bounds them
        unknown_writes = any(not w.literal for w in reading.writes)  # tar -x: the members, bounded likewise
        reads = [os.path.normpath(ws / w.value) for w in reading.reads if w.literal]
        writes = [os.path.normpath(ws / w.value) for w in reading.writes if w.literal]
        events = _events(trace, str(ws))
        if not any(c.startswith("exec") and os.path.realpath(p[0]) == binary for c, p, _ in events):
            problems.append(f"{shlex.join(argv)}: the trace does not show {binary} starting: {trace[:300]!r}")
        # a temporary renamed onto a written file (sed -i writes ./sedXXXXXX, then renames it)
        temporaries = {p[0] for c, p, _ in events if c.startswith("rename") and _explained(p[-1], writes)}
        for call, paths, args in events:
            path = paths[0]
            if call.startswith("rename"):
                if not all(_explained(p, writes) or p in temporaries for p in paths):
                    problems.append(f"{shlex.join(argv)}: {call} {paths}, not in the model's writes {writes}")
                continue
            if call.startswith("exec"):
                # tar runs its compressor through /bin/sh -c, with fixed text
                through_sh = re.search(r'"-c", "(\w+)', args) if os.path.basename(path) == "sh" else None
                fixed = os.path.basename(path) in EXECS.get(program, ()) or (
                    through_sh is not None and through_sh.group(1) in EXECS.get(program, ())
                )
                if os.path.realpath(path) != binary and not path.endswith("/strace") and not fixed:
                    problems.append(f"{shlex.join(argv)}: execs {path}")
                continue
            if path.startswith(SYSTEM) or path in SYSTEM_DIRS:
                continue
            if path.startswith(NSS) and not re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC", args):
                continue  # a user or group name looked up (tar --owner, ps -u): systemd's userdb
            looked_up = os.path.basename(path) in LOOKUPS.get(program, ()) or path.startswith(HOME + "/")
            if looked_up and not re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC", args):
                continue
            if path.startswith(str(ws) + "/.t") or path == str(ws):
                continue  # the trace itself, the cwd (always checked by the jail)
            writing = call in ("creat", "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat") or bool(
                re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC", args)
            )
            if writing:
                ok = unknown_writes or _explained(path, writes) or path in temporaries
            else:
                ok = unknown or _explained(path, reads) or _explained(path, writes)
            if not ok:
                access = "write" if writing else "read"
                problems.append(f"{shlex.join(argv)}: {call} {path} ({access}), not in {reads} / writes {writes}")
    assert not problems, "\n".join(problems[:30])


# --- git, per subcommand -------------------------------------------------------------------
# what each subcommand is given after the option, and what is done first in the case's copy of
# the repository (a tracked in.txt, a clean tree, one commit)
GIT_OPERANDS = {
    "diff": ["in.txt"], "log": ["in.txt"], "show": ["in.txt"], "rev-parse": ["HEAD"], "status": ["in.txt"],
    "ls-files": ["in.txt"], "grep": ["pat", "in.txt"], "add": ["in.txt"], "commit": ["-m", "msg"], "switch": [],
    "checkout": ["in.txt"], "restore": ["in.txt"], "rm": ["in.txt"], "mv": ["in.txt", "moved.txt"],
    "reset": ["HEAD"], "branch": [],
}  # fmt: skip
GIT_PRELUDE = {
    "add": "echo more >> in.txt", "commit": "echo more >> in.txt && git add in.txt",
    "checkout": "echo more >> in.txt", "restore": "echo more >> in.txt", "diff": "echo more >> in.txt",
}  # fmt: skip
GIT_OTHER = {
    "-n": "1", "--max-count": "1", "--skip": "0", "-U": "1", "--unified": "1", "--since": "2020-01-01",
    "--after": "2020-01-01", "--until": "2030-01-01", "--before": "2030-01-01", "--format": "%H", "--date": "iso",
    "--color": "never", "--diff-filter": "M", "-m": "msg", "--abbrev": "7", "--short": "7", "--max-depth": "1",
    "--threads": "1", "-A": "1", "-B": "1", "-C": "1", "--context": "1", "--after-context": "1",
    "--before-context": "1", "--chmod": "+x", "--conflict": "merge", "--cleanup": "strip", "--porcelain": "v1",
    "-u": "all", "--untracked-files": "all", "--ignored": "traditional", "--ignore-submodules": "all",
    "--column": "never", "--stat": "80", "--dirstat": "files", "--word-diff": "plain", "--submodule": "log",
    "--color-moved": "no", "--pretty": "oneline", "--decorate": "short", "--author": "a", "--date-order": "",
    "-s": "HEAD", "--source": "HEAD", "-c": "HEAD", "--reedit-message": "HEAD", "--reuse-message": "HEAD",
    "--fixup": "HEAD", "--squash": "HEAD", "--path-format": "absolute", "--default": "HEAD",
    "--recurse-submodules": "no", "-t": "direct", "--track": "direct", "--sort": "refname", "--format=": "%(refname)",
}  # fmt: skip
# switch, checkout, reset and restore rewrite tracked files of the work tree (any of them, for a
# revision): the repository's own files, which the sandbox bounds to the write roots
HOME = "/home/agent"
"""The sandbox's private HOME (a tmpfs): git looks for its user configuration there."""
GIT_METADATA = frozenset({".gitattributes", ".gitignore", ".mailmap", ".gitmodules"})
GIT_EXECS = ("/usr/lib/git-core/git", "/usr/bin/false", "/usr/bin/cat")
"""git running itself (commit's gc --auto), and the editor and pager the sandbox sets (core.editor=false,
core.pager=cat: sandbox/git.py): never a program of the agent's choosing."""
TREE_WRITERS = ("switch", "checkout", "reset", "restore", "rm", "mv")


def git_cases(model: ProgramModel) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    n = 0
    for sub in GIT_OPERANDS:
        m = model.subcommand(sub)
        assert m is not None, sub
        for opt in m.options:
            never = any(k in (Kind.PROGRAM, Kind.SCRIPT_FILE, Kind.COMMAND) for k in opt.kinds)
            if opt.runs_code or opt.unsupported or never or opt.ends_options:
                continue
            for name in opt.names:
                n += 1
                operands = list(GIT_OPERANDS[sub])
                if opt.replaces_first:
                    operands = operands[1:]
                words: list[str] = []
                for k in opt.kinds:
                    if k is Kind.READ:
                        words.append(f"r{n}.txt")
                    elif k is Kind.WRITE:
                        words.append(f"w{n}.out")
                    elif k is Kind.PATTERN:
                        words.append("pat")
                    else:
                        words.append(GIT_OTHER.get(name, "x"))
                if not words:
                    forms = [[name]]
                elif opt.optional:
                    forms = [[name], [name + ("=" if name.startswith("--") else "") + words[0]]]
                elif opt.separate_only:
                    forms = [[name, *words]]
                else:
                    forms = [[name, *words], [name + ("=" if name.startswith("--") else "") + words[0]]]
                out += [(sub, ["git", sub, *f, *operands]) for f in forms]
    return out


def test_git_opens_only_what_its_model_reports(tmp_path: Path) -> None:
    """Each case runs in its own copy of a one-commit repository, as the workspace (a repository
    nested in a write root is quarantined: sandbox/git.py), in a sandbox that leaves .git
    writable as for a git write."""
    model = model_for("git")
    assert model is not None
    base = tmp_path / "base"
    base.mkdir()
    git = ["git", "-c", "user.name=a", "-c", "user.email=a@example.com", "-C", str(base)]
    (base / "in.txt").write_text("pat\nb,2\n")
    for argv in (["init", "-q"], ["add", "in.txt"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *argv], check=True, capture_output=True)
    all_cases = git_cases(model)
    outputs: list[dict[str, object]] = []
    for i, (sub, argv) in enumerate(all_cases):
        case = tmp_path / f"c{i}"
        shutil.copytree(base, case, symlinks=True)
        for w in argv[2:]:
            if re.fullmatch(r"r\d+\.txt", w):
                (case / w).write_text("pat\n")
        hand_over(case)
        profile = sandbox.Profile(
            principal="agent", read_roots=(case,), write_roots=(case,), protected=(), private=(), quotas=Q
        )
        line = (
            f"{GIT_PRELUDE.get(sub, 'true')} && strace -f -qq -y -o .trace -e trace={SYSCALLS} "
            f"{shlex.join(argv)} </dev/null >/dev/null 2>&1"
        )
        out = shell.run(line, case, profile, timeout_ms=60_000, git_write=True)
        assert out.get("exit_code") is not None and not out.get("timed_out"), (argv, out)
        outputs.append(out)
    problems: list[str] = []
    binary = os.path.realpath(shutil.which("git") or "git")
    for i, (sub, argv) in enumerate(all_cases):
        case = tmp_path / f"c{i}"
        trace = (case / ".trace").read_text()
        (cmd,) = analyze(shlex.join(argv), second_opinion_enabled=False).commands
        reading = read(model, cmd)
        if reading.refused or reading.runs:
            problems.append(f"{shlex.join(argv)}: the model refuses it or says it runs code ({reading.refused})")
            continue
        unknown = any(not w.literal for w in reading.reads)
        reads = [os.path.normpath(case / w.value) for w in reading.reads if w.literal]
        writes = [os.path.normpath(case / w.value) for w in reading.writes if w.literal]
        tracked = [str(case / "in.txt")] if sub in TREE_WRITERS else []
        events = _events(trace, str(case))
        started = any(c.startswith("exec") and os.path.realpath(p[0]) == binary for c, p, _ in events)

        if not started:
            problems.append(f"{shlex.join(argv)}: git did not start: {trace[:300]!r} {outputs[i]!r}"[:1200])
        for call, paths, args in events:
            for path in paths if call.startswith("rename") else paths[:1]:
                if call.startswith("exec"):
                    if os.path.realpath(path) not in (binary, *GIT_EXECS) and not path.endswith("/strace"):
                        problems.append(f"{shlex.join(argv)}: execs {path}")
                    continue
                if path.startswith((*SYSTEM, "/run/agent-gateway/")) or path in ("/", str(case), str(case / ".trace")):
                    continue
                if _explained(path, [str(case / ".git"), HOME]):
                    continue  # git's own repository (sandbox/git.py keeps its config and hooks read-only), HOME
                if os.path.basename(path) in GIT_METADATA and not call.startswith(("rename", "unlink", "creat")):
                    continue  # .gitattributes, .gitignore, .mailmap: the repository's own settings, read
                writing = (
                    call.startswith("rename")
                    or call in ("creat", "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat")
                    or bool(re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC", args))
                )
                if writing:
                    ok = _explained(path, writes + tracked)
                else:  # tracked files: git reads its work tree (status, diff, add -A); the cwd is jailed
                    ok = unknown or _explained(path, reads + writes + [str(case / "in.txt")])
                if not ok:
                    problems.append(f"{shlex.join(argv)}: {call} {path} ({'write' if writing else 'read'}), "
                                    f"not in {reads} / writes {writes}")  # fmt: skip
    assert not problems, "\n".join(problems[:40])
