"""The fleet's ledger against the local log: appends per second and the latency of one append.

Run by hand: `.venv/bin/python bench/fleet.py [--store postgresql://...]` (without --store, a
PostgreSQL of its own under a temporary directory, as the tests start it: tests/store/pg.py,
fsync and synchronous_commit on, over a Unix socket). In one run, interleaved (the machine is
shared: the ratios are what count):

- throughput, 4 processes x 8 threads for 4 s, every append durable before it returns:
  - `local`: today's signed file log (`open_signed`: what `gateway serve` uses), one directory;
  - `store`: the store's ledger, one stream per process, signed with the same key;
  - `store+sequencer`: the same, with one process folding signed checkpoints every 100 ms;
- latency, 1 process x 1 thread for 3 s: each append's time, local and store (p50, p99).

Every store run is checked afterwards with `verify_store` (streams, links, checkpoints).

`--database-cpu N` plays the fleet's layout on one machine: the database on a core of its own
(PostgreSQL started pinned to CPU N), every writer, local and store alike, on the others, so a
gateway host's writers have the same cores in both modes and the store's server is not theirs.
Without it everything shares every core (the database competes with the writers it serves).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.store import db
from gateway.store.ledger import verify_store
from tests.store.pg import Postgres, bindir

PROCESSES, THREADS, SECONDS, REPS = 4, 8, 4.0, 3

WORKER = r"""
import json, sys, threading, time
from pathlib import Path
from gateway.audit import open_signed
from gateway.audit.keys import SigningKey
from gateway.store import db
from gateway.store.ledger import StoreLedger
mode, directory, keys, dsn, threads, seconds, start, sequence = sys.argv[1:9]
threads, seconds, start = int(threads), float(seconds), float(start)
if mode == "local":
    log = open_signed(Path(directory), Path(keys))
else:
    log = StoreLedger(db.Store(dsn, max_size=threads), Path(directory), key=SigningKey.load_or_create(Path(keys)),
                      sequence=sequence == "1")
counts = [0] * threads
times = [[] for _ in range(threads)]
def work(t):
    while time.time() < start:
        time.sleep(0.001)
    end = start + seconds
    n = 0
    while time.time() < end:
        t0 = time.perf_counter()
        log.append("decision", call_id=f"c{t}-{n}", principal="agent", decision="allow", rule="git-read",
                   arguments={"command": "git status", "cwd": "/srv/ws"}, policy_sha256="0" * 64)
        times[t].append(time.perf_counter() - t0)
        n += 1
    counts[t] = n
ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
if hasattr(log, "close"):
    log.close()
print(json.dumps({"records": sum(counts), "times": [x for ts_ in times for x in ts_]}))
"""


def run(mode: str, dsn: str, processes: int, threads: int, seconds: float) -> tuple[float, list[float]]:
    """(appends per second, every append's seconds)."""
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        keys = Path(tmp) / "keys"
        start = time.time() + 2.0
        procs = []
        for i in range(processes):
            directory = Path(tmp) / ("audit" if mode == "local" else f"audit{i}")
            sequence = "1" if mode == "store+sequencer" and i == 0 else "0"
            worker = "local" if mode == "local" else "store"
            argv = [sys.executable, "-c", WORKER, worker, str(directory), str(keys), dsn, str(threads), str(seconds),
                    str(start), sequence]  # fmt: skip
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
            if i == 0:
                time.sleep(0.5)  # the first makes the key; the others load it
        outs = [json.loads(p.communicate()[0]) for p in procs]
    return sum(o["records"] for o in outs) / seconds, [x for o in outs for x in o["times"]]


def fresh_database(admin: str, n: int) -> str:
    name = f"bench{n}"
    with db.Store(admin) as store, store.connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    dsn = admin.replace("/postgres?", f"/{name}?") if "/postgres?" in admin else f"{admin.rsplit('/', 1)[0]}/{name}"
    with db.Store(dsn) as store:
        db.migrate(store, init=True)
    return dsn


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", help="an admin connection string to a PostgreSQL to use (default: one of its own)")
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--database-cpu", type=int, help="pin the database to this CPU, the writers to the others")
    args = ap.parse_args()
    every = os.sched_getaffinity(0)
    writers = every
    if args.database_cpu is not None:
        if args.store is not None or args.database_cpu not in every or len(every) < 2:
            print("--database-cpu: a CPU of this process's, with another left, for a database of its own",
                  file=sys.stderr)  # fmt: skip
            return 2
        writers = every - {args.database_cpu}
    server = None
    admin = args.store
    if admin is None:
        found = bindir()
        if found is None:
            print("no PostgreSQL server binaries: apt-get install postgresql", file=sys.stderr)
            return 2
        server = Postgres(found, {"shared_buffers": "256MB", "max_wal_size": "2GB"})
        if args.database_cpu is not None:  # the server and every backend it forks inherit this
            os.sched_setaffinity(0, {args.database_cpu})
        try:
            server.start()
        finally:
            os.sched_setaffinity(0, writers)  # and the writers this
        admin = server.dsn()
    try:
        rates: dict[str, list[float]] = {"local": [], "store": [], "store+sequencer": []}
        n = 0
        for rep in range(args.reps):
            for mode in rates:
                n += 1
                dsn = fresh_database(admin, n)
                rate, _ = run(mode, dsn, PROCESSES, THREADS, SECONDS)
                rates[mode].append(rate)
                if mode != "local":
                    with db.Store(dsn) as store:
                        checked = verify_store(store)
                    assert checked.ok, checked.lines()
                    print(f"rep {rep + 1} {mode:16} {rate:8.0f}/s   {checked.lines()[0]}", flush=True)
                else:
                    print(f"rep {rep + 1} {mode:16} {rate:8.0f}/s", flush=True)
        latency: dict[str, list[float]] = {"local": [], "store": []}
        for _ in range(args.reps):
            for mode in latency:
                n += 1
                latency[mode] += run(mode, fresh_database(admin, n), 1, 1, 3.0)[1]
        where = (f"writers on CPU {sorted(writers)}, the database on CPU {args.database_cpu}"
                 if args.database_cpu is not None else f"everything on CPUs {sorted(every)}")  # fmt: skip
        print(f"\n{PROCESSES} processes x {THREADS} threads, {SECONDS:.0f} s, {args.reps} interleaved repetitions, "
              f"{where}:")  # fmt: skip
        base = statistics.median(rates["local"])
        for mode, xs in rates.items():
            med = statistics.median(xs)
            print(f"  {mode:16} median {med:8.0f}/s  ({min(xs):.0f}-{max(xs):.0f})  {med / base:4.2f}x local")
        print("one append, 1 process x 1 thread (ms):")
        for mode, xs in latency.items():
            print(f"  {mode:16} p50 {pct(xs, 0.5):6.2f}  p99 {pct(xs, 0.99):6.2f}  ({len(xs)} appends)")
        added = pct(latency["store"], 0.5) - pct(latency["local"], 0.5)
        print(f"  store adds {added:+.2f} ms at the median")
    finally:
        if server is not None:
            server.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
