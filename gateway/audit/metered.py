"""An audit log whose appends are measured: how long each took, which failed, and what each
durable record says about calls (gateway/metrics.py).

`meter(log)` wraps the log's `append` in place (the writer itself stays as it is): the caller's
thread times its own append and bumps a few counters after the record is on disk, or after the
failure it is about to deny on. Nothing waits on a scrape or an exporter; a metric that cannot be
counted is skipped, never a reason to fail an append that succeeded.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from gateway import metrics
from gateway.audit.records import AuditUnavailable
from gateway.audit.sink import AuditSink


def meter(log: AuditSink) -> AuditSink:
    """`log`, its appends measured from now on (once: metering it again changes nothing)."""
    if getattr(log, "_metered", False):
        return log
    inner = log.append

    def append(event: str, **fields: Any) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            record = inner(event, **fields)
        except AuditUnavailable:
            with contextlib.suppress(Exception):
                metrics.AUDIT_APPEND.observe(time.perf_counter() - start)
                metrics.AUDIT_FAILURES.inc()
            raise
        with contextlib.suppress(Exception):
            metrics.AUDIT_APPEND.observe(time.perf_counter() - start)
            metrics.recorded(record)
        return record

    log.append = append  # type: ignore[method-assign]
    log._metered = True  # type: ignore[attr-defined]
    return log
