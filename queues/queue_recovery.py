"""What a durable queue takes back from its journal at startup.

Recovered messages come back paged out: only their sequence numbers, delivery counts and
sizes are in memory, and each is read from disk as it nears the head of the queue, so
recovering a long queue costs its index, not its messages. A priority queue is the exception:
a message's level depends on its properties, so each is read once to place it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queues.priority_ready_messages import PriorityReadyMessages
from queues.recovered_expiry import RecoveredExpiry

if TYPE_CHECKING:
    from queues.queue import Queue


def take_back(queue: "Queue", recovered: list[tuple[int, int, int, int | None]]) -> None:
    """Put `recovered` (seq, delivery_count, size, due_ms) back into `queue`.

    A message whose retry is still due later waits for it again; every other one is ready
    (one that fell due while the broker was down, at once).
    """
    now_ms = int(queue.timers.now() * 1000)
    journal = queue.journal
    ready = queue.ready
    by_priority = isinstance(ready, PriorityReadyMessages)
    waiting: list[tuple[int, int, int]] = []
    for seq, delivery_count, size, due_ms in recovered:
        if due_ms is not None and due_ms > now_ms:
            waiting.append((seq, delivery_count, due_ms))
        elif by_priority:
            entry = journal.load(seq, delivery_count)
            if entry is not None:
                ready.page(entry)
        else:
            ready.append_paged(seq, delivery_count, size)
    if waiting:
        queue.delayed_retry().recover(waiting)
    if queue.settings.message_ttl_ms is not None and len(ready) and not by_priority:
        # Paged out, they are unknown to the expiry heap: expire them from the head instead.
        queue.recovered_expiry = RecoveredExpiry(queue, queue.next_seq)
