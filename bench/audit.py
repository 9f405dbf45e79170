"""Audit appends per second: 2 processes x 8 threads, each record fdatasynced before it returns.

Run by hand: `.venv/bin/python bench/audit.py`. In one run, side by side (the machine is shared:
the ratios are what count):
- `per-record`: the floor of the old design, every record its own write + fdatasync under the
  lock (written here as a bare loop: no JSON, no hashing, no signing);
- `gateway, unsigned`: AuditLog, group commit;
- `gateway, signed`: AuditLog with the Ed25519 key and the checkpoint (what `gateway serve` uses).
Every record of each run is then checked with `verify` (chain, and signatures for the signed one).
"""

from __future__ import annotations

import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROCESSES, THREADS, SECONDS = 2, 8, 4.0

WORKER = r"""
import fcntl, json, os, sys, threading, time
from pathlib import Path
mode, directory, keys, threads, seconds, start = sys.argv[1:7]
threads, seconds, start = int(threads), float(seconds), float(start)
if mode == "per-record":
    lock = threading.Lock()
    lock_fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    def append(i):
        with lock:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                fd = os.open(os.path.join(directory, "plain.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                os.write(fd, b'{"event":"decision","call_id":"%d"}\n' % i)
                os.fdatasync(fd)
                os.close(fd)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
else:
    from gateway.audit import AuditLog, open_signed
    log = open_signed(Path(directory), Path(keys)) if mode == "signed" else AuditLog(Path(directory))
    def append(i):
        log.append("decision", call_id=f"c{i}", principal="agent", decision="allow", rule="git-read",
                   arguments={"command": "git status"})
counts = [0] * threads
def work(t):
    while time.time() < start:
        time.sleep(0.001)
    end = start + seconds
    n = 0
    while time.time() < end:
        append(n)
        n += 1
    counts[t] = n
ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps({"records": sum(counts)}))
"""


def run(mode: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        directory, keys = Path(tmp) / "audit", Path(tmp) / "keys"
        directory.mkdir()
        start = time.time() + 1.5
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, mode, str(directory), str(keys), str(THREADS), str(SECONDS), str(start)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(PROCESSES)
        ]
        total = sum(json.loads(p.communicate()[0])["records"] for p in procs)
        if mode != "per-record":
            from gateway.audit import VerifyKey, verify

            key = VerifyKey.load(keys / "signing.pub") if mode == "signed" else None
            result = verify(directory, key)
            assert result.ok and result.records == total, result.describe()
        else:
            assert len((directory / "plain.jsonl").read_bytes().splitlines()) == total
        return total / SECONDS, total


def main() -> None:
    _ = (fcntl, os, threading)  # the worker's imports, named for readers
    modes = ("per-record", "unsigned", "signed")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for _round in range(3):  # interleaved, so that the machine's load falls on every mode alike
        for mode in modes:
            rates[mode].append(run(mode)[0])
    floor = statistics.median(rates["per-record"])
    print(f"audit appends, {PROCESSES} processes x {THREADS} threads, fdatasync, median of 3 x {SECONDS:.0f} s")
    for mode in modes:
        rate = statistics.median(rates[mode])
        spread = ", ".join(f"{r:.0f}" for r in rates[mode])
        print(f"  {mode:12} {rate:7.0f}/s  {rate / floor:5.2f}x the per-record floor   ({spread})")


if __name__ == "__main__":
    main()
