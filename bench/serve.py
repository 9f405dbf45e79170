"""Benchmark `run` over MCP streamable HTTP, side by side (run by hand).

    .venv/bin/python bench/serve.py [--repeats N] [--calls N] [--clients 1,8] [--docs]

Four servers, each in its own process, started and stopped here, all SDK `MCPServer`s on
uvicorn (h11) over loopback:

1. `bare`: a `run` tool that is `bash -c COMMAND`, no gate, no sandbox, no audit;
2. `bwrap by hand`: the same tool, but the command runs in the very sandbox the gateway would
   build for the policy's principal: `gateway.sandbox.start` (plan, nested-repository watcher,
   descriptors, cgroup, `agw-init outer -> bwrap -> agw-init inner -> bash`), Popen, wait,
   `Launch.finished` (the profile is `Gateway.profile` of the same policy and workspace). No
   decision, no audit, no token;
3. the gateway (`gateway serve --http`, shipped policy, a bearer token) running `true`: analysis,
   policy, the fsynced signed decision record, the sandbox, the result record;
4. the gateway denying `curl http://example.com` (analysis, policy, one record, nothing runs).

Each client is its own MCP connection (a real SDK `Client`, asyncio, in this process). For each
repeat, each concurrency and each target in turn (the order rotates per repeat), `--calls` calls
are timed after `--warmup` calls per client. Reported: calls/s min / median / max over the
repeats, p50 latency, the server process's own CPU per call (user + system of all its threads,
from /proc) and its children's (the sandboxes: agw-init, bwrap, bash, reaped), and each row's
calls/s against `bwrap by hand` in the same repeat. `--docs` also writes the table into
docs/performance.md between its bench/serve.py markers.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = Path(sys.executable).parent / "gateway"
ALLOWED = "true"
DENIED = "curl http://example.com"
READY_S = 60.0
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
DOCS = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench/serve.py: begin -->", "<!-- bench/serve.py: end -->"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the bare baselines (each in its own process: `serve.py --bare-server PORT [--sandbox-of DIR]`) --
def plain_runner() -> Any:
    def run(command: str) -> dict[str, Any]:
        t0 = time.monotonic()
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        return {"status": "ok", "exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                "duration_ms": int((time.monotonic() - t0) * 1000)}  # fmt: skip

    return run


def sandboxed_runner(tmp: Path) -> Any:
    """`run` in the sandbox the gateway would build for `agent` under the bench's policy and
    workspace: sandbox.start, Popen, wait, finished (what bench/run.py times "by hand")."""
    from gateway import sandbox
    from gateway.audit import AuditLog
    from gateway.executors.shell import SHELL, scrubbed_env
    from gateway.pipeline import Gateway
    from gateway.policy.selftest import load_checked

    policy = load_checked(tmp / "policies" / "default.yaml", tmp / "workspace")
    # the gateway's private directories: its tokens (their directory holds its audit, approvals, state) and keys
    gw = Gateway(policy, AuditLog(tmp / "bare-audit"), hidden=(tmp / "gateway", tmp / "gateway" / "keys"))
    profile = gw.profile(policy, "agent")
    env = scrubbed_env({})

    def run(command: str) -> dict[str, Any]:
        plan, launch = sandbox.start(profile, [*SHELL, command], policy.workspace, env)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                launch.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=plan.env, cwd="/", start_new_session=True, pass_fds=launch.pass_fds,
            )  # fmt: skip
        except OSError:
            launch.abandon()
            raise
        launch.started()
        out, err = proc.communicate()
        launch.finished()
        return {"status": "ok", "exit_code": proc.returncode, "stdout": out.decode(errors="replace"),
                "stderr": err.decode(errors="replace"), "duration_ms": int((time.monotonic() - t0) * 1000)}  # fmt: skip

    return run


def bare_server(port: int, sandbox_of: Path | None) -> None:
    mcp = MCPServer("bare", log_level="WARNING")
    runner = plain_runner() if sandbox_of is None else sandboxed_runner(sandbox_of)

    @mcp.tool()
    def run(command: str) -> dict[str, Any]:
        """Run a command (the SDK runs sync tools in a worker thread); a failure is an error."""
        out: dict[str, Any] = runner(command)
        if out["exit_code"] != 0:
            raise RuntimeError(f"exit {out['exit_code']}: {out['stderr']}")
        return out

    mcp.run(transport="streamable-http", host="127.0.0.1", port=port)


# --- processes -----------------------------------------------------------------------------------
def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd="/")


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


def start_gateway(
    tmp: Path, name: str, procs: list[subprocess.Popen[bytes]], env: dict[str, str], source: Path | None = None
) -> tuple[str, str]:
    """A gateway with its own tokens, audit log, keys and state under tmp/NAME (the policy and
    the workspace are shared); `source`: run the `gateway` package of that source tree instead."""
    own = tmp / name
    own.mkdir()
    gateway = [str(GATEWAY)] if source is None else [sys.executable, "-m", "gateway"]
    if source is not None:
        env = {**env, "PYTHONPATH": str(source)}
    common = ["--tokens", str(own / "tokens.json"), "--policy", str(tmp / "policies" / "default.yaml")]
    created = subprocess.run(
        [*gateway, "token", "create", "--principal", "agent", *common], capture_output=True, text=True, check=True,
        env=env, cwd="/",
    )  # fmt: skip
    token = created.stdout.strip().splitlines()[-1].strip()
    port = free_port()
    cmd = [*gateway, "serve", "--http", f"127.0.0.1:{port}", *common, "--workspace", str(tmp / "workspace")]
    cmd += ["--audit-dir", str(own / "audit"), "--audit-keys", str(own / "keys"), "--state-dir", str(own / "approvals")]
    cmd += ["--process-dir", str(own / "processes")]
    log = own / "gateway.log"
    procs.append(start(cmd, log, env))
    wait_ready(procs[-1], log, port, "listening on http://")
    return f"http://127.0.0.1:{port}/mcp", token


def start_bare(tmp: Path, procs: list[subprocess.Popen[bytes]], sandboxed: bool, env: dict[str, str]) -> str:
    port = free_port()
    log = tmp / ("bare-bwrap.log" if sandboxed else "bare.log")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--bare-server", str(port)]
    procs.append(start([*cmd, *(["--sandbox-of", str(tmp)] if sandboxed else [])], log, env))
    wait_ready(procs[-1], log, port, None)
    return f"http://127.0.0.1:{port}/mcp"


def cpu_ms(pid: int) -> tuple[float, float]:
    """(the process's own user + system CPU, all threads; its reaped children's), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_MS, (int(fields[13]) + int(fields[14])) * TICK_MS


