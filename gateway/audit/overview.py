"""The ledger in numbers: what the console's overview page draws, counted on the server.

`overview()` takes calls (folded by calls.py, in the order they began) and counts, for the
calls that began in [since, until):

    per_bucket    calls per hour (per day over a range longer than `MAX_BUCKETS` hours) by the
                  policy's decision: allow, ask, deny, other (refused before a decision)
    denied        calls whose final decision was a denial (the policy's, or a supervisor's
                  answer, a timeout, a withdrawal): the top rules (a stage's reason code where no
                  rule decided) and the top commands
    waits         asks and how long they waited for an answer: answered, timed out, still
                  waiting, and the answered ones' waits in buckets, median, 90th percentile, max
    principals    per principal: calls by decision

Every count is exact (nothing is sampled); only the top lists are cut (`TOP`), with the rest
counted. A call's time is its first record's; one without a readable time counts nowhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.audit import timespec
from gateway.audit.calls import Call

DECISIONS = ("allow", "ask", "deny", "other")
TOP = 10
MAX_BUCKETS = 72
"""Hours drawn one bar each; a longer range is drawn by day."""
MAX_COMMAND = 160
"""Characters of a command a top list keeps (the call page has it whole)."""
WAIT_BUCKETS = ((10_000, "under 10 s"), (30_000, "10-30 s"), (60_000, "30-60 s"), (300_000, "1-5 min"),
                (900_000, "5-15 min"), (None, "over 15 min"))  # fmt: skip


@dataclass(frozen=True)
class Range:
    since: datetime
    until: datetime

    @property
    def by_day(self) -> bool:
        return self.until - self.since > timedelta(hours=MAX_BUCKETS)

    def buckets(self) -> list[str]:
        """The bars' keys, oldest first: `YYYY-MM-DDTHH` (hours) or `YYYY-MM-DD` (days)."""
        step = timedelta(days=1) if self.by_day else timedelta(hours=1)
        at = self.since.replace(minute=0, second=0, microsecond=0)
        if self.by_day:
            at = at.replace(hour=0)
        out = []
        while at < self.until:
            out.append(at.strftime("%Y-%m-%d" if self.by_day else "%Y-%m-%dT%H"))
            at += step
        return out


def _decision(call: Call) -> str:
    return call.decision if call.decision in ("allow", "ask", "deny") else "other"


def _percentile(sorted_ms: list[int], p: float) -> int | None:
    if not sorted_ms:
        return None
    return sorted_ms[min(len(sorted_ms) - 1, int(p * len(sorted_ms)))]


def _top(counter: Counter[str], n: int = TOP) -> dict[str, Any]:
    top = counter.most_common(n)
    return {"top": [{"name": k, "count": v} for k, v in top], "others": sum(counter.values()) - sum(v for _, v in top)}


def overview(calls: Iterable[Call], since: datetime, until: datetime) -> dict[str, Any]:
    """The overview of the calls that began in [since, until) (aware datetimes)."""
    span = Range(since.astimezone(UTC), until.astimezone(UTC))
    keys = span.buckets()
    width = 10 if span.by_day else 13
    per: dict[str, list[int]] = {k: [0, 0, 0, 0] for k in keys}
    low, high = timespec.key(span.since), timespec.key(span.until)
    index = {d: n for n, d in enumerate(DECISIONS)}
    denied_rules: Counter[str] = Counter()
    denied_commands: Counter[str] = Counter()
    principals: dict[str, list[int]] = {}
    waits: list[int] = []
    timed_out = waiting = withdrawn = total = 0
    for call in calls:
        when = timespec.record_key(call.when)
        if when is None or not (low <= when < high):
            continue
        bar = per.get(when[:width])
        if bar is None:
            continue
        total += 1
        d = index[_decision(call)]
        bar[d] += 1
        row = principals.get(call.principal or "(none)")
        if row is None:
            row = principals[call.principal or "(none)"] = [0, 0, 0, 0]
        row[d] += 1
        if call.final == "deny" or call.decision == "deny":
            denied_rules[call.rule or f"({call.reason_code or call.error or 'no rule'})"] += 1
            command = call.command if len(call.command) <= MAX_COMMAND else call.command[:MAX_COMMAND] + "..."
            denied_commands[command] += 1
        if call.decision == "ask":
            if call.outcome == "waiting":
                waiting += 1
            elif call.outcome == "timeout":
                timed_out += 1
            elif call.outcome == "withdrawn":
                withdrawn += 1
            if call.waited_ms is not None and call.approved_by is not None:
                waits.append(call.waited_ms)
    waits.sort()
    counts = [0] * len(WAIT_BUCKETS)
    for ms in waits:
        counts[next(k for k, (bound, _) in enumerate(WAIT_BUCKETS) if bound is None or ms < bound)] += 1
    buckets = [
        {"label": label, "under_ms": bound, "count": n} for (bound, label), n in zip(WAIT_BUCKETS, counts, strict=True)
    ]
    by_principal = sorted(principals.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    return {
        "since": span.since.isoformat(timespec="seconds"),
        "until": span.until.isoformat(timespec="seconds"),
        "bucket": "day" if span.by_day else "hour",
        "decisions": list(DECISIONS),
        "calls": total,
        "per_bucket": [{"at": k, **dict(zip(DECISIONS, per[k], strict=True))} for k in keys],
        "denied": {"rules": _top(denied_rules), "commands": _top(denied_commands), "count": sum(denied_rules.values())},
        "waits": {
            "answered": len(waits),
            "timed_out": timed_out,
            "waiting": waiting,
            "withdrawn": withdrawn,
            "median_ms": _percentile(waits, 0.5),
            "p90_ms": _percentile(waits, 0.9),
            "max_ms": waits[-1] if waits else None,
            "buckets": buckets,
        },
        "principals": [
            {"principal": p, **dict(zip(DECISIONS, row, strict=True)), "calls": sum(row)}
            for p, row in by_principal[: TOP * 2]
        ],
        "principals_others": max(0, len(by_principal) - TOP * 2),
    }
