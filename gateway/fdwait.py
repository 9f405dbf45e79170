"""Waiting for one descriptor to become readable or writable, whatever its number.

`select.select` refuses descriptors numbered 1,024 and above (FD_SETSIZE): in a server holding a
thousand connections every new pipe is numbered above it, and a wait written with select failed
("filedescriptor out of range in select()") for every session, sandbox and repository watch after
that. poll(2) has no such ceiling.
"""

from __future__ import annotations

import select

_ERRORS = select.POLLERR | select.POLLHUP | select.POLLNVAL


def _wait(fd: int, events: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, events)
    ready = poller.poll(max(0, int(timeout_s * 1000 + 0.999)))
    return bool(ready)


def readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` has something to read (data, its end, or an error a read will report) within
    `timeout_s` seconds."""
    return _wait(fd, select.POLLIN | _ERRORS, timeout_s)


def writable(fd: int, timeout_s: float) -> bool:
    """Whether a write to `fd` can go on (room, or an error a write will report) within `timeout_s`."""
    return _wait(fd, select.POLLOUT | _ERRORS, timeout_s)


def ready(read_fds: list[int], write_fds: list[int], timeout_s: float) -> tuple[list[int], list[int]]:
    """select(2)'s answer for any descriptor numbers: which of `read_fds` are readable and which
    of `write_fds` writable within `timeout_s` (an error or hang-up counts as ready: the read or
    write reports it)."""
    poller = select.poll()
    wanted: dict[int, int] = {}
    for fd in read_fds:
        wanted[fd] = wanted.get(fd, 0) | select.POLLIN | _ERRORS
    for fd in write_fds:
        wanted[fd] = wanted.get(fd, 0) | select.POLLOUT | _ERRORS
    for fd, events in wanted.items():
        poller.register(fd, events)
    happened = dict(poller.poll(max(0, int(timeout_s * 1000 + 0.999))))
    readable = [fd for fd in read_fds if happened.get(fd, 0) & (select.POLLIN | _ERRORS)]
    writable = [fd for fd in write_fds if happened.get(fd, 0) & (select.POLLOUT | _ERRORS)]
    return readable, writable
