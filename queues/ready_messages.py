"""The ready messages of a queue, in delivery order."""

from __future__ import annotations

import heapq
from collections import deque

from queues.queue_entry import GONE, READY, UNACKED, QueueEntry


class ReadyMessages:
    """FIFO of new messages plus the messages that came back, which go first.

    A message that was delivered and then requeued (nack, reject, a channel closing) goes
    back to its original position, as in RabbitMQ: every message still in the FIFO arrived
    after every message that was delivered from it, so returned messages, ordered by their
    sequence number among themselves, all come before the FIFO.

    A message can also leave from the middle (it expired): `remove()` marks it gone and
    `pop()` skips it later, so removal costs O(1).
    """

    __slots__ = ("_fifo", "_returned", "_count", "bytes")

    def __init__(self) -> None:
        self._fifo: deque[QueueEntry] = deque()
        self._returned: list[tuple[int, QueueEntry]] = []
        self._count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def append(self, entry: QueueEntry) -> None:
        entry.state = READY
        self._fifo.append(entry)
        self._count += 1
        self.bytes += len(entry.message.body)

    def put_back(self, entry: QueueEntry) -> None:
        entry.state = READY
        heapq.heappush(self._returned, (entry.seq, entry))
        self._count += 1
        self.bytes += len(entry.message.body)

    def remove(self, entry: QueueEntry) -> None:
        """Take a ready message out wherever it is (it stays in place as a skipped tombstone)."""
        if entry.state == READY:
            entry.state = GONE
            self._count -= 1
            self.bytes -= len(entry.message.body)

    def peek(self) -> QueueEntry | None:
        """The next message to deliver, without removing it."""
        self._drop_tombstones()
        if self._returned:
            return self._returned[0][1]
        return self._fifo[0] if self._fifo else None

    def pop(self) -> QueueEntry:
        """Remove and return the next message to deliver; IndexError when empty."""
        self._drop_tombstones()
        if self._returned:
            entry = heapq.heappop(self._returned)[1]
        else:
            entry = self._fifo.popleft()
        entry.state = UNACKED
        self._count -= 1
        self.bytes -= len(entry.message.body)
        return entry

    def _drop_tombstones(self) -> None:
        returned = self._returned
        while returned and returned[0][1].state != READY:
            heapq.heappop(returned)
        fifo = self._fifo
        while fifo and fifo[0].state != READY:
            fifo.popleft()

    def clear(self) -> list[QueueEntry]:
        """Remove every ready message and return them in delivery order."""
        entries = [entry for _seq, entry in sorted(self._returned, key=lambda item: item[0]) if entry.state == READY]
        entries.extend(entry for entry in self._fifo if entry.state == READY)
        for entry in entries:
            entry.state = GONE
        self._returned.clear()
        self._fifo.clear()
        self._count = 0
        self.bytes = 0
        return entries
