"""The consumers of one queue in delivery order: highest x-priority first, round-robin within one.

A consumer of a lower priority gets messages only while every consumer of a higher priority
is out of room (its prefetch is full or its channel cannot take more), as in RabbitMQ.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from queues.consumer import Consumer


class ConsumerRotation:
    """Priority groups of consumers, each rotated as it is served."""

    __slots__ = ("_groups",)

    def __init__(self) -> None:
        # Highest priority first; a list from the first consumer on (an empty one shares the
        # empty tuple).
        self._groups: list[tuple[int, deque[Consumer]]] | tuple[()] = ()

    def __iter__(self) -> Iterator[Consumer]:
        for _priority, group in self._groups:
            yield from group

    def add(self, consumer: Consumer) -> None:
        for priority, group in self._groups:
            if priority == consumer.priority:
                group.append(consumer)
                return
        groups = self._groups or []
        groups.append((consumer.priority, deque([consumer])))
        groups.sort(key=lambda item: -item[0])
        self._groups = groups

    def remove(self, consumer: Consumer) -> bool:
        """Take `consumer` out; False if it was not here."""
        for index, (_priority, group) in enumerate(self._groups):
            if consumer in group:
                group.remove(consumer)
                if not group:
                    del self._groups[index]
                    if not self._groups:
                        self._groups = ()
                return True
        return False

    def next_with_room(self) -> Consumer | None:
        """The next consumer in turn that can take a message now (None if none can)."""
        groups = self._groups
        if len(groups) == 1 and len(groups[0][1]) == 1:
            # One consumer, the usual case: nothing to rotate (this runs once per delivery).
            consumer = groups[0][1][0]
            return consumer if consumer.has_capacity() else None
        for _priority, group in groups:
            for _ in range(len(group)):
                consumer = group[0]
                group.rotate(-1)
                if consumer.has_capacity():
                    return consumer
        return None

    def clear(self) -> None:
        self._groups = ()


# The rotation of every queue that never had a consumer: empty, and never added to (Queue makes
# its own at its first consumer), so such a queue carries no rotation object of its own.
NO_CONSUMERS = ConsumerRotation()
