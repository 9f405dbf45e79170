"""Benchmark MCP tool calls over streamable HTTP (run by hand).

    .venv/bin/python bench/serve.py [--calls N] [--warmup N]

Calls per second and p50 / p99 latency of `run` calls, with 1, 8 and 32 concurrent clients (each
its own MCP connection, asyncio), against:

1. the real gateway (`gateway serve --http`, shipped policy, a bearer token) running `true`
   (allowed: analysis, policy, fsynced audit, bwrap sandbox) and `curl http://example.com` (denied
   by the `network` rule: analysis, policy and audit, nothing runs);
2. a bare `MCPServer` defined here whose `run` tool is `subprocess.run(["bash", "-c", command])`:
   no gate, no sandbox, no audit. Only `true` is measured there; the denial has no bare equivalent.

Both servers run in their own process, started and stopped here. The ratios compare each gateway
row with bare `true` at the same concurrency. Numbers go into docs/performance.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = Path(sys.executable).parent / "gateway"
CONCURRENCY = (1, 8, 32)
ALLOWED = "true"
DENIED = "curl http://example.com"
READY_S = 60.0


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the bare baseline (runs in its own process: `serve.py --bare-server PORT`) ------------------
def bare_server(port: int) -> None:
    mcp = MCPServer("bare", log_level="WARNING")

    @mcp.tool()
    def run(command: str) -> str:
        """Run a command with bash, nothing else (the SDK runs sync tools in a worker thread)."""
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"exit {done.returncode}: {done.stderr}")
        return done.stdout

    mcp.run(transport="streamable-http", host="127.0.0.1", port=port)


# --- processes -----------------------------------------------------------------------------------
def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(proc: subprocess.Popen[bytes], log: Path, port: int, marker: str | None) -> None:
    """Until `marker` is in the log (or, without one, the port takes connections)."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}:\n{log.read_text()}")
        if marker is not None:
            if marker in log.read_text(errors="replace"):
                return
        else:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
        time.sleep(0.05)
    raise RuntimeError(f"{proc.args[:3]} not ready after {READY_S:.0f} s:\n{log.read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL to the whole process group if it does not go within 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            print(f"warning: {proc.args[:3]} ignored SIGTERM; killing it", file=sys.stderr)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # and anything it left behind in its group
    proc.wait()


def start_gateway(tmp: Path, procs: list[subprocess.Popen[bytes]]) -> tuple[str, str]:
    (tmp / "policies").mkdir()
    (tmp / "workspace").mkdir()
    for name in ("default.yaml", "default.tests.jsonl"):
        shutil.copy(ROOT / "policies" / name, tmp / "policies" / name)
    common = ["--tokens", str(tmp / "tokens.json"), "--policy", str(tmp / "policies" / "default.yaml")]
    created = subprocess.run(
        [str(GATEWAY), "token", "create", "--principal", "agent", *common], capture_output=True, text=True, check=True
    )
    token = created.stdout.strip().splitlines()[-1].strip()
    port = free_port()
    cmd = [str(GATEWAY), "serve", "--http", f"127.0.0.1:{port}", *common, "--workspace", str(tmp / "workspace")]
    cmd += ["--audit-dir", str(tmp / "audit"), "--state-dir", str(tmp / "approvals")]
    cmd += ["--process-dir", str(tmp / "processes")]
    log = tmp / "gateway.log"
    procs.append(start(cmd, log))
    wait_ready(procs[-1], log, port, "listening on http://")
    return f"http://127.0.0.1:{port}/mcp", token


def start_bare(tmp: Path, procs: list[subprocess.Popen[bytes]]) -> str:
    port = free_port()
    log = tmp / "bare.log"
    procs.append(start([sys.executable, str(Path(__file__).resolve()), "--bare-server", str(port)], log))
    wait_ready(procs[-1], log, port, None)
    return f"http://127.0.0.1:{port}/mcp"


# --- the clients ---------------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    url: str
    token: str | None
    command: str
    denied: bool


@dataclass
class Result:
    latencies: list[float]
    wall_s: float
    server_ms: list[float]  # the gateway's own `duration_ms` for the command (allowed calls only)


async def call(client: Client, target: Target, server_ms: list[float] | None = None) -> None:
    r = await client.call_tool("run", {"command": target.command})
    if r.is_error != target.denied:
        text = " | ".join(getattr(c, "text", "") for c in r.content)
        want = "an error" if target.denied else "success"
        raise RuntimeError(f"{target.name}: `{target.command}` gave is_error={r.is_error}, wanted {want}: {text}")
    duration = (r.structured_content or {}).get("duration_ms")  # the gateway's envelope; none from bare
    if server_ms is not None and isinstance(duration, int | float):
        server_ms.append(float(duration))


async def measure(target: Target, concurrency: int, calls: int, warmup: int) -> Result:
    per_client = -(-calls // concurrency)
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    latencies: list[float] = []
    server_ms: list[float] = []
    ends: list[float] = []
    ready = 0
    all_ready = asyncio.Event()
    go = asyncio.Event()

    async def one() -> None:
        nonlocal ready
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(target.url, http_client=http)) as client,
        ):
            for _ in range(warmup):
                await call(client, target)
            ready += 1
            if ready == concurrency:
                all_ready.set()
            await go.wait()
            for _ in range(per_client):
                t0 = time.perf_counter()
                await call(client, target, server_ms)
                latencies.append((time.perf_counter() - t0) * 1e3)
            ends.append(time.perf_counter())

    async with asyncio.TaskGroup() as tg:  # one failure cancels the rest and is raised here
        for _ in range(concurrency):
            tg.create_task(one())
        await all_ready.wait()
        t0 = time.perf_counter()
        go.set()
    return Result(latencies, max(ends) - t0, server_ms)  # to the last call's answer, not the disconnects


