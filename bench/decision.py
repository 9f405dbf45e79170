"""Benchmark policy decisions (run by hand: `.venv/bin/python bench/decision.py`).

For policies of 10, 100, 1,000 and 10,000 rules (the default policy's rules plus synthetic ones
on other programs), over the agent-command corpus:
- a repeated decision: `evaluate()` served from the policy's decision cache (its paths checked);
- the policy part: `evaluate()` with the analysis already cached (casbin + rules + path jail);
- the whole decision, analysis included (cache cleared before each command);
and the throughput of `gateway check --batch` as a process. Numbers go into docs/performance.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gateway.analysis.analyzer import cache
from gateway.pipeline import _evaluate, evaluate
from gateway.policy.compile import compile_policy
from gateway.policy.layers import load_layers
from gateway.policy.schema import Policy, Tool

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "bench" / "data" / "agent_commands.jsonl"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def policy_with(n: int, ws: Path) -> object:
    base = load_layers(ROOT / "policies" / "default.yaml").policy
    raw = base.model_dump(mode="json")
    extra = n - len(raw["rules"])
    for i in range(max(0, extra)):
        raw["rules"].append(
            {
                "id": f"synthetic-{i}",
                "decision": ["allow", "ask", "deny"][i % 3],
                "justification": "synthetic",
                "programs": [f"tool{i}"],
                "subcommands": ["run", "check"] if i % 2 else None,
                "forbidden_options": ["-x", "--exec"],
                "min_level": i % 3,
                "examples": {"match": [f"tool{i} run"]},
            }
        )
    if extra < 0:
        raw["rules"] = raw["rules"][:n]
    return compile_policy(Policy.model_validate(raw), ROOT / "policies" / "default.yaml", ws)


def main() -> None:
    texts = [json.loads(x)["command"] for x in CORPUS.read_text().splitlines() if x.strip()]
    ws = Path(tempfile.mkdtemp())
    print(f"corpus: {len(texts)} commands")
    for n in (10, 100, 1_000, 10_000):
        t0 = time.perf_counter()
        policy = policy_with(n, ws)
        build = time.perf_counter() - t0
        for t in texts:  # warm: analysis cache and casbin memo
            evaluate(policy, t, "agent")  # type: ignore[arg-type]
        warm, hit = [], []
        for _ in range(3):
            for t in texts:
                t1 = time.perf_counter()
                _evaluate(policy, t, "agent", None, None, Tool.RUN)  # type: ignore[arg-type]
                warm.append((time.perf_counter() - t1) * 1e3)
                t1 = time.perf_counter()
                evaluate(policy, t, "agent")  # type: ignore[arg-type]
                hit.append((time.perf_counter() - t1) * 1e3)
        cold = []
        for t in texts:
            cache.clear()
            t1 = time.perf_counter()
            _evaluate(policy, t, "agent", None, None, Tool.RUN)  # type: ignore[arg-type]
            cold.append((time.perf_counter() - t1) * 1e3)
        print(
            f"{n:6} rules (compile {build * 1e3:7.1f} ms): repeated (decision cache) p50 {pct(hit, 0.5):.3f} ms "
            f"p99 {pct(hit, 0.99):.3f} ms | policy part p50 {pct(warm, 0.5):.3f} ms p99 {pct(warm, 0.99):.3f} ms "
            f"| whole decision p50 {pct(cold, 0.5):.3f} ms p99 {pct(cold, 0.99):.3f} ms"
        )
    batch = "\n".join(json.dumps({"command": t}) for t in texts) + "\n"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--batch", "-"],
        input=batch,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    took = time.perf_counter() - t0
    lines = len(proc.stdout.splitlines())
    print(f"check --batch: {lines} lines in {took:.2f} s including start-up ({lines / took:.0f} lines/s)")


if __name__ == "__main__":
    main()
