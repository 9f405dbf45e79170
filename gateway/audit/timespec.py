"""Times a reviewer types (`--since 2h`, `--until yesterday`), as bounds on a record's `ts`.

Accepted forms (`parse`):

    2026-11-25T10:00, 2026-11-25T10:00:00.5+01:00, ...Z   an ISO 8601 time (UTC when no zone is given)
    2026-11-25                                            that day's start (00:00 UTC)
    2h, 30m, 45s, 7d, 1w, 1h30m (optionally "2h ago")     that long before now
    now, today, yesterday                                 now; today's or yesterday's start (UTC)

A range is half-open: `--since` keeps records at or after its time, `--until` those before
it, so `--since yesterday --until today` is all of yesterday and `--until 2026-11-25` stops
before that day begins. Day names and dates are UTC days: the log's times are UTC.

Records are compared through `key()`: the writer's own form of `ts`
(`2026-11-25T10:00:00.000000Z`), which sorts as text in time order, so a bound costs one
string comparison per record. A record whose `ts` is not in that form is read as ISO 8601;
one whose time cannot be read has no key and is outside every bounded range.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(?:\d+[smhdw])+$")
_PART = re.compile(r"(\d+)([smhdw])")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_WRITER_FORM = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
FORMS = "an ISO 8601 time (2026-11-25T10:00), a date (2026-11-25), a duration ago (2h, 30m, 7d), today or yesterday"


class TimeSpecError(ValueError):
    """A time the reader cannot take; the message names the option and the accepted forms."""


def parse(text: str, what: str = "--since", now: datetime | None = None) -> datetime:
    """`text` as an aware UTC datetime. Raises TimeSpecError naming `what`."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    given = text.strip()
    spec = given.lower().removesuffix(" ago").strip()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if spec == "now":
        return now
    if spec == "today":
        return midnight
    if spec == "yesterday":
        return midnight - timedelta(days=1)
    if _DURATION.match(spec):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(spec))
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            raise TimeSpecError(f"{what} {given!r}: too long ago") from None
    if _DATE.match(spec) or "t" in spec or " " in spec:
        try:
            when = datetime.fromisoformat(given.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            pass
        else:
            return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).astimezone(UTC)
    raise TimeSpecError(f"{what} {given!r}: expected {FORMS}")


def key(when: datetime) -> str:
    """The writer's form of a time: records' `ts` compare with it as text."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def bound(text: str | None, what: str, now: datetime | None = None) -> str | None:
    """The key of an option's time, None when it is not given."""
    if text is None or text.strip() == "":
        return None
    return key(parse(text, what, now))


def record_key(ts: Any) -> str | None:
    """The key of a record's `ts` (its own text in the writer's form), None when unreadable."""
    if not isinstance(ts, str):
        return None
    if _WRITER_FORM.match(ts):
        return ts
    try:
        when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return key(when if when.tzinfo is not None else when.replace(tzinfo=UTC))


def within(ts: Any, since: str | None, until: str | None) -> bool:
    """Whether a record's `ts` lies in [since, until) (keys from `bound`)."""
    if since is None and until is None:
        return True
    k = record_key(ts)
    return k is not None and (since is None or k >= since) and (until is None or k < until)
