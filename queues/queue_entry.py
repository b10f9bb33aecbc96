"""A message's place in one queue: the shared message plus this queue's own view of it."""

from __future__ import annotations

from queues.message import Message

READY = 0
UNACKED = 1
GONE = 2  # acked, dropped, expired or dead-lettered
WAITING = 3  # returned by a consumer and waiting for its delayed retry (neither ready nor unacked)


class QueueEntry:
    """A message as one queue holds it.

    `seq` is the queue's own sequence number (its position: requeued messages go back by it);
    `delivery_count` counts deliveries from this queue, so redelivered is `delivery_count > 0`;
    `expires_at` is the wall-clock time (seconds) the message expires, 0 for never;
    `persisted` says the queue's journal holds it, so what happens to it is journaled too.
    """

    __slots__ = ("message", "seq", "delivery_count", "expires_at", "state", "persisted")

    def __init__(self, message: Message, seq: int, expires_at: float = 0.0) -> None:
        self.message = message
        self.seq = seq
        self.delivery_count = 0
        self.expires_at = expires_at
        self.state = READY
        self.persisted = False  # written to the queue's journal (a persistent message, durable queue)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 0
