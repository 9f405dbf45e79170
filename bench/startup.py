"""Benchmark `gateway serve --stdio` start-up: spawn to the `initialize` answer (run by hand).

    .venv/bin/python bench/startup.py [--repeats N] [--importtime]

A client that spawns its stdio server (Codex, Claude Code) sends `initialize` at once and waits
for the answer; until it comes, the server's tools are not there. Timed, side by side and
interleaved round by round so the machine's load falls on all alike, each a fresh process from
spawn to the answer's line on stdout:

1. `bare SDK`: an `MCPServer` with one tool, in this venv's Python (`python -c ...`): the floor
   any server built on the official SDK pays (interpreter, the SDK's imports, its models);
2. `gateway serve --stdio` with the shipped policy, a fresh audit directory and keys each time.

min / median / max of `--repeats`, and the gateway's median against the bare server's.
`--importtime` prints the gateway's 15 slowest imports (`python -X importtime`), once.
The numbers go into docs/performance.md ("Serving over stdio: start-up") by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GATEWAY = str(Path(PY).parent / "gateway")
INITIALIZE = (
    json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"},
            },
        }
    )
    + "\n"
).encode()
BARE = """
from mcp.server import MCPServer
server = MCPServer("bare")

@server.tool()
def run(command: str) -> str:
    return command

server.run("stdio")
"""


def time_to_initialize(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds from spawn to the first line on stdout, the `initialize` answer."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(INITIALIZE)
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    proc.stdin.close()  # end of input: the server shuts down
    proc.wait(timeout=60)
    if b'"result"' not in line:
        raise SystemExit(f"{argv[0]}: no initialize answer: {line[:300]!r}")
    return elapsed


def gateway_argv(scratch: Path, i: int) -> list[str]:
    ws = scratch / "ws"
    ws.mkdir(exist_ok=True)
    return [
        GATEWAY, "serve", "--stdio", "--principal", "agent",
        "--policy", str(ROOT / "policies" / "default.yaml"), "--workspace", str(ws),
        "--audit-dir", str(scratch / f"audit-{i}"), "--audit-keys", str(scratch / f"keys-{i}"),
        "--process-dir", str(scratch / f"state-{i}"), "--state-dir", str(scratch / f"approvals-{i}"),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--importtime", action="store_true")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {"bare SDK": [], "gateway serve --stdio": []}
    with tempfile.TemporaryDirectory(prefix="agw-bench-startup-") as tmp:
        scratch = Path(tmp)
        from gateway.sandbox.identity import hand_over

        (scratch / "ws").mkdir()
        hand_over(scratch / "ws")
        time_to_initialize(gateway_argv(scratch, -1))  # warm the page cache and agw-init's build
        for i in range(args.repeats):
            rows["bare SDK"].append(time_to_initialize([PY, "-c", BARE]))
            rows["gateway serve --stdio"].append(time_to_initialize(gateway_argv(scratch, i)))
        if args.importtime:
            env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
            proc = subprocess.Popen(
                gateway_argv(scratch, 10_000), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env,
            )  # fmt: skip
            _, err = proc.communicate(INITIALIZE, timeout=60)
            imports = []
            for line in err.decode().splitlines():
                if line.startswith("import time:") and "|" in line:
                    _, cumulative, name = line.split("|")
                    if cumulative.strip().isdigit():
                        imports.append((int(cumulative), name.rstrip()))
            for us, name in sorted(imports, reverse=True)[:15]:
                print(f"  {us / 1000:7.1f} ms  {name}")
    print(f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {args.repeats} runs each")
    print("| Server | min | median | max |\n| --- | ---: | ---: | ---: |")
    for name, samples in rows.items():
        print(
            f"| {name} | {min(samples) * 1000:.0f} ms | {statistics.median(samples) * 1000:.0f} ms "
            f"| {max(samples) * 1000:.0f} ms |"
        )
    ratio = statistics.median(rows["gateway serve --stdio"]) / statistics.median(rows["bare SDK"])
    print(f"gateway / bare SDK (medians): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
