"""A cursor over a stream: its committed records from an offset on, read lazily from the files.

``StreamLog.reader(offset)`` makes one. ``read(max_records)`` returns the next
records (``StreamRecord``) and an empty list at the end of what is committed;
a later ``read`` returns what was committed since, from where the cursor
stopped. Iterating a cursor gives the same records one by one and stops at the
end; iterating again goes on.

What a cursor holds: the stream, one open file (the segment it is in), a read
buffer of ``read_size`` bytes (256 KiB by default) or the block it reads
(below), and its position. Any number of cursors read the same stream at
their own pace, and reading history never loads more than one buffer or block
(and the records returned) into memory.

``read_messages`` returns records as ``(offset, envelope, body)``, and
``read_run`` the same in runs: in committed history, for a cursor without a
filter, a run is a slice of a *block* (stream_blocks), read and checked once
for all the cursors reading it and shared among them through the stream's
``BlockCache``.

* **Gaps.** When the records the cursor would read next are no longer stored
  (its offset was below ``first_offset``, or retention dropped its segment),
  it goes on from the first record kept, adds the number of offsets skipped to
  ``lost`` and calls ``on_gap(from_offset, to_offset)`` (``to_offset`` is the
  first one it will read), the signal Spark's ``failOnDataLoss`` needs.
* **Damage.** A record that fails its checks (CRC, length, an offset out of
  sequence), or offsets missing between segments, raise
  ``CorruptStreamRecord`` once the records before it were returned. The cursor
  has then stepped over the damage: the next ``read`` goes on after it.
* **Filtering.** With ``filter_values``, a record whose filter value is not one
  of them (or that has none, unless ``match_unfiltered``) is skipped: its
  head (offset, filter value, length) is checked by the head CRC and the
  cursor moves on without reading the message, which for a message larger
  than the read buffer is never read from the file at all.
"""

from __future__ import annotations

import os
import struct
import zlib
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from persistence.record_format import MIN_RECORD_LENGTH, RECORD_HEAD
from persistence.segment_file import read_exactly
from persistence.stream_blocks import RecordBlock, RecordRun, parse_block
from persistence.stream_index import SegmentIndex
from persistence.stream_segment import (
    FILTER_AT,
    FLAG_FILTER,
    HEAD,
    RECORD_OVERHEAD,
    STREAM_RECORD,
    MalformedStreamRecord,
    StreamRecord,
    decode_message,
    envelope_end,
    head_crc_ok,
)

if TYPE_CHECKING:
    from persistence.stream_log import StreamLog

GapCallback = Callable[[int, int], None]
_HEAD_SIZE = HEAD.size
_HEAD_WITH_CRC = FILTER_AT + 4  # plus the filter value's length
_SMALL_READ = 4096
_NO_BYTE_LIMIT = 1 << 62
_U32 = struct.Struct(">I")


class CorruptStreamRecord(ValueError):
    """Damaged data where the cursor expected a record."""

    def __init__(self, path: str, position: int, offset: int | None, reason: str) -> None:
        self.path = path
        self.position = position
        self.offset = offset  # the offset that should have been there (None: unknown)
        self.reason = reason
        at = "" if offset is None else f" (offset {offset})"
        super().__init__(f"{path}: damaged stream data at byte {position}{at}: {reason}")


