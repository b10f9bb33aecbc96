"""A message's place in one queue: the shared message plus this queue's own view of it."""

from __future__ import annotations

from queues.message import Message


class QueueEntry:
    """A message as one queue holds it.

    `seq` is the queue's own sequence number (its position: requeued messages go back by it);
    `delivery_count` counts deliveries from this queue, so redelivered is `delivery_count > 0`.
    """

    __slots__ = ("message", "seq", "delivery_count")

    def __init__(self, message: Message, seq: int) -> None:
        self.message = message
        self.seq = seq
        self.delivery_count = 0

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 0
