"""The bashlex worker: parses shell text in a process of its own and prints what it saw.

bashlex can loop forever, recurse without bound and raise many exception types, so it never runs
inside the gateway. Protocol: one JSON object per line on stdin (`{"text": ...}`), one JSON reply
per line on stdout:

    {"status": "ok", "commands": [{"words": [[start, end, value, [part kinds]], ...],
                                    "blind": "..."}], "blind": [...]}
    {"status": "unparsed", "error": "ParsingError: ..."}
    {"status": "timeout"}                      (then the worker exits; the parent restarts it)

Each request gets `--cpu-seconds` of CPU time (ITIMER_VIRTUAL); the parent adds a wall timeout.

The worker is started as a script (`python -I .../bashlex_worker.py`): it imports nothing of the
gateway, only the standard library and bashlex. bashlex's bundled yacc builds its LALR tables on
every import (about 0.1-0.2 s; it never reads the `parsetab.py` it ships): with `--tables DIR` (a
directory private to the gateway's user) the tables built once are kept there as JSON, named by
a digest of bashlex's grammar sources and the Python version, and loaded instead of rebuilt.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import resource
import signal
import sys
from typing import Any

tables_source = "built"
"""How this worker got bashlex's tables: "built", or "cached" (read from --tables)."""


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


def import_bashlex(tables_dir: str | None) -> Any:
    """bashlex, its parse tables read from `tables_dir` when kept there (kept after a build)."""
    if tables_dir:
        try:
            return _import_with_tables(tables_dir)
        except Exception:  # anything odd: forget the half-import and build as bashlex does
            for name in [m for m in sys.modules if m == "bashlex" or m.startswith("bashlex.")]:
                del sys.modules[name]
    import bashlex

    return bashlex


def _import_with_tables(tables_dir: str) -> Any:
    global tables_source
    spec = importlib.util.find_spec("bashlex")
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        raise ImportError("bashlex is not installed")
    package_dir = spec.submodule_search_locations[0]
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for source in ("yacc.py", "parser.py"):
        with open(os.path.join(package_dir, source), "rb") as f:
            digest.update(f.read())
    path = os.path.join(tables_dir, f"bashlex-tables-{digest.hexdigest()[:24]}.json")
    package = importlib.util.module_from_spec(spec)  # the package, its __init__ not run yet
    sys.modules["bashlex"] = package
    yacc = importlib.import_module("bashlex.yacc")
    build = yacc.LRTable.lr_parse_table

    def lr_parse_table(table: Any) -> None:
        global tables_source
        kept = _read_tables(path)
        if kept is not None:
            table.lr_action, table.lr_goto = kept
            tables_source = "cached"
            return
        build(table)
        with contextlib.suppress(OSError):
            _write_tables(path, table.lr_action, table.lr_goto)

    yacc.LRTable.lr_parse_table = lr_parse_table
    try:
        spec.loader.exec_module(package)  # bashlex/__init__ imports the parser, which builds
    finally:
        yacc.LRTable.lr_parse_table = build
    return package


Tables = dict[int, dict[str, int]]


def _read_tables(path: str) -> tuple[Tables, Tables] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = json.loads(f.read())
        action = {int(s): {str(t): int(v) for t, v in row.items()} for s, row in raw["action"].items()}
        goto = {int(s): {str(t): int(v) for t, v in row.items()} for s, row in raw["goto"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (action, goto) if action and goto else None


def _write_tables(path: str, action: Tables, goto: Tables) -> None:
    data = json.dumps({"action": action, "goto": goto}).encode()
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def serve(cpu_seconds: float, tables_dir: str | None = None) -> int:
    bashlex = import_bashlex(tables_dir)  # here, so that a broken install is reported, not a crash

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
    ap.add_argument("--tables", help="a private directory to keep bashlex's parse tables in")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (args.memory_bytes, args.memory_bytes))
    return serve(args.cpu_seconds, args.tables)


if __name__ == "__main__":
    sys.exit(main())
