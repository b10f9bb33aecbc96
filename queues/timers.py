"""The one timer mechanism: a heap of deadlines serviced by one task.

Every delay in the broker (message TTL, queue expiry, delayed redelivery, consumer timeouts)
is a `Timer` in this heap, not a task or `call_later` per message. The event loop side
(`amqp_server.server`) sleeps until `next_deadline()` and calls `run_due()`; unit tests call
`run_due()` themselves with the time they want.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timer:
    """A scheduled callback; `cancel()` makes it a no-op (it stays in the heap until due)."""

    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """Deadlines in seconds on the `clock`: wall-clock time, because message expiry times are
    wall-clock (they are stored with the message and outlive the process)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        # Called when a new earliest deadline appears, so the driver can wake up sooner.
        self.on_earlier_deadline: Callable[[float], None] = lambda when: None

    def __len__(self) -> int:
        return len(self._heap)

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (when, next(self._order), timer))
        if earliest is None or when < earliest:
            self.on_earlier_deadline(when)
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.clock() + delay, callback)

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def run_due(self, now: float | None = None) -> int:
        """Run every timer due at `now`; returns how many ran."""
        now = self.clock() if now is None else now
        heap = self._heap
        ran = 0
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)[2]
            if timer.cancelled:
                continue
            timer.cancelled = True
            try:
                timer.callback()
            except Exception:  # one failing callback must not stop every other delay in the broker
                log.exception("timer callback failed")
            ran += 1
        return ran
