"""Which records (or calls) a reader asked for: `gateway audit tail|show|query|calls|export` and
the console's timeline filter the same way.

    since, until   a time range, half-open [since, until) (timespec.py: ISO times, dates, 2h, yesterday)
    events         the record's `event` is one of these (decision, approval, result, ...)
    call_ids       the record is about one of these calls: its `call_id`, or its `parent`
                   (the parts a call carried: each line of a session write, each startup command)
    principal, tool, decision, rule
                   the record's field equals this
    host           the record names this host: a fleet record's own `host`, or the network
                   host it is about (`data.host`: a server's listen address, an egress request)
    text           a case-insensitive substring of any key or value of the record

Every given filter must hold. A call matches (`calls.py`) when its first record is in the time
range, its own fields match (its decision is the final one: an approval's answer counts), and,
for `events` and `text`, any of its records does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.audit import timespec

_ESCAPED_IN_JSON = frozenset('"\\') | {chr(c) for c in range(0x20)} | {"\x7f"}


@dataclass(frozen=True)
class Selection:
    since: str | None = None
    """A `timespec.key`: records at or after it."""
    until: str | None = None
    """A `timespec.key`: records before it."""
    events: frozenset[str] = frozenset()
    call_ids: frozenset[str] = frozenset()
    principal: str | None = None
    tool: str | None = None
    decision: str | None = None
    rule: str | None = None
    host: str | None = None
    text: str | None = None

    @classmethod
    def of(
        cls,
        *,
        since: str | None = None,
        until: str | None = None,
        events: Iterable[str] = (),
        call_ids: Iterable[str] = (),
        principal: str | None = None,
        tool: str | None = None,
        decision: str | None = None,
        rule: str | None = None,
        host: str | None = None,
        text: str | None = None,
        now: datetime | None = None,
    ) -> Selection:
        """From what a person typed: times as `timespec` reads them (raises TimeSpecError),
        lists as repeated or comma-separated values."""
        return cls(
            since=timespec.bound(since, "--since", now),
            until=timespec.bound(until, "--until", now),
            events=_names(events),
            call_ids=_names(call_ids),
            principal=principal or None,
            tool=tool or None,
            decision=decision or None,
            rule=rule or None,
            host=host.lower() if host else None,
            text=text.lower() if text else None,
        )

    @property
    def everything(self) -> bool:
        """No filter at all: every record is kept (a reader can skip asking)."""
        return self == _ALL

    @property
    def timed(self) -> bool:
        return self.since is not None or self.until is not None

    def in_range(self, record: dict[str, Any]) -> bool:
        return timespec.within(record.get("ts"), self.since, self.until)

    def fields_match(self, record: dict[str, Any]) -> bool:
        """The filters on a record's own fields (not time, events, calls or text)."""
        return (
            (self.principal is None or record.get("principal") == self.principal)
            and (self.tool is None or record.get("tool") == self.tool)
            and (self.decision is None or record.get("decision") == self.decision)
            and (self.rule is None or record.get("rule") == self.rule)
            and (self.host is None or self.host in hosts_of(record))
        )

    def about_calls(self, record: dict[str, Any]) -> bool:
        return not self.call_ids or record.get("call_id") in self.call_ids or record.get("parent") in self.call_ids

    def has_text(self, record: dict[str, Any], raw: bytes | None = None) -> bool:
        """Whether the text filter is in the record: looked for in its line as written (fast),
        and in its values when the text holds a character JSON writes escaped (`"`, `\\`)."""
        if self.text is None:
            return True
        if raw is not None:
            if self.text in raw.decode("utf-8", "replace").lower():
                return True
            if not (_ESCAPED_IN_JSON & set(self.text)):
                return False
        return any(self.text in s.lower() for s in strings_of(record))

    def matches(self, record: dict[str, Any], raw: bytes | None = None) -> bool:
        """Every filter holds for this one record."""
        return (
            self.in_range(record)
            and (not self.events or record.get("event") in self.events)
            and self.about_calls(record)
            and self.fields_match(record)
            and self.has_text(record, raw)
        )


_ALL = Selection()


def _names(values: Iterable[str]) -> frozenset[str]:
    return frozenset(v.strip() for value in values for v in value.split(",") if v.strip())


def hosts_of(record: dict[str, Any]) -> set[str]:
    """The hosts a record names (lower case): its own `host` and `data.host`, and in the fleet's
    store the host whose stream holds it (`stream` is `HOST:PID:NONCE`)."""
    data = record.get("data")
    found = [record.get("host"), data.get("host") if isinstance(data, dict) else None]
    stream = record.get("stream")
    if isinstance(stream, str) and stream.count(":") >= 2:
        found.append(stream.rsplit(":", 2)[0])
    return {h.lower() for h in found if isinstance(h, str) and h}


def strings_of(value: Any) -> Iterable[str]:
    """Every key and string value in a record, depth first."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str):
                    yield k
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)