# --- the clients ---------------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    url: str
    token: str | None
    command: str
    denied: bool
    pid: int
    baseline: bool = False  # the row the others are compared with


@dataclass
class Result:
    latencies: list[float]
    wall_s: float
    server_cpu_ms: float  # per call
    children_cpu_ms: float  # per call

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall_s


async def call(client: Client, target: Target) -> None:
    r = await client.call_tool("run", {"command": target.command})
    if r.is_error != target.denied:
        text = " | ".join(getattr(c, "text", "") for c in r.content)
        want = "an error" if target.denied else "success"
        raise RuntimeError(f"{target.name}: `{target.command}` gave is_error={r.is_error}, wanted {want}: {text}")


async def measure(target: Target, concurrency: int, calls: int, warmup: int) -> Result:
    per_client = -(-calls // concurrency)
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
    latencies: list[float] = []
    ends: list[float] = []
    ready = 0
    all_ready = asyncio.Event()
    go = asyncio.Event()
    done = asyncio.Event()

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
                await call(client, target)
                latencies.append((time.perf_counter() - t0) * 1e3)
            ends.append(time.perf_counter())
            if len(ends) == concurrency:
                done.set()

    async with asyncio.TaskGroup() as tg:  # one failure cancels the rest and is raised here
        for _ in range(concurrency):
            tg.create_task(one())
        await all_ready.wait()
        own0, kids0 = cpu_ms(target.pid)
        t0 = time.perf_counter()
        go.set()
        await done.wait()  # to the last call's answer, not the disconnects
        own1, kids1 = cpu_ms(target.pid)
    n = len(latencies)
    return Result(latencies, max(ends) - t0, (own1 - own0) / n, (kids1 - kids0) / n)


Rows = dict[tuple[int, str], list[Result]]


async def bench(targets: list[Target], clients: list[int], repeats: int, calls: int, warmup: int) -> Rows:
    rows: Rows = {}
    for r in range(repeats):
        for concurrency in clients:
            k = r % len(targets)
            for target in targets[k:] + targets[:k]:  # each target first in turn: no fixed position
                res = await measure(target, concurrency, calls, warmup)
                rows.setdefault((concurrency, target.name), []).append(res)
                print(
                    f"  repeat {r + 1}/{repeats} {concurrency:2} clients  {target.name:30} {res.rate:7.1f} calls/s "
                    f"server CPU {res.server_cpu_ms:5.1f} ms/call, sandboxes {res.children_cpu_ms:5.1f} ms/call",
                    file=sys.stderr,
                )
    return rows


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def table(targets: list[Target], clients: list[int], rows: Rows) -> str:
    base = next(t for t in targets if t.baseline)
    out = [
        "| clients | target | calls/s min / median / max | p50 ms | p99 ms | server CPU ms/call | sandbox CPU ms/call "
        f"| calls/s / {base.name.replace('`', '')} (same repeat) min / median / max |",
        "|--:|---|--:|--:|--:|--:|--:|--:|",
    ]
    for c in clients:
        for t in targets:
            res = rows[(c, t.name)]
            lat = [x for r in res for x in r.latencies]
            ratios = [r.rate / b.rate for r, b in zip(res, rows[(c, base.name)], strict=True)]
            out.append(
                f"| {c} | {t.name} | {spread([r.rate for r in res])} | {statistics.median(lat):.1f} | "
                f"{pct(lat, 0.99):.1f} | {statistics.median([r.server_cpu_ms for r in res]):.1f} | "
                f"{statistics.median([r.children_cpu_ms for r in res]):.1f} | "
                f"{'-' if t.baseline else spread(ratios, '{:.2f}x')} |"
            )
    return "\n".join(out)


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
    load = os.getloadavg()[0]
    return (
        f"{cpus} CPUs ({model or platform.machine()}), Python {platform.python_version()}, {platform.system()}, "
        f"load average {load:.1f} at the start"
    )


def write_docs(text: str) -> None:
    doc = DOCS.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOCS}: no {BEGIN} ... {END} markers to write between")
    before, rest = doc.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    DOCS.write_text(f"{before}{BEGIN}\n{text}\n{END}{after}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5, help="rounds over every target and concurrency")
    ap.add_argument("--calls", type=int, default=200, help="measured calls per target, concurrency and repeat")
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured calls per client before measuring")
    ap.add_argument("--clients", default="1,8", help="concurrency levels, comma-separated")
    ap.add_argument("--docs", action="store_true", help="write the table into docs/performance.md")
    ap.add_argument("--baseline", metavar="[LABEL=]SOURCE_TREE", action="append", default=[],
                    help="also measure the gateway of this source tree (`git archive REV` unpacked), side by side:"
                         " an A/B of a change (repeatable; LABEL names its row)")  # fmt: skip
    ap.add_argument("--bare-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--sandbox-of", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server is not None:
        bare_server(args.bare_server, args.sandbox_of)
        return
    clients = [int(c) for c in args.clients.split(",")]

    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.perf_counter()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    about = machine()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmpdir:
        tmp = Path(tmpdir)
        tmp.chmod(0o755)
        (tmp / "policies").mkdir()
        (tmp / "workspace").mkdir()
        for name in ("default.yaml", "default.tests.jsonl"):
            shutil.copy(ROOT / "policies" / name, tmp / "policies" / name)
        from gateway.sandbox.identity import hand_over

        hand_over(tmp / "workspace")  # the sandbox's account owns the workspace, as --quickstart does
        try:
            url, token = start_gateway(tmp, "gateway", procs, dict(os.environ))
            gw_pid = procs[-1].pid
            others = []
            for n, given in enumerate(args.baseline):
                label, _, where = given.rpartition("=")
                source = Path(where).resolve()
                found = start_gateway(tmp, f"baseline{n}", procs, dict(os.environ), source)
                others.append(Target(f"{label or source.name} `{ALLOWED}`", *found, ALLOWED, False, procs[-1].pid))
            bare_url = start_bare(tmp, procs, False, dict(os.environ))
            bare_pid = procs[-1].pid
            boxed_url = start_bare(tmp, procs, True, dict(os.environ))
            boxed_pid = procs[-1].pid
            targets = [
                Target(f"bare `{ALLOWED}`", bare_url, None, ALLOWED, False, bare_pid),
                Target(f"bwrap by hand `{ALLOWED}`", boxed_url, None, ALLOWED, False, boxed_pid, baseline=True),
                Target(f"gateway `{ALLOWED}`", url, token, ALLOWED, False, gw_pid),
                Target(f"gateway `{DENIED}` (denied)", url, token, DENIED, True, gw_pid),
            ]
            targets += others
            rows = asyncio.run(bench(targets, clients, args.repeats, args.calls, args.warmup))
        finally:
            for proc in procs:
                stop(proc)
    text = (
        f"{when}; {about}; {args.repeats} repeats of {args.calls} calls per row (after {args.warmup} warm-up "
        f"calls per client), targets interleaved; took {time.perf_counter() - t0:.0f} s.\n\n"
        + table(targets, clients, rows)
    )
    print(text)
    if args.docs:
        write_docs(text)


if __name__ == "__main__":
    main()
