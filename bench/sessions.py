"""Benchmark sessions (run by hand: `.venv/bin/python bench/sessions.py`).

1. exec round trip: `echo hi` through `session exec` (decision + fsynced audit + control pipe +
   end marker) against the same command written to a bare `bash` over a pipe (no gate, no
   sandbox), for a pipe and a PTY session;
2. memory of 50 concurrent sessions: the resident set of every process they start (bwrap and
   bash, from /proc), plus the growth of the gateway's own RSS.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import gateway.tools  # noqa: F401  (the tool families register with the gate, as in every face)
from gateway.audit import AuditLog
from gateway.calls import SessionCall
from gateway.pipeline import Gateway
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.proctree import descendants

N = 200
POLICY = {
    "version": 1,
    "principals": {"agent": {"roles": ["dev"]}},
    "roles": {"dev": {"level": 1, "read_roots": ["."], "write_roots": ["."], "limits": {"sessions": 60}}},
    "tools": {"session": {"allow_from": 1}},
    "second_opinion": {"unconfirmed": "allow"},
    "rules": [{"id": "a", "decision": "allow", "justification": "j", "programs": ["echo", "true"],
               "examples": {"match": ["echo hi"]}}],
}  # fmt: skip


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def percentiles(samples: list[float]) -> str:
    s = sorted(samples)
    return f"p50 {statistics.median(s):6.2f} ms  p99 {s[int(len(s) * 0.99) - 1]:6.2f} ms"


def bare_bash() -> list[float]:
    proc = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    times = []
    for _ in range(N):
        t0 = time.perf_counter()
        proc.stdin.write(b"echo hi; echo __done\n")
        proc.stdin.flush()
        while proc.stdout.readline() != b"__done\n":
            pass
        times.append((time.perf_counter() - t0) * 1e3)
    proc.kill()
    proc.wait()
    return times


def main() -> None:
    ws = Path(tempfile.mkdtemp())
    policy = compile_policy(Policy.model_validate(POLICY), Path(tempfile.mkdtemp()) / "p.yaml", ws, sha256="bench")
    gw = Gateway(policy, AuditLog(Path(tempfile.mkdtemp())))
    bare = bare_bash()
    print(f"bare bash over a pipe      {percentiles(bare)}")
    for pty in (False, True):
        sid = gw.handle(SessionCall(principal="agent", action="start", pty=pty))["session_id"]
        times = []
        for _ in range(N):
            t0 = time.perf_counter()
            out = gw.handle(SessionCall(principal="agent", action="exec", session_id=sid, command="echo hi"))
            times.append((time.perf_counter() - t0) * 1e3)
            assert out.get("output", "").strip() == "hi", out
        kind = "PTY " if pty else "pipe"
        ratio = statistics.median(times) / statistics.median(bare)
        print(f"session exec ({kind})        {percentiles(times)}  ({ratio:.1f}x bare)")
        gw.handle(SessionCall(principal="agent", action="kill", session_id=sid))
    for pty in (False, True):
        before = rss_kb(os.getpid())
        t0 = time.perf_counter()
        ids = [gw.handle(SessionCall(principal="agent", action="start", pty=pty))["session_id"] for _ in range(50)]
        started = time.perf_counter() - t0
        pids = [p for s in gw.sessions.of("agent") for p in (s.proc.pid, *descendants(s.proc.pid))]
        children = sum(rss_kb(p) for p in pids)
        grown = rss_kb(os.getpid()) - before
        kind = "PTY " if pty else "pipe"
        print(
            f"50 {kind} sessions: started in {started:.2f} s; their processes {children / 1024:.0f} MiB RSS "
            f"({children / 1024 / 50:.1f} MiB each, {len(pids)} processes); the gateway grew {grown / 1024:.1f} MiB"
        )
        for sid in ids:
            gw.handle(SessionCall(principal="agent", action="kill", session_id=sid))
    gw.close()


if __name__ == "__main__":
    main()
