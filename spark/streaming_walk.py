"""Walking segment files on the driver, to find where records start: for a streaming batch's end.

A streaming batch ends at a record boundary that its offsets name exactly (segment, position,
``seq``), so that every attempt at the batch reads the same records. Queue segments have no
index, and the newest part of a stream segment is not in its side index, so the driver walks
the bytes from a known boundary, in windows of ``WINDOW`` bytes (a segment can be 500 MB):

* ``walk_queue``: the message records of a queue segment from ``start`` on, by the trusted-record
  rules of docs/queue-files.md section 4 (length and CRC checked). In the newest segment the
  bytes after the last whole record are a write in progress and end the walk; anything else
  that is not a trusted record is damage (``QueueDamage``), which the caller reports or skips.
* ``walk_stream``: the records of a stream segment from a boundary whose offset is known, up to
  a given offset or timestamp (committed bytes: lengths and offsets are checked, the CRCs are
  the executors' job, which they do for every record they return).
"""

from __future__ import annotations

import os
import zlib
from typing import NamedTuple

from persistence.record_format import LENGTH_AND_CRC, MIN_RECORD_LENGTH, RECORD_HEAD, RecordType
from persistence.segment_file import decode_header as decode_queue_header
from persistence.stream_cursor import CorruptStreamRecord
from persistence.stream_index import read_exactly

WINDOW = 4 * 1024 * 1024
_HEAD = LENGTH_AND_CRC.unpack_from
_U64 = ">Q"
_MESSAGE = int(RecordType.MESSAGE)
_SEQ_AT = RECORD_HEAD.size  # a message record's seq follows the type byte
_STREAM_OFFSET_AT = 9
_STREAM_TIMESTAMP_AT = 17


class QueueDamage(NamedTuple):
    """Bytes of a queue segment that are not a trusted record."""

    position: int
    reason: str
    resumes_at: int | None  # where the next trusted record starts (one damaged record); None: nowhere


class QueueWalk(NamedTuple):
    """What ``walk_queue`` found."""

    found: int  # message records with seq >= min_seq
    last_seq: int | None  # the seq of the last of them
    end: int  # file position just past the last of them (the walk's start when there is none)
    walked_to: int  # where the walk stopped: ``limit`` when it read every record before it
    boundaries: list[tuple[int, int]]  # (position, seq) of counted messages about every ``split`` bytes
    damage: QueueDamage | None  # what stopped the walk, when it was damage
    header_length: int


