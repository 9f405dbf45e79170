"""Exporting the ledger: records per second for each format (`gateway audit export`).

Run by hand: `.venv/bin/python bench/export.py [RECORDS]` (default 100,000). It writes a log of
RECORDS records the way the writer does (canonical lines, chained hashes, a signature on each
commit's last record), in the mix a gateway writes (decision, result, and now and then an
approval), each with a realistic command, its analysis and its context, then exports it:

- in process, `export()` into a sink that drops what it is given: the reading, redaction,
  selection and mapping alone (jsonl, ecs, ocsf; otlp: calls folded into SDK spans, handed to
  an exporter that drops them);
- through the real command, `gateway audit export --format F > /dev/null`, start-up included.

Each is run 3 times, interleaved; the median is printed (the machine is shared).
"""

from __future__ import annotations

import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gateway.audit import canonical, digest
from gateway.audit.export import export
from gateway.audit.otlp import SpanSink

RUNS = 3
COMMANDS = ["git status", "pytest -q tests/test_api.py -k login", "rm -rf build/cache", "ls -la src",
            "grep -rn TODO gateway | head -50", "make lint", "python3 -m pip list --format json"]  # fmt: skip


def write_log(directory: Path, n: int) -> None:
    start = datetime.now(UTC) - timedelta(hours=6)
    prev, seq, out = "", 0, []
    fake_sig = base64.b64encode(b"\0" * 64).decode()

    def add(fields: dict[str, Any], signed: bool) -> None:
        nonlocal prev, seq
        seq += 1
        ts = (start + timedelta(milliseconds=seq * 7)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        record = {**fields, "seq": seq, "ts": ts, "prev": prev}
        record["hash"] = prev = digest(record)
        if signed:
            record["sig"] = fake_sig
        out.append(canonical(record) + "\n")

    call = 0
    while seq < n:
        call += 1
        command = COMMANDS[call % len(COMMANDS)]
        asked = call % 7 == 0
        base = {"call_id": f"{call:016x}", "principal": "agent", "tool": "run", "policy_sha256": "ab" * 32}
        add({**base, "event": "decision", "decision": "ask" if asked else "allow", "rule": "dev-tools",
             "reasons": [{"stage": "permissions", "code": "rule", "message": "developer tools", "rule": "dev-tools"}],
             "arguments": {"command": command, "cwd": None, "env": {"CI": "1"}, "shell": "bash", "timeout_ms": None},
             "data": {"commands": [{"argv": command.split(), "redirects": []}],
                      "context": {"cwd": "/srv/ws", "env": {"CI": "1"}, "shell": "bash", "workspace": "/srv/ws",
                                  "level": 2, "read_roots": ["/srv/ws"], "write_roots": ["/srv/ws"]}}},
            signed=False)  # fmt: skip
        if asked and seq < n:
            add({**base, "event": "approval", "decision": "allow", "rule": "dev-tools",
                 "data": {"answered": True, "by": "alice", "how": "queue", "bound": True, "policy_unchanged": True,
                          "digest": "cd" * 32}}, signed=False)  # fmt: skip
        if seq < n:
            add({**base, "event": "result",
                 "data": {"status": "ok", "exit_code": 0, "duration_ms": 41, "stdout_bytes": 1200, "stderr_bytes": 0,
                          "started_at": "2026-11-25T10:00:00.000Z", "ended_at": "2026-11-25T10:00:00.041Z",
                          "cwd": "/srv/ws", "sandbox": {"landlock": "ABI 7", "quotas": "cgroup v2", "uid": 999}}},
                signed=True)  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "audit-000001.jsonl").write_text("".join(out), encoding="utf-8")


class Dropped:
    def __init__(self) -> None:
        self.items = 0

    def send(self, items: list[Any]) -> None:
        self.items += len(items)


class DropSpans(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def in_process(audit: Path, fmt: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    if fmt == "otlp":
        drop = DropSpans()
        report = export(audit, fmt, SpanSink(drop))
        sent = drop.spans
    else:
        sink = Dropped()
        report = export(audit, fmt, sink)
        sent = sink.items
    took = time.perf_counter() - t0
    assert report.records > 0
    return report.records / took, sent


def through_cli(audit: Path, fmt: str, n: int) -> float:
    t0 = time.perf_counter()
    with open(os.devnull, "w") as devnull:
        subprocess.run([sys.executable, "-m", "gateway", "audit", "export", "--format", fmt, "--audit-dir", str(audit)],
                       stdout=devnull, check=True)  # fmt: skip
    return n / (time.perf_counter() - t0)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit"
        write_log(audit, n)
        size = (audit / "audit-000001.jsonl").stat().st_size
        print(f"{n} records, {size / 1e6:.1f} MB")
        results: dict[str, list[float]] = {}
        sent: dict[str, int] = {}
        for _ in range(RUNS):
            for fmt in ("jsonl", "ecs", "ocsf", "otlp"):
                rate, sent[fmt] = in_process(audit, fmt)
                results.setdefault(f"in process, {fmt}", []).append(rate)
            for fmt in ("jsonl", "ecs", "ocsf"):
                results.setdefault(f"gateway audit export --format {fmt}", []).append(through_cli(audit, fmt, n))
        for name, rates in results.items():
            unit = f" ({sent[name.rsplit(' ', 1)[-1]]} spans)" if name.endswith("otlp") else ""
            print(f"{name:45} {statistics.median(rates):>10,.0f} records/s{unit}")


if __name__ == "__main__":
    main()
