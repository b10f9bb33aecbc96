"""A queue: ready messages, consumers, fair dispatch, and what acks and rejects do.

Dispatch is synchronous and cheap: whenever a message arrives, a consumer appears or a
consumer gains room (an ack, a new basic.qos, a socket that drained), `dispatch()` hands ready
messages to consumers that have room, highest consumer priority first and round-robin within a
priority, until messages or room run out. No task or future is created per message.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from queues.consumer import Consumer
from queues.message import Message
from queues.queue_entry import QueueEntry
from queues.ready_messages import ReadyMessages


class QueueStats:
    """Plain integer counters, read at scrape time (no library call per message)."""

    __slots__ = ("published", "delivered", "delivered_no_ack", "redelivered", "acked", "get", "get_empty")

    def __init__(self) -> None:
        self.published = 0
        self.delivered = 0
        self.delivered_no_ack = 0
        self.redelivered = 0
        self.acked = 0
        self.get = 0
        self.get_empty = 0


class Queue:
    """One queue of one vhost.

    `exclusive_owner` is the connection that owns an exclusive queue (None otherwise): the
    queue itself only compares it by identity.
    """

    def __init__(
        self,
        name: str,
        vhost: str,
        *,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.ready = ReadyMessages()
        self.unacked_count = 0
        self.stats = QueueStats()
        self.deleted = False
        # Called with the queue when an auto-delete queue loses its last consumer.
        self.on_unused: Callable[[Queue], None] | None = None
        self._next_seq = 1
        self._groups: list[tuple[int, deque[Consumer]]] = []
        self._consumer_count = 0
        self._had_consumers = False
        self._dispatching = False

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} vhost={self.vhost!r}>"

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        """Ready messages (what queue.declare-ok and basic.get-ok report)."""
        return len(self.ready)

    @property
    def consumer_count(self) -> int:
        return self._consumer_count

    def consumers(self) -> list[Consumer]:
        return [consumer for _priority, group in self._groups for consumer in group]

    # -- messages in -------------------------------------------------------------------

    def publish(self, message: Message) -> None:
        """Enqueue a routed message and deliver it if a consumer has room."""
        entry = QueueEntry(message, self._next_seq)
        self._next_seq += 1
        self.ready.append(entry)
        self.stats.published += 1
        if self._consumer_count:
            self.dispatch()

    # -- consumers ---------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        for priority, group in self._groups:
            if priority == consumer.priority:
                group.append(consumer)
                break
        else:
            self._groups.append((consumer.priority, deque([consumer])))
            self._groups.sort(key=lambda item: -item[0])
        self._consumer_count += 1
        self._had_consumers = True
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        for index, (_priority, group) in enumerate(self._groups):
            if consumer in group:
                group.remove(consumer)
                self._consumer_count -= 1
                if not group:
                    del self._groups[index]
                break
        else:
            return
        if self.auto_delete and self._had_consumers and not self._consumer_count and self.on_unused:
            self.on_unused(self)

    def has_exclusive_consumer(self) -> bool:
        return any(consumer.exclusive for consumer in self.consumers())

    def dispatch(self) -> None:
        """Deliver ready messages to consumers with room, in fair (round-robin) order."""
        if self._dispatching or self.deleted:
            return
        self._dispatching = True
        try:
            ready = self.ready
            stats = self.stats
            while ready:
                consumer = self._next_consumer()
                if consumer is None:
                    return
                entry = ready.pop()
                if entry.delivery_count:
                    stats.redelivered += 1
                if consumer.no_ack:
                    stats.delivered_no_ack += 1
                else:
                    consumer.unacked += 1
                    self.unacked_count += 1
                stats.delivered += 1
                consumer.sink.deliver(consumer, entry)
                entry.delivery_count += 1
        finally:
            self._dispatching = False

    def _next_consumer(self) -> Consumer | None:
        for _priority, group in self._groups:
            for _ in range(len(group)):
                consumer = group[0]
                group.rotate(-1)
                if consumer.has_capacity():
                    return consumer
        return None

    # -- pull --------------------------------------------------------------------------

    def get(self, no_ack: bool) -> QueueEntry | None:
        """basic.get: the next ready message, or None."""
        if not self.ready:
            self.stats.get_empty += 1
            return None
        entry = self.ready.pop()
        self.stats.get += 1
        if entry.delivery_count:
            self.stats.redelivered += 1
        if not no_ack:
            self.unacked_count += 1
        return entry

    def after_get(self, entry: QueueEntry) -> None:
        entry.delivery_count += 1

    # -- settlement --------------------------------------------------------------------

    def settle(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """An unacked delivery is done with (acked, or rejected without requeue)."""
        self.unacked_count -= 1
        if consumer is not None:
            consumer.unacked -= 1

    def ack(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        self.settle(entry, consumer)
        self.stats.acked += 1

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """Rejected without requeue: the message leaves the queue."""
        self.settle(entry, consumer)

    def requeue(self, entries: Iterable[tuple[QueueEntry, Consumer | None]]) -> None:
        """Put unacked deliveries back at their original positions, then dispatch."""
        for entry, consumer in entries:
            self.settle(entry, consumer)
            if not self.deleted:
                self.ready.put_back(entry)
        self.dispatch()

    # -- administration ----------------------------------------------------------------

    def purge(self) -> int:
        """Drop every ready message; return how many there were."""
        return len(self.ready.clear())

    def delete(self) -> list[Consumer]:
        """Mark deleted and return the consumers that must be told (basic.cancel)."""
        self.deleted = True
        consumers = self.consumers()
        self._groups.clear()
        self._consumer_count = 0
        self.ready.clear()
        return consumers
