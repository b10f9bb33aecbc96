"""Queue TTL (x-expires): a queue left unused for that long is deleted.

Declaring the queue, consuming from it or polling it (basic.get) restarts the clock. A queue
with consumers is in use whatever the clock says; removing its last consumer restarts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, Self

from queues.timers import Timer, Timers


class ExpiresQueue(Protocol):
    """What the x-expires clock uses of its queue (a queues.queue.Queue): its timers, whether it
    was deleted or has consumers, and the callback that deletes it once unused."""

    @property
    def timers(self) -> Timers: ...

    @property
    def deleted(self) -> bool: ...

    @property
    def consumer_count(self) -> int: ...

    @property
    def on_unused_expired(self) -> Callable[[Self], None] | None: ...


class QueueTtl:
    """The x-expires clock of one queue; when it runs out the queue's `on_unused_expired` is called."""

    __slots__ = ("queue", "expires_ms", "timer")

    def __init__(self, queue: ExpiresQueue, expires_ms: int) -> None:
        self.queue = queue
        self.expires_ms = expires_ms
        self.timer: Timer | None = None

    def restart(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.queue.timers.call_later(self.expires_ms / 1000.0, self._run_out)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _run_out(self) -> None:
        self.timer = None
        queue = self.queue
        if queue.deleted:
            return
        if queue.consumer_count:
            return  # consumers keep it alive; removing the last one restarts the clock
        if queue.on_unused_expired is not None:
            queue.on_unused_expired(queue)
