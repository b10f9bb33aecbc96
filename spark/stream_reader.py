"""Read one partition of a stream (a byte range of one segment) into Arrow record batches.

Plain Python, pyarrow and numpy, like ``partition_reader`` for queue segments.
The range was planned by ``stream_snapshot``: it starts and ends at record
boundaries of the committed part of the segment, so every byte in it belongs to
a whole, committed record. The range is read with one ``pread``; the records
are walked by recovery's rules (``segment_file.trusted_record_offsets``, a tight loop that checks
each length and CRC), once per Python worker (the positions found are kept, up to 64 MiB of
them, since committed bytes never change); offsets, timestamps and filter value lengths are
then read for all records at once with numpy, and the message columns are decoded by
``columnar.decode_columns``, the decoder of queue records (a stream record's message fields are
a queue message record's, after its offset, timestamp and filter value: docs/stream-files.md
section 3.2).

Damage fails the read with ``CorruptStreamRecord`` naming the file, the byte
position and the offset expected there: a record that does not fit the range,
a CRC mismatch, a stream record too short for its fields, or offsets that do
not run on one by one. A segment deleted since planning (retention) gives no
rows: the stream starts later now.

Streams have no state records: every stream row's ``state`` is ``in_stream``
(``STREAM_STATE``), ``state_event`` ``published``, ``delivery_count`` 0,
``redelivered`` false and ``state_at`` its timestamp, as for a queue message
nothing happened to yet. ``queue_type`` is ``stream``.
"""

from __future__ import annotations

import bisect
import os
from collections import OrderedDict
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from persistence.record_format import MESSAGE_FIELDS_AT
from persistence.segment_file import Damage, trusted_record_offsets
from persistence.segment_reader import file_identity
from persistence.stream_cursor import CorruptStreamRecord
from persistence.stream_index import read_exactly
from persistence.stream_segment import (
    FILTER_AT,
    HEADER_SIZE,
    RECORD_OVERHEAD,
    STREAM_RECORD,
    CorruptStreamHeader,
    decode_header,
)
from spark.columnar import decode_columns, record_batch
from spark.data_loss import LossPolicy
from spark.message_states import STREAM_STATE
from spark.partition_reader import ScanRequest
from spark.schema import arrow_schema
from spark.segment_index import be_uint
from spark.stream_snapshot import SegmentCopy, StreamPart, read_stream_meta

STREAM_QUEUE_TYPE = "stream"
_CACHE_BYTES = 64 * 1024 * 1024  # record positions, 8 bytes a record
_CACHE: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
_TS = pa.timestamp("us", tz="UTC")
# Where a stream record's message fields start, less MESSAGE_FIELDS_AT: the "payload start" the
# queue record decoder expects (it finds the exchange's length MESSAGE_FIELDS_AT bytes after it).
_FIELDS_AT = FILTER_AT + 4 - MESSAGE_FIELDS_AT  # plus the filter value's length
_CONSTANT = {
    "queue_type": STREAM_QUEUE_TYPE, "state": STREAM_STATE, "state_event": "published", "delivery_count": 0,
    "redelivered": False, "archived": False, "delayed_exchange": None, "reason": None, "due_at": None,
}


class ReadStats:
    """What this process's stream reads cost: segment files opened and bytes read from them
    (tests use it to prove that pushdown skips segments and seeks inside them)."""

    __slots__ = ("segments_opened", "bytes_read", "partitions")

    def __init__(self) -> None:
        self.segments_opened = 0
        self.bytes_read = 0
        self.partitions = 0

    def opened(self, nbytes: int) -> None:
        self.segments_opened += 1
        self.bytes_read += nbytes

    def read(self, nbytes: int) -> None:
        self.bytes_read += nbytes

    def partition(self) -> None:
        self.partitions += 1

    def reset(self) -> None:
        self.segments_opened = self.bytes_read = self.partitions = 0


STATS = ReadStats()


