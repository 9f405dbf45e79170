"""bashlex as an independent second opinion on the primary (tree-sitter) analysis, and mvdan/sh
(shfmt.py) where bashlex cannot confirm.

bashlex runs in a worker process (bashlex_worker.py) with a CPU limit per request and a wall
timeout here: it can loop forever and raises many exception types, and neither may reach the
gateway. Whatever goes wrong with it ends in a status that is not AGREED, never in an allow.

The comparison is made on simple commands as written (before wrappers are unwrapped): for every
command each parser found, the other must have found one starting at the same place, with the
same words at the same places and the same values. Where bashlex is known to be blind (see
`BLIND_SPOTS` and docs/analysis.md) a difference is recorded as a blind spot (PARTIAL) rather
than a disagreement.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from gateway import fdwait, private_cache
from gateway.analysis import shfmt
from gateway.analysis.model import OpinionStatus, SecondOpinion
from gateway.analysis.primary import SyntacticCommand, Walk

CPU_SECONDS = 0.5
WALL_SECONDS = 5.0
MAX_BASHLEX_BYTES = 16 * 1024
"""bashlex costs 12-25 us of CPU per byte here (bench/analysis.py): above this size it would
come near its CPU limit, and each time it hits it the worker restarts while other decisions
wait. Longer texts are not sent (status `too_large`: unconfirmed, the policy decides)."""
WORKERS = max(1, min(4, os.cpu_count() or 1))
"""Workers in the pool: decisions in parallel threads do not queue behind one bashlex."""

BLIND_QUOTES = "bashlex quote removal after a quoted part (\"a\"'b')"
BLIND_ANSI_C = "ANSI-C quoting $'...'"
BLIND_TRANSLATED = 'locale translation $"..."'
BLIND_HEREDOC = "here-document body, which bashlex misreads inside functions"
BLIND_BACKSLASH = 'bashlex drops backslashes inside double quotes ("\\(" is \\( in bash)'
BLIND_ARITHMETIC = "arithmetic command (( )), which bashlex reads as nested subshells"


@dataclass(frozen=True, slots=True)
class Verdict:
    opinion: SecondOpinion
    bashlex_view: list[list[str]] | None = None
    shfmt_view: list[list[str]] | None = None


WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bashlex_worker.py")


@functools.cache
def _tables_dir() -> str | None:
    """Where the worker keeps bashlex's parse tables: the gateway's private cache directory (the
    sandbox helper's, checked the same way: ours, and nobody else can change it). None: the
    worker builds them (slower start, same result)."""
    try:
        return private_cache.private_cache_dir()
    except private_cache.CacheUnavailable:
        return None


class Worker:
    """One bashlex worker process, used by one caller at a time (`send` holds it until the
    reply is read)."""

    def __init__(self, cpu_seconds: float = CPU_SECONDS, wall_seconds: float = WALL_SECONDS) -> None:
        self.cpu_seconds = cpu_seconds
        self.wall_seconds = wall_seconds
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._buffer = b""

    def _start(self) -> subprocess.Popen[bytes]:
        tables = _tables_dir()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",  # the script alone: no gateway import, no environment, no user site
                WORKER_SCRIPT,
                "--cpu-seconds",
                str(self.cpu_seconds),
                *(["--tables", tables] if tables else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self._buffer = b""
        return proc

    def stop(self) -> None:
        with self._lock:
            self._kill()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()

    def parse(self, text: str) -> dict[str, Any]:
        """bashlex's view of `text`: a reply of the worker protocol, never an exception."""
        return self.send(text).reply()

    def send(self, text: str, held: bool = False) -> Pending:
        """Start bashlex on `text` and hold the worker until `reply()` is read, so the caller can
        do other work (the primary walk) while bashlex parses. `held`: the caller already holds
        the worker (`try_hold`)."""
        if len(text.encode()) > MAX_BASHLEX_BYTES:
            if held:
                self._lock.release()
            return Pending(None, too_large(text))
        if not held:
            self._lock.acquire()
        try:
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._proc = self._start()
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps({"text": text}).encode() + b"\n")
            self._proc.stdin.flush()
        except Exception as exc:  # any failure here is a missing opinion, not an allow
            self._kill()
            self._lock.release()
            return Pending(self, {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return Pending(self, None)

    def try_hold(self) -> bool:
        return self._lock.acquire(blocking=False)

    def _receive(self) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.wall_seconds
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not fdwait.readable(fd, left):
                self._kill()
                return {"status": "timeout", "error": f"no answer within {self.wall_seconds}s"}
            chunk = os.read(fd, 65536)
            if not chunk:
                self._kill()
                return {"status": "failed", "error": "worker exited"}
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        if reply.get("status") == "timeout":
            self._kill()  # it exits after a timeout; reap it now
        return reply


def too_large(text: str) -> dict[str, Any]:
    size = len(text.encode())
    return {
        "status": "too_large",
        "error": f"the text is {size} bytes; bashlex is asked about texts up to {MAX_BASHLEX_BYTES} bytes "
        "(beyond that it would run into its CPU limit)",
    }


class Pending:
    """A request sent to a worker. `reply()` waits for the answer (once) and frees the worker;
    call it on every path, or the worker stays held."""

    def __init__(self, worker: Worker | None, failure: dict[str, Any] | None) -> None:
        self._worker = worker
        self._reply = failure
        self._open = failure is None

    def reply(self) -> dict[str, Any]:
        if self._open and self._worker is not None:
            self._open = False
            try:
                self._reply = self._worker._receive()
            except Exception as exc:
                self._worker._kill()
                self._reply = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
            finally:
                self._worker._lock.release()
        assert self._reply is not None
        return self._reply


class Pool:
    """Up to `size` workers, each started on first use: a request goes to an idle worker, or
    waits for the next one in turn when all are busy."""

    def __init__(self, size: int = WORKERS, cpu_seconds: float = CPU_SECONDS, wall_seconds: float = WALL_SECONDS):
        self.workers = [Worker(cpu_seconds, wall_seconds) for _ in range(max(1, size))]
        self._turn = 0
        self._lock = threading.Lock()

    def send(self, text: str) -> Pending:
        for worker in self.workers:
            if worker.try_hold():
                return worker.send(text, held=True)
        with self._lock:
            worker = self.workers[self._turn % len(self.workers)]
            self._turn += 1
        return worker.send(text)

    def parse(self, text: str) -> dict[str, Any]:
        return self.send(text).reply()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


_default: Pool | None = None
_default_lock = threading.Lock()


def default_worker() -> Pool:
    global _default
    with _default_lock:
        if _default is None:
            _default = Pool()
            atexit.register(_default.stop)
        return _default


_UNCONFIRMED = frozenset(
    {
        OpinionStatus.PARTIAL,
        OpinionStatus.UNPARSED,
        OpinionStatus.TIMEOUT,
        OpinionStatus.TOO_LARGE,
        OpinionStatus.FAILED,
    }
)


def judge(
    text: str,
    walk: Walk,
    worker: Worker | Pool | None = None,
    pending: Pending | None = None,
    use_cache: bool = True,
) -> Verdict:
    """Ask bashlex about `text` (or read the answer to a request already sent) and compare its
    view with the primary walk; where bashlex cannot confirm, ask mvdan/sh (shfmt.py)."""
    verdict = judge_bashlex(text, walk, worker, pending)
    if verdict.opinion.status not in _UNCONFIRMED:
        return verdict
    return confirm_with_shfmt(text, walk, verdict, use_cache=use_cache)


def confirm_with_shfmt(text: str, walk: Walk, verdict: Verdict, use_cache: bool = True) -> Verdict:
    """bashlex could not confirm: compare shfmt's view with the primary, exactly. Agreement
    confirms, a difference denies, and no answer from shfmt leaves bashlex's status standing."""
    bashlex = verdict.opinion
    parsed = shfmt.parse(text, use_cache=use_cache)
    why = f"bashlex {bashlex.status.value}" + (f" ({bashlex.detail})" if bashlex.detail else "")
    if parsed.status == "disagreed":
        return Verdict(
            SecondOpinion(OpinionStatus.DISAGREED, f"mvdan/sh: {parsed.error}", bashlex.blind_spots, "disagreed"),
            verdict.bashlex_view,
        )
    if parsed.status != "ok":
        detail = "; ".join(d for d in (bashlex.detail, f"shfmt {parsed.status}: {parsed.error}") if d)
        return Verdict(replace(bashlex, detail=detail, shfmt=parsed.status), verdict.bashlex_view)
    view = [[value for _, _, value in cmd] for cmd in parsed.commands]
    problems = compare_exact(walk, parsed.commands)
    if problems:
        detail = "; ".join(problems[:5])
        return Verdict(
            SecondOpinion(OpinionStatus.DISAGREED, detail, bashlex.blind_spots, "disagreed"),
            verdict.bashlex_view,
            view,
        )
    confirmed = SecondOpinion(
        OpinionStatus.CONFIRMED_BY_SHFMT,
        f"{why}; mvdan/sh read the same commands and words",
        bashlex.blind_spots,
        "agreed",
    )
    return Verdict(confirmed, verdict.bashlex_view, view)


def compare_exact(walk: Walk, commands: tuple[tuple[tuple[int, int, str], ...], ...]) -> list[str]:
    """Differences between the primary's simple commands and shfmt's: every command at the same
    place, with the same words at the same places and the same values. No allowances."""
    problems: list[str] = []
    ours: dict[int, list[tuple[int, int, str]]] = {}
    for c in walk.syntactic:
        if not c.spans:
            continue
        if c.spans[0][0] in ours:
            problems.append(f"tree-sitter sees two commands at offset {c.spans[0][0]}")
        ours[c.spans[0][0]] = [(a, b, w.value) for (a, b), w in zip(c.spans, c.argv, strict=True)]
    theirs: dict[int, list[tuple[int, int, str]]] = {}
    for cmd in commands:
        if cmd[0][0] in theirs:
            problems.append(f"mvdan/sh sees two commands at offset {cmd[0][0]}")
        theirs[cmd[0][0]] = list(cmd)
    for start, mine in sorted(ours.items()):
        other = theirs.get(start)
        if other is None:
            problems.append(
                f"tree-sitter sees a command {[v for _, _, v in mine]} at offset {start} that mvdan/sh does not"
            )
        elif other != mine:
            problems.append(
                f"command at offset {start}: mvdan/sh reads {[(a, b, v) for a, b, v in other]}, "
                f"tree-sitter {[(a, b, v) for a, b, v in mine]}"
            )
    for start, other in sorted(theirs.items()):
        if start not in ours:
            problems.append(
                f"mvdan/sh sees a command {[v for _, _, v in other]} at offset {start} that tree-sitter does not"
            )
    return problems


def judge_bashlex(
    text: str, walk: Walk, worker: Worker | Pool | None = None, pending: Pending | None = None
) -> Verdict:
    """bashlex's verdict alone."""
    reply = pending.reply() if pending is not None else (worker or default_worker()).parse(text)
    status = reply.get("status")
    if status == "ok":
        return compare(text, walk, reply)
    if status == "unparsed":
        return Verdict(SecondOpinion(OpinionStatus.UNPARSED, str(reply.get("error", ""))))
    if status == "timeout":
        return Verdict(SecondOpinion(OpinionStatus.TIMEOUT, str(reply.get("error", "bashlex ran out of CPU time"))))
    if status == "too_large":
        return Verdict(SecondOpinion(OpinionStatus.TOO_LARGE, str(reply.get("error", ""))))
    return Verdict(SecondOpinion(OpinionStatus.FAILED, str(reply.get("error", "no reply"))))


def _view(commands: list[dict[str, Any]]) -> list[list[str]]:
    return [[w[2] for w in c["words"]] for c in commands]


def _primary_view(walk: Walk) -> list[list[str]]:
    return [[w.value for w in c.argv] for c in walk.syntactic]


def compare(text: str, walk: Walk, reply: dict[str, Any]) -> Verdict:
    theirs: list[dict[str, Any]] = reply["commands"]
    blind: set[str] = set(reply.get("blind", []))
    ours: dict[int, SyntacticCommand] = {c.spans[0][0]: c for c in walk.syntactic if c.spans}
    mixed_quoting = set(walk.raw_quoted_words)
    problems: list[str] = []
    seen: set[int] = set()

    for cmd in theirs:
        words = cmd["words"]
        start = words[0][0]
        mine = ours.get(start)
        if mine is None and any(a <= start < b for a, b in walk.arithmetic_regions):
            blind.add(BLIND_ARITHMETIC)
            continue
        if mine is None and any(a <= start < b for a, b in walk.heredoc_bodies):
            blind.add(BLIND_HEREDOC)
            continue
        if mine is None:
            problems.append(f"bashlex sees a command {_quote(words)} at offset {start} that tree-sitter does not")
            continue
        seen.add(start)
        if len(words) != len(mine.spans):
            problems.append(
                f"command at offset {start}: bashlex sees {len(words)} words {_quote(words)}, "
                f"tree-sitter {len(mine.spans)} {[w.value for w in mine.argv]}"
            )
            continue
        for (b_start, b_end, b_value, _kinds), span, word in zip(words, mine.spans, mine.argv, strict=True):
            if (b_start, b_end) != span:
                problems.append(f"word {b_value!r} at {b_start}-{b_end}: tree-sitter has a word at {span[0]}-{span[1]}")
                break
            if b_value == word.value:
                continue
            raw = word.raw
            if "$'" in raw:
                blind.add(BLIND_ANSI_C)
            elif '$"' in raw:
                blind.add(BLIND_TRANSLATED)
            elif span in mixed_quoting and _unquoted(b_value) == _unquoted(word.value):
                blind.add(BLIND_QUOTES)
            elif '"' in raw and "\\" in raw and b_value.replace("\\", "") == word.value.replace("\\", ""):
                blind.add(BLIND_BACKSLASH)
            else:
                problems.append(f"word at {b_start}-{b_end}: bashlex reads {b_value!r}, tree-sitter {word.value!r}")

    for start, mine in ours.items():
        if start in seen:
            continue
        if mine.blind:
            blind.add(mine.blind)
        else:
            problems.append(
                f"tree-sitter sees a command {[w.value for w in mine.argv]} at offset {start} that bashlex does not"
            )

    view = _view(theirs)
    if problems:
        detail = "; ".join(problems[:5])
        return Verdict(SecondOpinion(OpinionStatus.DISAGREED, detail), view)
    if blind:
        return Verdict(SecondOpinion(OpinionStatus.PARTIAL, "", tuple(sorted(blind))), view)
    return Verdict(SecondOpinion(OpinionStatus.AGREED), view)


def _quote(words: list[list[Any]]) -> list[str]:
    return [str(w[2]) for w in words]


def _unquoted(value: str) -> str:
    return value.replace("'", "").replace('"', "").replace("\\", "")
