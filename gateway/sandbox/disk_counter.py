"""The disk budget's counts, in a process of their own (`python -m gateway.sandbox.disk_counter`).

A count (disk.usage) makes one system call per entry, and each gives the interpreter lock up
and takes it again. In the gateway, whose other threads (servers, proxies, sessions) want that
lock too, every entry then waits its turn: with three busy threads a count of 8,000 entries
took seconds, while the sandbox it was to stop wrote half a gigabyte. Here the count has an
interpreter to itself. The gateway's watch (disk.py, `_Counter`) asks and waits for the answer
with the lock given up once.

One request per line on stdin, one answer per line on stdout, both JSON:

    {"roots": ["/ws", ...], "stop_above": 33554432}        (stop_above may be null)
    {"bytes": N, "entries": N, "partial": false}
    {"too_deep": "message"}  or  {"errno": N, "message": "..."}

It says `ready` once it can count, and ends when its stdin closes (the gateway ended).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gateway.sandbox.disk import TooDeep, usage


def answer(request: dict[str, Any]) -> dict[str, Any]:
    stop_above = request.get("stop_above")
    try:
        found = usage(tuple(str(r) for r in request["roots"]), None if stop_above is None else int(stop_above))
    except TooDeep as exc:
        return {"too_deep": str(exc)}
    except OSError as exc:
        return {"errno": exc.errno or 0, "message": str(exc)}
    return {"bytes": found.bytes, "entries": found.entries, "partial": found.partial}


def main() -> None:
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(answer(json.loads(line))) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
