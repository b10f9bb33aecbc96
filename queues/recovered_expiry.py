"""Message TTL for the messages a durable x-message-ttl queue recovered at startup.

Recovered messages are paged out (only their numbers are in memory), so the queue's expiry heap
does not know when they expire. With one TTL for the whole queue they expire in queue order,
so watching the head is enough: read the head back, expire (or dead-letter) it if its time has
passed and look at the next, otherwise wake up when it expires. This stops at the first message
published after the restart (the expiry heap covers those). A per-message `expiration` shorter
than the queue's TTL on a recovered message deeper in the queue still takes effect only when
that message reaches the head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queues import dead_letter
from queues.queue_entry import GONE
from queues.timers import Deadline

if TYPE_CHECKING:
    from queues.queue import Queue

BATCH = 10_000  # head reads per timer run before yielding to the event loop


class RecoveredExpiry:
    def __init__(self, queue: "Queue", first_new_seq: int) -> None:
        self.queue = queue
        self.first_new_seq = first_new_seq
        self.deadline = Deadline(queue.timers, self.check)
        self.deadline.arm(queue.timers.now())

    def stop(self) -> None:
        self.deadline.disarm()

    def check(self) -> None:
        queue = self.queue
        ready = queue.ready
        now = queue.timers.now()
        for _ in range(BATCH):
            if queue.deleted or not ready:
                return
            try:
                entry = ready.pop()
            except IndexError:
                return
            if entry.expires_at and entry.expires_at <= now:
                entry.state = GONE
                dead_letter.hand_off(queue, [entry], dead_letter.EXPIRED)
                continue
            ready.put_back(entry)  # it was the head: it stays the head
            if entry.seq < self.first_new_seq and entry.expires_at:
                self.deadline.arm(entry.expires_at)
            return
        self.deadline.arm(now + 0.001)  # more to read: continue after other work
