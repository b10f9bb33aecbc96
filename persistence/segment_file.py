"""One segment file: its name, its header, walking its records, and cutting off a damaged tail.

A segment file is ``<segment id as 20 decimal digits>.seg``; it starts with a
40-byte header (magic, format version, header length, flags, segment id,
creation time, CRC) followed by records (see record_format). The segment id
is a lower bound for the sequence numbers of the messages in the file and is
above every sequence number in earlier segments.

``SegmentScan`` reads a whole segment and walks its records, trusting a
record only when its length fits the file and its CRC matches. It stops at
the first record it cannot trust, except when that record's length field
still leads to a valid record right after it: then only that one record is
reported as damaged and skipped (a flipped bit inside a payload costs one
record, not the rest of the segment). It never raises for damaged records;
it raises ``UnsupportedFormatVersion`` or ``CorruptSegmentHeader`` for a
header it cannot use.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

from persistence.format_version import FORMAT_VERSION, check_format_version
from persistence.record_format import LENGTH, LENGTH_AND_CRC, MIN_RECORD_LENGTH, RECORD_HEAD

MAGIC = b"AMQPQSEG"
HEADER_SIZE = 40
_HEADER = struct.Struct(">8sHHIQQI")  # magic, version, header_length, flags, segment_id, created_at_ms, reserved
_HEADER_CRC = struct.Struct(">I")
_VERSION_AT = struct.Struct(">8sH")
SUFFIX = ".seg"
_NAME = re.compile(r"^(\d{20})\.seg$")


class CorruptSegmentHeader(ValueError):
    """A segment file whose header is missing, short, or fails its magic or CRC check."""


class SegmentHeader(NamedTuple):
    version: int
    header_length: int
    flags: int
    segment_id: int  # a queue's: a lower bound of its sequence numbers; a stream's: its first offset
    created_at_ms: int


class SegmentKind(NamedTuple):
    """What tells one kind of segment file from another; the 40-byte header layout is the same
    (a stream segment's header is a queue segment's with its own magic and format version,
    docs/stream-files.md section 2)."""

    magic: bytes
    version: int  # written
    check_version: Callable[[str, object], None]  # raises for a version this code does not read
    corrupt: type[ValueError]  # raised for a header that is short or fails its magic or CRC check
    header_name: str  # for error messages: "segment header"
    file_name: str  # "queue segment file"


QUEUE_SEGMENT = SegmentKind(
    MAGIC, FORMAT_VERSION, check_format_version, CorruptSegmentHeader, "segment header", "queue segment file"
)


class Damage(NamedTuple):
    """Bytes of a segment that could not be trusted: where, how many, and why."""

    offset: int
    length: int
    reason: str


class RawRecord(NamedTuple):
    offset: int  # of the record's length field
    record_type: int
    payload_start: int
    end: int  # offset just past the record


def segment_file_name(segment_id: int) -> str:
    return f"{segment_id:020d}{SUFFIX}"


def parse_segment_file_name(name: str) -> int | None:
    """The segment id a file name stands for, or None when the name is not a segment's."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(segment id, path) of every segment file in ``directory``, in segment order."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(sid, directory / name) for name in names if (sid := parse_segment_file_name(name)) is not None]
    return sorted(found)


def encode_header(segment_id: int, created_at_ms: int, kind: SegmentKind = QUEUE_SEGMENT) -> bytes:
    head = _HEADER.pack(kind.magic, kind.version, HEADER_SIZE, 0, segment_id, created_at_ms, 0)
    return head + _HEADER_CRC.pack(zlib.crc32(head))