class StreamCursor:
    """Reads a stream forward from an offset; see the module docstring."""

    def __init__(
        self,
        log: StreamLog,
        offset: int,
        filter_values: Iterable[str] | None = None,
        match_unfiltered: bool = False,
        on_gap: GapCallback | None = None,
        read_size: int = 256 * 1024,
    ) -> None:
        self._log = log
        self._filter = None if filter_values is None else frozenset(v.encode("utf-8") for v in filter_values)
        self._match_unfiltered = match_unfiltered
        self._on_gap = on_gap
        self._read_size = read_size
        self._seg: SegmentIndex | None = None
        self._fd: int | None = None
        self._pos = 0
        self._expect: int | None = offset  # the offset the next record must have (None: unknown, after damage)
        self._skip_below = offset  # records below it are stepped over (the seek)
        self._buf = b""
        self._view = memoryview(self._buf)
        self._buf_at = 0
        self._envelope: bytes | None = None  # the last envelope read_messages returned
        self._block: RecordBlock | None = None  # the block read_run reads from
        self._error: CorruptStreamRecord | None = None
        self._closed = False
        self.lost = 0  # offsets skipped because they were no longer stored
        self._reposition()

    @classmethod
    def at_position(cls, log: StreamLog, seg: SegmentIndex, position: int, offset: int) -> "StreamCursor":
        """A cursor at a known record boundary of ``seg`` (the stream's own time lookups)."""
        cursor = cls(log, offset)
        cursor._enter(seg, position, offset)
        return cursor

    @property
    def next_offset(self) -> int:
        """The offset of the next record this cursor returns (or skips)."""
        if self._expect is None:
            return self._skip_below
        return max(self._expect, self._skip_below)

    # ---- reading ---------------------------------------------------------------------------

    def read(self, max_records: int = 256) -> list[StreamRecord]:
        """Up to ``max_records`` of the next committed records; [] at the end for now."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._closed:
            raise RuntimeError("the cursor is closed")
        out: list[StreamRecord] = []
        try:
            self._read_into(out, max_records, None)
        except CorruptStreamRecord as err:
            if not out:
                raise
            self._error = err  # raised at the next read, after these records are handled
        return out

    def read_messages(self, max_records: int = 256, max_bytes: int = 1024 * 1024) -> list[tuple[int, bytes, bytes]]:
        """As ``read``, but each record as ``(offset, envelope, body)``, and no more records once
        those returned take ``max_bytes`` (at least one is returned). The envelope is the record's
        exchange, routing key and properties with their lengths, as in the file
        (``stream_segment.envelope_end``, ``split_envelope``): the same bytes object for
        consecutive records with equal envelopes, so a reader derives what it needs from one
        envelope once (a delivery's basic.deliver and content header), not once per record."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._closed:
            raise RuntimeError("the cursor is closed")
        out: list[tuple[int, bytes, bytes]] = []
        try:
            self._read_into(out, max_records, None, True, max_bytes)
        except CorruptStreamRecord as err:
            if not out:
                raise
            self._error = err  # raised at the next read, after these records are handled
        return out

    @property
    def reads_blocks(self) -> bool:
        """True when it reads committed history a block at a time (read_run without a filter)."""
        return self._filter is None and not self._closed

    @property
    def place(self) -> tuple[int, int] | None:
        """(segment id, file position) of the next record it reads; None when it has to find its
        place first (at its first read, or after a gap)."""
        if self._seg is None:
            return None
        return self._seg.segment_id, self._pos

    def read_run(self, max_records: int = 256, max_bytes: int = 1024 * 1024) -> RecordRun:
        """As ``read_messages``: the next records as ``(offset, envelope, body)``, and no more
        once those returned take ``max_bytes`` (at least one). Without a filter, in committed
        history, they come from the block they are in (stream_blocks), read and checked once
        for every cursor reading it: ``run.records[run.start:run.stop]`` of ``run.block``.
        Elsewhere (the end of the committed records, a filter, damage) they are read one by
        one, as ``read_messages`` reads them, in a run without a block."""
        if self._error is None and not self._closed and self._filter is None:
            run = self._block_run(max_records, max_bytes)
            if run is not None:
                return run
        records = self.read_messages(max_records, max_bytes)
        return RecordRun(None, records, 0, len(records))

    def _block_run(self, max_records: int, max_bytes: int) -> RecordRun | None:
        """The next records from the block the cursor is in, or None when it is not in one."""
        seg = self._seg
        expect = self._expect
        if seg is None or expect is None:
            return None
        log = self._log
        readable = log.readable_end(seg)
        while True:
            pos = self._pos
            if pos >= readable:
                self._block = None  # (at the end of what is committed: it may wait there long)
                return None
            block = self._block
            if block is None or block.segment_id != seg.segment_id or not block.start <= pos < block.end:
                self._block = None
                block = self._find_block(seg, pos, readable, expect)
                if block is None:
                    return None
            first = block.first_offset
            k = expect - first
            ends = block.ends  # (from the block's start)
            at = pos - block.start
            if not 0 <= k < len(ends) or (ends[k - 1] if k else 0) != at:
                return None  # not at a record of the block (cannot happen in an undamaged stream)
            if expect < self._skip_below:  # seeking: step over the records before the target
                k = min(self._skip_below - first, len(ends))
                if k == len(ends):
                    self._pos, self._expect = block.end, first + k
                    expect = first + k
                    continue
                at = ends[k - 1] if k else 0
            stop = min(k + max_records, len(ends))
            if ends[stop - 1] - at > max_bytes:
                stop = max(k + 1, bisect_right(ends, at + max_bytes, k, stop))
            self._pos, self._expect = block.start + ends[stop - 1], first + stop
            return RecordRun(block, block.records, k, stop)

    def _find_block(self, seg: SegmentIndex, pos: int, readable: int, expect: int) -> RecordBlock | None:
        """The block of ``seg`` that ``pos`` is in, when it is all committed: from the stream's
        cache, or read from the file (and cached while other cursors may want it)."""
        positions = seg.positions
        j = bisect_right(positions, pos) - 1
        if j < 0:
            return None
        start = positions[j]
        if j + 1 < len(positions):
            end = positions[j + 1]
        elif self._log.is_sealed(seg):
            end = seg.size
        else:
            return None  # the newest records: their block is still growing
        if end > readable:
            return None
        log = self._log
        block = log.blocks.get(seg.segment_id, start)
        if block is None:
            data = read_exactly(self._fd_for(seg, start, expect), end - start, start)
            if len(data) != end - start:
                return None
            block = parse_block(seg.segment_id, start, data, seg.offsets[j], self._envelope)
            if block is None:
                return None  # something the careful read must report
            log.share_block(block, self)
        self._block = block
        self._envelope = block.records[-1][1]
        # The buffer of one-by-one reads is of no use past here.
        self._view.release()
        self._buf = b""
        self._view = memoryview(self._buf)
        self._buf_at = 0
        return block

    def __iter__(self) -> Iterator[StreamRecord]:
        return self

    def __next__(self) -> StreamRecord:
        records = self.read(1)
        if not records:
            raise StopIteration
        return records[0]

    def first_at_or_after(self, timestamp_ms: int) -> int | None:
        """The offset of the first committed record at or after ``timestamp_ms`` from here on, in
        this segment and the ones after it; None if there is none. Messages are not read."""
        found: list[StreamRecord] = []
        while True:
            before = (self._seg, self._pos)
            try:
                self._read_into(found, 1, timestamp_ms)
            except CorruptStreamRecord:
                continue  # stepped over; readers report it
            if found:
                return found[0].offset
            if (self._seg, self._pos) == before:
                return None

    def _read_into(
        self,
        out: list[Any],
        max_records: int,
        min_timestamp: int | None,
        messages: bool = False,
        max_bytes: int = _NO_BYTE_LIMIT,
    ) -> None:
        """Append to ``out`` up to ``max_records`` records (as long as ``max_bytes`` of them were
        not returned yet): StreamRecords, or with ``messages`` (offset, envelope, body) triples,
        or with ``min_timestamp`` a bodiless StreamRecord of the first record at or after it."""
        log = self._log
        flt = self._filter
        unfiltered = self._match_unfiltered
        crc32 = zlib.crc32
        unpack = HEAD.unpack_from
        u32 = _U32.unpack_from
        plain = min_timestamp is None
        envelope = self._envelope
        elen = 0 if envelope is None else len(envelope)
        count = before = len(out)
        while count < max_records:
            seg = self._seg
            if seg is None:
                if not self._reposition():
                    return
                continue
            end = log.readable_end(seg)
            pos = self._pos
            # Records are read while they start within max_bytes of here.
            limit = end if end - pos <= max_bytes else pos + max_bytes
            expect = self._expect
            skip_below = self._skip_below
            buf, view, at = self._buf, self._view, self._buf_at
            nbuf = len(buf)
            try:
                while pos < limit and count < max_records:
                    i = pos - at
                    # The usual record: whole in the buffer (which holds committed bytes only), the
                    # next offset, one to return. Its CRC is the only check left; anything else goes
                    # the careful way below.
                    if 0 <= i and i + _HEAD_SIZE <= nbuf:
                        length, crc, rtype, offset, timestamp, flags, n_filter = unpack(buf, i)
                        total = length + 4
                        usual = (
                            i + total <= nbuf
                            and expect == offset >= skip_below
                            and rtype == STREAM_RECORD
                            and total >= RECORD_OVERHEAD + n_filter
                            and plain
                            and (
                                flt is None
                                or (buf[i + FILTER_AT : i + FILTER_AT + n_filter] in flt if flags & FLAG_FILTER else unfiltered)
                            )
                        )
                    else:
                        usual = False
                    if usual:
                        if crc32(view[i + 8 : i + total]) != crc:
                            self._pos, self._expect = pos + total, None
                            raise CorruptStreamRecord(str(seg.path), pos, expect, "CRC mismatch")
                    else:
                        if i < 0 or i + _HEAD_SIZE > nbuf:
                            if end - pos < _HEAD_SIZE:
                                pos = self._odd_record(seg, pos, end, expect)
                                buf, view, at = self._buf, self._view, self._buf_at
                                nbuf = len(buf)
                                continue
                            # Past a skipped message larger than a buffer, the next is likely large
                            # too: read its head only, not a buffer of the message the filter may skip.
                            jumped = pos - at - nbuf >= self._read_size
                            buf, view, at = self._fill(seg, pos, _HEAD_SIZE, end, expect, _SMALL_READ if jumped else 0)
                            nbuf = len(buf)
                            i = 0
                        length, crc, rtype, offset, timestamp, flags, n_filter = unpack(buf, i)
                        total = length + 4
                        if pos + total > end or length < MIN_RECORD_LENGTH:
                            pos = self._bad_frame(seg, pos, end, expect, f"invalid record length {length}")
                            continue
                        if rtype != STREAM_RECORD or total < RECORD_OVERHEAD:
                            pos = self._odd_record(seg, pos, end, expect)
                            buf, view, at = self._buf, self._view, self._buf_at
                            nbuf = len(buf)
                            continue
                        if i + _HEAD_WITH_CRC + n_filter > nbuf:
                            buf, view, at = self._fill(seg, pos, _HEAD_WITH_CRC + n_filter, end, expect)
                            nbuf = len(buf)
                            i = 0
                        if not plain:
                            wanted = timestamp >= min_timestamp
                        elif offset < skip_below:
                            wanted = False
                        elif flt is None:
                            wanted = True
                        elif flags & FLAG_FILTER:
                            wanted = buf[i + FILTER_AT : i + FILTER_AT + n_filter] in flt
                        else:
                            wanted = unfiltered
                        if wanted and plain:
                            if i + total > nbuf:
                                buf, view, at = self._fill(seg, pos, total, end, expect)
                                nbuf = len(buf)
                                i = 0
                            if crc32(view[i + 8 : i + total]) != crc:
                                self._pos, self._expect = pos + total, None
                                raise CorruptStreamRecord(str(seg.path), pos, expect, "CRC mismatch")
                        elif not head_crc_ok(buf, i, n_filter):
                            self._pos, self._expect = pos + total, None
                            raise CorruptStreamRecord(str(seg.path), pos, expect, "head CRC mismatch")
                        if expect is not None and offset != expect:
                            self._out_of_sequence(seg, pos, total, expect, offset)
                        if not wanted:
                            expect = offset + 1
                            pos += total
                            continue
                    if not plain:
                        out.append(StreamRecord(offset, timestamp, "", "", b"", b""))
                    elif messages:
                        # Records of one publisher share their envelope: compared, not parsed again,
                        # and returned as the same bytes object (a reader's cue to reuse its work).
                        h = i + _HEAD_WITH_CRC + n_filter
                        if buf[h : h + elen] != envelope:
                            e = envelope_end(buf, h, i + total)
                            envelope = buf[h:e]
                            elen = e - h
                        h += elen
                        n = u32(buf, h)[0]
                        h += 4
                        if h + n > i + total:
                            raise MalformedStreamRecord(f"stream record {offset}: the body runs past the end of the record")
                        out.append((offset, envelope, buf[h : h + n]))
                    else:
                        out.append(decode_message(buf, i, i + total, offset, timestamp, flags, n_filter))
                    count += 1
                    expect = offset + 1
                    pos += total
            except MalformedStreamRecord as err:
                self._pos, self._expect = pos + total, None
                raise CorruptStreamRecord(str(seg.path), pos, expect, str(err)) from None
            finally:
                self._envelope = envelope
            # (The damage handlers, which raise, save the cursor's place themselves.)
            self._pos, self._expect = pos, expect
            if pos < end:
                if count > before:
                    return  # max_records or max_bytes reached
                continue  # max_bytes of records skipped (a filter), none returned: read on
            if not log.is_sealed(seg) or end < seg.size:
                return  # at the committed end of the stream, for now
            if not self._next_segment(seg, expect):
                return

    # ---- helpers -------------------------------------------------------------------------

    def _fill(
        self, seg: SegmentIndex, pos: int, need: int, end: int, expect: int | None, size: int = 0
    ) -> tuple[bytes, memoryview, int]:
        """Read from ``pos`` at least ``need`` bytes (``size`` or ``read_size`` if more, never past
        ``end``); ``expect`` is the offset due there (for a report of damage)."""
        fd = self._fd_for(seg, pos, expect)
        want = min(max(size or self._read_size, need), end - pos)
        data = read_exactly(fd, want, pos)
        if len(data) < need:
            self._pos, self._expect = end, None
            raise CorruptStreamRecord(str(seg.path), pos, expect, "the file is shorter than its index says")
        self._view.release()
        self._buf, self._view, self._buf_at = data, memoryview(data), pos
        return data, self._view, pos

    def _bad_frame(self, seg: SegmentIndex, pos: int, end: int, expect: int | None, reason: str) -> int:
        """A length that does not fit: nothing after it in this segment can be located."""
        self._pos, self._expect = end, None
        raise CorruptStreamRecord(str(seg.path), pos, expect, f"{reason}; the rest of the committed segment is skipped")

    def _odd_record(self, seg: SegmentIndex, pos: int, end: int, expect: int | None) -> int:
        """A record of another type (added in a later format 1 writer) or too short for a stream
        record, or the last bytes before ``end`` too few for a head: check and step over it."""
        head = read_exactly(self._fd_for(seg, pos, expect), min(end - pos, 4096), pos)
        if len(head) < RECORD_HEAD.size:
            return self._bad_frame(seg, pos, end, expect, "torn record")
        length: int
        length, crc, rtype = RECORD_HEAD.unpack_from(head, 0)
        total = length + 4
        if length < MIN_RECORD_LENGTH or pos + total > end:
            return self._bad_frame(seg, pos, end, expect, f"invalid record length {length}")
        data = head if total <= len(head) else read_exactly(self._fd_for(seg, pos, expect), total, pos)
        if len(data) < total or zlib.crc32(memoryview(data)[8:total]) != crc:
            self._pos, self._expect = pos + total, None
            raise CorruptStreamRecord(str(seg.path), pos, expect, "CRC mismatch")
        if rtype == STREAM_RECORD:
            self._pos, self._expect = pos + total, None
            raise CorruptStreamRecord(str(seg.path), pos, expect, "stream record too short for its fields")
        return pos + total  # an unknown record type: skipped, as format 1 readers do

    def _fd_for(self, seg: SegmentIndex, pos: int, expect: int | None) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(seg.path, os.O_RDONLY)
            except FileNotFoundError:
                # Removed behind the stream's back (retention tells its cursors first): the whole
                # segment is lost; go on after it.
                self._pos, self._expect = seg.size, None
                raise CorruptStreamRecord(str(seg.path), pos, expect, "segment file missing") from None
        return self._fd

    def _out_of_sequence(self, seg: SegmentIndex, pos: int, total: int, expect: int, offset: int) -> None:
        if offset > expect:
            # Offsets missing before a good record: report them; the record is read next time.
            self._pos, self._expect = pos, offset
            self._skip_below = max(self._skip_below, offset)
            raise CorruptStreamRecord(str(seg.path), pos, expect, f"offsets {expect}..{offset - 1} missing")
        self._pos, self._expect = pos + total, expect
        raise CorruptStreamRecord(str(seg.path), pos, expect, f"offset {offset} where {expect} was expected")

    def _next_segment(self, seg: SegmentIndex, expect: int | None) -> bool:
        """Move from the sealed ``seg`` to the segment after it; False if there is none yet."""
        nxt = self._log.segment_after(seg)
        if nxt is None:
            return False
        self._enter(nxt, nxt.header_length, nxt.segment_id)
        if expect is not None and nxt.segment_id > expect:
            self._skip_below = max(self._skip_below, nxt.segment_id)
            missing = f"offsets {expect}..{nxt.segment_id - 1} missing"
            raise CorruptStreamRecord(str(seg.path), seg.size, expect, missing)
        if expect is not None:
            self._expect = expect if expect >= nxt.segment_id else nxt.segment_id
        return True

    def _enter(self, seg: SegmentIndex, position: int, offset: int) -> None:
        self._close_fd()
        self._seg = seg
        self._pos = position
        self._expect = offset

    def _reposition(self) -> bool:
        """Find the segment and position of ``next_offset`` (after a gap, from the first record
        kept). False when the stream has no segment yet."""
        log = self._log
        target = self.next_offset
        first = log.first_offset
        if target < first:
            self.lost += first - target
            if self._on_gap is not None:
                self._on_gap(target, first)
            target = first
        target = min(target, log.next_offset)
        found = log.locate(target)
        self._skip_below = target
        if found is None:
            self._expect = target
            return False
        seg, position, at = found
        self._enter(seg, position, at)
        return True

    def segment_dropped(self, seg: SegmentIndex) -> None:
        """Retention removed ``seg``: if the cursor is in it, let go of the file (so its space is
        freed now) and go on from the first record kept at the next read."""
        if seg is self._seg:
            self._skip_below = self.next_offset
            self._close_fd()
            self._seg = None
            self._expect = None

    def _close_fd(self) -> None:
        self._block = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._view.release()
        self._buf = b""
        self._view = memoryview(self._buf)
        self._buf_at = 0

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_fd()
            self._seg = None
            self._log.forget_cursor(self)

    def __del__(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
