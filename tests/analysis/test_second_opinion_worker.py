"""The bashlex worker: its failures end in a status that is never an allow, and it recovers."""

from __future__ import annotations

import threading

from gateway.analysis import OpinionStatus, analyze, primary
from gateway.analysis.second_opinion import Worker, judge

HANG = "echo 'pre${'post"  # bashlex loops forever on this


def test_a_hang_is_cut_by_the_cpu_limit_and_the_worker_recovers() -> None:
    worker = Worker(cpu_seconds=0.3, wall_seconds=5)
    try:
        verdict = judge(HANG, primary.walk(HANG), worker)
        assert verdict.opinion.status is OpinionStatus.TIMEOUT
        assert not verdict.opinion.confirmed
        after = judge("ls", primary.walk("ls"), worker)  # a fresh worker answers
        assert after.opinion.status is OpinionStatus.AGREED
    finally:
        worker.stop()


def test_the_wall_timeout_holds_when_the_worker_does_not_answer() -> None:
    worker = Worker(cpu_seconds=30, wall_seconds=0.5)  # CPU limit too high to fire first
    try:
        verdict = judge(HANG, primary.walk(HANG), worker)
        assert verdict.opinion.status is OpinionStatus.TIMEOUT
        assert "0.5" in verdict.opinion.detail
    finally:
        worker.stop()


def test_a_dead_worker_is_a_failure_then_a_restart() -> None:
    worker = Worker()
    try:
        assert judge("ls", primary.walk("ls"), worker).opinion.status is OpinionStatus.AGREED
        assert worker._proc is not None
        worker._proc.kill()
        worker._proc.wait()
        # the dead process is noticed before the request is sent and replaced
        assert judge("pwd", primary.walk("pwd"), worker).opinion.status is OpinionStatus.AGREED
    finally:
        worker.stop()


def test_an_unstartable_worker_is_a_failure_not_an_allow() -> None:
    import gateway.analysis.second_opinion as so

    worker = Worker()

    def broken() -> None:
        raise OSError("no such interpreter")

    worker._start = broken  # type: ignore[assignment,method-assign]
    verdict = so.judge("ls", primary.walk("ls"), worker)
    assert verdict.opinion.status is OpinionStatus.FAILED
    assert "no such interpreter" in verdict.opinion.detail


def test_a_denial_while_bashlex_parses_frees_the_worker() -> None:
    # the text is sent to bashlex before the primary walk; a primary denial must still read the
    # reply, or the next caller would wait on a held worker
    for _ in range(3):
        assert analyze("eval x", use_cache=False).denial is not None
        assert analyze("ls", use_cache=False).second_opinion.status is OpinionStatus.AGREED


def test_a_timeout_is_not_cached() -> None:
    first = analyze(HANG)
    assert first.second_opinion.status is OpinionStatus.TIMEOUT
    assert first.denial is None and [c.program for c in first.commands] == ["echo"]


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
