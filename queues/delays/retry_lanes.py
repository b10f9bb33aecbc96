"""Messages waiting for a delayed retry, ordered by due time, at about 28 bytes a message.

The delay of a retry depends only on the queue's settings and the message's delivery count,
so messages that wait the same delay become due in the order they started waiting. Each
distinct delay is therefore a FIFO *lane* (appending keeps it sorted), and a small heap over
the lanes' heads finds the next due message: O(1) to add, O(log lanes) to take, and compact
arrays instead of a heap entry per message. A lane holds sequence number, delivery count and
due time in arrays, and the entry itself only when it is not paged out (None when the
queue's journal holds the message and it is read back when due).
"""

from __future__ import annotations

import heapq
from array import array
from typing import TYPE_CHECKING, Iterator, NamedTuple

if TYPE_CHECKING:
    from queues.message import QueueEntry

RECOVERED_LANE = -1  # messages that were waiting when the broker stopped, sorted once at start
_COMPACT_AFTER = 4096  # taken items kept at a lane's front before the arrays are cut


class Waiting(NamedTuple):
    seq: int
    delivery_count: int
    due_ms: int
    entry: "QueueEntry | None"  # None: paged out, read back from the journal


class _Lane:
    __slots__ = ("due", "seqs", "counts", "entries", "head")

    def __init__(self) -> None:
        self.due = array("q")
        self.seqs = array("Q")
        self.counts = array("I")
        self.entries: list[QueueEntry | None] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.due) - self.head

    def add(self, due_ms: int, seq: int, delivery_count: int, entry: "QueueEntry | None") -> None:
        if self.due and due_ms < self.due[-1]:
            due_ms = self.due[-1]  # the clock stepped back: keep the lane sorted (fires a little late)
        self.due.append(due_ms)
        self.seqs.append(seq)
        self.counts.append(delivery_count)
        self.entries.append(entry)

    def take(self) -> Waiting:
        i = self.head
        item = Waiting(self.seqs[i], self.counts[i], self.due[i], self.entries[i])
        self.entries[i] = None
        self.head = i + 1
        if self.head >= _COMPACT_AFTER and self.head * 2 >= len(self.due):
            cut = self.head
            del self.due[:cut], self.seqs[:cut], self.counts[:cut], self.entries[:cut]
            self.head = 0
        return item

    def items(self) -> Iterator[Waiting]:
        for i in range(self.head, len(self.due)):
            yield Waiting(self.seqs[i], self.counts[i], self.due[i], self.entries[i])


class RetryLanes:
    """Waiting messages of one queue; see the module docstring."""

    __slots__ = ("_lanes", "_heads", "_count")

    def __init__(self) -> None:
        self._lanes: dict[int, _Lane] = {}
        self._heads: list[tuple[int, int]] = []  # (due_ms of the lane's head, lane key), one per non-empty lane
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, delay_ms: int, due_ms: int, seq: int, delivery_count: int, entry: "QueueEntry | None") -> None:
        """Add a message that waits `delay_ms` (its lane) until `due_ms`."""
        lane = self._lanes.get(delay_ms)
        if lane is None:
            lane = self._lanes[delay_ms] = _Lane()
        if not len(lane):
            heapq.heappush(self._heads, (due_ms, delay_ms))
        lane.add(due_ms, seq, delivery_count, entry)
        self._count += 1

    def add_recovered(self, items: list[tuple[int, int, int]]) -> None:
        """Messages (seq, delivery_count, due_ms) that waited when the broker stopped, any order."""
        if not items:
            return
        lane = self._lanes.setdefault(RECOVERED_LANE, _Lane())
        merged = sorted([(w.due_ms, w.seq, w.delivery_count) for w in lane.items()] + [(d, s, c) for s, c, d in items])
        self._heads = [head for head in self._heads if head[1] != RECOVERED_LANE]
        heapq.heapify(self._heads)
        self._count -= len(lane)
        lane = self._lanes[RECOVERED_LANE] = _Lane()
        for due_ms, seq, count in merged:
            lane.add(due_ms, seq, count, None)
        heapq.heappush(self._heads, (merged[0][0], RECOVERED_LANE))
        self._count += len(merged)

    def next_due_ms(self) -> int | None:
        return self._heads[0][0] if self._heads else None

    def take_due(self, now_ms: int, limit: int | None = None) -> list[Waiting]:
        """Remove and return the messages due at `now_ms` (at most `limit`), earliest first per lane."""
        taken: list[Waiting] = []
        heads = self._heads
        while heads and heads[0][0] <= now_ms and (limit is None or len(taken) < limit):
            _due, key = heapq.heappop(heads)
            lane = self._lanes[key]
            while len(lane) and lane.due[lane.head] <= now_ms and (limit is None or len(taken) < limit):
                taken.append(lane.take())
            if len(lane):
                heapq.heappush(heads, (lane.due[lane.head], key))
            else:
                del self._lanes[key]
        self._count -= len(taken)
        return taken

    def items(self) -> Iterator[Waiting]:
        for lane in self._lanes.values():
            yield from lane.items()

    def clear(self) -> list[Waiting]:
        """Remove every waiting message; returns them."""
        removed = list(self.items())
        self._lanes.clear()
        self._heads.clear()
        self._count = 0
        return removed
