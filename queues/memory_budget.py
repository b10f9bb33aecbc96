"""The memory budget: how many bytes of ready messages the broker keeps as objects before
durable queues page out to disk (one MemoryBudget shared by every queue's ready list,
queues/ready_messages.py)."""

from __future__ import annotations

# Python holds a message as several objects (entry, message, header, body); this is roughly
# what they cost beyond the body itself, so the budget counts memory, not only payload.
PER_MESSAGE_OVERHEAD = 400
DEFAULT_LIMIT_BYTES = 48 * 1024 * 1024


class MemoryBudget:
    """Shared by every queue of a broker: `held` is what their in-memory ready messages cost.

    Once `held` passes `limit`, durable queues keep new persistent messages in their journal
    only (see ReadyMessages.append_paged) and read them back when they near the head.
    """

    __slots__ = ("limit", "held")

    def __init__(self, limit: int = DEFAULT_LIMIT_BYTES) -> None:
        self.limit = limit
        self.held = 0

    @property
    def exhausted(self) -> bool:
        return self.held > self.limit

    def hold(self, size: int) -> None:
        """A ready message of `size` body bytes is now kept in memory."""
        self.held += size + PER_MESSAGE_OVERHEAD

    def release(self, size: int) -> None:
        """A ready message of `size` body bytes is no longer kept in memory (taken or paged out)."""
        self.held -= size + PER_MESSAGE_OVERHEAD
