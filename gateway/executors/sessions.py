"""Persistent shell sessions (the `session` tool): pipe or PTY, inside the same sandbox as `run`.

How the gate holds inside a session. The shell never reads commands from its terminal or its
stdin. It runs a loop that reads commands from a private control pipe, which only the gateway
writes, and only after the pipeline allowed the command:

    loop:  read CWD and TEXT (NUL-terminated) from the control pipe
           cd -- CWD          (the directory the gateway checked the command against)
           eval TEXT          (with the control pipe closed for it)
           print the end marker with the exit status

The loop itself comes the same way: the shell's command line only reads the first record of the
control pipe and runs it. The end marker holds a random value per session, and a program the
commands run could read any command line in the sandbox (/proc/*/cmdline): one that found the
marker there could print it and make the gateway answer "finished" while it runs on. So the
marker is only in the loop's code, in the shell's memory (non-dumpable, below), never in an
argv or an environment. The loop's own variables (`__gw_*`) are not the commands' to set: a text
naming one is refused before it is decided (`names_the_loop`), the prompt is read-only, and the
others are cleared (namerefs too) before each record is read.

The loop's bash is a copy the sandbox's account may execute but not read (sandbox.LOOP_SHELL),
so the kernel keeps it non-dumpable: the commands it runs (that account, that sandbox) cannot
ptrace it or open its /proc/PID/mem or fd/ to feed it a record (checked before the session is
listed; a dumpable loop fails the start).

So the terminal (PTY) or stdin (pipe) is data only: whatever the agent `write`s while a command
runs is input to that program, and input nobody read is never run as a command later. A `write`
while the shell is idle is taken as commands, each line decided like an `exec`.

The gateway knows the shell is idle from its own protocol: every command it sent has printed its
end marker. Allowed code could print a fake marker; that only makes the gateway decide more
(input taken for commands) or treat commands as input, never run text undecided. Each command
runs in the cwd it was checked against (the `cd -- CWD` above), so a command still running when
a fake marker arrives cannot move the next command's relative paths. The session's cwd shown to
the agent is read from `/proc/<shell>/cwd`, not from the shell's output.

Why not `ptyprocess`: its spawn runs Python between fork and exec (unsafe in a threaded server),
a read on its non-blocking fd can report a false EOF after which `isalive()` blocks, and killing
its process group misses `setsid` children. Here the PTY is `os.openpty()`, the child is started
by `subprocess.Popen` (fork and exec in C), the shell gets the terminal as its controlling tty
from `setsid -w -c` inside the sandbox, output is read by one blocking reader thread per session,
and killing kills bubblewrap, whose PID namespace takes every descendant with it. The terminal
has `-isig`: ^C is a byte, and the `interrupt` of `write` signals the shell's children instead,
so the loop itself survives (bash without job control dies of a ^C that reaches its group).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from gateway import fdwait, sandbox
from gateway.executors.shell import READONLY, sandbox_pipe, scrubbed_env
from gateway.executors.spawner import SPAWNER
from gateway.sandbox import identity, reaper
from gateway.sandbox.proctree import children, comm, signal_descendants

CANCEL_POLL_S = 0.1
"""How often a wait for a session's command looks at the call's cancel event."""

# One record per command: GS CWD US TEXT NUL. Only the gateway writes records, and neither a cwd
# (refused with control characters) nor a command (the analyser refuses them) holds GS, US or
# NUL. Code running inside `eval` can read the loop's saved control descriptor; if it swallows
# all or part of a record, the loop's next read starts mid-record, lacks the GS, and is dropped:
# a decided command can be lost, but no other text can become a command.
#
# The prompt goes before the end marker, so it belongs to the reply of the command it follows
# (and the first one to `start`). A command that ends the shell (`exit 3`) never reaches the
# marker after `eval`: the EXIT trap, set only while a command runs, prints it with the status
# the shell exits with (marked `x`: the shell is ending), so the reply says 3, not the previous
# command's status, and the gateway waits for the end before it answers.
#
# The nonce is in the loop's own lines only, so none of them may be traced: a command that turns
# `set -x` (or -v) on would have had the loop's printf, nonce and all, written to its output,
# and could then print a marker of its own. Tracing is turned off, silently, as soon as a command
# returns (and in the EXIT trap) and put back just before the next one: the agent's `set -x`
# traces its commands and never the loop.
_LOOP = r"""
builtin unset -v __gw_loop
builtin readonly __gw_prompt={prompt}
builtin readonly {protected}
{ready}
__gw_trace=
while :; do
  builtin unset -n __gw_rec __gw_cwd __gw_cmd __gw_status __gw_exit || break
  IFS= read -r -d '' __gw_rec <&{fd} || break
  case $__gw_rec in
    $'\x1d'*$'\x1f'*) ;;
    *) builtin printf '\036GW{nonce}:125\036'; continue ;;
  esac
  __gw_rec=${{__gw_rec#$'\x1d'}}
  __gw_cwd=${{__gw_rec%%$'\x1f'*}}
  __gw_cmd=${{__gw_rec#*$'\x1f'}}
  if builtin cd -- "$__gw_cwd" 2>/dev/null; then
    builtin trap '__gw_exit=$?; {{ builtin set +xv; }} 2>/dev/null
      builtin printf "%s\036GW{nonce}:x%d\036" "$__gw_prompt" "$__gw_exit"' EXIT
    {{ case $__gw_trace in *x*) builtin set -x ;; esac; case $__gw_trace in *v*) builtin set -v ;; esac; }} 2>/dev/null
    eval "$__gw_cmd" {fd}<&-
    {{ __gw_status=$? __gw_trace=$-; builtin set +xv; }} 2>/dev/null
    builtin trap - EXIT
  else
    __gw_status=126
  fi
  builtin printf '%s\036GW{nonce}:%d\036' "$__gw_prompt" "$__gw_status"
done
"""


ZSH_OPTIONS = (
    "NO_EQUALS", "NO_BARE_GLOB_QUAL", "NO_EXTENDED_GLOB", "NO_KSH_GLOB", "NO_GLOB_SUBST", "NO_MAGIC_EQUAL_SUBST",
    "NO_RC_EXPAND_PARAM", "NO_ALIASES", "SH_NULLCMD", "SH_WORD_SPLIT", "NO_MULTIOS", "NO_SHORT_LOOPS",
    "NO_AUTO_CD", "NO_CDABLE_VARS", "NO_AUTO_NAME_DIRS", "NO_AUTO_PUSHD", "NO_PROMPT_SUBST", "NO_RC_QUOTES",
    "NO_IGNORE_BRACES", "NO_BRACE_CCL", "NO_POSIX_BUILTINS", "NO_CORRECT", "NO_CORRECT_ALL", "NO_HASH_DIRS",
)  # fmt: skip
"""The options a zsh session's loop sets before the first command (docs/tools.md): what zsh would
read otherwise than bash in a line the gate let through. `=cmd` and glob qualifiers (`*(e:...:)`
runs code) are off, aliases are never expanded, a redirection alone runs `:` (not $NULLCMD's
`cat` or $READNULLCMD's pager), unquoted expansions split as bash splits them, and a redirection
names one file. The lines that could change them back (`setopt`, `emulate`, `set -o`,
`options[...]`) are refused by gateway/analysis/zsh.py."""

ZSH_READONLY = ("PATH", "path", "FPATH", "fpath", "CDPATH", "cdpath", "HOME", "TMPPREFIX")
"""The parameters a zsh session's loop makes read-only (each of a tied pair is its own parameter)."""

# A zsh session's loop: the bash loop's protocol (records on LOOP_FD, the nonce'd markers, the cwd
# per command, the EXIT trap for `exit N`), written for zsh. It sets its options, loads zsh/regex
# (`[[ =~ ]]`), then empties `module_path` and makes it read-only: no module loads after this
# (zsh/system, zsh/mapfile, zsh/zpty...), even through a builtin or parameter zsh would autoload.
# The parameters zsh finds programs, functions, directories and here-documents' files by are made
# read-only too (ZSH_READONLY): the gate refuses every line that assigns them by name, and read-only
# they stay as they are when a line reaches them another way (`y=path=5; (( y ))`: zsh evaluates
# the value of y as arithmetic, which assigns path). `cd -q` runs no chpwd hook; `always` lets
# the loop go on after an error zsh would otherwise end the script for (assigning to a read-only
# parameter).
_ZSH_LOOP = r"""
builtin unset __gw_loop
builtin setopt {options}
builtin zmodload zsh/regex 2>/dev/null
module_path=()
builtin typeset -r module_path {protected}
builtin typeset -r __gw_prompt={prompt}
{ready}
while :; do
  builtin unset __gw_rec __gw_cwd __gw_cmd __gw_status 2>/dev/null
  IFS= builtin read -r -d '' __gw_rec <&{fd} || break
  case $__gw_rec in
    $'\x1d'*$'\x1f'*) ;;
    *) builtin printf '\036GW{nonce}:125\036'; continue ;;
  esac
  __gw_rec=${{__gw_rec#$'\x1d'}}
  __gw_cwd=${{__gw_rec%%$'\x1f'*}}
  __gw_cmd=${{__gw_rec#*$'\x1f'}}
  if builtin cd -q -- "$__gw_cwd" 2>/dev/null; then
    builtin trap 'builtin printf "%s\036GW{nonce}:x%d\036" "$__gw_prompt" "$?"' EXIT
    {{ builtin eval "$__gw_cmd" {fd}<&- }} always {{ TRY_BLOCK_ERROR=0 }}
    __gw_status=$?
    builtin trap - EXIT
  else
    __gw_status=126
  fi
  builtin printf '%s\036GW{nonce}:%d\036' "$__gw_prompt" "$__gw_status"
done
"""

_ZSH_BOOT = "{move}IFS= read -r -d '' __gw_loop <&{fd} && eval \"$__gw_loop\""
"""A zsh loop's command line: zsh names only descriptors 0-9 on the left of a redirection, so the
control pipe is moved to LOOP_FD with `3<&N` and closed through a parameter holding N."""


def zsh_boot_command(control_fd: int) -> str:
    """The zsh loop shell's `-c` text for a control pipe the shell inherits as `control_fd`."""
    move = "" if control_fd == LOOP_FD else f"exec {LOOP_FD}<&{control_fd}; __gw_fd={control_fd}; exec {{__gw_fd}}<&-; "
    return _ZSH_BOOT.format(move=move, fd=LOOP_FD)


_PYTHON_SETUP = "import sys; sys.ps1 = {prompt!r} + '\\x1eGW{nonce}:0\\x1e'; sys.ps2 = '... '; del sys"
"""A Python session's REPL: the prompt it prints before reading each statement (`>>> `), then the
end marker (so the gateway knows the statement before it is done, its prompt ending its output,
as a shell session's does; a statement reports no status: 0). It comes through the control pipe,
as a shell's loop does (`_PYTHON_BOOT`): the marker is in no argv."""

_PYTHON_BOOT = (
    "import os\n"
    "_gw = b''\n"
    "while not _gw.endswith(b'\\0'):\n"
    "    _gw_part = os.read({fd}, 4096)\n"
    "    if not _gw_part:\n"
    "        raise SystemExit('agent-gateway: no setup on the control pipe')\n"
    "    _gw += _gw_part\n"
    "exec(_gw[:-1].decode())\n"
    "del os, _gw, _gw_part\n"
)
"""The Python session's whole command line: read its setup (the control pipe's first record) and run it."""

LOOP_FD = 3
"""The control pipe's descriptor in the loop shell. The gateway's own number for it may be anything:
a server holding a thousand connections passes one above the sandbox's descriptor limit
(`limits.open_files`, 1,024 by default), where bash can close it around a command but cannot put
it back (`eval ... 1030<&-` saved it, ran the command, failed to restore it with "Bad file
descriptor", and the next read ended the session). So the shell moves it to 3 before anything
else: the sandbox's command inherits only 0-2 and the kept descriptors, so 3 is free unless it is
the pipe itself."""

_BOOT = "{move}IFS= read -r -d '' __gw_loop <&{fd} && eval \"$__gw_loop\""
"""The loop shell's whole command line: move the control pipe to LOOP_FD, read the loop (the pipe's
first record) and run it."""


def boot_command(control_fd: int) -> str:
    """The loop shell's `-c` text for a control pipe the shell inherits as `control_fd`."""
    move = "" if control_fd == LOOP_FD else f"exec {LOOP_FD}<&{control_fd} {control_fd}<&-; "
    return _BOOT.format(move=move, fd=LOOP_FD)


_RESERVED = re.compile(r"__gw_[A-Za-z0-9_]*")


def names_the_loop(text: str) -> str | None:
    """The first of the loop's own names (`__gw_*`) that `text` holds, or None. A command naming
    one could set it (`__gw_prompt=X` put agent text into later replies) or clear it."""
    found = _RESERVED.search(text)
    return found.group(0) if found else None


def reserved_message(name: str) -> str:
    return f"{name}: names beginning with __gw_ belong to the session's own loop; a command may not use them"


@dataclass
class Buffer:
    """Unread output, bounded: the oldest bytes go first, counted in `dropped`."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        excess = len(self.data) - self.limit
        if excess > 0:
            del self.data[:excess]
            self.dropped += excess

    def take(self, upto: int | None = None) -> tuple[str, int]:
        end = len(self.data) if upto is None else min(upto, len(self.data))
        out = bytes(self.data[:end])
        del self.data[:end]
        dropped, self.dropped = self.dropped, 0
        return out.decode("utf-8", "replace"), dropped


class Session:
    """One live shell. Thread-safe: a reader thread fills the buffer; calls read it."""

    def __init__(
        self,
        session_id: str,
        principal: str,
        proc: subprocess.Popen[bytes],
        output_fd: int,
        input_fd: int,
        control_fd: int,
        pty: bool,
        nonce: str,
        buffer_bytes: int,
    ) -> None:
        self.id = session_id
        self.principal = principal
        self.proc = proc
        self.pty = pty
        self.output_fd = output_fd  # the PTY master, or the read end of the output pipe
        self.input_fd = input_fd  # the PTY master, or the write end of the shell's stdin
        self.control_fd = control_fd
        self.marker = re.compile(rb"\x1eGW" + nonce.encode() + rb":(x?)(\d+)\x1e")
        self.buffer = Buffer(buffer_bytes)
        self.cond = threading.Condition()
        self.outstanding = 1  # the loop prints a marker when it is ready
        self.last_exit: int | None = None
        self.done_at: int | None = None  # where in the buffer the last finished command's output ends
        self.started = time.monotonic()
        self.last_used = self.started
        self.shell_pid: int | None = None
        self.loading_env: dict[str, str | None] = {}
        """The shell's variables that make programs load files (gateway/runfiles.py): None when a
        text may have changed one (its value known only at run time)."""
        self.launch: sandbox.Launch | None = None  # its sandbox's cgroup, removed with it
        self.sandbox: dict[str, object] = {}  # what holds it (Landlock, quotas, uid), shown at start
        self.closed = False
        self.on_end: Callable[[Session], None] | None = None  # the manager forgets it when its shell ends
        self.exiting = False  # the shell reported that it is ending (`exit` in a command)
        self.initial_output = ""  # what the shell printed before its first command (its prompt)
        self.echo = False  # each command's output begins with the command, as a terminal echoes it
        self.python = False  # a Python REPL: its lines are input (send_line), not records of the loop
        self.zsh = False  # a zsh loop: each line is checked as zsh reads it (gateway/analysis/zsh.py) first
        self._carry = b""
        # Descriptors are closed exactly once, and never while another thread may use the number
        # (a closed number is reused at once by the next open anywhere in the gateway: a second
        # close, or a write after the close, would hit that file). The reader owns output_fd and
        # closes it when it ends; the input side is used and closed under `_io`.
        self._io = threading.Lock()
        self._input_open = True
        self.reader = threading.Thread(target=self._read, name=f"session-{session_id}", daemon=True)
        self.reader.start()

    # --- output ------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.output_fd, 65536)  # blocking, on this thread only
            except OSError:  # EIO: the PTY's other side is gone
                chunk = b""
            with self.cond:
                if not chunk:
                    if self._carry:
                        self.buffer.add(self._carry)
                        self._carry = b""
                    self.closed = True
                    self.cond.notify_all()
                    break
                self._scan(self._carry + chunk)
        with self._io:  # the output side is ours alone; a PTY master is the input side too
            if self.output_fd != self.input_fd or not self._input_open:
                with contextlib.suppress(OSError):
                    os.close(self.output_fd)
            else:
                self._input_open = False  # closed here for both: kill() must not close it again
                with contextlib.suppress(OSError):
                    os.close(self.output_fd)
                if self.control_fd != self.output_fd:
                    with contextlib.suppress(OSError):
                        os.close(self.control_fd)
        # the output closed: the shell is gone (or going). Wait for bubblewrap now, so it is not
        # left a zombie, and let the manager drop the session at once, not at the next start.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)
        if self.on_end is not None and self.proc.poll() is not None:
            with contextlib.suppress(Exception):
                self.on_end(self)

    def _scan(self, data: bytes) -> None:
        """Move output into the buffer, taking end markers out. A marker may be split across
        reads: a tail that could begin one is carried to the next chunk."""
        while True:
            m = self.marker.search(data)
            if m is None:
                break
            self.buffer.add(data[: m.start()])
            self.outstanding = max(0, self.outstanding - 1)
            self.last_exit = int(m.group(2))
            self.exiting = self.exiting or bool(m.group(1))
            self.done_at = len(self.buffer.data)
            data = data[m.end() :]
        cut = data.rfind(b"\x1e")
        if cut != -1 and len(data) - cut < 64:
            self._carry = data[cut:]
            data = data[:cut]
        else:
            self._carry = b""
        self.buffer.add(data)
        self.cond.notify_all()

    # --- state -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self.closed and self.proc.poll() is None

    @property
    def busy(self) -> bool:
        return self.outstanding > 0

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def cwd(self) -> str | None:
        if self.shell_pid is None:
            return None
        with contextlib.suppress(OSError):
            return os.readlink(f"/proc/{self.shell_pid}/cwd")
        return None

    def wait_idle(self, timeout_s: float, cancel: threading.Event | None = None) -> bool:
        """Wait until the commands sent have finished (True), at most `timeout_s`, and no longer
        once `cancel` is set (the caller went away, the server stops): the command runs on."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self.outstanding and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0 or (cancel is not None and cancel.is_set()):
                    return False
                self.cond.wait(left if cancel is None else min(left, CANCEL_POLL_S))
            return not self.outstanding

    def wait_closed(self, timeout_s: float) -> bool:
        """Wait until the shell's output has closed (it ended)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    # --- input -------------------------------------------------------------------------
    def send_command(self, cwd: str, text: str) -> None:
        record = "\x1d" + cwd + "\x1f" + text
        if any(ord(c) < 0x20 and c not in "\t\n" for c in cwd + text) or record.count("\x1f") != 1:
            raise SessionError("INVALID_INPUT", "a command or cwd holding control characters is not sent")
        name = names_the_loop(text)
        if name is not None:  # the tool refuses it before it is decided; never sent, whoever calls
            raise SessionError("INVALID_INPUT", reserved_message(name))
        with self.cond:
            self.outstanding += 1
            self.done_at = None
        network = self.launch.network if self.launch is not None else None
        if network is not None:  # its connections from now on belong to the call sending this command
            network.follow(text)
        with self._io:
            if not self._input_open:
                raise SessionError("SESSION_NOT_FOUND", "the session has ended")
            os.write(self.control_fd, record.encode() + b"\0")

    def send_line(self, text: str, timeout_s: float = 5.0) -> int:
        """A Python session: `text` (one statement, newline-ended) typed to the REPL, which prints
        its prompt, and so the end marker, when it is done. The bytes written."""
        with self.cond:
            self.outstanding += 1
            self.done_at = None
        sent = self.send_input(text, timeout_s)
        if sent < len(text.encode()):
            with self.cond:
                self.outstanding = max(0, self.outstanding - 1)
        return sent

    def send_input(self, text: str, timeout_s: float = 5.0) -> int:
        """Write `text` to the program; the bytes written. A program that does not read its
        input fills the pipe or the terminal's queue: waiting is bounded, never a hung call."""
        data = text.encode()
        sent = 0
        deadline = time.monotonic() + timeout_s
        while sent < len(data):
            left = deadline - time.monotonic()
            with self._io:
                if not self._input_open:
                    break
                # a short wait under the lock: kill() waits at most this long for it
                if left > 0 and fdwait.writable(self.input_fd, min(left, 0.05)):
                    sent += os.write(self.input_fd, data[sent : sent + 512])  # a writable fd takes it whole
            if left <= 0:
                break
        return sent

    def take_output(self, finished_only: bool = False) -> tuple[str, int]:
        with self.cond:
            return self.buffer.take(self.done_at if finished_only else None)

    def resize(self, rows: int, cols: int) -> None:
        with self._io:
            if not self._input_open:
                raise SessionError("SESSION_NOT_FOUND", "the session has ended")
            fcntl.ioctl(self.input_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def interrupt(self) -> int:
        """SIGINT to every descendant of the shell (not the shell: it runs the loop)."""
        return signal_descendants(self.shell_pid, signal.SIGINT) if self.shell_pid else 0

    def kill(self) -> None:
        """Kill bubblewrap's group; its PID namespace takes every process of the session."""
        for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        reaper.poke()  # bwrap's orphaned namespace init is the gateway's to reap
        with self._io:
            if self._input_open:
                self._input_open = False
                for fd in {self.input_fd, self.control_fd} - {self.output_fd}:  # the reader closes that one
                    with contextlib.suppress(OSError):
                        os.close(fd)
        if self.launch is not None:  # its cgroup: whatever is left in it, and the group itself
            with contextlib.suppress(Exception):
                self.launch.finished()
        # the reader ends on end-of-file (or EIO: the terminal's other side is gone) and closes
        # the output side itself; one blocked past this is left to do so when it ends
        self.reader.join(2.0)

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "session_id": self.id,
            "alive": self.alive,
            "pty": self.pty,
            "running": self.busy and self.alive,
            "cwd": self.cwd(),
            "idle_seconds": round(now - self.last_used, 1),
            "uptime_seconds": round(now - self.started, 1),
        }


def _find_shell(root: int, name: str = "bash") -> int | None:
    """The loop's bash (or a Python session's python3), the first below bubblewrap: found before
    any command runs."""
    todo = [root]
    while todo:
        p = todo.pop(0)
        if p != root and comm(p) == name:
            return p
        todo += children(p)
    return None


def _undumpable(pid: int, uid: int) -> bool:
    """The loop's shell is non-dumpable: the kernel gives the files in /proc/PID (not the directory
    itself) to root, not to the account it runs as (`uid`), while a process is so. Only then are
    its memory, descriptors and ptrace out of reach of the commands it runs, which are that account
    in that sandbox."""
    try:
        return os.stat(f"/proc/{pid}/environ").st_uid != uid
    except OSError:
        return False


class SessionError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class SessionManager:
    """The live sessions, per principal. `reap()` ends idle ones (a thread calls it)."""

    def __init__(self, on_event: Callable[[str, Session, dict[str, Any]], None] | None = None) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._ending: set[str] = set()  # dead sessions a forget_dead is ending (still listed)
        self._forgotten = threading.Condition(self._lock)  # notified when one of them is gone
        self._spawn_lock = threading.Lock()  # one place starts shells
        self.on_event = on_event or (lambda event, session, data: None)
        self._idle_limits: dict[str, float] = {}
        self._starting: dict[str, int] = {}  # per principal: sessions being started now
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    def start(
        self,
        principal: str,
        cwd: Path,
        env: dict[str, str],
        profile: sandbox.Profile,
        *,
        pty: bool,
        rows: int,
        cols: int,
        posix: bool,
        prompt: str | None,
        max_sessions: int,
        idle_seconds: float,
        buffer_bytes: int,
        python: bool = False,
        zsh: bool = False,
    ) -> Session:
        if prompt and any(ord(c) < 0x20 or ord(c) == 0x7F for c in prompt):
            raise SessionError("INVALID_INPUT", "prompt: control characters are not allowed")
        self.forget_dead()
        with self._lock:  # count the sessions being started too: concurrent starts cannot pass the limit
            live = sum(s.principal == principal for s in self._sessions.values()) + self._starting.get(principal, 0)
            if live >= max_sessions:
                raise SessionError(
                    "SESSION_LIMIT", f"{principal} has {live} live sessions (limit {max_sessions}): kill one first"
                )
            self._starting[principal] = self._starting.get(principal, 0) + 1
        try:
            return self._start(
                principal, cwd, env, profile, pty, rows, cols, posix, prompt, idle_seconds, buffer_bytes, python, zsh
            )
        finally:
            with self._lock:
                self._starting[principal] -= 1

    def _start(
        self, principal: str, cwd: Path, env: dict[str, str], profile: sandbox.Profile, pty: bool, rows: int, cols: int,
        posix: bool, prompt: str | None, idle_seconds: float, buffer_bytes: int, python: bool = False,
        zsh: bool = False,
    ) -> Session:  # fmt: skip
        if not cwd.is_dir():
            raise SessionError("INVALID_INPUT", f"cwd {cwd} is not a directory")
        nonce = secrets.token_hex(8)
        control_r, control_w = os.pipe()
        if python:  # a Python REPL: its prompt carries the marker (the lines are its input, not records)
            first = _PYTHON_SETUP.format(nonce=nonce, prompt=prompt or ">>> ")
            shell = ["python3", "-q", "-i", "-c", _PYTHON_BOOT.format(fd=control_r)]
        else:
            quoted_prompt = "''" if not prompt else "'" + prompt.replace("'", "'\\''") + "'"
            ready = "stty -isig 2>/dev/null; " if pty else ""
            ready += f"builtin printf '%s\\036GW{nonce}:0\\036' \"$__gw_prompt\""
            if zsh:  # no rc files (-f); its options are the loop's first lines
                options = " ".join(ZSH_OPTIONS)
                first = _ZSH_LOOP.format(
                    fd=LOOP_FD, nonce=nonce, prompt=quoted_prompt, ready=ready, options=options,
                    protected=" ".join(ZSH_READONLY),
                )  # fmt: skip
                shell = [sandbox.LOOP_ZSH, "-f", "-c", zsh_boot_command(control_r)]
            else:
                first = _LOOP.format(
                    fd=LOOP_FD, nonce=nonce, prompt=quoted_prompt, ready=ready, protected=" ".join(READONLY)
                )
                boot = boot_command(control_r)  # the loop comes through the pipe: its marker is in no argv
                shell = [sandbox.LOOP_SHELL, "--noprofile", "--norc", *(["--posix"] if posix else []), "-c", boot]
        inner = ["setsid", "-w", "-c", *shell] if pty else shell
        base_env = scrubbed_env(env)
        base_env["TERM"] = "xterm-256color" if pty else "dumb"
        try:
            loop: bool | Literal["zsh"] = "zsh" if zsh and not python else True
            plan, launch = sandbox.start(profile, inner, cwd, base_env, keep_fds=(control_r,), loop_shell=loop)
        except BaseException:
            os.close(control_r)
            os.close(control_w)
            raise
        if launch.disk_refusal is not None:  # its write roots are too full to start anything in
            launch.abandon()
            os.close(control_r)
            os.close(control_w)
            raise SessionError("DISK_BUDGET", f"the session was refused: {launch.disk_refusal}")
        argv, full_env = launch.argv, plan.env
        pass_fds = (control_r, *launch.pass_fds)
        opened: list[int] = []
        proc: subprocess.Popen[bytes] | None = None
        with self._spawn_lock:
            try:
                if pty:
                    master, slave = os.openpty()
                    opened += [master, slave]
                    identity.own(slave)  # the terminal is the command's: /dev/tty reopens it
                    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                    proc = SPAWNER.call(partial(
                        _popen, argv, stdin=slave, stdout=slave, stderr=slave, pass_fds=pass_fds,
                        start_new_session=True, env=full_env, cwd="/",
                    ))  # fmt: skip
                    os.close(slave)
                    out_fd = in_fd = master
                else:  # pipes owned by the sandbox's account (shell.sandbox_pipe)
                    out_fd, child_out = sandbox_pipe()
                    child_in, in_fd = sandbox_pipe()
                    opened += [out_fd, child_out, child_in, in_fd]
                    proc = SPAWNER.call(partial(
                        _popen, argv, stdin=child_in, stdout=child_out,
                        stderr=child_out, pass_fds=pass_fds, start_new_session=True, env=full_env, cwd="/",
                    ))  # fmt: skip
                    os.close(child_out)
                    os.close(child_in)
            except BaseException:
                for fd in (*opened, control_w):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                launch.abandon()
                raise
            finally:
                os.close(control_r)
                launch.started(proc.pid if proc is not None else None)
        with contextlib.suppress(OSError):  # a shell already gone fails to start below
            os.write(control_w, first.encode() + b"\0")  # well under a pipe's capacity: never blocks
        session = Session(secrets.token_hex(6), principal, proc, out_fd, in_fd, control_w, pty, nonce, buffer_bytes)
        session.launch = launch
        session.sandbox = launch.summary(plan)
        if not session.wait_idle(10.0):
            session.kill()
            output, _ = session.take_output()
            if launch.disk_tripped is not None:  # its disk budget stopped it before its shell was ready
                how = "refused" if launch.refused else "stopped"
                raise SessionError("DISK_BUDGET", f"the session was {how}: {launch.disk_tripped}")
            raise SessionError("SANDBOX_UNAVAILABLE", f"the session's shell did not start: {output.strip()[-300:]}")
        session.python = python
        session.zsh = zsh and not python
        session.shell_pid = _find_shell(proc.pid, "python3" if python else "zsh" if session.zsh else "bash")
        if python:  # no loop to protect: its lines are input, recorded, and the sandbox is their boundary
            if session.shell_pid is None:
                session.kill()
                raise SessionError("SANDBOX_UNAVAILABLE", "the session's python3 did not start")
        elif session.shell_pid is None or not _undumpable(session.shell_pid, plan.uid):
            session.kill()  # its commands could ptrace the loop and feed it records of their own
            raise SessionError(
                "SANDBOX_UNAVAILABLE",
                "the session's shell is not protected from the commands it runs (it is dumpable: "
                "is /proc/sys/fs/suid_dumpable 1?), so no session starts",
            )
        session.initial_output, _ = session.take_output()  # the first prompt
        with self._lock:
            self._sessions[session.id] = session
            self._idle_limits[session.id] = idle_seconds
        session.on_end = self._ended
        if not session.reader.is_alive():  # it ended before it was listed
            self._ended(session)
        return session

    def _ended(self, session: Session) -> None:
        """A session's shell ended (`exit`, killed): forget it now, off the reader's thread
        (forgetting joins it)."""
        threading.Thread(target=self.forget_dead, name="session-ended", daemon=True).start()

    def get(self, principal: str, session_id: str) -> Session:
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None or s.principal != principal:  # another principal's session does not exist for you
            raise SessionError("SESSION_NOT_FOUND", f"no session {session_id!r} (session list shows yours)")
        return s

    def of(self, principal: str) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if s.principal == principal]

    def kill(self, principal: str, session_id: str) -> None:
        s = self.get(principal, session_id)
        with self._lock:
            if s.id in self._ending:  # its shell ended and forget_dead is ending it: wait for that
                self._forgotten.wait_for(lambda: s.id not in self._ending, timeout=FORGET_WAIT_S)
                return
            self._sessions.pop(s.id, None)
            self._idle_limits.pop(s.id, None)
        s.kill()

    def forget_dead(self) -> None:
        """Close the descriptors of sessions whose shell has ended (`exit`), now, not at idle expiry.

        A session leaves the list only once `session_ended` is recorded: no client is told it
        has gone (nor given its slot) before the audit log says so. Returns once every session
        it found dead is gone, whichever thread ended it (one thread ends each)."""
        with self._lock:
            found = [s for s in self._sessions.values() if not s.alive]
            mine = [s for s in found if s.id not in self._ending]
            self._ending.update(s.id for s in mine)
        for s in mine:
            try:
                s.kill()
                self.on_event("session_ended", s, {})
            finally:
                with self._forgotten:
                    self._sessions.pop(s.id, None)
                    self._idle_limits.pop(s.id, None)
                    self._ending.discard(s.id)
                    self._forgotten.notify_all()
        with self._forgotten:
            self._forgotten.wait_for(lambda: not any(s.id in self._ending for s in found), timeout=FORGET_WAIT_S)

    def reap(self) -> list[str]:
        """End sessions idle longer than their limit, and forget dead ones."""
        now = time.monotonic()
        ended: list[str] = []
        with self._lock:
            expired = [
                s
                for s in self._sessions.values()
                if now - s.last_used > self._idle_limits.get(s.id, 1800) and s.id not in self._ending
            ]
            for s in expired:
                self._sessions.pop(s.id, None)
                self._idle_limits.pop(s.id, None)
        for s in expired:
            s.kill()
            self.on_event("session_expired", s, {"idle_seconds": round(now - s.last_used, 1)})
            ended.append(s.id)
        return ended

    def start_reaper(self, interval_s: float = 5.0) -> None:
        def loop() -> None:
            while not self._stop.wait(interval_s):
                with contextlib.suppress(Exception):
                    self.reap()
                    self.forget_dead()

        self._reaper = threading.Thread(target=loop, name="session-reaper", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            sessions = [s for s in self._sessions.values() if s.id not in self._ending]  # those end themselves
            for s in sessions:
                self._sessions.pop(s.id, None)
        for s in sessions:
            s.kill()


FORGET_WAIT_S = 60.0
"""How long a caller waits for another thread to end a dead session (its kill is bounded by
seconds, its record by the audit disk)."""


def _popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, **kwargs)