def read_stream_partition(part: StreamPart, request: ScanRequest,
                          policy: LossPolicy | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of ``part`` that pass the request's offset and time filters, as record batches of
    at most ``request.batch_rows`` rows.

    ``policy`` is the streaming source's ``failOnDataLoss``: without one (a batch query) a segment
    gone since planning gives no rows and damage raises ``CorruptStreamRecord``; with one, a
    segment gone is ``policy.lost`` and damage ``policy.damaged`` (skipped and counted when it
    does not fail)."""
    STATS.partition()
    try:
        loaded = _load(part)
    except CorruptStreamRecord as err:
        if policy is None or policy.fail:
            raise
        policy.damaged(err, None if part.end_offset is None else part.end_offset - part.start_offset)
        return
    if loaded is None:
        if policy is not None:
            known = "" if part.end_offset is None else f"..{part.end_offset - 1}"
            policy.lost(f"the segment {part.path} of stream {part.stream!r} (vhost {part.vhost!r}) holding offsets "
                        f"{part.start_offset}{known} is gone", None if part.end_offset is None
                        else part.end_offset - part.start_offset)
        return
    part, data, base = loaded
    if policy is None or policy.fail:
        positions = _positions(data, base, part)
    else:
        positions = _positions_skipping_damage(data, base, part, policy)
    if not len(positions) and (policy is None or policy.fail):
        return
    d = np.frombuffer(data, np.uint8)
    lengths = be_uint(d, positions, 4)
    ends = positions + 4 + lengths
    types = d[positions + 8]
    if not (types == STREAM_RECORD).all():  # a record type added later in format 1: skipped
        keep = types == STREAM_RECORD
        positions, ends = positions[keep], ends[keep]
    offsets = be_uint(d, positions + 9, 8)
    timestamps = be_uint(d, positions + 17, 8)
    n_filter = be_uint(d, positions + 26, 1)
    if policy is None or policy.fail:
        _check(part, base, positions, ends, offsets, n_filter)
    else:
        positions, ends, offsets, timestamps, n_filter = _drop_unreadable(part, base, positions, ends, offsets,
                                                                          timestamps, n_filter, policy)
    keep_rows = _row_filter(offsets, timestamps, request)
    rows = np.flatnonzero(keep_rows) if keep_rows is not None else np.arange(len(offsets))
    starts = positions + _FIELDS_AT + n_filter
    for first in range(0, len(rows), request.batch_rows):
        chosen = rows[first : first + request.batch_rows]
        yield _batch(part, request, data, starts[chosen], ends[chosen], offsets[chosen], timestamps[chosen])


def _load(part: StreamPart) -> tuple[StreamPart, bytes, int] | None:
    """(the part as read: the copy it was read from, the bytes of the range, the file position of
    its first byte); None if the file is gone, from every copy of a replicated stream's."""
    damage: CorruptStreamRecord | None = None
    for copy in part.copies():
        try:
            loaded = _load_copy(part, copy)
        except CorruptStreamRecord as err:  # (a copy cut short, say by a power cut): another may be whole
            damage = damage or err
            continue
        if loaded is not None:
            chosen = part._replace(path=copy.path, identity=copy.identity,
                                   stream_created_at_ms=copy.stream_created_at_ms, alternatives=())
            return (chosen, *loaded)
    if damage is not None:
        raise damage
    return None


def _load_copy(part: StreamPart, copy: SegmentCopy) -> tuple[bytes, int] | None:
    try:
        fd = os.open(copy.path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if file_identity(os.fstat(fd)) != copy.identity or not _same_stream(copy):
            return None  # not the file planned: the stream was deleted (and maybe declared again)
        # The header first, for every range: a version this code does not read is refused before
        # anything else in the file is interpreted (UnsupportedStreamFormatVersion).
        head = read_exactly(fd, HEADER_SIZE, 0)
        STATS.opened(len(head))
        try:
            header = decode_header(copy.path, head)
        except CorruptStreamHeader as err:
            raise CorruptStreamRecord(copy.path, 0, part.start_offset, f"unreadable segment header: {err}") from None
        start = part.start or header.header_length
        data = read_exactly(fd, max(part.end - start, 0), start)
        STATS.read(len(data))
    finally:
        os.close(fd)
    if start + len(data) < part.end:
        raise CorruptStreamRecord(copy.path, start + len(data), None,
                                  f"the file ends before the committed end at byte {part.end}")
    return data, start


def _same_stream(copy: SegmentCopy) -> bool:
    meta = read_stream_meta(Path(copy.path).parent)
    return meta is not None and meta.created_at_ms == copy.stream_created_at_ms


def _positions(data: bytes, base: int, part: StreamPart) -> np.ndarray:
    """The records' positions in the range, walked once per process: committed bytes never change,
    and a file that is not the one planned is never read (``_load``)."""
    key = (part.path, part.identity, part.stream_created_at_ms, part.start, part.end)
    positions = _CACHE.get(key)
    if positions is not None:
        _CACHE.move_to_end(key)
        return positions
    positions = _walk(data, base, part)
    _CACHE[key] = positions
    total = sum(p.nbytes for p in _CACHE.values())
    while total > _CACHE_BYTES and len(_CACHE) > 1:
        _, dropped = _CACHE.popitem(last=False)
        total -= dropped.nbytes
    return positions


def clear_cache() -> None:
    """Forget the record positions walked so far (benchmarks measure cold reads with it)."""
    _CACHE.clear()


def _walk(data: bytes, base: int, part: StreamPart) -> np.ndarray:
    """The position in ``data`` of every record, each checked whole and by its CRC."""
    damage: list[Damage] = []
    positions = trusted_record_offsets(data, 0, damage)
    if damage:
        raise _damage(part, base, damage[0], positions, data)
    return np.array(positions, np.int64)


def _positions_skipping_damage(data: bytes, base: int, part: StreamPart, policy: LossPolicy) -> np.ndarray:
    """The positions of the records of the range that pass their checks (``failOnDataLoss=false``),
    by recovery's rules: a record whose CRC fails, with a good record right after it, is skipped;
    bytes that are not a record end the range (nothing tells where the next record starts). Each
    is logged; the offsets they cost are counted by ``_drop_unreadable``."""
    damage: list[Damage] = []
    positions = trusted_record_offsets(data, 0, damage)
    for bad in damage:
        policy.damaged(_damage(part, base, bad, positions, data))
    return np.array(positions, np.int64)


def _drop_unreadable(part: StreamPart, base: int, positions: np.ndarray, ends: np.ndarray, offsets: np.ndarray,
                     timestamps: np.ndarray, n_filter: np.ndarray, policy: LossPolicy) -> tuple[np.ndarray, ...]:
    """``failOnDataLoss=false``: leave out records too short for their fields and offsets that do
    not increase (damage), and count the offsets of the range that are missing."""
    short = ends - positions < RECORD_OVERHEAD + n_filter
    increasing = offsets > np.maximum.accumulate(np.concatenate(([part.start_offset - 1], offsets[:-1])))
    keep = ~short & increasing & (offsets >= part.start_offset)
    if part.end_offset is not None:
        keep &= offsets < part.end_offset
    if not keep.all():
        i = int(np.argmax(~keep))
        policy.damaged(CorruptStreamRecord(part.path, base + int(positions[i]), int(offsets[i]),
                                           "a stream record too short for its fields, or out of order"))
    kept = offsets[keep]
    if part.end_offset is not None and len(kept) < part.end_offset - part.start_offset:
        missing = part.end_offset - part.start_offset - len(kept)
        policy.lost(f"offsets missing from the range {part.start_offset}..{part.end_offset - 1} of {part.path}",
                    missing)
    return positions[keep], ends[keep], kept, timestamps[keep], n_filter[keep]


def _damage(part: StreamPart, base: int, bad: Damage, positions: list[int], data: bytes) -> CorruptStreamRecord:
    """``bad`` as the error that names the file, the byte and the offset expected there."""
    before = bisect.bisect_left(positions, bad.offset)
    expected = part.start_offset
    if before:
        expected = int.from_bytes(data[positions[before - 1] + 9 : positions[before - 1] + 17], "big") + 1
    if bad.offset + bad.length < len(data):
        reason = "CRC mismatch"  # one record, a good one after it (skipped with failOnDataLoss=false)
    else:
        reason = f"{bad.reason} (no record can be found after it: the rest of the range is unread)"
    return CorruptStreamRecord(part.path, base + bad.offset, expected, reason)


def _check(part: StreamPart, base: int, positions: np.ndarray, ends: np.ndarray, offsets: np.ndarray,
           n_filter: np.ndarray) -> None:
    """Every stream record has room for its fields, and the offsets run on one by one from the
    range's first offset to its end offset (when known)."""
    short = ends - positions < RECORD_OVERHEAD + n_filter
    if short.any():
        i = int(np.argmax(short))
        raise CorruptStreamRecord(part.path, base + int(positions[i]), int(offsets[i]),
                                  "stream record too short for its fields")
    expected = part.start_offset + np.arange(len(offsets))
    wrong = offsets != expected
    if wrong.any():
        i = int(np.argmax(wrong))
        got, want = int(offsets[i]), int(expected[i])
        reason = f"offsets {want}..{got - 1} missing" if got > want else f"offset {got} where {want} was expected"
        raise CorruptStreamRecord(part.path, base + int(positions[i]), want, reason)
    end_offset = part.start_offset + len(offsets)
    if part.end_offset is not None and end_offset != part.end_offset:
        reason = (f"offsets {end_offset}..{part.end_offset - 1} missing" if part.end_offset > end_offset
                  else f"records up to offset {end_offset - 1} where the index says {part.end_offset - 1}")
        raise CorruptStreamRecord(part.path, part.end, end_offset, reason)


def _row_filter(offsets: np.ndarray, timestamps: np.ndarray, request: ScanRequest) -> np.ndarray | None:
    keep = None

    def narrow(mask: np.ndarray) -> None:
        nonlocal keep
        keep = mask if keep is None else keep & mask

    if request.seq_min is not None:
        narrow(offsets >= request.seq_min)
    if request.seq_max is not None:
        narrow(offsets <= request.seq_max)
    if request.seq_values is not None:
        narrow(np.isin(offsets, np.array(request.seq_values, np.int64)))
    if request.published_min_us is not None:
        narrow(timestamps * 1000 >= request.published_min_us)
    if request.published_max_us is not None:
        narrow(timestamps * 1000 <= request.published_max_us)
    return keep


def _batch(part: StreamPart, request: ScanRequest, data: bytes, starts: np.ndarray, ends: np.ndarray,
           offsets: np.ndarray, timestamps: np.ndarray) -> pa.RecordBatch:
    at = pa.array(timestamps * 1000, _TS)
    values = {**_CONSTANT, "seq": pa.array(offsets), "published_at": at, "state_at": at, "vhost": part.vhost,
              "queue": part.stream, "segment": part.segment_name,
              **decode_columns(data, starts, ends, request.columns)}
    return record_batch(arrow_schema(request.columns, request.not_null), len(starts), values)
