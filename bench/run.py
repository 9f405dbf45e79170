"""Benchmark the gateway's cost per command (run by hand: `.venv/bin/python bench/run.py`).

In one run, for `true`, `echo hi` and a 1 MB output: the command run bare (bash -c), run in the
same bwrap sandbox by hand, and run through `Gateway.handle` (decision + audit with fsync +
sandbox); the ratios; and decisions with audit appends per second.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gateway import sandbox
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway, evaluate
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy

N = 40
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


def main() -> None:
    ws = Path(tempfile.mkdtemp())
    policy = compile_policy(Policy.model_validate(POLICY), Path(tempfile.mkdtemp()) / "p.yaml", ws, sha256="bench")
    gw = Gateway(policy, AuditLog(Path(tempfile.mkdtemp())))
    for text in ("true", "echo hi", "yes | head -c 1000000"):
        bare = median_ms(lambda t=text: subprocess.run(["bash", "--noprofile", "--norc", "-c", t], capture_output=True))
        argv = sandbox.wrap(["bash", "--noprofile", "--norc", "-c", text], ws, (ws,), sandbox.Limits())
        boxed = median_ms(lambda a=argv: subprocess.run(a, capture_output=True, cwd=ws))
        full = median_ms(lambda t=text: gw.handle(RunCall(principal="agent", command=t)))
        print(
            f"{text:24} bare {bare:6.2f} ms | sandbox by hand {boxed:6.2f} ms | gateway {full:6.2f} ms "
            f"| gateway / sandbox {full / boxed:4.2f}x"
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
