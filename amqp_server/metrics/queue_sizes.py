"""Per-queue byte and paging figures, computed when the API is read or Prometheus scrapes.

Nothing here runs on the message path: ready bytes and the in-memory count are the queue's own
counters; unacknowledged bytes are summed in one pass over the channels' unacked deliveries
(queues count their unacked messages but not their bytes), so a read costs O(unacked messages
in the broker), once per request or scrape however many queues it shows.

`memory` is an estimate, not a measurement: the bodies held in memory plus
queues.memory_budget.PER_MESSAGE_OVERHEAD per message held (what the memory budget charges).
A stream holds its records in its files, not in memory: only its deliveries the channels hold
unacked count, and none of its records is "ready" in memory or "paged out" (RabbitMQ reports
no byte or paging figures for streams; the metrics and the API leave them out for streams).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amqp_server.metrics.broker_view import channels_of
from queues.memory_budget import PER_MESSAGE_OVERHEAD
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from queues.queue import Queue


def unacked_bytes_by_queue(broker: "Broker") -> dict["Queue", int]:
    """Body bytes of each queue's unacknowledged deliveries (queues with none are absent)."""
    totals: dict["Queue", int] = {}
    for _connection, channel in channels_of(broker):
        for unacked in list(channel.unacked.values()):
            totals[unacked.queue] = totals.get(unacked.queue, 0) + len(unacked.entry.message.body)
    return totals


# (metric name without its prefix, RabbitMQ's help, value): the per-queue gauges read from QueueSizes,
# on /metrics/per-object and in /metrics/detailed's queue_metrics family.
SIZE_GAUGES: tuple[tuple[str, str, Callable[[QueueSizes], float]], ...] = (
    ("queue_messages_bytes", "Size in bytes of ready and unacknowledged messages", lambda s: s.bytes),
    ("queue_messages_unacked_bytes", "Size in bytes of all unacknowledged messages", lambda s: s.unacked_bytes),
    ("queue_messages_paged_out", "Messages paged out to disk", lambda s: s.paged_out),
    ("queue_consumer_utilisation", "Same as consumer capacity", lambda s: s.consumer_utilisation),
)


@dataclass(frozen=True)
class QueueSizes:
    ready_bytes: int
    unacked_bytes: int
    paged_out: int
    in_memory: int
    memory: int
    consumer_utilisation: float

    @property
    def bytes(self) -> int:
        return self.ready_bytes + self.unacked_bytes


def queue_sizes(queue: "Queue", unacked_bytes: int) -> QueueSizes:
    if isinstance(queue, StreamQueue):
        return QueueSizes(ready_bytes=0, unacked_bytes=unacked_bytes, paged_out=0, in_memory=0,
                          memory=unacked_bytes + queue.unacked_count * PER_MESSAGE_OVERHEAD,
                          consumer_utilisation=0.0)
    ready = queue.ready
    ready_count = queue.message_count
    in_memory = getattr(ready, "in_memory", ready_count)
    # Paged-out sizes are not counted apart, so the in-memory share of ready bytes is prorated.
    ready_bytes_in_memory = ready.bytes if in_memory == ready_count else ready.bytes * in_memory // max(ready_count, 1)
    memory = ready_bytes_in_memory + unacked_bytes + (in_memory + queue.unacked_count) * PER_MESSAGE_OVERHEAD
    return QueueSizes(
        ready_bytes=ready.bytes,
        unacked_bytes=unacked_bytes,
        paged_out=ready_count - in_memory,
        in_memory=in_memory,
        memory=memory,
        consumer_utilisation=consumer_utilisation(queue),
    )


def consumer_utilisation(queue: "Queue") -> float:
    """RabbitMQ's consumer capacity, the share of time the queue could hand a message to a consumer
    at once, sampled now instead of averaged over time: 0.0 without consumers (as RabbitMQ),
    1.0 when consumers have taken every ready message, 0.0 when messages wait although there
    are consumers (every consumer is at its prefetch limit, or the queue is busy)."""
    if not queue.consumer_count:
        return 0.0
    return 0.0 if queue.message_count else 1.0
