"""Benchmark an upstream MCP tool through the gateway against the same upstream called directly
(run by hand).

    .venv/bin/python bench/upstream.py [--repeats N] [--calls N] [--clients 1,8] [--docs]

The upstream is tests/upstream/servers/fake_upstream.py (the official SDK's `MCPServer`) and its
trivial `echo` tool. Three targets, each its own process(es), started and stopped here:

1. `direct`: the upstream over streamable HTTP (uvicorn), the clients connected to it;
2. `gateway, stdio upstream`: `gateway serve --http` (a bearer token, an allow rule on
   `bench.echo` with an argument condition, the signed and fsynced decision and result records),
   the upstream as the gateway runs it by default: over stdio, in its sandbox;
3. `gateway, HTTP upstream`: the same gateway in front of the upstream of 1 over HTTP.

Each client is its own SDK `Client` connection (asyncio, in this process). For each repeat and
each concurrency, every target in turn (the order rotates per repeat), `--calls` calls per
client are timed after `--warmup` per client. Reported: calls/s (median, min, max over the
repeats), p50 latency, and the gateway's calls/s against `direct` in the same repeat. `--docs`
writes the table into docs/performance.md between its bench/upstream.py markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = Path(sys.executable).parent / "gateway"
FAKE = ROOT / "tests" / "upstream" / "servers" / "fake_upstream.py"
SITE = sysconfig.get_paths()["purelib"]
DOCS = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench/upstream.py: begin -->", "<!-- bench/upstream.py: end -->"
READY_S = 60.0


def policy(upstream_url: str | None) -> dict[str, Any]:
    if upstream_url is None:
        bench: dict[str, Any] = {"command": ["/usr/bin/python3", str(FAKE), "stdio", "--site", SITE],
                                 "read_roots": [SITE, str(FAKE.parent)]}  # fmt: skip
    else:
        bench = {"url": upstream_url}
    return {
        "version": 1,
        "principals": {"agent": {"roles": ["dev"]}},
        "roles": {"dev": {"level": 1, "read_roots": ["."], "write_roots": ["."]}},
        "tools": {"upstream": {"allow_from": 1}},
        "upstreams": {"bench": bench},
        "rules": [{"id": "echo", "decision": "allow", "justification": "the bench's trivial tool",
                   "tool": "bench.echo", "arguments": [{"at": "/text", "max_length": 100}]}],
    }  # fmt: skip


# --- processes -----------------------------------------------------------------------------------
def start(cmd: list[str], log: Path, marker: re.Pattern[str]) -> tuple[subprocess.Popen[bytes], re.Match[str]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        found = marker.search(log.read_text(errors="replace"))
        if found:
            return proc, found
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{cmd[:3]} did not start:\n{log.read_text(errors='replace')}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start_gateway(tmp: Path, name: str, upstream_url: str | None, procs: list[Any]) -> tuple[str, str]:
    own = tmp / name
    (own / "workspace").mkdir(parents=True)
    policy_file = own / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy(upstream_url)))
    common = ["--tokens", str(own / "tokens.json"), "--policy", str(policy_file)]
    made = subprocess.run([str(GATEWAY), "token", "create", "--principal", "agent", *common],
                          capture_output=True, text=True, check=True, cwd="/")  # fmt: skip
    token = made.stdout.strip().splitlines()[-1]
    cmd = [str(GATEWAY), "serve", "--http", "127.0.0.1:0", *common, "--workspace", str(own / "workspace"),
           "--audit-dir", str(own / "audit"), "--audit-keys", str(own / "keys"), "--state-dir",
           str(own / "approvals"), "--process-dir", str(own / "state")]  # fmt: skip
    proc, found = start(cmd, own / "gateway.log", re.compile(r"listening on (http://127\.0\.0\.1:\d+/mcp)"))
    procs.append(proc)
    return found.group(1), token


# --- clients -------------------------------------------------------------------------------------
@dataclass
class Run:
    calls_per_s: float
    p50_ms: float


async def drive(url: str, token: str | None, tool: str, clients: int, calls: int, warmup: int) -> Run:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with contextlib.AsyncExitStack() as stack:
        sessions = []
        for _ in range(clients):
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=60))
            sessions.append(await stack.enter_async_context(Client(streamable_http_client(url, http_client=http))))
        latencies: list[float] = []

        async def one(c: Client, n: int, timed: bool) -> None:
            for i in range(n):
                t0 = time.perf_counter()
                r = await c.call_tool(tool, {"text": f"hello {i}"})
                if r.is_error:
                    raise RuntimeError(f"{tool}: {r.content}")
                if timed:
                    latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(c, warmup, False) for c in sessions))
        t0 = time.perf_counter()
        await asyncio.gather(*(one(c, calls, True) for c in sessions))
        wall = time.perf_counter() - t0
    return Run(clients * calls / wall, statistics.median(latencies) * 1000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100, help="timed calls per client")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls per client first")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/performance.md")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[tuple[str, int], list[Run]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="agw-bench-upstream-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            upstream, found = start([sys.executable, str(FAKE), "http"], tmp / "upstream.log",
                                    re.compile(r"listening on (\d+)"))  # fmt: skip
            procs.append(upstream)
            direct_url = f"http://127.0.0.1:{found.group(1)}/mcp"
            via_stdio = start_gateway(tmp, "gw-stdio", None, procs)
            via_http = start_gateway(tmp, "gw-http", direct_url, procs)
            targets = [("direct", direct_url, None, "echo"),
                       ("gateway, stdio upstream", *via_stdio, "bench__echo"),
                       ("gateway, HTTP upstream", *via_http, "bench__echo")]  # fmt: skip
            for repeat in range(args.repeats):
                for clients in counts:
                    order = targets[repeat % 3 :] + targets[: repeat % 3]
                    got = {name: asyncio.run(drive(url, token, tool, clients, args.calls, args.warmup))
                           for name, url, token, tool in order}  # fmt: skip
                    for name, r in got.items():
                        results.setdefault((name, clients), []).append(r)
                        ratios.setdefault((name, clients), []).append(r.calls_per_s / got["direct"].calls_per_s)
                    print(f"repeat {repeat + 1}, {clients} clients: " + ", ".join(
                        f"{n} {r.calls_per_s:.0f}/s" for n, r in got.items()), file=sys.stderr)  # fmt: skip
        finally:
            for p in reversed(procs):
                stop(p)
    table = render(results, ratios, counts, args)
    print(table)
    if args.docs:
        text = DOCS.read_text()
        start_at, end_at = text.index(BEGIN) + len(BEGIN), text.index(END)
        DOCS.write_text(text[:start_at] + "\n" + table + "\n" + text[end_at:])
    return 0


def render(
    results: dict[tuple[str, int], list[Run]], ratios: dict[tuple[str, int], list[float]], counts: list[int],
    args: argparse.Namespace,
) -> str:  # fmt: skip
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    cpus = os.cpu_count()
    lines = [
        f"Measured {when} on {platform.machine()}, {cpus} CPUs shared with other work, Python "
        f"{platform.python_version()}: {args.repeats} repeats of {args.calls} calls per client (after "
        f"{args.warmup}), streamable HTTP on loopback.",
        "",
        "| Target | Clients | Calls/s (median, min-max) | p50 latency | vs direct (median) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for clients in counts:
        for name in ("direct", "gateway, stdio upstream", "gateway, HTTP upstream"):
            runs = results[(name, clients)]
            rates = [r.calls_per_s for r in runs]
            ratio = statistics.median(ratios[(name, clients)])
            lines.append(
                f"| {name} | {clients} | {statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f}) | "
                f"{statistics.median(r.p50_ms for r in runs):.1f} ms | {ratio:.2f}x |"
            )
    return "\n".join(lines) + "\n\n" + json.dumps({"calls": args.calls, "repeats": args.repeats})


if __name__ == "__main__":
    sys.exit(main())
