"""The gateway's operational log: structlog, to stderr, one line per event.

This is for operators (what the gateway is doing); the audit log (gateway/audit.py) is the
durable, hash-chained record of decisions, and owns durability and the chain.
"""

from __future__ import annotations

import logging
import sys

import structlog

structlog.configure(
    processors=[
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"], drop_missing=True),
    ],
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    cache_logger_on_first_use=True,
)

log = structlog.get_logger("gateway")


def set_level(level: int) -> None:
    """Make the operational log more or less verbose (default: warnings only)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))
