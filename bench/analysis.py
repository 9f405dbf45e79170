"""Benchmark the command analyser on a corpus of realistic agent commands (run by hand).

    .venv/bin/python bench/analysis.py [--rounds N]

Prints p50 / p90 / p99 per command for: the primary parser alone, primary + second opinion
(bashlex worker, and shfmt where bashlex cannot confirm), the same without shfmt, shfmt alone on
the texts it is asked about, and cache hits; the outcome mix; and analysis time against text size
(the basis for the length cap). Numbers go into docs/performance.md by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path

from gateway.analysis import analyze, primary, shfmt
from gateway.analysis.analyzer import cache
from gateway.analysis.screen import MAX_TEXT_BYTES
from gateway.analysis.second_opinion import default_worker

CORPUS = Path(__file__).parent / "data" / "agent_commands.jsonl"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: object, texts: list[str], rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        for text in texts:
            t0 = time.perf_counter()
            fn(text)  # type: ignore[operator]
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def report(name: str, samples: list[float]) -> None:
    print(
        f"{name:34} n={len(samples):5}  p50={pct(samples, 0.5):7.3f} ms  p90={pct(samples, 0.9):7.3f} ms  "
        f"p99={pct(samples, 0.99):7.3f} ms  mean={statistics.fmean(samples):7.3f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    texts = [json.loads(line)["command"] for line in CORPUS.read_text().splitlines() if line.strip()]
    print(f"corpus: {len(texts)} commands, {sum(len(t) for t in texts) / len(texts):.0f} bytes on average")

    analyze("ls")  # start the bashlex worker (about 0.3 s, once per process)
    default_worker().parse("ls")

    report("tree-sitter parse only", timed(primary.parse_tree, texts, args.rounds))
    report(
        "primary analysis (no 2nd opinion)",
        timed(lambda t: analyze(t, second_opinion_enabled=False, use_cache=False), texts, args.rounds),
    )
    report("primary + 2nd opinion (bashlex, shfmt)", timed(lambda t: analyze(t, use_cache=False), texts, args.rounds))
    binary = shfmt.binary
    shfmt.binary = lambda: None  # type: ignore[assignment]  # bashlex alone, as before shfmt
    try:
        report("primary + bashlex only", timed(lambda t: analyze(t, use_cache=False), texts, args.rounds))
    finally:
        shfmt.binary = binary  # type: ignore[method-assign]
    report("bashlex worker round trip alone", timed(default_worker().parse, texts, args.rounds))
    asked = [t for t in texts if analyze(t, use_cache=False).second_opinion.shfmt]
    print(f"shfmt is asked about {len(asked)} of {len(texts)} texts (where bashlex cannot confirm)")
    report("shfmt run + tree walk alone (asked)", timed(lambda t: shfmt.parse(t, use_cache=False), asked, args.rounds))
    report("shfmt process alone (asked)", timed(shfmt.run, asked, args.rounds))

    cache.clear()
    for t in texts:
        analyze(t)
    hits = timed(analyze, texts, args.rounds)
    report("cache hit", hits)
    print(f"cache: {cache.hits} hits, {cache.misses} misses ({cache.hits / (cache.hits + cache.misses):.0%} hit rate)")

    outcomes = Counter()
    for t in texts:
        a = analyze(t)
        outcomes[a.denial.code if a.denial else a.second_opinion.status.value] += 1
    print("outcomes:", dict(outcomes.most_common()))

    print("\nsize scaling (one long script built from the corpus's one-line commands):")
    lines = [t for t in texts if "\n" not in t and "<<" not in t and analyze(t).second_opinion.status.value == "agreed"]
    for size in (1_000, 4_000, 16_000, 64_000):
        script = ""
        i = 0
        while len(script.encode()) < size - 200:
            script += lines[i % len(lines)] + "\n"
            i += 1
        p = timed(lambda t: analyze(t, second_opinion_enabled=False, use_cache=False), [script], 3)
        w = timed(default_worker().parse, [script], 1)
        status = analyze(script, use_cache=False).second_opinion.status.value
        print(
            f"  {len(script.encode()):6} bytes: primary {statistics.median(p):8.2f} ms, "
            f"bashlex worker {w[0]:8.1f} ms ({status})"
        )
    print(f"length cap: {MAX_TEXT_BYTES} bytes")


if __name__ == "__main__":
    main()
