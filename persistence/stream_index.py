"""What a stream knows about each of its segments, kept in memory and in a side file.

``SegmentIndex`` holds one segment's facts (first and next offset, first and
last timestamp, size, the first offset of its last chunk) and a *sparse*
position index: one (offset, timestamp, file position) entry every
``interval`` bytes (64 KiB by default), so a seek reads at most that much of a
segment before reaching its target. A 500 MB segment has about 7,600 entries
(180 KB).

``<segment id>.sidx`` is the same index on disk, written by the stream once
the bytes it covers are fsynced (see stream_log): at open, a segment whose
side file is valid is only scanned past the side file's ``covered_size``, so
opening a large stream reads its side files and at most the tail of its newest
segment. A side file that is missing, damaged or does not fit the segment is
ignored and the segment scanned whole. It is an optimisation only: a reader of
the stream files may ignore it (docs/stream-files.md section 5).

``scan_records`` walks a segment's records from a position, in chunks (never
the whole file in memory), checks each record's CRC and that offsets run on,
feeds them to the index and says where the trusted records end.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import NamedTuple

from persistence.record_format import LENGTH, MIN_RECORD_LENGTH, RECORD_HEAD
from persistence.segment_file import read_exactly as read_exactly  # also the stream readers' (spark)
from persistence.stream_segment import (
    FLAG_CHUNK_START,
    HEAD,
    RECORD_OVERHEAD,
    STREAM_RECORD,
    check_stream_format_version,
)

DEFAULT_INDEX_INTERVAL = 64 * 1024
NO_CHUNK = -1

INDEX_MAGIC = b"AMQPSIDX"
INDEX_VERSION = 1
# magic, version, reserved, entry_count, segment_id, covered_size, next_offset, record_count,
# first_timestamp, last_timestamp, last_chunk_offset (2**64-1: none)
_INDEX_HEAD = struct.Struct(">8sHHIQQQQQQQ")
_INDEX_CRC = struct.Struct(">I")
_NONE_U64 = (1 << 64) - 1
_BIG_ENDIAN = sys.byteorder == "big"


class StreamDamage(NamedTuple):
    """Bytes of a stream that could not be trusted: which file, where, the offset expected there
    (None when unknown), and why."""

    path: str
    position: int
    first_missing: int | None
    reason: str


class SegmentIndex:
    """One segment's facts and sparse position index; changed only through its methods."""

    __slots__ = (
        "segment_id",
        "path",
        "header_length",
        "created_at_ms",
        "interval",
        "size",
        "next_offset",
        "record_count",
        "first_timestamp",
        "last_timestamp",
        "last_chunk",
        "offsets",
        "timestamps",
        "positions",
        "indexed_size",
        "dropped",
        "_next_entry_at",
    )

    def __init__(
        self,
        segment_id: int,
        path: Path,
        header_length: int,
        created_at_ms: int,
        interval: int = DEFAULT_INDEX_INTERVAL,
    ) -> None:
        self.segment_id = segment_id  # the offset of its first record
        self.path = path
        self.header_length = header_length
        self.created_at_ms = created_at_ms
        self.interval = interval
        self.size = header_length  # bytes written to the OS
        self.next_offset = segment_id  # one past its last record
        self.record_count = 0
        self.first_timestamp = 0
        self.last_timestamp = 0
        self.last_chunk = NO_CHUNK  # the first offset of its last chunk
        self.offsets = array("Q")
        self.timestamps = array("Q")
        self.positions = array("Q")
        self.indexed_size = 0  # bytes its side file covers (0: none written)
        self.dropped = False  # removed by retention
        self._next_entry_at = 0

    def note(self, offset: int, timestamp_ms: int, position: int, chunk_start: bool) -> None:
        """A record at ``position`` (in the file or about to be): add it to the facts and maybe the index."""
        if position >= self._next_entry_at:
            self.offsets.append(offset)
            self.timestamps.append(timestamp_ms)
            self.positions.append(position)
            self._next_entry_at = position + self.interval
        if not self.record_count:
            self.first_timestamp = timestamp_ms
        self.record_count += 1
        self.next_offset = offset + 1
        self.last_timestamp = timestamp_ms
        if chunk_start:
            self.last_chunk = offset

    def grew(self, written: int) -> None:
        self.size += written

    def set_size(self, size: int) -> None:
        self.size = size

    def mark_indexed(self, covered_size: int) -> None:
        self.indexed_size = covered_size

    def mark_dropped(self) -> None:
        self.dropped = True

    def cut(self, position: int, next_offset: int, last_timestamp: int, last_chunk: int) -> None:
        """Forget the records from file position ``position`` on (the stream cut them off): the
        segment now ends there, one past offset ``next_offset - 1``, whose timestamp and chunk
        start (NO_CHUNK: none in this segment) the caller knows."""
        keep = bisect_left(self.positions, position)
        del self.offsets[keep:], self.timestamps[keep:], self.positions[keep:]
        self._next_entry_at = (self.positions[-1] + self.interval) if keep else 0
        self.size = position
        self.next_offset = next_offset
        self.record_count = max(0, min(self.record_count, next_offset - self.segment_id))
        if not self.record_count:
            self.first_timestamp = self.last_timestamp = 0
        else:
            self.last_timestamp = last_timestamp
        self.last_chunk = last_chunk
        if self.indexed_size > position:
            self.indexed_size = 0

    def seek(self, offset: int) -> tuple[int, int]:
        """(file position, offset of the record there) from which ``offset`` is at most one
        index interval away, going forward."""
        i = bisect_right(self.offsets, offset) - 1
        if i < 0:
            return self.header_length, self.segment_id
        return self.positions[i], self.offsets[i]

    def seek_time(self, timestamp_ms: int) -> tuple[int, int]:
        """(file position, offset) at or before the first record at or after ``timestamp_ms``."""
        i = bisect_left(self.timestamps, timestamp_ms) - 1
        if i < 0:
            return self.header_length, self.segment_id
        return self.positions[i], self.offsets[i]

    def restore(self, side: "SideIndex") -> None:
        """Take the facts and entries of a side file (into a fresh index)."""
        at = side.checkpoint
        self.offsets, self.timestamps, self.positions = side.offsets, side.timestamps, side.positions
        self.next_offset = at.next_offset
        self.record_count = at.record_count
        self.first_timestamp = at.first_timestamp
        self.last_timestamp = at.last_timestamp
        self.last_chunk = at.last_chunk
        self.size = self.indexed_size = at.covered_size
        self._next_entry_at = (side.positions[-1] + self.interval) if len(side.positions) else 0

    def entries_before(self, position: int) -> int:
        """How many index entries are for records before ``position``."""
        return bisect_left(self.positions, position)


