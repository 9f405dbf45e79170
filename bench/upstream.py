"""Benchmark an upstream MCP tool through the gateway against the same upstream called directly
(run by hand).

    .venv/bin/python bench/upstream.py [--repeats N] [--calls N] [--clients 1,8] [--work-ms 0,50] [--docs]

The upstream is tests/upstream/servers/fake_upstream.py (the official SDK's `MCPServer`): its
trivial `echo` tool, and with `--work-ms 50` its `slow` tool, which waits that long (a tool that
calls a web API). Three targets, each its own process(es), started and stopped here:

1. `direct`: the upstream over streamable HTTP (uvicorn), the clients connected to it;
2. `gateway, stdio upstream`: `gateway serve --http` (a bearer token, an allow rule on the tool
   with an argument condition, the signed and fsynced decision and result records), the
   upstream as the gateway runs it by default: over stdio, in its sandbox;
3. `gateway, HTTP upstream`: the same gateway in front of the upstream of 1 over HTTP;
4. `bare SDK proxy, stdio upstream`: bench/sdk_proxy.py, an SDK server whose tools call the
   upstream over stdio through an SDK client and do nothing else: what any pass-through built on
   the official SDK costs on this machine, the ceiling for the gateway's ratio.

Each client is its own SDK `Client` connection (asyncio, in this process). For each repeat, each
concurrency and each tool, every target in turn (the order rotates per repeat), `--calls` calls
per client are timed after `--warmup` per client. Reported: calls/s (median, min, max over the
repeats), p50 latency, the calls/s against `direct` in the same repeat, and the CPU each process
spent per timed call (user + system, from /proc): this process's clients, the server (the direct
upstream, or the gateway), the gateway's upstream. `--docs` writes the table into
docs/performance.md between its bench/upstream.py markers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import Callable
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
TICK = os.sysconf("SC_CLK_TCK")
NAMES = ("direct", "bare SDK proxy, stdio upstream", "gateway, stdio upstream", "gateway, HTTP upstream")
PROXY = ROOT / "bench" / "sdk_proxy.py"


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
        "rules": [
            {"id": "echo", "decision": "allow", "justification": "the bench's trivial tool", "tool": "bench.echo",
             "arguments": [{"at": "/text", "max_length": 100}]},
            {"id": "slow", "decision": "allow", "justification": "the bench's working tool", "tool": "bench.slow"},
        ],
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


def start_gateway(tmp: Path, name: str, upstream_url: str | None, procs: list[Any]) -> tuple[str, str, int]:
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
    return found.group(1), token, proc.pid


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a live process (all its threads); 0 for none."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sandboxed_upstream() -> int | None:
    """The gateway's sandboxed upstream (the fake server over stdio), once it runs."""
    return upstream_of(b"/usr/bin/python3")


def upstream_of(python: bytes) -> int | None:
    """The fake server over stdio run by `python`, once it runs."""
    wanted = [python, str(FAKE).encode(), b"stdio"]
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[:3] == wanted:
                return int(entry)
    return None


# --- clients -------------------------------------------------------------------------------------
@dataclass
class Run:
    calls_per_s: float
    p50_ms: float
    cpu_ms: tuple[float, float, float]
    """Per timed call: the clients (this process), the server, the server's upstream."""


