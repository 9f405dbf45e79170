"""The bashlex worker: its failures end in a status that is never an allow, and it recovers.

These are bashlex's own verdicts (`judge_bashlex`); where it cannot confirm, mvdan/sh is asked
next (test_shfmt_opinion.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gateway.analysis import OpinionStatus, analyze, primary, shfmt
from gateway.analysis.second_opinion import MAX_BASHLEX_BYTES, WORKER_SCRIPT, Pool, Worker, judge_bashlex

HANG = "echo 'pre${'post"  # bashlex loops forever on this


def test_a_hang_is_cut_by_the_cpu_limit_and_the_worker_recovers() -> None:
    worker = Worker(cpu_seconds=0.3, wall_seconds=5)
    try:
        verdict = judge_bashlex(HANG, primary.walk(HANG), worker)
        assert verdict.opinion.status is OpinionStatus.TIMEOUT
        assert not verdict.opinion.confirmed
        after = judge_bashlex("ls", primary.walk("ls"), worker)  # a fresh worker answers
        assert after.opinion.status is OpinionStatus.AGREED
    finally:
        worker.stop()


def test_the_wall_timeout_holds_when_the_worker_does_not_answer() -> None:
    worker = Worker(cpu_seconds=30, wall_seconds=0.5)  # CPU limit too high to fire first
    try:
        verdict = judge_bashlex(HANG, primary.walk(HANG), worker)
        assert verdict.opinion.status is OpinionStatus.TIMEOUT
        assert "0.5" in verdict.opinion.detail
    finally:
        worker.stop()


def test_a_dead_worker_is_a_failure_then_a_restart() -> None:
    worker = Worker()
    try:
        assert judge_bashlex("ls", primary.walk("ls"), worker).opinion.status is OpinionStatus.AGREED
        assert worker._proc is not None
        worker._proc.kill()
        worker._proc.wait()
        # the dead process is noticed before the request is sent and replaced
        assert judge_bashlex("pwd", primary.walk("pwd"), worker).opinion.status is OpinionStatus.AGREED
    finally:
        worker.stop()


def test_an_unstartable_worker_is_a_failure_not_an_allow() -> None:
    import gateway.analysis.second_opinion as so

    worker = Worker()

    def broken() -> None:
        raise OSError("no such interpreter")

    worker._start = broken  # type: ignore[assignment,method-assign]
    verdict = so.judge_bashlex("ls", primary.walk("ls"), worker)
    assert verdict.opinion.status is OpinionStatus.FAILED
    assert "no such interpreter" in verdict.opinion.detail


def test_a_denial_while_bashlex_parses_frees_the_worker() -> None:
    # the text is sent to bashlex before the primary walk; a primary denial must still read the
    # reply, or the next caller would wait on a held worker
    for _ in range(3):
        assert analyze("eval x", use_cache=False).denial is not None
        assert analyze("ls", use_cache=False).second_opinion.status is OpinionStatus.AGREED


def test_a_timeout_is_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shfmt, "binary", lambda: None)  # nobody to confirm where bashlex hangs
    first = analyze(HANG)
    assert first.second_opinion.status is OpinionStatus.TIMEOUT and first.second_opinion.shfmt == "failed"
    assert first.denial is None and [c.program for c in first.commands] == ["echo"]
    monkeypatch.undo()
    again = analyze(HANG)  # asked again, not read from the cache: now mvdan/sh confirms
    assert again.second_opinion.status is OpinionStatus.CONFIRMED_BY_SHFMT


def test_concurrent_callers_get_consistent_answers() -> None:
    texts = [f"ls dir{i} | grep x{i}" for i in range(40)]
    results: dict[str, list[str]] = {}

    def run(text: str) -> None:
        a = analyze(text, use_cache=False)
        results[text] = [a.second_opinion.status.value, *[w.value for w in a.commands[0].argv]]

    threads = [threading.Thread(target=run, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i, text in enumerate(texts):
        assert results[text] == ["agreed", "ls", f"dir{i}"]


# --- size bound, pool, kept tables ---------------------------------------------------------------
def test_a_text_over_the_bound_is_not_sent_and_says_so() -> None:
    """Before: texts near the 64 KiB cap ran bashlex into its CPU limit; each time the worker
    restarted while every other decision waited."""
    big = "echo " + "word " * (MAX_BASHLEX_BYTES // 5 + 10)
    verdict = judge_bashlex(big, primary.walk(big))
    assert verdict.opinion.status is OpinionStatus.TOO_LARGE
    assert not verdict.opinion.confirmed and str(MAX_BASHLEX_BYTES) in verdict.opinion.detail
    a = analyze(big, use_cache=False)  # mvdan/sh takes texts up to the analyser's own cap
    assert a.denial is None and a.second_opinion.status is OpinionStatus.CONFIRMED_BY_SHFMT
    assert "bashlex too_large" in a.second_opinion.detail
    small = analyze("echo " + "word " * 100, use_cache=False)
    assert small.second_opinion.status is OpinionStatus.AGREED


def test_a_busy_worker_does_not_hold_up_the_next_decision() -> None:
    """A request that keeps one worker busy (its reply not yet read) leaves the pool able to
    answer another: before, one lock held every decision behind the slowest."""
    pool = Pool(size=2)
    try:
        held = pool.send("echo " + "a " * 4000)  # holds a worker until its reply is read
        answered: list[str] = []
        t = threading.Thread(target=lambda: answered.append(pool.parse("ls")["status"]))
        t.start()
        t.join(60)
        assert answered == ["ok"], "the second request waited for the first worker"
        assert held.reply()["status"] == "ok"
    finally:
        pool.stop()


def run_worker(tables: Path | None, texts: list[str]) -> list[dict[str, object]]:
    argv = [sys.executable, "-I", WORKER_SCRIPT, *(["--tables", str(tables)] if tables else [])]
    requests = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    out = subprocess.run(argv, input=requests, capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


CORPUS = ["ls -la", "git commit -m 'x y' && echo $(date)", 'for f in *.py; do echo "$f"; done',
          "a=1 b=2 env | sort > out.txt 2>&1", "cat <<EOF\nhi $USER\nEOF", "echo 'pre${'post'"]  # fmt: skip


def test_kept_tables_parse_exactly_as_built_ones(tmp_path: Path) -> None:
    tables = tmp_path / "tables"
    tables.mkdir(mode=0o700)
    built = run_worker(None, CORPUS[:-1])
    first = run_worker(tables, CORPUS[:-1])  # builds, then keeps
    (kept,) = list(tables.glob("bashlex-tables-*.json"))
    stamp = kept.stat().st_mtime_ns
    second = run_worker(tables, CORPUS[:-1])  # reads them
    assert built == first == second
    assert kept.stat().st_mtime_ns == stamp  # read, not rebuilt


def test_a_damaged_table_file_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    tables = tmp_path / "tables"
    tables.mkdir(mode=0o700)
    built = run_worker(None, CORPUS[:-1])
    run_worker(tables, ["ls"])
    (kept,) = list(tables.glob("bashlex-tables-*.json"))
    for damage in ('{"action": {"0": {"NEWLINE": "x"}}, "goto": {}}', "not json", '{"action": {}, "goto": {}}'):
        kept.write_text(damage)
        assert run_worker(tables, CORPUS[:-1]) == built