# ---- the side file -------------------------------------------------------------------------


class IndexCheckpoint(NamedTuple):
    """What a side file records about the first ``covered_size`` bytes of a segment."""

    covered_size: int
    next_offset: int
    record_count: int
    first_timestamp: int
    last_timestamp: int
    last_chunk: int


def checkpoint_of(index: SegmentIndex) -> IndexCheckpoint:
    """The checkpoint of everything ``index`` holds, taken when its buffer is empty."""
    return IndexCheckpoint(
        index.size, index.next_offset, index.record_count, index.first_timestamp, index.last_timestamp, index.last_chunk
    )


def encode_side_index(index: SegmentIndex, at: IndexCheckpoint) -> bytes:
    n = index.entries_before(at.covered_size)
    entries = array("Q", bytes(24 * n))
    entries[0::3] = index.offsets[:n]
    entries[1::3] = index.timestamps[:n]
    entries[2::3] = index.positions[:n]
    if not _BIG_ENDIAN:
        entries.byteswap()
    head = _INDEX_HEAD.pack(
        INDEX_MAGIC,
        INDEX_VERSION,
        0,
        n,
        index.segment_id,
        at.covered_size,
        at.next_offset,
        at.record_count,
        at.first_timestamp,
        at.last_timestamp,
        _NONE_U64 if at.last_chunk == NO_CHUNK else at.last_chunk,
    )
    body = head + entries.tobytes()
    return body + _INDEX_CRC.pack(zlib.crc32(body))


class SideIndex(NamedTuple):
    """A side file's contents."""

    checkpoint: IndexCheckpoint
    offsets: "array[int]"
    timestamps: "array[int]"
    positions: "array[int]"