async def drive(
    url: str, token: str | None, tool: str, args: dict[str, Any], clients: int, calls: int, warmup: int,
    pids: Callable[[], tuple[int | None, int | None]],
) -> Run:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with contextlib.AsyncExitStack() as stack:
        sessions = []
        for _ in range(clients):
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=60))
            sessions.append(await stack.enter_async_context(Client(streamable_http_client(url, http_client=http))))
        latencies: list[float] = []
        errors: list[str] = []

        async def one(c: Client, n: int, timed: bool) -> None:
            for _ in range(n):
                t0 = time.perf_counter()
                r = await c.call_tool(tool, args)
                if r.is_error:
                    errors.append(str(r.content)[:300])
                if timed:
                    latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(c, warmup, False) for c in sessions))
        server, upstream = pids()
        before = (time.process_time(), cpu_s(server), cpu_s(upstream))
        t0 = time.perf_counter()
        await asyncio.gather(*(one(c, calls, True) for c in sessions))
        wall = time.perf_counter() - t0
        after = (time.process_time(), cpu_s(server), cpu_s(upstream))
    if errors:  # a bench of failures would mean nothing: say what failed
        raise RuntimeError(f"{len(errors)} of the calls to {tool} failed, the first: {errors[0]}")
    n = clients * calls
    cpu = tuple((a - b) / n * 1000 for a, b in zip(after, before, strict=True))
    return Run(n / wall, statistics.median(latencies) * 1000, (cpu[0], cpu[1], cpu[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100, help="timed calls per client")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls per client first")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--work-ms", default="0", help="0: the trivial echo tool; N: a tool that waits N ms")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/performance.md")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    works = [int(w) for w in args.work_ms.split(",")]
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[tuple[int, str, int], list[Run]] = {}
    ratios: dict[tuple[int, str, int], list[float]] = {}
    load = os.getloadavg()[0]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agw-bench-upstream-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            upstream, found = start([sys.executable, str(FAKE), "http"], tmp / "upstream.log",
                                    re.compile(r"listening on (\d+)"))  # fmt: skip
            procs.append(upstream)
            direct_url = f"http://127.0.0.1:{found.group(1)}/mcp"
            proxy, found = start([sys.executable, str(PROXY), str(FAKE)], tmp / "proxy.log",
                                 re.compile(r"listening on (\d+)"))  # fmt: skip
            procs.append(proxy)
            proxy_url = f"http://127.0.0.1:{found.group(1)}/mcp"
            s_url, s_token, s_pid = start_gateway(tmp, "gw-stdio", None, procs)
            h_url, h_token, h_pid = start_gateway(tmp, "gw-http", direct_url, procs)
            targets: list[tuple[str, str, str | None, str, Callable[[], tuple[int | None, int | None]]]] = [
                (NAMES[0], direct_url, None, "", lambda: (upstream.pid, None)),
                (NAMES[1], proxy_url, None, "", lambda: (proxy.pid, upstream_of(sys.executable.encode()))),
                (NAMES[2], s_url, s_token, "bench__", lambda: (s_pid, sandboxed_upstream())),
                (NAMES[3], h_url, h_token, "bench__", lambda: (h_pid, upstream.pid)),
            ]
            for repeat in range(args.repeats):
                for work in works:
                    tool, call = ("echo", {"text": "hello"}) if work == 0 else ("slow", {"seconds": work / 1000})
                    for clients in counts:
                        turn = repeat % len(targets)
                        order = targets[turn:] + targets[:turn]
                        got = {
                            name: asyncio.run(
                                drive(url, token, prefix + tool, call, clients, args.calls, args.warmup, pids)
                            )
                            for name, url, token, prefix, pids in order
                        }
                        for name, r in got.items():
                            results.setdefault((work, name, clients), []).append(r)
                            ratio = r.calls_per_s / got[NAMES[0]].calls_per_s
                            ratios.setdefault((work, name, clients), []).append(ratio)
                        print(f"repeat {repeat + 1}, {tool} {work} ms, {clients} clients: " + ", ".join(
                            f"{n} {r.calls_per_s:.0f}/s" for n, r in got.items()), file=sys.stderr)  # fmt: skip
        finally:
            for p in reversed(procs):
                stop(p)
    table = render(results, ratios, counts, works, args, load, time.monotonic() - began)
    print(table)
    if args.docs:
        text = DOCS.read_text()
        start_at, end_at = text.index(BEGIN) + len(BEGIN), text.index(END)
        DOCS.write_text(text[:start_at] + "\n" + table + "\n" + text[end_at:])
    return 0


def render(
    results: dict[tuple[int, str, int], list[Run]], ratios: dict[tuple[int, str, int], list[float]],
    counts: list[int], works: list[int], args: argparse.Namespace, load: float, took: float,
) -> str:  # fmt: skip
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"{when}; {os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load:.1f} at the "
        f"start; {args.repeats} repeats of {args.calls} calls per client (after {args.warmup}), targets "
        f"interleaved; took {took:.0f} s.",
        "",
        "| tool | clients | target | calls/s min / median / max | p50 ms | vs direct (same repeat) median "
        "| CPU ms/call: clients / server / its upstream |",
        "|---|--:|---|--:|--:|--:|--:|",
    ]
    for work in works:
        tool = "`echo`" if work == 0 else f"`slow` {work} ms"
        for clients in counts:
            for name in NAMES:
                runs = results[(work, name, clients)]
                rates = sorted(r.calls_per_s for r in runs)
                cpu = [statistics.median(r.cpu_ms[i] for r in runs) for i in range(3)]
                lines.append(
                    f"| {tool} | {clients} | {name} | {rates[0]:.0f} / {statistics.median(rates):.0f} / "
                    f"{rates[-1]:.0f} | {statistics.median(r.p50_ms for r in runs):.1f} | "
                    f"{statistics.median(ratios[(work, name, clients)]):.2f}x | "
                    f"{cpu[0]:.1f} / {cpu[1]:.1f} / {cpu[2]:.1f} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
