"""Message TTL for ready messages that are paged out (only their numbers are in memory).

A durable queue keeps a long backlog in its journal (ReadyMessages.append_paged), and takes its
messages back paged out after a restart, so the queue's expiry heap of entries
(message_ttl.MessageExpiry) does not hold them. They must still expire where they are, not
only on reaching the head: this keeps their expiry times in a binary heap over two arrays
(16 bytes a message, not a tuple and an entry each), with one timer for the earliest. When one
is due, the message is taken out of the middle of the queue, read back, and expired or
dead-lettered like any other.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from queues import dead_letter
from queues.timers import Deadline

if TYPE_CHECKING:
    from queues.message_ttl import ExpiringQueue

BATCH = 10_000  # messages expired per timer run before yielding to the event loop


class ExpiryHeap:
    """A min-heap of (expires_at, seq) kept in two flat arrays; ties go in sequence (queue) order."""

    __slots__ = ("times", "seqs")

    def __init__(self) -> None:
        self.times = array("d")
        self.seqs = array("Q")

    def __len__(self) -> int:
        return len(self.seqs)

    def push(self, expires_at: float, seq: int) -> None:
        times, seqs = self.times, self.seqs
        times.append(expires_at)
        seqs.append(seq)
        i = len(seqs) - 1
        while i:
            parent = (i - 1) >> 1
            parent_time = times[parent]
            if parent_time < expires_at or (parent_time == expires_at and seqs[parent] < seq):
                break
            times[i], seqs[i] = times[parent], seqs[parent]
            i = parent
        times[i], seqs[i] = expires_at, seq

    def earliest(self) -> float:
        return self.times[0]

    def pop(self) -> int:
        """Remove the earliest entry and return its sequence number."""
        times, seqs = self.times, self.seqs
        top = seqs[0]
        last_time, last_seq = times.pop(), seqs.pop()
        size = len(seqs)
        if size:
            i = 0
            while True:
                child = 2 * i + 1
                if child >= size:
                    break
                right = child + 1
                if right < size and (
                    times[right] < times[child] or (times[right] == times[child] and seqs[right] < seqs[child])
                ):
                    child = right
                child_time = times[child]
                if last_time < child_time or (last_time == child_time and last_seq < seqs[child]):
                    break
                times[i], seqs[i] = times[child], seqs[child]
                i = child
            times[i], seqs[i] = last_time, last_seq
        return top

    def clear(self) -> None:
        del self.times[:]
        del self.seqs[:]


class PagedExpiry:
    """The paged-out ready messages of one queue that can expire, and the timer for the earliest."""

    __slots__ = ("queue", "heap", "deadline")

    def __init__(self, queue: ExpiringQueue) -> None:
        self.queue = queue
        self.heap = ExpiryHeap()
        self.deadline = Deadline(queue.timers, self.expire_due)

    def __len__(self) -> int:
        return len(self.heap)

    def track(self, seq: int, expires_at: float) -> None:
        """Paged-out message `seq` expires at `expires_at` (one already due expires at once)."""
        self.heap.push(expires_at, seq)
        self.deadline.arm(expires_at)

    def expire_due(self) -> None:
        """Take out and expire (or dead-letter) every tracked message whose time has passed.

        A tracked message that was read back meanwhile (it neared the head) is no longer paged
        out: the head check (message_ttl.pop_unexpired) or the entry heap covers it."""
        queue = self.queue
        heap = self.heap
        now = queue.timers.now()
        expired = []
        for _ in range(BATCH):
            if not heap or heap.earliest() > now or queue.deleted:
                break
            entry = queue.ready.take_paged(heap.pop())
            if entry is not None:
                expired.append(entry)
        dead_letter.hand_off(queue, expired, dead_letter.EXPIRED)
        if heap and not queue.deleted:
            earliest = heap.earliest()
            self.deadline.arm(earliest if earliest > now else now + 0.001)  # more due: after other work

    def clear(self) -> None:
        """Forget every tracked message (they were purged)."""
        self.heap.clear()

    def stop(self) -> None:
        """The queue is deleted: no timer fires any more."""
        self.deadline.close()
        self.heap.clear()
