"""The gateway's private cache directory: where it keeps what it builds once and trusts later
(the sandbox helper's binary, bashlex's parse tables). `$AGW_CACHE_DIR`, else
`~/.cache/agent-gateway/`. A directory anyone else could change is refused (`make_private`):
what the gateway reads back from it must be what it wrote there.

A shared value below both the analyser and the sandbox, which use it and never each other.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class CacheUnavailable(Exception):
    """The cache directory cannot be named, made, or is not private. The message says what to do."""


def cache_dir() -> str:
    """Where built files are kept: `$AGW_CACHE_DIR`, else `~/.cache/agent-gateway`."""
    configured = os.environ.get("AGW_CACHE_DIR")
    if configured:
        return os.path.abspath(configured)
    try:
        home = Path.home()
    except RuntimeError as exc:  # no HOME and no passwd entry
        raise CacheUnavailable(f"no home directory for the helper cache ({exc}): set AGW_CACHE_DIR") from None
    return str(home / ".cache" / "agent-gateway")


def private_cache_dir() -> str:
    """The cache directory, created and checked private (`make_private`)."""
    return make_private(cache_dir())


def make_private(directory: str) -> str:
    """Create the cache directory (0700) and check nobody else can change what is in it: it is
    ours and writable only by us, and every directory above it belongs to us or root and is not
    writable by others (unless sticky, like /tmp), so it cannot be renamed away and replaced.
    Returns its real path: a symlink on the way (which its owner could point elsewhere later)
    is not part of the path the helper is run by."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        directory = os.path.realpath(directory)
        st = os.stat(directory)
    except OSError as exc:
        why = f"cannot create the helper cache directory {directory}: {exc}"
        raise CacheUnavailable(f"{why}: set AGW_CACHE_DIR") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise CacheUnavailable(f"the helper cache {directory} is not a directory: set AGW_CACHE_DIR")
    euid = os.geteuid()
    if st.st_uid != euid or st.st_mode & 0o022:
        raise CacheUnavailable(
            f"the helper cache directory {directory} is not private (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):o}): make it yours with mode 0700, or set AGW_CACHE_DIR to another directory"
        )
    parent = os.path.dirname(directory)
    while True:
        st = os.stat(parent)
        shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, euid) or shared:
            raise CacheUnavailable(
                f"the helper cache directory {directory} is inside {parent}, which others can change (owner uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): set AGW_CACHE_DIR to a directory only you control"
            )
        if parent == "/":
            return directory
        parent = os.path.dirname(parent)
