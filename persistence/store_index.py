"""The in-memory index of one segment of a QueueStore: where each message record is, and what
became of it (``SegmentEntry``), and ``locate``, which finds a message among the segments.

Kept compact on purpose: per message an 8-byte sequence number, a 4-byte
file offset and a 1-byte state, in arrays rather than Python objects, so a
million messages cost about 13 MB. Sequence numbers within a segment only
grow, so lookups are a direct hit for consecutive numbers and a binary
search otherwise.

The store keeps it up to date as it appends (persistence/queue_store.py); recovery rebuilds it
from the segment files (persistence/store_recovery.py).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from pathlib import Path

READY = 0  # in the queue, waiting for a consumer
DELIVERED = 1  # handed to a consumer, not yet settled
WAITING_RETRY = 2  # rejected, due back in the queue at a later time
SETTLED = 3  # acked, dropped, dead-lettered, expired or purged: gone for good


class SegmentEntry:
    """What the store knows about one segment file.

    ``live`` counts messages not yet settled. ``refs`` holds the ids of other
    (older) segments whose messages have state records in this one: this
    segment may only be deleted after those are gone, or recovery would
    forget what happened to their messages.
    """

    __slots__ = ("segment_id", "path", "header_length", "size", "seqs", "offsets", "states", "live", "refs")

    def __init__(self, segment_id: int, path: Path, header_length: int, size: int) -> None:
        self.segment_id = segment_id
        self.path = path
        self.header_length = header_length
        self.size = size  # bytes in the file (written to the OS), header included
        self.seqs = array("Q")
        self.offsets = array("I")
        self.states = bytearray()
        self.live = 0
        self.refs: set[int] = set()

    def add(self, seq: int, offset: int) -> None:
        self.seqs.append(seq)
        self.offsets.append(offset)
        self.states.append(READY)
        self.live += 1

    def index_of(self, seq: int) -> int | None:
        seqs = self.seqs
        if not seqs:
            return None
        i = seq - seqs[0]
        if 0 <= i < len(seqs) and seqs[i] == seq:
            return i
        i = bisect_left(seqs, seq)
        return i if i < len(seqs) and seqs[i] == seq else None

    @property
    def message_count(self) -> int:
        return len(self.seqs)

    def grew(self, written: int) -> None:
        """``written`` more bytes reached the file (a flush)."""
        self.size += written

    def settle(self, i: int) -> bool:
        """Mark message ``i`` settled; True when it was live before."""
        if self.states[i] == SETTLED:
            return False
        self.states[i] = SETTLED
        self.live -= 1
        return True


def locate(segments: Sequence[SegmentEntry], segment_ids: Sequence[int], seq: int) -> tuple[SegmentEntry, int] | None:
    """The segment holding message `seq` and its index there (segments sorted by id, which is
    each segment's first sequence number); None if no segment has it."""
    k = bisect_right(segment_ids, seq) - 1
    if k < 0:
        return None
    entry = segments[k]
    i = entry.index_of(seq)
    return None if i is None else (entry, i)
