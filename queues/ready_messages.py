"""The ready messages of a queue, in delivery order."""

from __future__ import annotations

import heapq
from collections import deque

from queues.queue_entry import QueueEntry


class ReadyMessages:
    """FIFO of new messages plus the messages that came back, which go first.

    A message that was delivered and then requeued (nack, reject, a channel closing) goes
    back to its original position, as in RabbitMQ: every message still in the FIFO arrived
    after every message that was delivered from it, so returned messages, ordered by their
    sequence number among themselves, all come before the FIFO.
    """

    __slots__ = ("_fifo", "_returned", "bytes")

    def __init__(self) -> None:
        self._fifo: deque[QueueEntry] = deque()
        self._returned: list[tuple[int, QueueEntry]] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._fifo) + len(self._returned)

    def __bool__(self) -> bool:
        return bool(self._fifo) or bool(self._returned)

    def append(self, entry: QueueEntry) -> None:
        self._fifo.append(entry)
        self.bytes += len(entry.message.body)

    def put_back(self, entry: QueueEntry) -> None:
        heapq.heappush(self._returned, (entry.seq, entry))
        self.bytes += len(entry.message.body)

    def pop(self) -> QueueEntry:
        """Remove and return the next message to deliver; IndexError when empty."""
        if self._returned:
            entry = heapq.heappop(self._returned)[1]
        else:
            entry = self._fifo.popleft()
        self.bytes -= len(entry.message.body)
        return entry

    def clear(self) -> list[QueueEntry]:
        """Remove every ready message and return them in delivery order."""
        entries = [entry for _seq, entry in sorted(self._returned, key=lambda item: item[0])]
        entries.extend(self._fifo)
        self._returned.clear()
        self._fifo.clear()
        self.bytes = 0
        return entries
