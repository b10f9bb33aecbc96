"""Blocks of a stream's committed records, read and checked once, shared by the cursors reading them.

A *block* is the records of one segment from one entry of its sparse position index
(stream_index: an entry at least every 64 KiB of file) to the next, or to the end of a sealed
segment. Every cursor cuts a segment into the same blocks wherever it started, so cursors
reading the same history meet in the same blocks. A cursor without a filter reads committed
history a block at a time (``StreamCursor.read_run``): the block it is in, else the block from
the stream's ``BlockCache``, else one read from the file with one ``pread`` and checked (each
record's CRC, the offsets running on from the index entry's). A block a cursor read is put in
the cache while the stream has more than one cursor without a filter, so ten consumers
reading the same stream read and check each record once, and hold one copy of it, not ten.

The cache is small and bounded (``BLOCK_CACHE_BYTES`` of records per stream, least recently
used first out), so the history is never pulled into memory: readers that drift further apart
than the cache each read their blocks from the files, as a single reader does. A block with
anything a careful read must report (a damaged record, a record of another type, offsets that
do not run on) is not made: its cursor reads it the careful way, which reports the damage.

A block's reader may keep what it derived from the records with it (``keep_derived``: the
stream queue keeps the messages it makes of them), so the readers sharing the block share that
too. This module does not look at it.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple

from persistence.stream_segment import HEAD, STREAM_RECORD, MalformedStreamRecord, envelope_end

BLOCK_CACHE_BYTES = 2 * 1024 * 1024  # records of one stream's blocks kept for other cursors, at most
_ENVELOPE_AT = HEAD.size + 4  # after the HEAD and head_crc (plus the filter value)
# HEAD without the timestamp and flags, which a block does not keep: length, crc, type, offset, filter_len.
_HEAD_FIELDS = struct.Struct(">IIBQ9xB")
_U32 = struct.Struct(">I")

MessageTriple = tuple[int, bytes, bytes]  # offset, envelope (stream_segment.envelope_end), body


class RecordBlock:
    """The checked records of one block: ``records[k]`` is ``(offset, envelope, body)``, the
    offsets run on from ``first_offset``, and record ``k`` ends ``ends[k]`` bytes after the
    block's start, file position ``start`` (where the first begins)."""

    __slots__ = ("segment_id", "start", "first_offset", "records", "ends", "derived")

    def __init__(self, segment_id: int, start: int, first_offset: int, records: list[MessageTriple], ends: list[int]) -> None:
        self.segment_id = segment_id
        self.start = start
        self.first_offset = first_offset
        self.records = records
        self.ends = ends
        self.derived: Any = None  # what a reader made of the records (keep_derived)

    @property
    def end(self) -> int:
        """The file position after its last record."""
        return self.start + self.ends[-1]

    @property
    def size(self) -> int:
        return self.ends[-1]

    def keep_derived(self, value: Any) -> None:
        """Keep ``value``, made from ``records``, for the other readers of this block."""
        self.derived = value


class RecordRun(NamedTuple):
    """What ``StreamCursor.read_run`` read: ``records[start:stop]``, each ``(offset, envelope,
    body)``. ``block`` is the RecordBlock they are in (``records`` is then the whole block's,
    shared with other cursors: do not change it), or None when they were read one by one."""

    block: RecordBlock | None
    records: list[MessageTriple]
    start: int
    stop: int


def parse_block(
    segment_id: int, start: int, data: bytes, first_offset: int, envelope: bytes | None
) -> RecordBlock | None:
    """The block of the records that fill ``data`` exactly (read from file position ``start``),
    the first with offset ``first_offset``; None unless every one is a stream record with a
    matching CRC and the offsets run on. ``envelope`` is the reader's last one: records with an
    equal envelope get that very object (so do runs of equal envelopes within the block)."""
    unpack = _HEAD_FIELDS.unpack_from
    u32 = _U32.unpack_from
    crc32 = zlib.crc32
    view = memoryview(data)
    records: list[MessageTriple] = []
    ends: list[int] = []
    append = records.append
    append_end = ends.append
    elen = 0 if envelope is None else len(envelope)
    expect = first_offset
    size = len(data)
    i = 0
    # Per record, the checks a careful read makes that can fail for a record whose CRC matches
    # (a record cut by the end of the data, or too short for its fields, fails the CRC or the
    # body's bounds, and the data must end with a record).
    try:
        while i < size:
            length, crc, rtype, offset, n_filter = unpack(data, i)
            stop = i + length + 4
            if crc32(view[i + 8 : stop]) != crc or rtype != STREAM_RECORD or offset != expect:
                return None
            h = i + _ENVELOPE_AT + n_filter
            if data[h : h + elen] != envelope:
                e = envelope_end(data, h, stop)
                envelope = data[h:e]
                elen = e - h
            h += elen
            n = u32(data, h)[0]
            h += 4
            if h + n > stop:
                return None
            append((offset, envelope, data[h : h + n]))
            append_end(stop)
            expect = offset + 1
            i = stop
    except (MalformedStreamRecord, struct.error):
        return None
    finally:
        view.release()
    if i != size or not records:
        return None
    return RecordBlock(segment_id, start, first_offset, records, ends)


class BlockCache:
    """A stream's blocks kept for the cursors behind the one that read them, by (segment id,
    start), at most ``max_bytes`` of records."""

    def __init__(self, max_bytes: int = BLOCK_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._blocks: dict[tuple[int, int], RecordBlock] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def bytes(self) -> int:
        """Bytes of the records held (as in the files)."""
        return self._bytes

    def get(self, segment_id: int, start: int) -> RecordBlock | None:
        block = self._blocks.pop((segment_id, start), None)
        if block is not None:
            self._blocks[(segment_id, start)] = block  # (the most recently used is last)
        return block

    def keep(self, block: RecordBlock) -> None:
        """Hold ``block`` (unless it alone is larger than the cache), the least recently used
        blocks leaving to make room. (Least recently used, not the first in the stream: readers
        come in groups, and a block the group behind reads again must stay for that group.)"""
        size = block.size
        key = (block.segment_id, block.start)
        if size > self.max_bytes or key in self._blocks:
            return
        blocks = self._blocks
        blocks[key] = block
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._bytes -= blocks.pop(next(iter(blocks))).size

    def drop_before(self, segment_id: int, position: int) -> None:
        """No cursor will read the blocks that end at or before ``position`` of ``segment_id`` (or
        in an earlier segment): they go."""
        blocks = self._blocks
        for key in [key for key, block in blocks.items() if (block.segment_id, block.end) <= (segment_id, position)]:
            self._bytes -= blocks.pop(key).size

    def drop_segment(self, segment_id: int) -> None:
        """Retention removed the segment: its blocks go."""
        for key in [key for key in self._blocks if key[0] == segment_id]:
            self._bytes -= self._blocks.pop(key).size

    def clear(self) -> None:
        self._blocks.clear()
        self._bytes = 0
