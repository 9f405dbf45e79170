"""The sandbox's own sockets, made inside its network namespace by the helper (`agw-init netns`)
and handed to the gateway, which serves them from outside: the resolver's UDP socket on
127.0.0.1:53, a listener on every port the policy can reach, and the HTTP proxy's listener.

The namespace is found by the pid bwrap reported (`--info-fd`) and checked by the inode bwrap
reported with it, so a pid recycled in between names another namespace and is refused."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass

from gateway import fdwait
from gateway.sandbox import helper

INFO_TIMEOUT = 30.0
"""Seconds to wait for bwrap to say its sandbox exists (a loaded machine is slow, never this slow)."""


class NetnsUnavailable(Exception):
    pass


@dataclass
class Sockets:
    dns: socket.socket
    listeners: dict[int, socket.socket]
    """Port -> a listener on 0.0.0.0:port inside the sandbox (the addresses its resolver gives)."""
    proxy: socket.socket
    """The HTTP proxy's listener on 127.0.0.1 (HTTP_PROXY inside)."""

    def close(self) -> None:
        for s in (self.dns, self.proxy, *self.listeners.values()):
            with contextlib.suppress(OSError):
                s.close()


def read_info(fd: int, timeout: float = INFO_TIMEOUT) -> dict[str, int]:
    """bwrap's JSON about the sandbox it made (child-pid, net-namespace), read until it closes."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NetnsUnavailable("bubblewrap did not say in time that the sandbox exists")
        if not fdwait.readable(fd, left):
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        if len(data) > 65536:
            raise NetnsUnavailable("bubblewrap's sandbox information is too long")
        with contextlib.suppress(ValueError):
            info = json.loads(data)
            if isinstance(info, dict) and "child-pid" in info:
                break
    try:
        info = json.loads(data)
        return {"child-pid": int(info["child-pid"]), "net-namespace": int(info["net-namespace"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise NetnsUnavailable(f"bubblewrap's sandbox information cannot be read: {data[:200]!r}") from exc


def open_sockets(pid: int, inode: int, ports: tuple[int, ...], proxy_port: int) -> Sockets:
    specs = ["udp:53", f"tcp-lo:{proxy_port}", *(f"tcp:{p}" for p in ports if p != proxy_port)]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        binary = helper.helper_path()
        proc = subprocess.run(
            [binary, "netns", str(pid), str(inode), str(theirs.fileno()), *specs],
            pass_fds=(theirs.fileno(),),
            capture_output=True,
            timeout=INFO_TIMEOUT,
            check=False,
        )
        theirs.close()
        if proc.returncode != 0:
            why = proc.stderr.decode(errors="replace").strip()[:300]
            raise NetnsUnavailable(f"the sandbox's network could not be set up: {why}")
        _, fds, _, _ = socket.recv_fds(ours, 1, len(specs))
    except (OSError, subprocess.TimeoutExpired, helper.HelperUnavailable) as exc:
        raise NetnsUnavailable(f"the sandbox's network could not be set up: {exc}") from exc
    finally:
        theirs.close()
        ours.close()
    if len(fds) != len(specs):
        for fd in fds:
            os.close(fd)
        raise NetnsUnavailable("the helper passed fewer sockets than asked")
    made = [socket.socket(fileno=fd) for fd in fds]
    for s in made:
        s.setblocking(False)
    listeners = {p: s for p, s in zip([p for p in ports if p != proxy_port], made[2:], strict=True)}
    return Sockets(made[0], listeners, made[1])
