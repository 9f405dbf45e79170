"""Space kept for the audit log, so that a full disk is a refused call, not a dead gateway.

An agent that fills the disk its write roots share with the audit log would leave the gateway
unable to record anything: not the refusal of its next call, not the end of the one that filled
the disk. So the writer keeps a reserve: a file of allocated blocks (`.reserve` in the audit
directory, at most `RESERVE_BYTES`, and at most an eighth of the space free when it is made).
When an append finds the disk full (ENOSPC, EDQUOT), the writer gives back a piece of the
reserve (`release`: the file is cut shorter, which needs no space) and tries again, for the
records that let nothing new run: a denial, a refusal, a call's result or error, the gateway's
own events. A record that would let a call run (an allowed decision or approval) never uses the
reserve: on a full disk that call is refused, and its refusal recorded from the reserve.

Once the disk has room again, the writer fills the reserve back up (`refill`, at most every
REFILL_S). A reserve that cannot be made (the disk is full at start) is not an error: the
writer just has none until there is room.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time

from gateway.audit.files import AuditDir
from gateway.audit.records import AuditUnavailable

NAME = ".reserve"
RESERVE_BYTES = 8 << 20
"""The most a reserve holds: some ten thousand records' worth."""
CHUNK = 16 << 10
"""What the reserve grows and shrinks by (at least)."""
REFILL_S = 1.0
FULL = (errno.ENOSPC, errno.EDQUOT)


class AuditDiskFull(AuditUnavailable):
    """The audit log's disk (or quota) is full."""


class Reserve:
    """The reserve of one audit directory (used under the writer's lock)."""

    def __init__(self, directory: AuditDir, size: int = RESERVE_BYTES) -> None:
        self._dir = directory
        self.size = size
        self.held = 0
        """Bytes the reserve holds now (its file's size: every byte of it allocated)."""
        self.whole = 0
        """What it held when it was last whole: what `refill` grows it back to after use."""
        self.released = 0
        """Bytes given back to the log since it was last whole (0: not in use). While it is in
        use the disk is full: the writer refuses records that would let a call run."""
        self._tried = 0.0

    def refill(self, now: bool = False) -> None:
        """Grow the reserve back (to `whole` after use; else to its size, at most an eighth of
        the free space) as far as the disk allows, at most every REFILL_S unless `now`. Never
        raises: a reserve is a help, not a condition of writing."""
        if self.size <= 0 or (self.held >= self.size and not self.released):
            return
        moment = time.monotonic()
        if not now and moment - self._tried < REFILL_S:
            return
        self._tried = moment
        with contextlib.suppress(OSError):
            fd = self._dir.open_write(NAME, create=True)
            try:
                held = os.fstat(fd).st_size
                target = self.whole
                if not self.released:  # an eighth of what is free at most: never the cause of a full disk
                    sv = os.fstatvfs(fd)
                    target = min(self.size, (sv.f_bavail * sv.f_frsize + held) // 8) // CHUNK * CHUNK
                while held < target:
                    try:
                        os.posix_fallocate(fd, held, CHUNK)
                    except OSError:
                        os.ftruncate(fd, held)  # nothing half-made left behind
                        break
                    held += CHUNK
                self.held = held
                if held >= target:
                    self.whole, self.released = max(held, target), 0
            finally:
                os.close(fd)

    def release(self, need: int) -> bool:
        """Give back at least `need` bytes (a CHUNK at least) for the log. False: nothing left."""
        if self.size <= 0:
            return False
        try:
            fd = self._dir.open_write(NAME)
        except OSError:
            self.held = 0
            return False
        try:
            self.held = os.fstat(fd).st_size  # (another process on this log may have used some)
            give = min(self.held, max(CHUNK, -(-2 * need // CHUNK) * CHUNK))
            if give <= 0:
                return False
            os.ftruncate(fd, self.held - give)  # shrinking needs no space: works on a full disk
            os.fsync(fd)
        except OSError:
            return False
        finally:
            os.close(fd)
        self.held -= give
        self.whole = max(self.whole, self.held + give)
        self.released += give
        self._tried = time.monotonic()  # not refilled the very next moment
        return True

    def in_use(self) -> bool:
        """Whether some of the reserve was given to the log and the disk has not had room to take
        it back since (tried again now): the disk is full."""
        if not self.released:
            return False
        self.refill(now=True)
        return self.released > 0
