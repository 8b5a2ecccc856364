"""The background thread under the controller's loop, lease, standby and retention: a failing call does not stop
it, the first call can come before the first wait, and a thread that ended unstopped reports it."""
import threading
import time

import pytest

from controller.periodic import Periodic


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_failing_call_is_logged_and_the_next_one_goes_ahead(caplog):
    calls = []

    def work():
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("first call fails")
    job = Periodic("test-job", work, lambda: 0.01)
    job.start()
    _until(lambda: len(calls) >= 3)
    job.stop()
    assert not job.died() and "test-job failed" in caplog.text


def test_first_at_once_calls_before_the_first_wait():
    called = threading.Event()
    job = Periodic("test-job", called.set, lambda: 3600.0, first_at_once=True)
    job.start()
    assert called.wait(10)
    job.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # the death is the point
def test_a_thread_that_ended_unstopped_has_died():
    def work():
        raise SystemExit      # not an Exception: it ends the thread
    job = Periodic("test-job", work, lambda: 0.01)
    assert not job.died()                    # never started
    job.start()
    _until(job.died)