async def bench(targets: list[Target], calls: int, warmup: int) -> list[tuple[int, Target, Result]]:
    out = []
    for concurrency in CONCURRENCY:
        for target in targets:
            t0 = time.perf_counter()
            res = await measure(target, concurrency, calls, warmup)
            print(
                f"  {concurrency:2} clients  {target.name:26} {len(res.latencies) / res.wall_s:7.1f} calls/s "
                f"(took {time.perf_counter() - t0:.1f} s)",
                file=sys.stderr,
            )
            out.append((concurrency, target, res))
    return out


def table(rows: list[tuple[int, Target, Result]]) -> None:
    bare = {c: r for c, t, r in rows if t.name.startswith("bare")}
    print("| clients | target | calls/s | p50 ms | p99 ms | p50 / bare p50 | calls/s / bare calls/s |")
    print("|--:|---|--:|--:|--:|--:|--:|")
    for c, t, r in rows:
        rate = len(r.latencies) / r.wall_s
        p50 = statistics.median(r.latencies)
        b = bare[c]
        ratios = "- | -"
        if not t.name.startswith("bare"):
            ratios = f"{p50 / statistics.median(b.latencies):.1f}x | {rate / (len(b.latencies) / b.wall_s):.2f}x"
        print(f"| {c} | {t.name} | {rate:.1f} | {p50:.1f} | {pct(r.latencies, 0.99):.1f} | {ratios} |")
    print()
    for c, t, r in rows:
        if r.server_ms:
            print(
                f"{t.name}, {c} clients: the command itself (sandbox start to exit, the gateway's `duration_ms`) "
                f"p50 {statistics.median(r.server_ms):.0f} ms, p99 {pct(r.server_ms, 0.99):.0f} ms"
            )


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0))
    return f"{cpus} CPUs ({model or platform.machine()}), Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400, help="measured calls per target and concurrency level")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured calls per client before measuring")
    ap.add_argument("--bare-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server is not None:
        bare_server(args.bare_server)
        return

    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            url, token = start_gateway(tmp, procs)
            bare_url = start_bare(tmp, procs)
            targets = [
                Target(f"bare `{ALLOWED}`", bare_url, None, ALLOWED, denied=False),
                Target(f"gateway `{ALLOWED}`", url, token, ALLOWED, denied=False),
                Target(f"gateway `{DENIED}` (denied)", url, token, DENIED, denied=True),
            ]
            rows = asyncio.run(bench(targets, args.calls, args.warmup))
        finally:
            for proc in procs:
                stop(proc)
    print(f"\nmachine: {machine()}; {args.calls} calls per row after {args.warmup} warm-up calls per client\n")
    table(rows)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
