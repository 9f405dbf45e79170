"""`gateway daemon`: the resident gateway the hook clients ask, on a Unix socket.

It loads the policy once (and reloads it when its files change), keeps the audit log open and
the parser warm, and answers one hook call per connection (protocol: gateway/hook_client.py).

Who may ask:
- the socket lives in a directory of the daemon's user with mode 0700 (checked at start: a
  directory anyone else can enter is refused), and is made owner-only (umask 077);
- every connection's peer credentials (SO_PEERCRED) are checked: the daemon's own uid, or one
  given with `--allow-uid`; any other is closed unanswered (its client then denies).

One daemon per socket: it holds an exclusive lock on `NAME.pid` for its life, so a second one
started for the same socket exits at once; a stale socket is removed only under that lock.

Requests (protocol: gateway/hook_client.py): an agent's hook call, answered within the
deadline (service.py), or the `exec` of a call it decided and rewrote, run in the sandbox while
the client stays connected (a client that goes away stops the command).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gateway import metrics, sandbox
from gateway.audit import AuditUnavailable
from gateway.audit.metered import meter
from gateway.decide import evaluate
from gateway.executors import shell
from gateway.hooks.formats import AGENTS
from gateway.hooks.service import DEADLINE_S, Caller, HookService
from gateway.log import log
from gateway.pipeline import unsafe_setup
from gateway.policy.loader import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.policy.selftest import load_checked
from gateway.sandbox import quotas, reaper
from gateway.store.commands import commit_timeout_of, dsn_of, spool_dirs, spool_of
from gateway.store.ledger import open_sink

PROTOCOL = b"AGW2"
MAX_REQUEST = 32 << 20
MAX_HEADER = 16 << 10
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64
EXIT_USAGE = 2


class DaemonError(Exception):
    pass


def check_private_dir(path: Path) -> None:
    """Refuse a socket directory that is not a real directory of this user, mode 0700."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise DaemonError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise DaemonError(
            f"{path} must be a directory of uid {os.geteuid()} with mode 0700 "
            f"(it is owned by {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
        )


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class Daemon:
    def __init__(self, sock_path: Path, allowed_uids: frozenset[int], idle_exit_s: float = 0.0) -> None:
        self.sock_path = sock_path
        self.service: HookService | None = None
        self.allowed = allowed_uids | {os.geteuid()}
        self.idle_exit_s = idle_exit_s
        self.last_activity = time.monotonic()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stop = threading.Event()
        self._lock_fd = -1
        self._listener: socket.socket | None = None
        self._inode = 0

    def lock(self) -> bool:
        """Take the life lock of this socket. False when another daemon holds it."""
        check_private_dir(self.sock_path.parent)
        base = str(self.sock_path)[: -len(".sock")] if self.sock_path.suffix == ".sock" else str(self.sock_path)
        fd = os.open(base + ".pid", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return True

    def bind(self) -> None:
        """Listen on the socket (under the life lock: a stale one is removed first)."""
        assert self._lock_fd >= 0
        with contextlib.suppress(FileNotFoundError):  # a socket left by a daemon that died
            if stat.S_ISSOCK(os.lstat(self.sock_path).st_mode):
                os.unlink(self.sock_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            listener.bind(str(self.sock_path))
        finally:
            os.umask(old)
        listener.listen(128)
        self._inode = os.lstat(self.sock_path).st_ino
        self._listener = listener

    def serve(self) -> None:
        assert self._listener is not None
        self._listener.settimeout(1.0)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                if self.idle_exit_s and time.monotonic() - self.last_activity > self.idle_exit_s:
                    log.warning("daemon_idle_exit", socket=str(self.sock_path))
                    break
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            self.last_activity = time.monotonic()
            if not self._slots.acquire(blocking=False):
                conn.close()  # its client denies: better than a queue that grows without bound
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(OSError):  # only our own socket: a newer daemon's stays
            if self._inode and os.lstat(self.sock_path).st_ino == self._inode:
                os.unlink(self.sock_path)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)

    def _one(self, conn: socket.socket) -> None:
        try:
            with conn:
                uid = peer_uid(conn)
                if uid not in self.allowed:
                    log.warning("hook_peer_refused", uid=uid, socket=str(self.sock_path))
                    return
                conn.settimeout(READ_TIMEOUT_S)
                request = _read_request(conn)
                if request is None or self.service is None:
                    return  # not a hook client: nothing to answer in
                kind, home, body = request
                if kind == "exec":
                    conn.settimeout(None)
                    cancel = threading.Event()
                    ended = threading.Event()
                    watcher = threading.Thread(target=_watch_hangup, args=(conn, cancel, ended), daemon=True)
                    watcher.start()
                    try:
                        reply = self.service.execute(body, uid, cancel)
                    finally:
                        ended.set()
                elif kind in AGENTS:
                    reply = self.service.handle(kind, body, Caller(uid, home))
                else:
                    return
                conn.sendall(b"%d %d\n" % (reply.exit, len(reply.stdout)) + reply.stdout + reply.stderr)
        except OSError:
            pass  # the client went away: it answered its agent with a denial already
        finally:
            self.last_activity = time.monotonic()
            self._slots.release()


def _read_request(conn: socket.socket) -> tuple[str, str | None, bytes] | None:
    """`AGW2 KIND HOME LENGTH\\n` and LENGTH bytes: (kind, the agent's HOME or None, body), or
    None for anything else."""
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_HEADER and b"\n" not in data[:MAX_HEADER]:
            return None
    head, _, body = data.partition(b"\n")
    parts = head.split(b" ")
    if len(parts) != 4 or parts[0] != PROTOCOL or not parts[3].isdigit():
        return None
    size = int(parts[3])
    if size > MAX_REQUEST:
        return None
    home: str | None = None
    if parts[2] != b"-":
        if not parts[2].startswith(b"h"):
            return None
        try:
            home = os.fsdecode(bytes.fromhex(parts[2][1:].decode("ascii")))
        except ValueError:
            return None
    chunks = [body]
    got = len(body)
    while got < size:
        chunk = conn.recv(min(1 << 16, size - got))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return parts[1].decode("ascii", "replace"), home, b"".join(chunks)[:size]


def _watch_hangup(conn: socket.socket, cancel: threading.Event, ended: threading.Event) -> None:
    """Set `cancel` when the exec's client goes away (the agent stopped it) before `ended`."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    while not ended.is_set():
        try:
            if poller.poll(200):
                cancel.set()
                return
        except (OSError, ValueError):
            return


def main(args: argparse.Namespace) -> int:
    sock_path = Path(os.path.abspath(args.socket))
    daemon = Daemon(sock_path, frozenset(args.allow_uid or ()), args.idle_exit)
    try:
        if not daemon.lock():  # first, before any work: a second daemon leaves at once
            print(f"gateway daemon: another daemon serves {sock_path}", file=sys.stderr)
            return 0
        policy_file = Path(args.policy)
        workspace = Path(args.workspace) if args.workspace else None
        first = load_checked(policy_file, workspace)
        keys, spool = Path(args.audit_keys), spool_of(args)
        audit = meter(open_sink(dsn_of(args), Path(args.audit_dir), keys, first.policy.audit.redact, spool=spool,
                                commit_timeout=commit_timeout_of(args)))  # fmt: skip

        def record(kind: str, data: dict[str, Any]) -> None:
            audit.append(kind, data=data)

        holder = PolicyHolder(policy_file, workspace, on_event=record)
        policy = holder.current()
        principal = args.principal
        if not principal:
            if len(policy.grants) != 1:
                names = ", ".join(sorted(policy.grants))
                raise PolicyError(f"the policy defines several principals ({names}): pass --principal")
            principal = next(iter(policy.grants))
        if principal not in policy.grants:
            names = ", ".join(sorted(policy.grants))
            raise PolicyError(f"{policy_file}: no principal {principal!r} (defined: {names})")
        private = (Path(args.audit_keys), sock_path.parent, *spool_dirs(args))
        unsafe = unsafe_setup(policy, principal, Path(args.audit_dir), private)
        if unsafe:
            raise PolicyError(unsafe)
        executor = None
        if not args.no_sandbox:  # allowed shell calls of Claude Code and Codex run in the sandbox
            try:
                sandbox.check()
            except sandbox.SandboxUnavailable as exc:
                raise DaemonError(
                    f"the sandbox cannot start here ({exc}): `gateway doctor` says why; "
                    "--no-sandbox decides only (the agent then runs every call itself)"
                ) from None
            reaper.start()  # killed sandboxes' orphaned namespace inits are reaped here
            with contextlib.suppress(Exception):
                quotas.kill_abandoned()
            executor = shell.run
        deadline = args.deadline if args.deadline is not None else DEADLINE_S
        daemon.service = HookService(holder.current, audit, principal, private, sock_path, deadline, executor)
        with contextlib.suppress(Exception):  # start the parser's workers now, not on the first call
            evaluate(policy, "true", principal)
        daemon.bind()
    except (PolicyError, AuditUnavailable, DaemonError, OSError) as exc:
        print(f"gateway daemon: {exc}", file=sys.stderr)
        daemon.close()
        return EXIT_USAGE
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: daemon.stop())
    print(f"gateway daemon: serving {sock_path} (policy {policy_file}, principal {principal})", file=sys.stderr)
    sys.stderr.flush()
    done = threading.Event()
    metrics_file = getattr(args, "metrics_file", None)
    if metrics_file:
        threading.Thread(target=write_metrics, args=(Path(metrics_file), args.metrics_interval, done),
                         name="daemon-metrics", daemon=True).start()  # fmt: skip
    try:
        daemon.serve()
    finally:
        done.set()
        daemon.close()
    return 0


def write_metrics(path: Path, interval_s: float, done: threading.Event) -> None:
    """The daemon's metrics (gateway/metrics.py) in Prometheus' text format, written to `path`
    every `interval_s` and once more at the end (written aside and renamed: a reader, such as
    node_exporter's textfile collector, never sees half a file)."""
    from prometheus_client import write_to_textfile

    while True:
        stopping = done.wait(max(interval_s, 1.0))
        try:
            write_to_textfile(str(path), metrics.REGISTRY)
        except OSError as exc:
            log.warning("daemon_metrics_unwritable", path=str(path), error=str(exc))
        if stopping:
            return
