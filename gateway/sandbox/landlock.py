"""What Landlock this kernel offers. The rules themselves are applied inside the sandbox by the
helper (`agw_init.c`), after bwrap has built the mounts and before the command starts: a
Landlock-restricted process may not mount, so it must come last."""

from __future__ import annotations

import ctypes
import functools
import os

SYS_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture Linux has
LANDLOCK_CREATE_RULESET_VERSION = 1


@functools.lru_cache(maxsize=1)
def abi() -> int:
    """The Landlock ABI version (0: not available: kernel without it, or disabled at boot)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        version = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                               ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))  # fmt: skip
    except (OSError, AttributeError):
        return 0
    return int(version) if version > 0 else 0


def describe() -> str:
    """One line for `gateway doctor` and the audit record."""
    version = abi()
    if version == 0:
        errno = ctypes.get_errno()
        why = os.strerror(errno) if errno else "not offered by this kernel"
        return f"unavailable ({why})"
    return f"ABI {version}"
