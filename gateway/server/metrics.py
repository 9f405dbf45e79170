"""`GET /metrics` on the HTTP server: the gateway's metrics (gateway/metrics.py) in Prometheus'
text format, for a supervisor's secret or a metrics token only.

    Authorization: Bearer agws_...  (a supervisor: gateway token create --supervisor NAME)
    Authorization: Bearer agwm_...  (a scraper:    gateway token create --metrics NAME)

Anything else is 401 (an agent's token: 403), recorded by the front like any refusal; a `Host`
this server does not answer to is 421. Besides the counters and histograms the gate keeps, a
scrape reads what is true now, off the event loop:

    agent_gateway_approvals_waiting                    asks waiting for a supervisor (the queue)
    agent_gateway_approval_oldest_wait_seconds         how long the oldest of them has waited
    agent_gateway_approvals_waiting_by_age{le}         how many have waited at most `le` seconds
    agent_gateway_calls_in_flight                      calls this server is handling
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from gateway import approval_queue, metrics
from gateway.tokens import AGENT, TokenStore

PATH = "/metrics"
AGES = (10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class Now(Collector):
    """What a scrape reads at the moment it asks: the approvals queue and the calls in flight."""

    def __init__(self, state_dir: Path | None, in_flight: Callable[[], int] | None) -> None:
        self.state_dir = state_dir
        self.in_flight = in_flight

    def collect(self) -> Iterator[Metric]:
        waiting = approval_queue.pending(self.state_dir) if self.state_dir is not None else []
        now = time.time()
        ages = [max(0.0, now - float(r.get("created", now))) for r in waiting]
        yield GaugeMetricFamily("agent_gateway_approvals_waiting", "Asks waiting for a supervisor", len(waiting))
        yield GaugeMetricFamily(
            "agent_gateway_approval_oldest_wait_seconds",
            "How long the oldest waiting ask has waited",
            max(ages, default=0),
        )
        by_age = GaugeMetricFamily(
            "agent_gateway_approvals_waiting_by_age",
            "Waiting asks that have waited at most `le` seconds",
            labels=["le"],
        )
        for bound in AGES:
            by_age.add_metric([str(bound)], sum(1 for a in ages if a <= bound))
        by_age.add_metric(["+Inf"], len(ages))
        yield by_age
        if self.in_flight is not None:
            yield GaugeMetricFamily("agent_gateway_calls_in_flight", "Calls this server is handling", self.in_flight())


class MetricsEndpoint:
    """The ASGI app behind `/metrics`."""

    def __init__(
        self,
        tokens: TokenStore,
        hosts: tuple[str, ...],
        state_dir: Path | None = None,
        in_flight: Callable[[], int] | None = None,
    ) -> None:
        self.tokens = tokens
        self.hosts = hosts
        self.now = CollectorRegistry()
        self.now.register(Now(state_dir, in_flight))

    def render(self) -> bytes:
        return generate_latest(metrics.REGISTRY) + generate_latest(self.now)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        response = await self._answer(Request(scope, receive))
        await response(scope, receive, send)

    async def _answer(self, request: Request) -> Response:
        if request.headers.get("host", "") not in self.hosts:
            return PlainTextResponse("misdirected request: this server does not answer to that Host\n", 421)
        if request.method not in ("GET", "HEAD"):
            return PlainTextResponse("GET /metrics\n", 405, headers={"Allow": "GET, HEAD"})
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            return _unauthorized("Authorization: expected 'Bearer <a metrics token or a supervisor's secret>'")
        if self.tokens.lookup_metrics(secret) is None and self.tokens.lookup_supervisor(secret) is None:
            if self.tokens.kind_of(secret) == AGENT:
                return PlainTextResponse("an agent token cannot read the metrics\n", 403)
            return _unauthorized("unknown token: gateway token create --metrics NAME makes one")
        body = await run_in_threadpool(self.render)
        return Response(body, 200, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})


def _unauthorized(why: str) -> Response:
    return PlainTextResponse(why + "\n", 401, headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
