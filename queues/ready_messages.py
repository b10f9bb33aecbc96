"""A queue's ready messages, in delivery order, with the tail kept on disk when it is long.

ReadyMessages is the ready list of a queue; PriorityReadyMessages (at the end) is that of an
x-max-priority queue, one ReadyMessages per priority level. What their in-memory messages cost
is charged to the broker's MemoryBudget (queues/memory_budget.py); past its limit, a durable
queue's new persistent messages stay in its journal only (should_page) and are read back as
they near the head. A message's place in the queue is a QueueEntry (queues/message.py).
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from typing import cast

from queues.memory_budget import MemoryBudget
from queues.message import FLAG_PRIORITY, READY, Message, QueueEntry

# Loads a paged-out message back: (seq, delivery_count) -> entry, or None if it cannot be read.
Loader = Callable[[int, int], "QueueEntry | None"]

# A queue always keeps this many ready messages in memory, so dispatch never waits on a read.
KEEP_PER_QUEUE = 64


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


class PagedRun:
    """Consecutive persistent messages held only in the journal: their numbers and sizes.

    About 16 bytes a message instead of the message itself, which is what keeps a queue of
    a million messages within bounded memory.
    """

    __slots__ = ("seqs", "delivery_counts", "sizes", "start")

    def __init__(self) -> None:
        self.seqs = array("Q")
        self.delivery_counts = array("I")
        self.sizes = array("I")
        self.start = 0  # index of the next message to hand out

    def __len__(self) -> int:
        return len(self.seqs) - self.start

    def add(self, seq: int, delivery_count: int, size: int) -> None:
        self.seqs.append(seq)
        self.delivery_counts.append(delivery_count)
        self.sizes.append(size)

    def release(self) -> None:
        """Every message was handed out or taken: free the arrays (the run may still sit in the FIFO)."""
        self.seqs = array("Q")
        self.delivery_counts = array("I")
        self.sizes = array("I")
        self.start = 0


# What the structures of a queue that never had a message (never paged out, never had one
# returned) hold: shared and immutable, so an idle queue carries no objects of its own for them
# (fewer for each full garbage collection to scan, and no 600-byte deque). The first change
# replaces them with its own; a change made to one by mistake raises instead of reaching every
# idle queue (tests/test_ready_messages_paged.py checks they stay empty). The attributes are
# typed as the containers they become (the casts): the stand-ins are empty, so reading one reads
# as an empty container does.
_NO_MESSAGES = cast("deque[QueueEntry | PagedRun]", ())
_NO_RUNS = cast("deque[PagedRun]", ())
_NO_RETURNED = cast("list[tuple[int, QueueEntry]]", ())
_NOTHING_TAKEN = cast("set[int]", frozenset())


class ReadyMessages:
    """FIFO of new messages plus the messages that came back, which go first.

    A message that was delivered and then requeued (nack, reject, a channel closing) goes
    back to its original position, as in RabbitMQ: every message still in the FIFO arrived
    after every message that was delivered from it, so returned messages, ordered by their
    sequence number among themselves, all come before the FIFO.

    A message can also leave from the middle (it expired): `remove()` marks it gone and
    `pop()` skips it later, so removal costs O(1).

    Persistent messages of a durable queue may be paged out (`append_paged`): the FIFO then
    holds a PagedRun instead of the entries, and `pop()` reads them back through `loader`.
    """

    __slots__ = ("_fifo", "_runs", "_returned", "count", "bytes", "in_memory", "loader", "budget", "_taken")

    def __init__(self, loader: Loader | None = None, budget: MemoryBudget | None = None) -> None:
        self._fifo = _NO_MESSAGES
        # The PagedRuns of the FIFO, in order (lookup by seq); its own deque from the first one.
        self._runs = _NO_RUNS
        # Returned messages, a heap by seq; its own list from the first one.
        self._returned = _NO_RETURNED
        # Ready messages: what len() says, read as an attribute by the queue's per-message code
        # (no __len__/__bool__ call there). Only this class changes it.
        self.count = 0
        self.bytes = 0
        self.in_memory = 0  # ready messages held as objects (not paged out)
        self.loader = loader
        self.budget = budget if budget is not None else MemoryBudget()
        # Paged-out messages taken from the middle of their run (they expired): skipped later;
        # its own set from the first one.
        self._taken = _NOTHING_TAKEN

    def _hold(self, size: int) -> None:
        self.in_memory += 1
        self.budget.hold(size)

    def _release(self, size: int) -> None:
        self.in_memory -= 1
        self.budget.release(size)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def append(self, entry: QueueEntry) -> None:
        """Add a new message (READY, as QueueEntry makes it; one that comes back is put_back)."""
        fifo = self._fifo
        if fifo is _NO_MESSAGES:
            fifo = self._fifo = deque()
        fifo.append(entry)
        self.count += 1
        size = len(entry.message.body)
        # _hold(size), inline: this runs once per message.
        self.in_memory += 1
        self.budget.hold(size)
        self.bytes += size

    def append_paged(self, seq: int, delivery_count: int, size: int, priority: int = 0) -> None:
        """Add a message that only the journal holds (`priority` is for PriorityReadyMessages)."""
        fifo = self._fifo
        if fifo is _NO_MESSAGES:
            fifo = self._fifo = deque()
        tail = fifo[-1] if fifo else None
        if not isinstance(tail, PagedRun):
            tail = PagedRun()
            fifo.append(tail)
            if self._runs is _NO_RUNS:
                self._runs = deque()
            self._runs.append(tail)
        tail.add(seq, delivery_count, size)
        self.count += 1
        self.bytes += size

    def page(self, entry: QueueEntry) -> None:
        """Add a journaled message but keep only its number in memory (memory is tight)."""
        self.append_paged(entry.seq, entry.delivery_count, len(entry.message.body))

    def put_back(self, entry: QueueEntry) -> None:
        entry.mark_ready()
        if self._returned is _NO_RETURNED:
            self._returned = []
        heapq.heappush(self._returned, (entry.seq, entry))
        self.count += 1
        size = len(entry.message.body)
        self._hold(size)
        self.bytes += size

    def remove(self, entry: QueueEntry) -> None:
        """Take a ready message out wherever it is (it stays in place as a skipped tombstone)."""
        if entry.state == READY:
            entry.mark_gone()
            self.count -= 1
            size = len(entry.message.body)
            self._release(size)
            self.bytes -= size

    def take_paged(self, seq: int) -> QueueEntry | None:
        """Take out the paged-out message `seq` from wherever it is, read back; None if it is
        not paged out here (delivered or read back already, or gone)."""
        taken = self._taken
        for run in self._runs:
            if not len(run):
                continue
            seqs = run.seqs
            if seq > seqs[-1]:
                continue
            i = bisect_left(seqs, seq, run.start)
            if seqs[i] != seq or seq in taken:
                return None
            size, delivery_count = run.sizes[i], run.delivery_counts[i]
            if i == run.start:
                # The run's first: advance past it (and past any taken before), so that expiring
                # in queue order, the usual case, leaves nothing behind.
                run.start += 1
                while taken and run.start < len(seqs) and seqs[run.start] in taken:
                    taken.discard(seqs[run.start])
                    run.start += 1
                if not len(run):
                    run.release()
            else:
                if taken is _NOTHING_TAKEN:
                    taken = self._taken = set()
                taken.add(seq)
            self.count -= 1
            self.bytes -= size
            entry = self.loader(seq, delivery_count) if self.loader else None
            if entry is not None:
                entry.mark_gone()
            return entry
        return None

    def pop(self) -> QueueEntry:
        """Remove and return the next message to deliver; IndexError when empty. It is still
        READY: the caller says what became of it (QueueEntry.delivered, mark_gone...)."""
        fifo = self._fifo
        if not self._returned and fifo and fifo[0].__class__ is QueueEntry and fifo[0].state == READY:
            # The usual case: nothing came back, the head is in memory (a QueueEntry, tested).
            entry: QueueEntry = fifo.popleft()  # type: ignore[assignment]
        else:
            entry = self._take_head()
        self.count -= 1
        size = len(entry.message.body)
        # _release(size), inline: this runs once per message.
        self.in_memory -= 1
        self.budget.release(size)
        self.bytes -= size
        return entry

    def _take_head(self) -> QueueEntry:
        returned = self._returned
        while returned:
            entry = heapq.heappop(returned)[1]
            if entry.state == READY:
                return entry
        fifo = self._fifo
        while True:
            head = fifo[0]  # IndexError when empty
            if isinstance(head, QueueEntry):
                fifo.popleft()
                if head.state == READY:
                    return head
                continue
            if not len(head):  # every message of the run was taken out (they expired)
                fifo.popleft()
                self._runs.popleft()
                continue
            loaded = self._load_from(head)
            if loaded is not None:
                return loaded

    def _load_from(self, run: PagedRun) -> QueueEntry | None:
        i = run.start
        run.start += 1
        if not len(run):
            self._fifo.popleft()
            self._runs.popleft()
        if self._taken and run.seqs[i] in self._taken:
            self._taken.discard(run.seqs[i])
            return None  # counted out when it was taken
        entry = self.loader(run.seqs[i], run.delivery_counts[i]) if self.loader else None
        if entry is None:  # unreadable: it is gone; keep the counts true
            self.count -= 1
            self.bytes -= run.sizes[i]
            return None
        # It counts as in memory from now on, and its size is what was read.
        size = len(entry.message.body)
        self._hold(size)
        self.bytes += size - run.sizes[i]
        return entry

    def in_memory_entries(self) -> list[QueueEntry]:
        """The ready messages held as objects (not paged out), in no particular order."""
        entries = [entry for _seq, entry in self._returned if entry.state == READY]
        entries.extend(item for item in self._fifo if isinstance(item, QueueEntry) and item.state == READY)
        return entries

    def peek(self, count: int) -> list[QueueEntry]:
        """The first `count` ready messages in delivery order, left where they are."""
        returned = heapq.nsmallest(count, (item for item in self._returned if item[1].state == READY))
        entries = [entry for _seq, entry in returned]
        for item in self._fifo:
            if len(entries) >= count:
                break
            if isinstance(item, QueueEntry):
                if item.state == READY:
                    entries.append(item)
                continue
            for i in range(item.start, len(item.seqs)):
                if len(entries) >= count:
                    break
                if item.seqs[i] in self._taken:
                    continue
                loaded = self.loader(item.seqs[i], item.delivery_counts[i]) if self.loader else None
                if loaded is not None:
                    entries.append(loaded)
        return entries

    def clear(self) -> int:
        """Remove every ready message; returns how many there were."""
        count = self.count
        for _seq, entry in self._returned:
            if entry.state == READY:
                entry.mark_gone()
                self._release(len(entry.message.body))
        for item in self._fifo:
            if isinstance(item, QueueEntry) and item.state == READY:
                item.mark_gone()
                self._release(len(item.message.body))
        self._returned = _NO_RETURNED
        self._fifo = _NO_MESSAGES
        self._runs = _NO_RUNS
        self._taken = _NOTHING_TAKEN
        self.count = 0
        self.bytes = 0
        return count

    def close(self) -> int:
        """The queue is deleted: remove every ready message (returns how many) and forget the
        loader, which refers back to the queue (no reference cycle outlives the queue)."""
        self.loader = None
        return self.clear()


# -- the ready list by priority -------------------------------------------------------------
#
# The ready messages of an x-max-priority queue: higher priority first, FIFO within a priority.
#
# One ReadyMessages per priority level in use, so everything ReadyMessages promises holds within
# a level: a requeued message goes back to its original position among the messages of its
# priority, a message can expire from the middle, and persistent messages of a durable queue
# page out to the journal and are read back near the head. As in RabbitMQ, a message without a
# priority has priority 0 and one above the queue's maximum counts as the maximum.
#
# Only queues declared with x-max-priority >= 1 use this store; every other queue keeps the plain
# ReadyMessages, so their path costs nothing more.


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


# A queue's ready list: PriorityReadyMessages for an x-max-priority queue, else ReadyMessages.
ReadyList = ReadyMessages | PriorityReadyMessages
