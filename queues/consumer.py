"""A consumer: one basic.consume on one queue, with its own prefetch limit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from queues.queue import Queue
    from queues.message import QueueEntry


class DeliverySink(Protocol):
    """What a consumer delivers into (a channel); the queue never sees the network."""

    @property
    def global_prefetch_count(self) -> int:
        """The channel's own limit on its unacked deliveries, all consumers together
        (basic.qos global=true; 0: none), which applies besides each consumer's."""

    def can_deliver(self) -> bool:
        """False while the channel is at its global prefetch, flow-stopped, or its socket is full."""

    def deliver(self, consumer: "Consumer", entry: "QueueEntry") -> None:
        """Send the message to the client and track it as unacked unless no_ack."""

    def deliver_many(self, consumer: "Consumer", entries: "list[QueueEntry]") -> None:
        """`deliver` each of `entries`, in order, in one call (a stream's batch of records). They are
        first deliveries: none is redelivered."""

    def consumer_cancelled(self, consumer: "Consumer") -> None:
        """The broker cancelled this consumer (its queue was deleted)."""


class Consumer:
    """A subscription of one channel to one queue.

    `prefetch_count` is the per-consumer limit (basic.qos global=false, 0 = none); `unacked`
    counts its deliveries not yet acked. Both limits apply at once with the channel's global one.
    """

    __slots__ = (
        "tag", "queue", "sink", "no_ack", "exclusive", "priority", "prefetch_count", "unacked", "arguments", "timeout_ms",
    )

    def __init__(
        self,
        tag: str,
        queue: "Queue",
        sink: DeliverySink,
        *,
        no_ack: bool,
        exclusive: bool = False,
        priority: int = 0,
        prefetch_count: int = 0,
        arguments: dict[str, Any] | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        """`timeout_ms`: a delivery unacked for longer times out (consumer timeout; None: never)."""
        self.tag = tag
        self.queue = queue
        self.sink = sink
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch_count = prefetch_count
        self.unacked = 0
        self.arguments = arguments or {}
        self.timeout_ms = timeout_ms

    def move_to(self, queue: "Queue") -> None:
        """The consumer's queue took another form here: a replicated queue whose leader changed
        is now the queue itself or a stand-in reaching the new leader (cluster_apply.py). The
        consumer keeps its tag, prefetch and unacked count; deliveries made before stay settled
        through the queue they came from."""
        self.queue = queue

    def go_on_with(self, arguments: dict[str, Any]) -> None:
        """Its consume arguments on the queue's next form: where it is now (a stream's offset),
        so the new form goes on from there (QueueType.continuation)."""
        self.arguments = arguments

    def count_unacked(self) -> None:
        """One more delivery to it waits for its ack."""
        self.unacked += 1

    def count_unacked_batch(self, count: int) -> None:
        """`count` more deliveries to it wait for their acks."""
        self.unacked += count

    def count_settled(self) -> None:
        """One of its deliveries was settled (acked, rejected or requeued)."""
        self.unacked -= 1

    def count_settled_batch(self, count: int) -> None:
        """`count` of its deliveries were settled."""
        self.unacked -= count

    def set_prefetch(self, count: int) -> None:
        """A new per-consumer limit (basic.qos global=false on its channel; 0 = none)."""
        self.prefetch_count = count

    def has_capacity(self) -> bool:
        if not self.no_ack and self.prefetch_count and self.unacked >= self.prefetch_count:
            return False
        return self.sink.can_deliver()
