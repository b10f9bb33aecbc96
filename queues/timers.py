"""The one timer mechanism: a heap of deadlines serviced by one task.

Every delay in the broker (message TTL, queue expiry, delayed redelivery, x-delay, consumer
timeouts) is a `Timer` in this heap, not a task or `call_later` per message. A structure that
holds many deadlines (a queue's expiring messages, its messages waiting for a retry, a delayed
exchange's pending messages) keeps them itself and puts only its earliest one here, through a
`Deadline`; so the heap holds a few entries per queue, not one per message.

The event loop side (`amqp_server.runtime.server.drive_timers`) sleeps until `next_deadline()` and calls
`run_due()`; unit tests call `run_due()` themselves with the time they want.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Cancelled timers stay in the heap until due; once they are this many and more than half of
# it, the heap is rebuilt without them (a re-armed deadline 49 days out must not pile up).
_COMPACT_MIN_CANCELLED = 1024


def _spent() -> None:
    """What a cancelled timer calls instead of its callback (never: it is skipped)."""


class Timer:
    """A scheduled callback; `cancel()` makes it a no-op (it stays in the heap until due)."""

    __slots__ = ("when", "callback", "cancelled", "_timers")

    def __init__(self, when: float, callback: Callable[[], object], timers: "Timers | None" = None) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        self._timers = timers

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            # The callback (a bound method of a queue's part, usually) goes at once, not when the
            # timer leaves the heap: a deleted queue is then freed by reference counting alone.
            self.callback = _spent
            if self._timers is not None:
                self._timers.note_cancelled()


class Timers:
    """Deadlines in seconds on the `clock`: wall-clock time, because message expiry times are
    wall-clock (they are stored with the message and outlive the process)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._cancelled = 0  # cancelled timers still in the heap
        self._running_at: float | None = None  # the `now` of the run_due in progress
        # Called when a new earliest deadline appears, so the driver can wake up sooner (wake_with).
        self.on_earlier_deadline: Callable[[float], None] = lambda when: None

    def wake_with(self, callback: Callable[[float], None]) -> None:
        """Call `callback(when)` whenever a new earliest deadline appears: the driver that waits
        for the next deadline (server.drive_timers) must wake up sooner."""
        self.on_earlier_deadline = callback

    def __len__(self) -> int:
        return len(self._heap)

    def note_cancelled(self) -> None:
        """One of this heap's timers was cancelled (Timer.cancel): it stays in the heap until
        compacted or popped, and is counted so that compaction knows when it pays."""
        self._cancelled += 1

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        timer = Timer(when, callback, self)
        heap = self._heap
        if self._cancelled >= _COMPACT_MIN_CANCELLED and self._cancelled * 2 > len(heap):
            self._compact()
        earliest = heap[0][0] if heap else None
        heapq.heappush(heap, (when, next(self._order), timer))
        if earliest is None or when < earliest:
            self.on_earlier_deadline(when)
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return self.call_at(self.clock() + delay, callback)

    def now(self) -> float:
        """The current time as timer callbacks must see it: during `run_due(now)` that `now`
        (so a test driving time by hand sees consistent times), otherwise the clock."""
        running_at = self._running_at
        return self.clock() if running_at is None else running_at

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
            self._cancelled -= 1
        return heap[0][0] if heap else None

    def run_due(self, now: float | None = None) -> int:
        """Run every timer due at `now`; returns how many ran."""
        now = self.clock() if now is None else now
        heap = self._heap
        ran = 0
        self._running_at = now
        try:
            while heap and heap[0][0] <= now:
                timer = heapq.heappop(heap)[2]
                if timer.cancelled:
                    self._cancelled -= 1
                    continue
                callback = timer.callback
                timer.cancelled = True
                timer.callback = _spent  # a spent timer holds nothing (see Timer.cancel)
                try:
                    callback()
                except Exception:  # one failing callback must not stop every other delay in the broker
                    log.exception("timer callback failed")
                ran += 1
        finally:
            self._running_at = None
        return ran

    def _compact(self) -> None:
        self._heap = [item for item in self._heap if not item[2].cancelled]
        heapq.heapify(self._heap)
        self._cancelled = 0


class Deadline:
    """The earliest deadline of a structure that holds many: one Timer, moved only earlier.

    `arm(when)` makes sure `callback` runs at or before `when` (a later `when` than the one
    armed changes nothing: the callback, when it runs, handles what is due and re-arms for the
    next). `disarm()` cancels it.
    """

    __slots__ = ("timers", "callback", "_timer")

    def __init__(self, timers: Timers, callback: Callable[[], None]) -> None:
        self.timers = timers
        self.callback = callback
        self._timer: Timer | None = None

    @property
    def when(self) -> float | None:
        timer = self._timer
        return None if timer is None or timer.cancelled else timer.when

    def arm(self, when: float) -> None:
        timer = self._timer
        if timer is not None and not timer.cancelled:
            if timer.when <= when:
                return
            timer.cancel()
        self._timer = self.timers.call_at(when, self.callback)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        """Disarm for good (its owner is going away) and drop the callback, which refers back
        to the owner: no reference cycle is left for the garbage collector."""
        self.disarm()
        self.callback = _spent
