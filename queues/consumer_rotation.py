"""The consumers of one queue in delivery order: highest x-priority first, round-robin within one.

A consumer of a lower priority gets messages only while every consumer of a higher priority
is out of room (its prefetch is full or its channel cannot take more), as in RabbitMQ.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar


class RotatedConsumer(Protocol):
    """What the rotation uses of a consumer (a queues.consumer.Consumer)."""

    @property
    def priority(self) -> int: ...

    def has_capacity(self) -> bool: ...


C = TypeVar("C", bound=RotatedConsumer)


class ConsumerRotation(Generic[C]):
    """Priority groups of consumers, each rotated as it is served."""

    __slots__ = ("_groups", "_only")

    def __init__(self) -> None:
        # Highest priority first; a list from the first consumer on (an empty one shares the
        # empty tuple).
        self._groups: list[tuple[int, deque[C]]] | tuple[()] = ()
        # The consumer while it is the only one (the usual case), else None: nothing to rotate.
        self._only: C | None = None

    def __iter__(self) -> Iterator[C]:
        for _priority, group in self._groups:
            yield from group

    def add(self, consumer: C) -> None:
        self._only = consumer if not self._groups else None
        for priority, group in self._groups:
            if priority == consumer.priority:
                group.append(consumer)
                return
        groups = self._groups or []
        groups.append((consumer.priority, deque([consumer])))
        groups.sort(key=lambda item: -item[0])
        self._groups = groups

    def remove(self, consumer: C) -> bool:
        """Take `consumer` out; False if it was not here."""
        for index, (_priority, group) in enumerate(self._groups):
            if consumer in group:
                group.remove(consumer)
                if not group:
                    del self._groups[index]  # type: ignore[union-attr]  # a list: it held `group`
                    if not self._groups:
                        self._groups = ()
                groups = self._groups
                self._only = groups[0][1][0] if len(groups) == 1 and len(groups[0][1]) == 1 else None
                return True
        return False

    def next_with_room(self) -> C | None:
        """The next consumer in turn that can take a message now (None if none can)."""
        only = self._only
        if only is not None:
            # One consumer, the usual case: nothing to rotate (this runs once per delivery).
            return only if only.has_capacity() else None
        for _priority, group in self._groups:
            for _ in range(len(group)):
                consumer = group[0]
                group.rotate(-1)
                if consumer.has_capacity():
                    return consumer
        return None

    def clear(self) -> None:
        self._groups = ()
        self._only = None


# The rotation of every queue that never had a consumer: empty, and never added to (Queue makes
# its own at its first consumer), so such a queue carries no rotation object of its own.
NO_CONSUMERS: ConsumerRotation[Any] = ConsumerRotation()