def decode_header(path: str, data: bytes, kind: SegmentKind = QUEUE_SEGMENT) -> SegmentHeader:
    """The header at the start of ``data`` (the first bytes of the file at ``path``): the magic
    first, then the version, then the CRC."""
    corrupt = kind.corrupt
    if len(data) < _VERSION_AT.size:
        raise corrupt(f"{path}: {len(data)} bytes, too short for a {kind.header_name}")
    magic, version = _VERSION_AT.unpack_from(data, 0)
    if magic != kind.magic:
        raise corrupt(f"{path}: not a {kind.file_name} (magic {magic!r})")
    kind.check_version(path, version)
    if len(data) < HEADER_SIZE:
        raise corrupt(f"{path}: {len(data)} bytes, too short for a {kind.header_name}")
    _, version, header_length, flags, segment_id, created_at_ms, _ = _HEADER.unpack_from(data, 0)
    (crc,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    if crc != zlib.crc32(data[: _HEADER.size]):
        raise corrupt(f"{path}: {kind.header_name} CRC mismatch")
    if header_length < HEADER_SIZE:
        raise corrupt(f"{path}: header length {header_length} is below {HEADER_SIZE}")
    return SegmentHeader(version, header_length, flags, segment_id, created_at_ms)


def create_segment(path: Path, header: bytes) -> int:
    """Create the segment file ``path`` (it must not exist) holding ``header``, and return its
    descriptor, open for appending; on failure no file is left behind."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        if os.write(fd, header) != len(header):
            raise OSError(f"{path}: short write of the segment header")
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    return fd


class SegmentScan:
    """The records of one segment file, read into memory once.

    Iterate ``records()`` to get every trusted record in file order; after
    that ``skipped`` lists isolated damaged records that were stepped over,
    ``damage`` says where (if anywhere) the walk stopped, and ``good_end`` is
    the offset just past the last trusted record.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            self.data = f.read()
        self.header = decode_header(str(path), self.data)
        if self.header.header_length > len(self.data):
            raise CorruptSegmentHeader(f"{path}: header length {self.header.header_length} exceeds the file")
        self.view = memoryview(self.data)
        self.skipped: list[Damage] = []
        self.damage: Damage | None = None
        self.good_end = self.header.header_length
        self.record_count = 0

    @property
    def size(self) -> int:
        return len(self.data)

    def records(self) -> Iterator[RawRecord]:
        data, view, size = self.data, self.view, len(self.data)
        crc32, unpack_head = zlib.crc32, RECORD_HEAD.unpack_from
        pos = self.header.header_length
        while pos < size:
            problem = _frame_problem(data, pos)
            if problem is not None:
                self.damage = Damage(pos, size - pos, problem)
                return
            length, crc, rtype = unpack_head(data, pos)
            end = pos + 4 + length
            if crc32(view[pos + 8 : end]) != crc:
                if end < size and _is_valid_record(data, view, end):
                    self.skipped.append(Damage(pos, end - pos, "CRC mismatch (record skipped)"))
                    pos = end
                    continue
                self.damage = Damage(pos, size - pos, "CRC mismatch")
                return
            self.record_count += 1
            yield RawRecord(pos, rtype, pos + 9, end)
            pos = end
            self.good_end = end

    def close(self) -> None:
        self.view.release()


def trusted_record_offsets(data: bytes, header_length: int, damage: list[Damage] | None = None) -> list[int]:
    """The offsets of the records ``SegmentScan.records()`` yields for a segment's bytes, by the same
    rules, without a generator step and a RawRecord per record (the Spark reader's record index,
    spark.segment_index, reads the rest of each record for all records at once).

    With ``damage``, what the walk did not trust is appended to it, as ``SegmentScan`` reports it:
    each damaged record stepped over (it ends before the bytes do), then where the walk stopped,
    when that is before the end (to the end of the bytes)."""
    view = memoryview(data)
    size = len(data)
    limit = size - RECORD_HEAD.size  # fewer bytes left: no record can start there (_frame_problem)
    head, crc32 = LENGTH_AND_CRC.unpack_from, zlib.crc32
    offsets: list[int] = []
    keep = offsets.append
    pos = header_length
    crc_failed = False
    while pos <= limit:
        length, crc = head(data, pos)
        end = pos + 4 + length
        if length < MIN_RECORD_LENGTH or end > size:
            break  # _frame_problem: zero-filled tail, invalid length or torn record
        if crc32(view[pos + 8 : end]) != crc:
            if end < size and _is_valid_record(data, view, end):
                if damage is not None:
                    damage.append(Damage(pos, end - pos, "CRC mismatch (record skipped)"))
                pos = end  # one damaged record with an intact length: skipped
                continue
            crc_failed = True
            break
        keep(pos)
        pos = end
    view.release()
    if damage is not None and pos < size:
        damage.append(Damage(pos, size - pos, "CRC mismatch" if crc_failed else _frame_problem(data, pos) or ""))
    return offsets


def _frame_problem(data: bytes, pos: int) -> str | None:
    """Why no record can start at ``pos`` of a segment's bytes, or None when its length fits them."""
    size = len(data)
    if size - pos < RECORD_HEAD.size:
        if not any(data[pos:]):
            return "zero-filled tail"
        return "torn record (partial header)"
    (length,) = LENGTH.unpack_from(data, pos)
    if length == 0:
        if not any(data[pos:]):
            return "zero-filled tail"
        return "zero length field"
    if length < MIN_RECORD_LENGTH:
        return f"invalid record length {length}"
    if pos + 4 + length > size:
        return f"torn record (length {length} runs {pos + 4 + length - size} bytes past the end of the file)"
    return None


def _is_valid_record(data: bytes, view: memoryview, pos: int) -> bool:
    """True when a whole record with a matching CRC starts at ``pos`` (``view`` is ``data``'s)."""
    if _frame_problem(data, pos) is not None:
        return False
    crc: int  # (struct's fields are Any to mypy)
    length, crc, _ = RECORD_HEAD.unpack_from(data, pos)
    return zlib.crc32(view[pos + 8 : pos + 4 + length]) == crc


def cut_damaged_tail(path: Path, offset: int) -> Path | None:
    """Truncate the segment at ``offset``; bytes that were not all zeros are first
    copied to ``<name>.dropped-at-<offset>`` for inspection. Returns that copy's path."""
    saved: Path | None = None
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size <= offset:
            return None
        dropped = os.pread(fd, size - offset, offset)
        if any(dropped):
            saved = path.with_name(f"{path.name}.dropped-at-{offset}")
            with open(saved, "wb") as out:
                out.write(dropped)
                out.flush()
                os.fsync(out.fileno())
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return saved


def read_exactly(fd: int, n: int, pos: int) -> bytes:
    """``n`` bytes of ``fd`` from ``pos`` (fewer only at the end of the file)."""
    data = os.pread(fd, n, pos)
    if len(data) >= n or not data:
        return data
    parts = [data]
    done = len(data)
    while done < n:
        more = os.pread(fd, n - done, pos + done)
        if not more:
            break
        parts.append(more)
        done += len(more)
    return b"".join(parts)


class CorruptRecord(ValueError):
    """A record read back by offset failed its length or CRC check."""


def read_record(fd: int, offset: int, path: str = "segment") -> tuple[int, bytes]:
    """(record type, payload) of the record at ``offset`` in the open segment ``fd``."""
    head = os.pread(fd, 4096, offset)
    if len(head) < RECORD_HEAD.size:
        raise CorruptRecord(f"{path}: no record at offset {offset}")
    length, crc, rtype = RECORD_HEAD.unpack_from(head, 0)
    total = 4 + length
    if length < MIN_RECORD_LENGTH:
        raise CorruptRecord(f"{path}: invalid record length {length} at offset {offset}")
    data = head[:total] if total <= len(head) else head + os.pread(fd, total - len(head), offset + len(head))
    if len(data) < total:
        raise CorruptRecord(f"{path}: record at offset {offset} is cut short")
    if zlib.crc32(memoryview(data)[8:]) != crc:
        raise CorruptRecord(f"{path}: CRC mismatch in the record at offset {offset}")
    return rtype, data[9:]
