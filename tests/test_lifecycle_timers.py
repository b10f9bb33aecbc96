"""The one timer heap: Deadline (one timer per structure), cancelled-timer compaction, now()."""

from __future__ import annotations

from queues.timers import Deadline, Timers


def test_a_deadline_moves_only_earlier_and_fires_once():
    timers = Timers(clock=lambda: 0.0)
    fired = []
    deadline = Deadline(timers, lambda: fired.append(timers.now()))
    deadline.arm(10.0)
    deadline.arm(20.0)  # later: nothing changes
    assert deadline.when == 10.0
    deadline.arm(5.0)
    assert deadline.when == 5.0
    assert timers.run_due(6.0) == 1
    assert fired == [6.0]  # now() inside a callback is the run's now
    assert timers.run_due(100.0) == 0  # the cancelled 10.0 timer does not run
    assert deadline.when is None


def test_a_disarmed_deadline_does_not_fire():
    timers = Timers(clock=lambda: 0.0)
    fired = []
    deadline = Deadline(timers, lambda: fired.append(1))
    deadline.arm(1.0)
    deadline.disarm()
    timers.run_due(2.0)
    assert fired == []


def test_cancelled_timers_are_swept_from_the_heap():
    # A deadline re-armed earlier and earlier (publishes with shrinking x-delay) leaves
    # cancelled timers behind; they must not pile up until their far-away due time.
    timers = Timers(clock=lambda: 0.0)
    deadline = Deadline(timers, lambda: None)
    for n in range(10_000):
        deadline.arm(1e9 - n)
    assert len(timers) < 3000
    assert timers.next_deadline() == 1e9 - 9999


def test_next_deadline_skips_cancelled_timers():
    timers = Timers(clock=lambda: 0.0)
    first = timers.call_at(1.0, lambda: None)
    timers.call_at(2.0, lambda: None)
    first.cancel()
    assert timers.next_deadline() == 2.0


def test_a_failing_callback_does_not_stop_the_others():
    timers = Timers(clock=lambda: 0.0)
    ran = []

    def fail() -> None:
        raise RuntimeError("boom")

    timers.call_at(1.0, fail)
    timers.call_at(1.0, lambda: ran.append(1))
    assert timers.run_due(1.0) == 2
    assert ran == [1]