def walk_queue(path: str, start: int, limit: int, *, min_seq: int, max_count: int | None, tail: bool,
               split: int) -> QueueWalk | None:
    """Walk the queue segment ``path`` from file position ``start`` (0: its first record) up to
    ``limit`` bytes, counting message records with ``seq >= min_seq`` (and above every seq before
    them: out-of-order records are ignored, as by recovery); stop after ``max_count`` of them (None:
    no limit). ``tail``: the broker may be writing the segment, so an incomplete record at the end
    is not damage. None when the file is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        header = decode_queue_header(path, read_exactly(fd, 64, 0))
        pos = max(start, header.header_length)
        count, last_seq, end = 0, None, pos
        boundaries: list[tuple[int, int]] = []
        next_split = pos
        damage: QueueDamage | None = None
        window_at, data = pos, b""
        while pos < limit:
            rel = pos - window_at
            available = len(data) - rel
            record_bytes = 4 + int.from_bytes(data[rel : rel + 4], "big") if available >= 4 else RECORD_HEAD.size
            if available < max(record_bytes, RECORD_HEAD.size) and window_at + len(data) < limit:
                wanted = min(max(WINDOW, record_bytes), limit - pos)
                window_at, data, rel = pos, read_exactly(fd, wanted, pos), 0
                available = len(data)
                if available < wanted:
                    limit = pos + available  # the file is shorter than measured (cut back or truncated)
            if available < RECORD_HEAD.size:
                if not tail:
                    damage = QueueDamage(pos, "torn record (partial header)", None)
                break
            length, crc = _HEAD(data, rel)
            record_end = pos + 4 + length
            if length < MIN_RECORD_LENGTH:
                damage = QueueDamage(pos, f"invalid record length {length}", None)
                break
            if record_end > limit:
                if not tail:
                    damage = QueueDamage(pos, f"torn record (length {length} runs past the end of the file)", None)
                break
            if zlib.crc32(memoryview(data)[rel + 8 : rel + 4 + length]) != crc:
                damage = QueueDamage(pos, "CRC mismatch", record_end)
                break
            if data[rel + 8] == _MESSAGE and length >= 5 + 16:
                seq = int.from_bytes(data[rel + _SEQ_AT : rel + _SEQ_AT + 8], "big")
                if seq >= min_seq and (last_seq is None or seq > last_seq):
                    if pos >= next_split:
                        boundaries.append((pos, seq))
                        next_split = pos + split
                    count += 1
                    last_seq, end = seq, record_end
                    if max_count is not None and count >= max_count:
                        pos = record_end
                        break
            pos = record_end
        return QueueWalk(count, last_seq, end, pos, boundaries, damage, header.header_length)
    finally:
        os.close(fd)


def walk_stream(path: str, start: int, start_offset: int, limit: int, *, to_offset: int | None = None,
                min_timestamp_ms: int | None = None, min_position: int | None = None) -> tuple[int, int]:
    """From the record boundary ``start`` (0: the first record), whose record has offset
    ``start_offset``, walk the stream segment ``path`` (its committed bytes end at ``limit``) to
    the record with offset ``to_offset``, or to the first record with a timestamp at or after
    ``min_timestamp_ms``, or to the first record at or after file position ``min_position``: its
    (position, offset), or (``limit``, the offset after the last record)
    when there is none before ``limit``. Offsets that do not run on one by one, or a record that
    does not fit, raise ``CorruptStreamRecord``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        from persistence.stream_segment import HEADER_SIZE

        pos = start or HEADER_SIZE
        expected = start_offset
        window_at, data = pos, b""
        while pos < limit:
            if (to_offset is not None and expected >= to_offset) or (min_position is not None and pos >= min_position):
                return pos, expected
            rel = pos - window_at
            if len(data) - rel < 25:
                window_at, data = pos, read_exactly(fd, min(max(WINDOW, 25), limit - pos), pos)
                rel = 0
                if len(data) < 25:
                    raise CorruptStreamRecord(path, pos, expected, "the committed bytes end inside a record")
            length = int.from_bytes(data[rel : rel + 4], "big")
            offset = int.from_bytes(data[rel + _STREAM_OFFSET_AT : rel + _STREAM_OFFSET_AT + 8], "big")
            if length < MIN_RECORD_LENGTH or pos + 4 + length > limit:
                raise CorruptStreamRecord(path, pos, expected, f"invalid record length {length}")
            if offset != expected:
                raise CorruptStreamRecord(path, pos, expected, f"offset {offset} where {expected} was expected")
            if min_timestamp_ms is not None:
                timestamp = int.from_bytes(data[rel + _STREAM_TIMESTAMP_AT : rel + _STREAM_TIMESTAMP_AT + 8], "big")
                if timestamp >= min_timestamp_ms:
                    return pos, offset
            pos += 4 + length
            expected += 1
        return limit, expected
    finally:
        os.close(fd)


def stream_boundaries(path: str, start: int, start_offset: int, limit: int, every: int) -> list[tuple[int, int]]:
    """(position, offset) of records of the stream segment ``path`` about every ``every`` bytes
    from the boundary ``start`` (offset ``start_offset``) up to ``limit`` (committed bytes):
    where a batch can be cut where the side index has no entries (the newest part of the newest
    segment). Lengths and offsets are checked; ``CorruptStreamRecord`` when they do not fit."""
    found: list[tuple[int, int]] = []
    position, offset = start, start_offset
    while True:
        position, offset = walk_stream(path, position, offset, limit, to_offset=None, min_position=position + every)
        if position >= limit:
            return found
        found.append((position, offset))
