"""x-single-active-consumer: one consumer of the queue receives at a time, the others stand by.

As in RabbitMQ's classic queues, the active consumer is the earliest registered one still
present; when it goes (cancel, channel or connection closed, consumer timeout) the next in
registration order takes over, starting with the messages the previous one left unacked
(they are requeued at their original positions). basic.get is refused on such a queue (405).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class StandingConsumer(Protocol):
    """What the single-active order uses of a consumer (a queues.consumer.Consumer)."""

    def has_capacity(self) -> bool: ...


C = TypeVar("C", bound=StandingConsumer)


class ActiveConsumer(Generic[C]):
    """Registration order of a single-active-consumer queue's consumers."""

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: list[C] = []

    def add(self, consumer: C) -> None:
        self._order.append(consumer)

    def remove(self, consumer: C) -> None:
        if consumer in self._order:
            self._order.remove(consumer)

    @property
    def active(self) -> C | None:
        return self._order[0] if self._order else None

    def next_with_room(self) -> C | None:
        """The active consumer if it can take a message now (nobody else ever can)."""
        consumer = self.active
        return consumer if consumer is not None and consumer.has_capacity() else None
