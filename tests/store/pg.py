"""A real PostgreSQL for the store's tests: Debian's server binaries, a cluster made under a
temporary directory, run as an unprivileged account (initdb refuses root), reached over a Unix
socket in that directory (no TCP), stopped and removed at the end.

The binaries are looked for in /usr/lib/postgresql/*/bin (newest first), then `pg_config
--bindir`, then PATH. `make test` installs Debian's `postgresql` when none is found.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

ACCOUNT = "nobody"
SUPERUSER = "gw"


def bindir() -> Path | None:
    """Where initdb, pg_ctl and postgres are, or None."""

    def version(d: str) -> tuple[int, ...]:
        part = Path(d).parent.name
        return tuple(int(x) for x in part.split(".") if x.isdigit())

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            candidates.append(out.stdout.strip())
    found = shutil.which("initdb")
    if found:
        candidates.append(str(Path(found).resolve().parent))
    for d in candidates:
        if all(os.access(Path(d) / b, os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    """One cluster. `dsn(db)` reaches database `db` as the superuser over the socket."""

    def __init__(self, bin_dir: Path, settings: dict[str, str] | None = None) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="agw-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.settings = settings or {}
        self._as: pwd.struct_passwd | None = pwd.getpwnam(ACCOUNT) if os.geteuid() == 0 else None
        if self._as is not None:
            os.chown(self.root, self._as.pw_uid, self._as.pw_gid)
        self.root.chmod(0o755)  # the socket is reached by this (root) process and its children

    def _run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, object] = {}
        if self._as is not None:
            kwargs = {"user": self._as.pw_uid, "group": self._as.pw_gid, "extra_groups": []}
        env = {**os.environ, "HOME": str(self.root), "LC_ALL": "C"}
        return subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env,
            cwd=self.root, check=False, **kwargs,  # type: ignore[call-overload]
        )  # fmt: skip

    def start(self) -> None:
        if not self.data.exists():
            done = self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8")
            if done.returncode != 0:
                raise RuntimeError(f"initdb failed: {done.stdout}{done.stderr}")
            conf = {
                "listen_addresses": "''",
                "unix_socket_directories": f"'{self.root}'",
                "port": str(self.port),
                "max_connections": "200",
                "shared_buffers": "32MB",
                "fsync": "on",
                "synchronous_commit": "on",
                **self.settings,
            }
            with open(self.data / "postgresql.conf", "a", encoding="utf-8") as f:
                f.writelines(f"{k} = {v}\n" for k, v in conf.items())
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "120",
                         "start")  # fmt: skip
        if done.returncode != 0:
            log = (self.root / "server.log").read_text(errors="replace") if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {done.stdout}{done.stderr}{log[-2000:]}")

    def stop(self, mode: str = "fast") -> None:
        done = self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")
        if done.returncode != 0 and (self.data / "postmaster.pid").exists():
            with contextlib.suppress(OSError, ValueError):
                pid = int((self.data / "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGKILL)

    def standby_of(self, primary: Postgres, name: str) -> None:
        """Make this cluster a streaming standby of `primary` (a base backup of it), reporting
        as `name` (what the primary's `synchronous_standby_names` lists). Start it after."""
        done = self._run("pg_basebackup", "-D", str(self.data), "-h", str(primary.root), "-p", str(primary.port),
                         "-U", SUPERUSER, "-X", "stream", "-c", "fast")  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {done.stdout}{done.stderr}")
        (self.data / "standby.signal").touch()
        conninfo = f"host={primary.root} port={primary.port} user={SUPERUSER} application_name={name}"
        with open(self.data / "postgresql.auto.conf", "a", encoding="utf-8") as f:
            f.write(f"unix_socket_directories = '{self.root}'\nport = {self.port}\nprimary_conninfo = '{conninfo}'\n")
            f.write("synchronous_standby_names = ''\n")
        if self._as is not None:
            for path in (self.data / "standby.signal", self.data / "postgresql.auto.conf"):
                os.chown(path, self._as.pw_uid, self._as.pw_gid)

    def promote(self) -> None:
        done = self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "120", "promote")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed: {done.stdout}{done.stderr}")

    def dsn(self, db: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@/{db}?host={self.root}&port={self.port}"

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
