"""Delayed redelivery: a message that comes back to its queue waits before it is ready again.

The queue's `x-delayed-retry-type` says which returns wait: `failed` (basic.reject / basic.nack
with requeue=true), `returned` (the consumer went away without settling it: channel or
connection closed, basic.recover, consumer timeout), `all`, or none (`disabled`, the default).
The delay grows with the message's delivery count:

  linear:      min(x-delayed-retry-min × count, x-delayed-retry-max)   (RabbitMQ 4.3)
  exponential: min(x-delayed-retry-min × 2^(count-1), x-delayed-retry-max)

While it waits the message is neither ready nor unacked, so other messages keep flowing. A
persistent message of a durable queue waits paged out (only its number, count and due time
stay in memory) and is journaled as `waiting_retry` with its due time, so it survives a
restart and comes back at that time, or at once when it fell due while the broker was down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from queues import dead_letter
from queues.arguments import QueueArguments
from queues.length_limit import LimitedQueue, drop_head_after_return
from queues.delays.retry_lanes import RetryLanes
from queues.timers import Deadline, Timers

if TYPE_CHECKING:
    from queues.message import QueueEntry

# Why an unacked delivery came back (the `cause` of Queue.requeue).
FAILED = "failed"  # the client rejected it: basic.reject / basic.nack with requeue=true
RETURNED = "returned"  # the client went away or gave up on it without settling it

RELEASE_BATCH = 10_000  # messages made ready per timer run before yielding to the event loop
# A delay is never longer than this (about 35 years): keeps due times far inside u63 milliseconds.
MAX_DELAY_MS = 1 << 40


def retry_delay_ms(settings: QueueArguments, delivery_count: int, cause: str | None) -> int:
    """How long a message returned for `cause` after `delivery_count` deliveries waits (0: not at all)."""
    kind = settings.retry_type
    if cause is None or kind == "disabled" or (kind != "all" and kind != cause):
        return 0
    count = max(delivery_count, 1)
    minimum = settings.retry_min_ms
    if settings.retry_backoff == "exponential":
        delay = minimum << min(count - 1, 48)
    else:
        delay = minimum * count
    maximum = settings.retry_max_ms
    if maximum is not None and delay > maximum:
        delay = maximum
    return min(delay, MAX_DELAY_MS)


class RetryingQueue(LimitedQueue, Protocol):
    """What delayed retry uses of the queue (a queues.queue.Queue): its clock, its paged-out
    messages read back, putting a message back in its place and dispatching, and what its
    length limits and dead-lettering use."""

    @property
    def timers(self) -> Timers: ...

    @property
    def deleted(self) -> bool: ...

    def load_paged(self, seq: int, delivery_count: int) -> QueueEntry | None: ...

    def put_back(self, entry: QueueEntry) -> None: ...

    def dispatch(self) -> None: ...


class DelayedRetry:
    """The messages of one queue that wait for their retry, and the one timer that releases them."""

    def __init__(self, queue: RetryingQueue) -> None:
        self.queue = queue
        self.lanes = RetryLanes()
        self.deadline = Deadline(queue.timers, self.release_due)

    def __len__(self) -> int:
        return len(self.lanes)

    def hold(self, entry: "QueueEntry", delay_ms: int) -> None:
        """`entry` (just returned by a consumer) waits `delay_ms` before it is ready again."""
        due_ms = int(self.queue.timers.now() * 1000) + delay_ms
        entry.mark_waiting()
        if entry.persisted:
            # The journal holds it: keep only its number (read back when due).
            self.queue.journal.waiting(entry, due_ms)  # type: ignore[union-attr]  # persisted: journaled
            self.lanes.add(delay_ms, due_ms, entry.seq, entry.delivery_count, None)
        else:
            self.lanes.add(delay_ms, due_ms, entry.seq, entry.delivery_count, entry)
        self.deadline.arm(due_ms / 1000.0)

    def recover(self, waiting: list[tuple[int, int, int]]) -> None:
        """Messages (seq, delivery_count, due_ms) that were waiting when the broker stopped."""
        self.lanes.add_recovered(waiting)
        self._rearm()

    def release_due(self) -> None:
        """Timer callback: messages whose time has come are ready again at their original
        positions (or expire, if their TTL passed while they waited); then the queue enforces
        its length limit and delivers them."""
        queue = self.queue
        if queue.deleted:
            return
        now_ms = int(queue.timers.now() * 1000)
        taken = self.lanes.take_due(now_ms, RELEASE_BATCH)
        for item in taken:
            entry = item.entry if item.entry is not None else queue.load_paged(item.seq, item.delivery_count)
            if entry is None:
                continue
            if entry.expires_at and entry.expires_at <= queue.timers.now():
                entry.mark_gone()
                dead_letter.hand_off(queue, [entry], dead_letter.EXPIRED)
            else:
                queue.put_back(entry)
        self._rearm(now_ms, len(taken) >= RELEASE_BATCH)
        drop_head_after_return(queue)
        queue.dispatch()

    def _rearm(self, now_ms: int = 0, batch_full: bool = False) -> None:
        due_ms = self.lanes.next_due_ms()
        if due_ms is not None:
            if batch_full:
                due_ms = max(due_ms, now_ms + 1)  # more are due: continue after other work
            self.deadline.arm(due_ms / 1000.0)

    def clear(self) -> int:
        """Drop every waiting message (purge); returns how many there were."""
        self.deadline.disarm()
        removed = self.lanes.clear()
        for item in removed:
            if item.entry is not None:
                item.entry.mark_gone()
        return len(removed)

    def stop(self) -> int:
        """The queue is deleted: drop every waiting message (returns how many) and the timer's
        callback, so no reference cycle outlives the queue."""
        removed = self.clear()
        self.deadline.close()
        return removed
