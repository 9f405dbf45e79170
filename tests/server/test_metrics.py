"""`/metrics` on a real `gateway serve --http`: what the gate counted after real calls (allowed,
denied, one that waits for a supervisor and is answered), read by a supervisor's secret or a
metrics token only; the audit log's failures counted as they happen; the daemon's metrics file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway import approval_queue, metrics
from gateway.audit import AuditLog, AuditUnavailable, records
from gateway.audit.metered import meter
from tests.audit.test_full_disk import fill_up, small_disk
from tests.conftest import PATIENCE_S, eventually
from tests.server.conftest import HttpGateway, env_without_state, gateway_cmd
from tests.server.test_supervisor_side import approvals, ask_in_background, wait_for
from tests.server.test_transports import call_http

__all__ = ["small_disk"]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


class Served:
    def __init__(self, server: HttpGateway) -> None:
        self.server = server
        env = env_without_state(server.tmp)
        made = gateway_cmd("token", "create", "--supervisor", "alice", "--tokens", str(server.tokens), env=env)
        self.supervisor = made.stdout.strip().splitlines()[-1]
        made = gateway_cmd("token", "create", "--metrics", "prometheus", "--tokens", str(server.tokens), env=env)
        self.scraper = made.stdout.strip().splitlines()[-1]
        self.agent = server.token("agent")
        self.url = f"http://127.0.0.1:{server.port}/metrics"

    def scrape(self, token: str | None = None, **headers: str) -> httpx2.Response:
        auth = {"Authorization": f"Bearer {token or self.scraper}"} if token != "" else {}
        return httpx2.get(self.url, headers={**auth, **headers}, timeout=60)


@pytest.fixture
def served(tmp_path: Path, policy_file: Path, ws: Path) -> Iterator[Served]:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        yield Served(server)
    finally:
        server.stop()


def test_metrics_count_real_calls_and_the_asks_that_wait(served: Served) -> None:
    before = served.scrape().text
    assert value(before, "agent_gateway_calls_total", tool="run", decision="allow") == 0
    asyncio.run(call_http(served.server.url, served.agent, "auto", ("run", {"command": "echo hi"}),
                          ("run", {"command": "curl https://example.com"}), ("run", {"nope": 1})))  # fmt: skip
    after = served.scrape()
    assert after.status_code == 200 and after.headers["content-type"].startswith("text/plain; version=")
    text = after.text
    assert value(text, "agent_gateway_calls_total", tool="run", decision="allow") == 1
    assert value(text, "agent_gateway_calls_total", tool="run", decision="deny") == 1
    assert value(text, "agent_gateway_calls_total", tool="run", decision="rejected") == 1
    assert value(text, "agent_gateway_decision_seconds_count", tool="run") == 2
    assert value(text, "agent_gateway_run_seconds_count", tool="run", status="ok") == 1
    assert value(text, "agent_gateway_sandbox_starts_total") >= 1
    # every record but the ones the writer writes itself when it opens the log (its key's pin)
    appended = len([r for _, _, r, _ in records(served.server.audit) if r and r["event"] != "audit_key"])
    assert value(text, "agent_gateway_audit_append_seconds_count") == appended  # server_started included
    assert value(text, "agent_gateway_audit_append_failures_total") == 0
    assert value(text, "agent_gateway_approvals_waiting") == 0 and "process_resident_memory_bytes" in text

    got = ask_in_background(served.server, served.agent, ("run", {"command": "rm -f nothing"}))
    (row,) = wait_for("an ask", lambda: approval_queue.pending(served.server.queue), agent=got)
    time.sleep(0.01)  # (it has waited for some time: its age is above 0)
    waiting = served.scrape().text
    assert value(waiting, "agent_gateway_approvals_waiting") == 1
    assert value(waiting, "agent_gateway_approval_oldest_wait_seconds") > 0
    assert value(waiting, "agent_gateway_approvals_waiting_by_age", le="+Inf") == 1
    assert value(waiting, "agent_gateway_calls_in_flight") == 1
    assert value(waiting, "agent_gateway_calls_total", tool="run", decision="ask") == 1
    answered = approvals(served.server, "approve", row["call_id"], "--state-dir", str(served.server.queue))
    assert answered.returncode == 0, answered.stderr
    wait_for("the answer", lambda: got, limit=PATIENCE_S)
    done = served.scrape().text
    assert value(done, "agent_gateway_approvals_waiting") == 0
    assert value(done, "agent_gateway_approvals_total", answer="allow") == 1
    assert value(done, "agent_gateway_approval_wait_seconds_count", answer="allow") == 1


def test_only_a_supervisor_or_a_metrics_token_reads_them(served: Served) -> None:
    assert served.scrape(served.supervisor).status_code == 200
    assert served.scrape(served.scraper).status_code == 200
    no_token = served.scrape("")
    assert no_token.status_code == 401 and "Bearer" in no_token.headers["www-authenticate"]
    assert served.scrape("agws_guessed-secret").status_code == 401
    assert served.scrape(served.agent).status_code == 403  # the agent cannot watch its supervisor's queue
    assert served.scrape(served.scraper, Host="evil.example").status_code == 421  # a rebinding page
    assert httpx2.post(served.url, headers={"Authorization": f"Bearer {served.scraper}"}, timeout=60).status_code == 405
    # a metrics token opens nothing else: not the console, not MCP
    console = httpx2.get(f"http://127.0.0.1:{served.server.port}/console/api/approvals",
                         headers={"Authorization": f"Bearer {served.scraper}"}, timeout=60)  # fmt: skip
    assert console.status_code == 401
    mcp = httpx2.post(served.server.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                      headers={"Authorization": f"Bearer {served.scraper}", "Accept": "application/json, "
                               "text/event-stream"}, timeout=60)  # fmt: skip
    assert mcp.status_code == 401
    refused = eventually(
        lambda: [r for _, _, r, _ in records(served.server.audit) if r and r["event"] == "auth_refused"]
    )
    assert refused  # refusals at /metrics are recorded like any other


def test_audit_failures_are_counted_and_still_raise(small_disk: Path) -> None:
    log = meter(AuditLog(small_disk / "audit"))
    failures = metrics.AUDIT_FAILURES._value.get()
    log.append("note", data={"n": 1})
    filler = fill_up(small_disk)
    with pytest.raises(AuditUnavailable):
        log.append("note", data={"n": "x" * 50_000})
    assert metrics.AUDIT_FAILURES._value.get() == failures + 1
    filler.unlink()
    log.append("note", data={"n": 2})  # space is back: it just works, and counts nothing more
    assert metrics.AUDIT_FAILURES._value.get() == failures + 1
    assert meter(log) is log  # metered once


def test_the_daemon_writes_its_metrics_file(tmp_path: Path, policy_file: Path, ws: Path) -> None:
    sockets = tmp_path / "sock"
    sockets.mkdir(mode=0o700)
    out = tmp_path / "daemon.prom"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "daemon", "--socket", str(sockets / "d.sock"), "--policy", str(policy_file),
         "--workspace", str(ws), "--audit-dir", str(tmp_path / "audit"), "--principal", "agent",
         "--metrics-file", str(out), "--metrics-interval", "1"],
        stderr=subprocess.PIPE, env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )  # fmt: skip
    try:
        assert eventually(lambda: out.exists() and "agent_gateway_audit_append_seconds_count" in out.read_text())
        assert value(out.read_text(), "agent_gateway_audit_append_seconds_count") >= 1  # its policy_loaded
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(PATIENCE_S)
