"""What a durable queue takes back from its journal at startup.

Recovered messages come back paged out: only their sequence numbers, delivery counts and
sizes are in memory, and each is read from disk as it nears the head of the queue, so
recovering a long queue costs its index, not its messages. A priority queue is the exception:
a message's level depends on its properties, so each is read once to place it. Those that can
expire (x-message-ttl, or their own `expiration`) are tracked by the queue's paged expiry, so
they expire where they are, and those whose time passed while the broker was down go at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from queues.message import decode_properties
from queues.message_ttl import expiry_of

if TYPE_CHECKING:
    from queues.arguments import QueueArguments
    from queues.delays.delayed_retry import DelayedRetry
    from queues.journal import JournalRecovery, QueueJournal
    from queues.paged_expiry import PagedExpiry
    from queues.ready_messages import ReadyList
    from queues.timers import Timers


class RecoveringQueue(Protocol):
    """What taking messages back uses of the queue (a queues.queue.Queue): its clock, journal,
    settings and ready messages, and its paged expiry and delayed retry."""

    @property
    def timers(self) -> Timers: ...

    @property
    def journal(self) -> QueueJournal | None: ...

    @property
    def settings(self) -> QueueArguments: ...

    @property
    def ready(self) -> ReadyList: ...

    def paged_message_expiry(self) -> PagedExpiry: ...

    def delayed_retry(self) -> DelayedRetry: ...


def take_back(queue: RecoveringQueue, recovery: "JournalRecovery") -> None:
    """Put the recovered messages back into `queue`.

    A message whose retry is still due later waits for it again; every other one is ready
    (one that fell due while the broker was down, at once).
    """
    now_ms = int(queue.timers.now() * 1000)
    journal = queue.journal
    assert journal is not None  # the recovery came from it
    ready = queue.ready
    by_priority = bool(queue.settings.max_priority)  # a PriorityReadyMessages (Queue.__init__)
    queue_ttl_ms = queue.settings.message_ttl_ms
    expiring = recovery.expiring_properties
    waiting: list[tuple[int, int, int]] = []
    tracks_expiry = queue_ttl_ms is not None or bool(expiring)
    for seq, delivery_count, size, due_ms, published_at_ms in recovery.messages:
        if due_ms is not None and due_ms > now_ms:
            waiting.append((seq, delivery_count, due_ms))
            continue
        if by_priority:
            entry = journal.load(seq, delivery_count)
            if entry is None:
                continue
            ready.page(entry)
        else:
            ready.append_paged(seq, delivery_count, size)
        if tracks_expiry and (queue_ttl_ms is not None or seq in expiring):
            expiration = _expiration(expiring[seq]) if seq in expiring else None
            expires_at = expiry_of(published_at_ms / 1000.0, expiration, queue_ttl_ms)
            if expires_at:
                queue.paged_message_expiry().track(seq, expires_at)
    if waiting:
        queue.delayed_retry().recover(waiting)


def _expiration(raw_properties: bytes) -> str | None:
    try:
        return decode_properties(raw_properties).expiration
    except Exception:  # a property list pamqp cannot read: it has no usable expiration
        return None