def read_side_index(path: Path, segment_id: int, header_length: int, segment_size: int) -> SideIndex | None:
    """The side file at ``path``, or None when it is missing, damaged, or does not fit the segment
    ``segment_id`` of ``segment_size`` bytes. Raises ``UnsupportedStreamFormatVersion`` for a
    version it does not read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _INDEX_HEAD.size + _INDEX_CRC.size or data[:8] != INDEX_MAGIC:
        return None
    (crc,) = _INDEX_CRC.unpack_from(data, len(data) - 4)
    if zlib.crc32(memoryview(data)[:-4]) != crc:
        return None
    _, version, _, n, sid, covered, next_offset, count, first_ts, last_ts, last_chunk = _INDEX_HEAD.unpack_from(data, 0)
    check_stream_format_version(str(path), version)
    if (
        sid != segment_id
        or not header_length <= covered <= segment_size
        or len(data) != _INDEX_HEAD.size + 24 * n + 4
        or next_offset < segment_id
    ):
        return None
    entries = array("Q")
    entries.frombytes(data[_INDEX_HEAD.size : _INDEX_HEAD.size + 24 * n])
    if not _BIG_ENDIAN:
        entries.byteswap()
    chunk = NO_CHUNK if last_chunk == _NONE_U64 else last_chunk
    at = IndexCheckpoint(covered, next_offset, count, first_ts, last_ts, chunk)
    return SideIndex(at, entries[0::3], entries[1::3], entries[2::3])


# ---- scanning a segment ----------------------------------------------------------------------


class ScanOutcome(NamedTuple):
    good_end: int  # the position just past the last trusted record
    stop: StreamDamage | None  # where and why the walk stopped before the end of the file
    skipped: list[StreamDamage]  # damaged records or holes stepped over (the walk went on)


class _Window:
    """Reads of one file by chunks: ``get(pos, need)`` gives (bytes, index) with ``need`` bytes from
    ``pos`` in the bytes, or fewer when the file (``limit``) ends first."""

    __slots__ = ("fd", "limit", "read_size", "buf", "at")

    def __init__(self, fd: int, limit: int, read_size: int) -> None:
        self.fd = fd
        self.limit = limit
        self.read_size = read_size
        self.buf = b""
        self.at = 0

    def get(self, pos: int, need: int) -> tuple[bytes, int]:
        i = pos - self.at
        if 0 <= i and i + need <= len(self.buf):
            return self.buf, i
        want = min(max(self.read_size, need), self.limit - pos)
        self.buf = read_exactly(self.fd, want, pos)
        self.at = pos
        return self.buf, 0


def scan_records(
    fd: int, path: Path, index: SegmentIndex, start: int, file_size: int, read_size: int = 1 << 20
) -> ScanOutcome:
    """Walk the records of the segment ``fd`` from ``start`` to ``file_size`` into ``index``.

    A record is trusted when its length fits the file and its CRC matches. A damaged record whose
    length leads to a trusted record is skipped and reported (``skipped``); otherwise the walk
    stops there (``stop``: a torn or zero-filled tail, or a damaged last record). Offsets must run
    on from ``index.next_offset``: a jump forward is reported as a hole, a step back stops the walk.
    """
    window = _Window(fd, file_size, read_size)
    skipped: list[StreamDamage] = []
    where = str(path)
    expected: int | None = index.next_offset
    pos = start
    crc32 = zlib.crc32
    while pos < file_size:
        problem = _frame_problem(window, pos, file_size)
        if problem is not None:
            return ScanOutcome(pos, StreamDamage(where, pos, expected, problem), skipped)
        buf, i = window.get(pos, RECORD_HEAD.size)
        length, crc, rtype = RECORD_HEAD.unpack_from(buf, i)
        total = 4 + length
        buf, i = window.get(pos, total)
        after = pos + total
        if crc32(memoryview(buf)[i + 8 : i + total]) != crc:
            if after < file_size and _valid_at(window, after, file_size):
                skipped.append(StreamDamage(where, pos, expected, "CRC mismatch (record skipped)"))
                expected = None
                pos = after
                continue
            return ScanOutcome(pos, StreamDamage(where, pos, expected, "CRC mismatch"), skipped)
        if rtype != STREAM_RECORD:
            pos = after  # a record type added later: skipped (docs/stream-files.md section 3)
            continue
        if total < RECORD_OVERHEAD:
            skipped.append(StreamDamage(where, pos, expected, "record too short for its type (skipped)"))
            expected = None
            pos = after
            continue
        _, _, _, offset, timestamp, flags, _ = HEAD.unpack_from(buf, i)
        if expected is not None and offset != expected:
            if offset < expected:
                return ScanOutcome(pos, StreamDamage(where, pos, expected, f"offset {offset} goes back"), skipped)
            skipped.append(StreamDamage(where, pos, expected, f"offsets {expected}..{offset - 1} missing"))
        elif expected is None and offset < index.next_offset:
            return ScanOutcome(pos, StreamDamage(where, pos, index.next_offset, f"offset {offset} goes back"), skipped)
        # Timestamps never decrease in a stream (the writer clamps them); keep it so for the index.
        index.note(offset, max(timestamp, index.last_timestamp), pos, bool(flags & FLAG_CHUNK_START))
        expected = offset + 1
        pos = after
    return ScanOutcome(pos, None, skipped)


def _frame_problem(window: _Window, pos: int, file_size: int) -> str | None:
    left = file_size - pos
    if left < RECORD_HEAD.size:
        buf, i = window.get(pos, left)
        return "zero-filled tail" if not any(buf[i : i + left]) else "torn record (partial header)"
    buf, i = window.get(pos, RECORD_HEAD.size)
    (length,) = LENGTH.unpack_from(buf, i)
    if length == 0 or length < MIN_RECORD_LENGTH:
        rest = read_exactly(window.fd, left, pos)
        if length == 0 and not any(rest):
            return "zero-filled tail"
        return "zero length field" if length == 0 else f"invalid record length {length}"
    if pos + 4 + length > file_size:
        return f"torn record (length {length} runs {pos + 4 + length - file_size} bytes past the end of the file)"
    return None


def _valid_at(window: _Window, pos: int, file_size: int) -> bool:
    """True when a whole record with a matching CRC starts at ``pos``."""
    if file_size - pos < RECORD_HEAD.size:
        return False
    buf, i = window.get(pos, RECORD_HEAD.size)
    crc: int  # (struct's fields are Any to mypy)
    length, crc, _ = RECORD_HEAD.unpack_from(buf, i)
    if length < MIN_RECORD_LENGTH or pos + 4 + length > file_size:
        return False
    buf, i = window.get(pos, 4 + length)
    return zlib.crc32(memoryview(buf)[i + 8 : i + 4 + length]) == crc

