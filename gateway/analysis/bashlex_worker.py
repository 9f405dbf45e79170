"""The bashlex worker: parses shell text in a process of its own and prints what it saw.

bashlex can loop forever, recurse without bound and raise many exception types, so it never runs
inside the gateway. Protocol: one JSON object per line on stdin (`{"text": ...}`), one JSON reply
per line on stdout:

    {"status": "ok", "commands": [{"words": [[start, end, value, [part kinds]], ...],
                                    "blind": "..."}], "blind": [...]}
    {"status": "unparsed", "error": "ParsingError: ..."}
    {"status": "timeout"}                      (then the worker exits; the parent restarts it)

Each request gets `--cpu-seconds` of CPU time (ITIMER_VIRTUAL); the parent adds a wall timeout.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import sys
from typing import Any


class CpuLimit(BaseException):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise CpuLimit


def describe(trees: list[Any]) -> dict[str, Any]:
    """The simple commands bashlex found, with their words' spans and values."""
    commands: list[dict[str, Any]] = []
    blind: list[str] = []

    def visit(node: Any, hidden: str) -> None:
        kind = getattr(node, "kind", "")
        if kind == "command":
            words = []
            for part in node.parts:
                if part.kind == "word":
                    kinds = sorted({p.kind for p in getattr(part, "parts", [])})
                    words.append([part.pos[0], part.pos[1], part.word, kinds])
            if words:
                commands.append({"words": words, "blind": hidden})
        if kind == "parameter" and any(s in getattr(node, "value", "") for s in ("$(", "`")):
            blind.append("command substitution inside ${...}")
        if kind == "heredoc" and ("$(" in node.value or "`" in node.value or "$((" in node.value):
            blind.append("substitution in a here-document")
        for attr in ("parts", "list", "redirects"):
            for child in getattr(node, attr, None) or []:
                visit(child, hidden)
        for attr in ("command", "output", "heredoc"):
            child = getattr(node, attr, None)
            if child is not None and hasattr(child, "kind"):
                visit(child, hidden)

    for tree in trees:
        visit(tree, "")
    return {"status": "ok", "commands": commands, "blind": sorted(set(blind))}


def serve(cpu_seconds: float) -> int:
    import bashlex  # imported here so that a broken install is reported, not a crash at import

    signal.signal(signal.SIGVTALRM, _on_alarm)
    sys.setrecursionlimit(5000)
    for line in sys.stdin:
        try:
            text = json.loads(line)["text"]
        except (ValueError, KeyError, TypeError) as exc:
            reply: dict[str, Any] = {"status": "failed", "error": f"bad request: {exc}"}
        else:
            signal.setitimer(signal.ITIMER_VIRTUAL, cpu_seconds)
            try:
                reply = describe(bashlex.parse(text))
            except CpuLimit:
                reply = {"status": "timeout"}
            except RecursionError:
                reply = {"status": "unparsed", "error": "RecursionError: nesting too deep"}
            except Exception as exc:  # bashlex raises ParsingError, NotImplementedError, ...
                reply = {"status": "unparsed", "error": f"{type(exc).__name__}: {exc}"[:300]}
            finally:
                signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if reply["status"] == "timeout":
            return 3  # bashlex state after an interrupted parse is not trusted: start afresh
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cpu-seconds", type=float, default=0.5)
    ap.add_argument("--memory-bytes", type=int, default=1 << 30)
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (args.memory_bytes, args.memory_bytes))
    return serve(args.cpu_seconds)


if __name__ == "__main__":
    sys.exit(main())
