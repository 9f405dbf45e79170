"""Benchmark the gateway's cost per command (run by hand: `.venv/bin/python bench/run.py`).

In one run, for `true`, `echo hi` and a 1 MB output: the command run bare (bash -c); the same
sandbox launched by hand (the very argv and descriptors the gateway would use, prepared outside
the timing: agw-init outer -> bwrap -> agw-init inner -> bash); and the command through
`Gateway.handle` (decision, fsynced audit, plan, descriptors, cgroup, launch, audit). The ratio
gateway / by hand is the gateway's own cost; also decisions with audit appends per second.
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import gateway.tools  # noqa: F401  (the tool families register with the gate, as in every face)
from gateway import sandbox
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway, evaluate
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over

N = 100
ROUNDS = 5
POLICY = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}},
    "roles": {"dev": {"level": 1, "read_roots": ["."], "write_roots": ["."], "limits": {"output_bytes": 4 << 20}}},
    "tools": {"run": {"allow_from": 1}},
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [{"id": "a", "decision": "allow", "justification": "j", "programs": ["true", "echo", "head", "yes"],
               "accept_unknown": True, "examples": {"match": ["true"]}}],
}  # fmt: skip


def median_ms(fn: object) -> float:
    times = []
    for _ in range(N):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def side_by_side(gw: Gateway, ws: Path, text: str) -> tuple[float, float]:
    """Median ms of (the gateway's own launch by hand: Popen + wait, prepared outside the timing;
    the whole call through the gateway), taken alternately so both see the same machine."""
    profile = gw.profile(gw.policy, "agent")
    hand, full = [], []
    for _ in range(N):
        plan, launch = sandbox.start(profile, ["bash", "--noprofile", "--norc", "-c", text], ws, {"PATH": "/usr/bin"})
        t0 = time.perf_counter()
        proc = subprocess.run(launch.argv, capture_output=True, pass_fds=launch.pass_fds, env=plan.env)
        hand.append((time.perf_counter() - t0) * 1e3)
        launch.finished()
        assert proc.returncode == 0, proc.stderr
        t0 = time.perf_counter()
        out = gw.handle(RunCall(principal="agent", command=text))
        full.append((time.perf_counter() - t0) * 1e3)
        assert out["status"] == "ok", out
    return statistics.median(hand), statistics.median(full)


def tail(gw: Gateway, n: int = 300) -> list[float]:
    """`true` through the gateway as the MCP server calls it (with a cancel event), n times: ms."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = gw.handle(RunCall(principal="agent", command="true"), cancel=threading.Event())
        times.append((time.perf_counter() - t0) * 1e3)
        assert out["status"] == "ok", out
    return sorted(times)


def main() -> None:
    ws = Path(tempfile.mkdtemp())
    ws.chmod(0o755)
    hand_over(ws)
    policy = compile_policy(Policy.model_validate(POLICY), Path(tempfile.mkdtemp()) / "p.yaml", ws, sha256="bench")
    gw = Gateway(policy, AuditLog(Path(tempfile.mkdtemp())))
    gc.freeze()  # as `gateway serve` does once the gateway is built (gateway/server/serve.py)
    for text in ("true", "echo hi", "yes | head -c 1000000"):
        bare = median_ms(lambda t=text: subprocess.run(["bash", "--noprofile", "--norc", "-c", t], capture_output=True))
        boxed, full = side_by_side(gw, ws, text)
        print(
            f"{text:24} bare {bare:6.2f} ms | sandbox by hand {boxed:6.2f} ms | gateway {full:6.2f} ms "
            f"| gateway / sandbox {full / boxed:4.2f}x"
        )
    # the aim of issue 11 (at most 1.3x for `true`): the ratio of ROUNDS rounds, each side by side
    ratios = sorted(full / boxed for boxed, full in (side_by_side(gw, ws, "true") for _ in range(ROUNDS)))
    print(
        f"`true`, gateway / sandbox by hand over {ROUNDS} rounds of {N}: min {ratios[0]:.2f}x, "
        f"median {ratios[len(ratios) // 2]:.2f}x, max {ratios[-1]:.2f}x"
    )
    times = tail(gw)
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99) - 1]
    stalls = sum(1 for t in times if t > p50 + 80)
    print(
        f"`true` with a cancel event, {len(times)} calls: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {times[-1]:.2f} ms, "
        f"p99/p50 {p99 / p50:.2f}x, calls over p50 + 80 ms: {stalls}"
    )
    audit = AuditLog(Path(tempfile.mkdtemp()))
    t0 = time.perf_counter()
    n = 500
    for i in range(n):
        d = evaluate(policy, "echo hi", "agent").decision
        audit.append("decision", call_id=str(i), decision=d.verdict.label, rule=d.rule)
    took = time.perf_counter() - t0
    print(f"decisions + fsynced audit appends: {n / took:.0f} per second ({took / n * 1e3:.2f} ms each)")


if __name__ == "__main__":
    main()
