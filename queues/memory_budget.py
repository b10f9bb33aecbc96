"""How many bytes of ready messages the broker keeps as objects before paging out to disk."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queues.queue import PriorityReadyMessages, ReadyMessages

# Python holds a message as several objects (entry, message, header, body); this is roughly
# what they cost beyond the body itself, so the budget counts memory, not only payload.
PER_MESSAGE_OVERHEAD = 400
DEFAULT_LIMIT_BYTES = 48 * 1024 * 1024
# A queue always keeps this many ready messages in memory, so dispatch never waits on a read.
KEEP_PER_QUEUE = 64


class MemoryBudget:
    """Shared by every queue of a broker: `held` is what their in-memory ready messages cost.

    Once `held` passes `limit`, durable queues keep new persistent messages in their journal
    only (see ReadyMessages.append_paged, queues/queue.py) and read them back when they near the head.
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


def should_page(ready: "ReadyMessages | PriorityReadyMessages") -> bool:
    """Should a new persistent message of a durable queue stay in its journal only?

    Yes once the queue keeps KEEP_PER_QUEUE messages in memory and either the budget is spent
    or messages ahead of it are paged out already (a consumer will not want it soon).
    """
    if ready.in_memory < KEEP_PER_QUEUE:
        return False
    budget = ready.budget
    # (budget.exhausted and len(ready), inline: this runs once per message of a backlog)
    return budget.held > budget.limit or ready.count > ready.in_memory
