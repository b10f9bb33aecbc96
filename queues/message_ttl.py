"""Message TTL of a queue's ready messages: x-message-ttl and the per-message `expiration`.

A message's expiry time is fixed when it enters the queue: the shorter of the two TTLs,
counted from when it was published. An expired message leaves wherever it is: a heap of the
ready messages that can expire keeps one timer for the earliest, and a message that reaches
the head (dispatch, basic.get) after its time is expired instead of delivered. Either way it
is dead-lettered (reason `expired`) if the queue has a dead-letter exchange. Paged-out messages
(a long durable backlog, or recovered at startup) have a compact heap of their own
(paged_expiry.py).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Protocol

from queues import dead_letter
from queues.message import FLAG_EXPIRATION, READY, Message, QueueEntry
from queues.timers import Timer, Timers

if TYPE_CHECKING:
    from queues.ready_messages import ReadyList


class ExpiringQueue(dead_letter.DeadLetterSource, Protocol):
    """What message expiry uses of the queue (a queues.queue.Queue): its ready messages, its
    clock, whether it was deleted, and what dead-lettering uses."""

    @property
    def ready(self) -> ReadyList: ...

    @property
    def timers(self) -> Timers: ...

    @property
    def deleted(self) -> bool: ...


def expiry_time(message: Message, queue_ttl_ms: int | None) -> float:
    """When `message` expires in a queue whose x-message-ttl is `queue_ttl_ms` (0.0: never)."""
    if queue_ttl_ms is None and not message.property_flags & FLAG_EXPIRATION:
        return 0.0  # the usual case, once per message and queue: no TTL at all
    expiration = message.properties.expiration if message.property_flags & FLAG_EXPIRATION else None
    return expiry_of(message.published_at, expiration, queue_ttl_ms)


def expiry_of(published_at: float, expiration: str | None, queue_ttl_ms: int | None) -> float:
    """When a message published at `published_at` with the `expiration` property expires in a
    queue whose x-message-ttl is `queue_ttl_ms`: the shorter TTL wins (0.0: never)."""
    ttl_ms = queue_ttl_ms
    if expiration is not None:
        try:
            per_message = int(expiration)
        except (TypeError, ValueError):
            per_message = None
        if per_message is not None and (ttl_ms is None or per_message < ttl_ms):
            ttl_ms = per_message
    if ttl_ms is None:
        return 0.0
    return published_at + ttl_ms / 1000.0


def pop_unexpired(queue: ExpiringQueue, now: float) -> QueueEntry | None:
    """Pop the queue's next ready message, expiring any at the head whose time has come."""
    ready = queue.ready
    while ready:
        entry = ready.pop()
        if entry.expires_at and entry.expires_at < now:
            entry.mark_gone()
            dead_letter.hand_off(queue, [entry], dead_letter.EXPIRED)
            continue
        return entry
    return None


class MessageExpiry:
    """The ready messages of one queue that can expire, earliest first, and one timer for the earliest."""

    __slots__ = ("queue", "heap", "timer")

    def __init__(self, queue: ExpiringQueue) -> None:
        self.queue = queue
        # (expires_at, seq, entry); entries that left the ready messages meanwhile are skipped when popped.
        self.heap: list[tuple[float, int, QueueEntry]] = []
        self.timer: Timer | None = None

    def track(self, entry: QueueEntry) -> None:
        """`entry` (with an expiry time) became ready; one that is already due expires at once."""
        heap = self.heap
        heapq.heappush(heap, (entry.expires_at, entry.seq, entry))
        if heap[0][2] is entry:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.queue.timers.call_at(entry.expires_at, self.expire_due)

    def expire_due(self, now: float | None = None) -> int:
        """Remove (or dead-letter) every ready message whose TTL has passed; returns how many."""
        queue = self.queue
        now = queue.timers.now() if now is None else now
        heap = self.heap
        expired = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.state == READY:
                queue.ready.remove(entry)
                expired.append(entry)
        self.timer = None
        if heap and not queue.deleted:
            self.timer = queue.timers.call_at(heap[0][0], self.expire_due)
        dead_letter.hand_off(queue, expired, dead_letter.EXPIRED)
        return len(expired)

    def retime(self, queue_ttl_ms: int | None) -> None:
        """The queue's x-message-ttl changed (a policy): every in-memory ready message gets its
        expiry time under the new TTL, still counted from when it was published, and those
        already past it expire now."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        heap = self.heap
        heap.clear()
        for entry in self.queue.ready.in_memory_entries():
            entry.expire_at(expiry_time(entry.message, queue_ttl_ms))
            if entry.expires_at:
                heap.append((entry.expires_at, entry.seq, entry))
        heapq.heapify(heap)
        self.expire_due()

    def clear(self) -> None:
        """Forget every tracked message (they were purged)."""
        self.heap.clear()

    def stop(self) -> None:
        """The queue is deleted: no timer fires any more."""
        if self.timer is not None:
            self.timer.cancel()
        self.heap.clear()
