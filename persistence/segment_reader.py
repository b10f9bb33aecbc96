"""Reading segment files that a running broker may still be writing, without changing them.

Analytics tools (spark/) read live and archived queue directories while the
broker appends to them. They need two things the recovery code does not give:

* ``snapshot_scan(path, size)``: a ``SegmentScan`` over only the first
  ``size`` bytes of a segment, as measured when a query was planned. Every
  reader of the same (file, size) sees the same records, however much the
  broker appended since, and a record still being written at the end is not
  returned (the scan stops there, as at any torn tail). The file is opened
  once and never modified. Returns None when the file is gone (deleted or
  renamed into the archive) or is no longer the file that was measured.
* ``list_archived_segments(directory)``: the segments of an archive
  directory, including the ``<id>.<n>.seg`` copies that docs/queue-files.md
  (section 1) allows there, in replay order.

Record parsing itself stays in segment_file and record_format.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from persistence.segment_file import CorruptSegmentHeader, SegmentScan, decode_header, read_exactly

_ARCHIVED_NAME = re.compile(r"^(\d{20})(?:\.(\d+))?\.seg$")


class FileIdentity(NamedTuple):
    """Which file a path named when it was measured (a renamed file keeps its identity)."""

    device: int
    inode: int


class ArchivedSegment(NamedTuple):
    segment_id: int
    copy: int  # 0 for <id>.seg, n for <id>.<n>.seg (an archive edited by hand)
    path: Path


class SnapshotScan(SegmentScan):
    """A ``SegmentScan`` over bytes already read (a prefix of the file)."""

    def __init__(self, path: Path, data: bytes) -> None:  # noqa: super().__init__ would read the whole file
        self.path = path
        self.data = data
        self.header = decode_header(str(path), data)
        if self.header.header_length > len(data):
            raise CorruptSegmentHeader(f"{path}: header length {self.header.header_length} exceeds the snapshot")
        self.view = memoryview(data)
        self.skipped = []
        self.damage = None
        self.good_end = self.header.header_length
        self.record_count = 0


def file_identity(stat: os.stat_result) -> FileIdentity:
    return FileIdentity(stat.st_dev, stat.st_ino)


def read_prefix(path: Path, size: int, identity: FileIdentity | None = None) -> bytes | None:
    """The first ``size`` bytes of ``path`` (fewer if it is shorter now), or None when the file is
    missing or is not the file ``identity`` names."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if identity is not None and file_identity(os.fstat(fd)) != identity:
            return None
        return read_exactly(fd, size, 0)
    finally:
        os.close(fd)


def snapshot_scan(path: Path, size: int, identity: FileIdentity | None = None) -> SnapshotScan | None:
    """A scan of the first ``size`` bytes of the segment at ``path``; None if the file is gone.
    Raises ``CorruptSegmentHeader`` or ``UnsupportedFormatVersion`` for a header it cannot use."""
    data = read_prefix(path, size, identity)
    return None if data is None else SnapshotScan(path, data)


def list_archived_segments(directory: Path) -> list[ArchivedSegment]:
    """Every segment file in an archive (or live) queue directory, in replay order."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        match = _ARCHIVED_NAME.match(name)
        if match:
            found.append(ArchivedSegment(int(match.group(1)), int(match.group(2) or 0), directory / name))
    return sorted(found)
