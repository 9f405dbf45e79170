"""The gateway's metrics, in Prometheus' registry (prometheus_client), read at `/metrics`.

Everything here is an in-process counter or histogram that the gate updates on its own thread
(a lock and an addition): nothing in the gate waits on a scrape, an exporter or the network.
What is true of the moment (approvals waiting, their age, calls in flight) is collected when a
scrape asks (gateway/server/metrics.py).

    agent_gateway_calls_total{tool, decision}          calls decided (allow, ask, deny) or refused
                                                       before the policy (rejected)
    agent_gateway_decision_seconds{tool}               from a call's arrival to its decision on disk
    agent_gateway_run_seconds{tool, status}            from the decision to the result on disk
    agent_gateway_approvals_total{answer}              answers: allow, deny, timeout, withdrawn, void
    agent_gateway_approval_wait_seconds{answer}        how long each waited for its answer
    agent_gateway_audit_append_seconds                 one record made durable (group commit included)
    agent_gateway_audit_append_failures_total          appends that failed (the call was denied)
    agent_gateway_sandbox_starts_total                 sandboxes prepared (run, sessions, processes)
    agent_gateway_sandbox_quota_kills_total{quota}     commands killed by a quota: memory (the OOM
                                                       killer in the cgroup), time (timeout_ms)
    agent_gateway_sandbox_pids_refused_total           sandboxes whose process cap refused a fork
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, gc_collector, platform_collector, process_collector

REGISTRY = CollectorRegistry()
process_collector.ProcessCollector(registry=REGISTRY)
platform_collector.PlatformCollector(registry=REGISTRY)
gc_collector.GCCollector(registry=REGISTRY)

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

CALLS = Counter("agent_gateway_calls", "Calls decided, by tool and decision (rejected: refused before the policy)",
                ["tool", "decision"], registry=REGISTRY)  # fmt: skip
DECISION_SECONDS = Histogram("agent_gateway_decision_seconds", "From a call's arrival to its decision on disk",
                             ["tool"], buckets=_FAST, registry=REGISTRY)  # fmt: skip
RUN_SECONDS = Histogram("agent_gateway_run_seconds", "From a call's decision to its result on disk",
                        ["tool", "status"], buckets=_SLOW, registry=REGISTRY)  # fmt: skip
APPROVALS = Counter("agent_gateway_approvals", "Answers to asks, by answer", ["answer"], registry=REGISTRY)
APPROVAL_WAIT = Histogram("agent_gateway_approval_wait_seconds", "How long an ask waited for its answer",
                          ["answer"], buckets=_SLOW, registry=REGISTRY)  # fmt: skip
AUDIT_APPEND = Histogram("agent_gateway_audit_append_seconds", "One record made durable",
                         buckets=_FAST, registry=REGISTRY)  # fmt: skip
AUDIT_FAILURES = Counter("agent_gateway_audit_append_failures", "Appends that failed (their calls were denied)",
                         registry=REGISTRY)  # fmt: skip
SANDBOX_STARTS = Counter("agent_gateway_sandbox_starts", "Sandboxes prepared", registry=REGISTRY)
QUOTA_KILLS = Counter("agent_gateway_sandbox_quota_kills", "Commands a quota killed, by quota (memory, time, disk)",
                      ["quota"], registry=REGISTRY)  # fmt: skip
PIDS_REFUSED = Counter("agent_gateway_sandbox_pids_refused", "Sandboxes whose process cap refused a fork",
                       registry=REGISTRY)  # fmt: skip

_ANSWERS = {"approval_withdrawn": "withdrawn", "approval_void": "void"}


def recorded(record: dict[str, Any]) -> None:
    """Count what a record just made durable says: a call decided or refused, an answer, a
    command a time limit killed."""
    event = record.get("event")
    tool = str(record.get("tool") or "-")
    data: dict[str, Any] = record["data"] if isinstance(record.get("data"), dict) else {}
    if event == "decision":
        CALLS.labels(tool, str(record.get("decision") or "-")).inc()
    elif event == "rejected":
        CALLS.labels(tool, "rejected").inc()
    elif event == "approval":
        answer = "timeout" if data.get("how") == "timeout" else str(record.get("decision") or "deny")
        APPROVALS.labels(answer).inc()
    elif event in _ANSWERS:
        APPROVALS.labels(_ANSWERS[str(event)]).inc()
    elif event == "result":
        error = data.get("error")
        if isinstance(error, dict) and error.get("code") == "COMMAND_TIMEOUT":
            QUOTA_KILLS.labels("time").inc()
