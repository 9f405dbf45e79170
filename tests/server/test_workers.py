"""The threads calls run on (`Workers`): a blocked call never holds up another, threads are kept."""

import threading

from gateway.server.app import Workers


def test_a_blocked_call_does_not_hold_up_the_next_and_threads_are_kept() -> None:
    workers = Workers()
    release, first_running, second_ran = threading.Event(), threading.Event(), threading.Event()
    names: list[int] = []

    def blocked() -> None:
        names.append(threading.get_ident())
        first_running.set()
        release.wait(30)

    def quick() -> None:
        names.append(threading.get_ident())
        second_ran.set()

    workers.submit(blocked)
    assert first_running.wait(30)
    workers.submit(quick)  # the only thread is busy (waiting for a supervisor, say): a new one runs it
    assert second_ran.wait(30)
    assert names[0] != names[1]
    release.set()
    done = threading.Event()
    for _ in range(50):  # sequential calls afterwards: served by the threads already there
        done.clear()
        workers.submit(lambda: (names.append(threading.get_ident()), done.set()))
        assert done.wait(30)
    assert len(set(names)) <= 4  # not one thread per call (a thread going idle may race a submit)


def test_a_job_that_raises_leaves_its_thread_usable() -> None:
    workers = Workers()
    ran = threading.Event()

    def boom() -> None:
        raise RuntimeError("a bug in a job")

    workers.submit(boom)
    workers.submit(ran.set)
    assert ran.wait(30)


def test_idle_threads_end() -> None:
    workers = Workers(idle_s=0.05)
    before = set(threading.enumerate())
    done = threading.Event()
    workers.submit(done.set)
    assert done.wait(30)
    mine = [t for t in threading.enumerate() if t.name == "call" and t not in before]
    assert mine
    for t in mine:
        t.join(30)
    assert not any(t.is_alive() for t in mine)
