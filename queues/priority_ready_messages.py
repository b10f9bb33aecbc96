"""The ready messages of an x-max-priority queue: higher priority first, FIFO within a priority.

One ReadyMessages per priority level in use, so everything ReadyMessages promises holds within
a level: a requeued message goes back to its original position among the messages of its
priority, a message can expire from the middle, and persistent messages of a durable queue
page out to the journal and are read back near the head. As in RabbitMQ, a message without a
priority has priority 0 and one above the queue's maximum counts as the maximum.

Only queues declared with x-max-priority >= 1 use this store; every other queue keeps the plain
ReadyMessages, so their path costs nothing more.
"""

from __future__ import annotations

from collections.abc import Iterator

from queues.memory_budget import MemoryBudget
from queues.message import FLAG_PRIORITY, Message, QueueEntry
from queues.ready_messages import Loader, ReadyMessages


def message_priority(message: Message, max_priority: int) -> int:
    """The priority level `message` is kept at in a queue with `max_priority`."""
    if not message.property_flags & FLAG_PRIORITY:
        return 0
    priority = message.properties.priority or 0
    return priority if priority < max_priority else max_priority


class PriorityReadyMessages:
    """Same interface as ReadyMessages; see the module docstring."""

    __slots__ = ("max_priority", "loader", "budget", "_levels", "_order", "count")

    def __init__(self, max_priority: int, loader: Loader | None = None, budget: MemoryBudget | None = None) -> None:
        self.max_priority = max_priority
        self.loader = loader
        self.budget = budget if budget is not None else MemoryBudget()
        self._levels: dict[int, ReadyMessages] = {}
        self._order: list[ReadyMessages] = []  # the levels in use, highest priority first
        self.count = 0  # ready messages, as ReadyMessages.count

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    @property
    def bytes(self) -> int:
        return sum(level.bytes for level in self._order)

    @property
    def in_memory(self) -> int:
        return sum(level.in_memory for level in self._order)

    def _level(self, priority: int) -> ReadyMessages:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = ReadyMessages(self.loader, self.budget)
            self._order = [self._levels[p] for p in sorted(self._levels, reverse=True)]
        return level

    def _level_of(self, entry: QueueEntry) -> ReadyMessages:
        return self._level(message_priority(entry.message, self.max_priority))

    def append(self, entry: QueueEntry) -> None:
        self._level_of(entry).append(entry)
        self.count += 1

    def append_paged(self, seq: int, delivery_count: int, size: int, priority: int = 0) -> None:
        self._level(min(priority, self.max_priority)).append_paged(seq, delivery_count, size)
        self.count += 1

    def page(self, entry: QueueEntry) -> None:
        """Keep `entry` in the journal only (see ReadyMessages.page)."""
        self._level_of(entry).page(entry)
        self.count += 1

    def put_back(self, entry: QueueEntry) -> None:
        self._level_of(entry).put_back(entry)
        self.count += 1

    def remove(self, entry: QueueEntry) -> None:
        level = self._level_of(entry)
        before = len(level)
        level.remove(entry)
        self.count -= before - len(level)

    def take_paged(self, seq: int) -> QueueEntry | None:
        """Take out the paged-out message `seq` (see ReadyMessages.take_paged)."""
        for level in self._order:
            before = len(level)
            entry = level.take_paged(seq)
            if len(level) != before:
                self.count -= before - len(level)
                return entry
        return None

    def pop(self) -> QueueEntry:
        """Remove and return the next message to deliver; IndexError when empty."""
        for level in self._order:
            if level:
                before = len(level)
                try:
                    entry = level.pop()
                except IndexError:  # its paged-out messages could not be read back
                    self.count -= before - len(level)
                    continue
                self.count -= before - len(level)
                return entry
        raise IndexError("no ready messages")

    def in_memory_entries(self) -> list[QueueEntry]:
        return [entry for level in self._order for entry in level.in_memory_entries()]

    def peek(self, count: int) -> list[QueueEntry]:
        entries: list[QueueEntry] = []
        for level in self._order:
            if len(entries) >= count:
                break
            entries.extend(level.peek(count - len(entries)))
        return entries

    def clear(self) -> int:
        count = sum(level.clear() for level in self._order)
        self.count = 0
        return count

    def close(self) -> int:
        """The queue is deleted: see ReadyMessages.close."""
        self.loader = None
        count = sum(level.close() for level in self._order)
        self.count = 0
        return count

    def levels(self) -> Iterator[tuple[int, int]]:
        """(priority, ready messages) of each level in use, highest first (for inspection)."""
        for priority in sorted(self._levels, reverse=True):
            yield priority, len(self._levels[priority])
