"""Where a stream's committed records end, in a file that readers of the files can trust.

A record of a stream is *committed* once a group commit round that started after it was
written has completed (docs/stream-files.md section 8); the broker's consumers see committed
records only. The segment files alone cannot tell a reader where that is: the newest segment
may hold records written but not yet fsynced, which a power cut can take away and whose
offsets would then be given to other messages. So after every round that commits records the
stream log rewrites ``<stream-dir>/committed``, 44 bytes in place::

    magic "AMQPSCMT", version u16, reserved u16, reserved u32,
    segment_id u64 (the segment the committed records end in; 2**64-1: none yet),
    position u64 (the committed bytes of that segment, header included: a record boundary),
    next_offset u64 (one past the last committed record),
    crc u32 (CRC-32 of the 40 bytes before it)

It is written with one ``pwrite`` after the round's fsyncs returned and is never fsynced
itself: whatever version of it a reader finds, even after a crash, names records that were
durable when it was written. Every segment before ``segment_id`` was committed whole; no
record of a later segment was. The mark can only lag (by the few microseconds between an
fsync and the write, or while a crashed broker is down), never lead. docs/stream-files.md
section 8 is the contract; ``read_commit_mark`` is the reader's half (the Spark data source).
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

from persistence.stream_segment import check_stream_format_version

MARK_FILE = "committed"
MARK_MAGIC = b"AMQPSCMT"
MARK_VERSION = 1
_MARK = struct.Struct(">8sHHIQQQ")
_CRC = struct.Struct(">I")
MARK_SIZE = _MARK.size + _CRC.size
_NO_SEGMENT = (1 << 64) - 1
_READ_ATTEMPTS = 5  # a read racing the broker's pwrite may see a mix of two marks: read again
T = TypeVar("T")


class CommitMark(NamedTuple):
    """The committed end of a stream: every record before ``position`` of segment ``segment_id``
    (and every record of the segments before it) is committed, nothing after."""

    segment_id: int | None  # None: the stream had no segment
    position: int
    next_offset: int


class DamagedCommitMark(ValueError):
    """A ``committed`` file that stays unreadable (not a read racing a write)."""


def encode_commit_mark(mark: CommitMark) -> bytes:
    segment = _NO_SEGMENT if mark.segment_id is None else mark.segment_id
    body = _MARK.pack(MARK_MAGIC, MARK_VERSION, 0, 0, segment, mark.position, mark.next_offset)
    return body + _CRC.pack(zlib.crc32(body))


def decode_commit_mark(path: str, data: bytes) -> CommitMark | None:
    """The mark in ``data``, or None when it is torn or damaged. Raises
    ``UnsupportedStreamFormatVersion`` for a version this code does not read."""
    if len(data) < MARK_SIZE or data[:8] != MARK_MAGIC:
        return None
    magic, version, _, _, segment, position, next_offset = _MARK.unpack_from(data, 0)
    if _CRC.unpack_from(data, _MARK.size)[0] != zlib.crc32(data[: _MARK.size]):
        return None
    check_stream_format_version(path, version)
    return CommitMark(None if segment == _NO_SEGMENT else segment, position, next_offset)


class StaysUnreadable(Exception):
    """A file rewritten in place that no read of a few decoded: ``size`` bytes, the last read."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def read_rewritten(path: Path, decode: Callable[[bytes], T | None]) -> T | None:
    """What ``decode`` makes of the file at ``path``, which its writer rewrites in place with one
    pwrite (a commit mark); None when there is no such file. A read racing the pwrite may see a mix
    of two versions, which ``decode`` rejects (None): read again, a few times, then
    ``StaysUnreadable``."""
    data = b""
    for attempt in range(_READ_ATTEMPTS):
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        decoded = decode(data)
        if decoded is not None:
            return decoded
        time.sleep(0.002 * (attempt + 1))
    raise StaysUnreadable(len(data))


def read_commit_mark(directory: Path) -> CommitMark | None:
    """The commit mark of the stream directory ``directory``; None when there is no such file
    (a directory no broker with commit marks has opened). Raises ``DamagedCommitMark`` when it
    stays unreadable over a few attempts."""
    path = Path(directory) / MARK_FILE
    try:
        return read_rewritten(path, lambda data: decode_commit_mark(str(path), data))
    except StaysUnreadable as error:
        raise DamagedCommitMark(f"{path}: damaged commit mark ({error.size} bytes); the broker rewrites it after "
                                f"its next commit round or when it opens the stream") from None


def mark_unwritten(directory: Path) -> bool:
    """The stream directory's ``committed`` file exists and is empty: the broker created it at the
    stream's open and has not written the mark yet (the open writes it after scanning the tail), or
    a power cut lost that first, never fsynced write. Nothing is known committed there;
    ``read_commit_mark`` would call it damaged."""
    try:
        return os.stat(Path(directory) / MARK_FILE).st_size == 0
    except (FileNotFoundError, NotADirectoryError):
        return False


class CommitMarkWriter:
    """The writer's half: keeps ``committed`` open and rewrites it in place."""

    __slots__ = ("_fd", "path")

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / MARK_FILE
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    def write(self, mark: CommitMark) -> None:
        """Replace the mark (one pwrite, no fsync: see the module docstring)."""
        if self._fd is not None:
            os.pwrite(self._fd, encode_commit_mark(mark), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["MARK_FILE", "CommitMark", "CommitMarkWriter", "DamagedCommitMark", "StaysUnreadable",
           "decode_commit_mark", "encode_commit_mark", "mark_unwritten", "read_commit_mark", "read_rewritten"]
