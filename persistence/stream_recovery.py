"""Opening a stream directory after a clean shutdown or a crash: what its segment files still hold.

``recover_segments(directory)`` lists the segments in offset order and builds
the ``SegmentIndex`` of each: from its side file where one is valid, by a
scan (``stream_index.scan_records``) of whatever the side file does not
cover. It repairs as it goes, by the rules of docs/stream-files.md section 4:

* a torn tail (an incomplete or CRC-failing last record, a zero-filled tail)
  is cut off, the bytes kept in ``<segment>.dropped-at-<position>`` unless
  all zeros; every record before it is kept;
* a damaged record in the middle, and offsets missing between segments, are
  *reported* (logged and returned in ``damage``), never silently skipped;
* the newest segment cut short while being created is removed; a segment
  whose header is unreadable, or that overlaps the one before it, is renamed
  to ``<name>.corrupt`` and reported.

Sealed segments that had to be scanned get their side file written again, so
the next open reads no segment twice. It never raises because of damaged data,
only ``UnsupportedStreamFormatVersion``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

from persistence.atomic_file import make_directories, write_atomically
from persistence.segment_file import cut_damaged_tail
from persistence.stream_index import (
    SegmentIndex,
    StreamDamage,
    checkpoint_of,
    encode_side_index,
    read_side_index,
    scan_records,
)
from persistence.stream_segment import (
    HEADER_SIZE,
    INDEX_SUFFIX,
    STREAM_FORMAT_VERSION,
    STREAM_META,
    VHOST_META,
    CorruptStreamHeader,
    check_stream_format_version,
    decode_header,
    index_file_name,
    parse_segment_file_name,
)

log = logging.getLogger(__name__)


class StreamRecovery(NamedTuple):
    """What opening the stream found."""

    segments: int
    scanned_bytes: int  # read by a scan (the rest came from side files)
    truncated_bytes: int  # cut off torn tails
    seconds: float


class RecoveredSegments(NamedTuple):
    segments: list[SegmentIndex]  # in offset order; the last one is the tail
    damage: list[StreamDamage]
    scanned_bytes: int
    truncated_bytes: int


def make_stream_directory(directory: Path, vhost: str, name: str, now_ms: int) -> None:
    """Create the stream directory and its meta files if missing (durably: a stream is declared
    rarely, and its directory must outlive a crash right after). A meta file of a format version
    this code does not read raises ``UnsupportedStreamFormatVersion``."""
    make_directories(directory, durably=True)
    metas = (
        (directory.parent / VHOST_META, {"vhost": vhost}),
        (directory / STREAM_META, {"vhost": vhost, "stream": name}),
    )
    for meta, fields in metas:
        try:
            document = json.loads(meta.read_bytes())
            check_stream_format_version(str(meta), document.get("format_version"))
            continue
        except (OSError, ValueError, AttributeError):
            pass  # missing or unreadable: written again
        body = {"format_version": STREAM_FORMAT_VERSION, **fields, "created_at_ms": now_ms}
        write_atomically(meta, json.dumps(body, ensure_ascii=False, indent=2).encode("utf-8") + b"\n")


def recover_segments(directory: Path, index_interval: int) -> RecoveredSegments:
    """The segments of the stream in ``directory``, repaired and indexed (module docstring)."""
    found = []
    for entry in os.listdir(directory):
        sid = parse_segment_file_name(entry)
        if sid is not None:
            found.append((sid, directory / entry))
        elif entry.startswith(".") and entry.endswith(f"{INDEX_SUFFIX}.tmp"):
            (directory / entry).unlink(missing_ok=True)  # a side file write cut short
    found.sort()
    recovering = _Recovering(directory, index_interval)
    for k, (sid, path) in enumerate(found):
        recovering.add(sid, path, is_last=k == len(found) - 1)
    for seg in recovering.segments[:-1]:
        if seg.indexed_size != seg.size:
            write_atomically(directory / index_file_name(seg.segment_id), encode_side_index(seg, checkpoint_of(seg)))
            seg.mark_indexed(seg.size)
    return RecoveredSegments(recovering.segments, recovering.damage, recovering.scanned, recovering.truncated)


class _Recovering:
    """The segments recovered so far, and what was found on the way."""

    def __init__(self, directory: Path, index_interval: int) -> None:
        self.directory = directory
        self.interval = index_interval
        self.segments: list[SegmentIndex] = []
        self.damage: list[StreamDamage] = []
        self.scanned = 0
        self.truncated = 0

    def add(self, sid: int, path: Path, is_last: bool) -> None:
        seg = self._recover(sid, path, is_last)
        if seg is None:
            return
        if self.segments:
            before = self.segments[-1]
            if seg.segment_id > before.next_offset:
                missing = f"offsets {before.next_offset}..{seg.segment_id - 1} missing"
                self._report(StreamDamage(str(path), 0, before.next_offset, missing))
        self.segments.append(seg)

    def _recover(self, sid: int, path: Path, is_last: bool) -> SegmentIndex | None:
        """The index of one segment file; None for a file removed or set aside."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            try:
                header = decode_header(str(path), os.pread(fd, HEADER_SIZE, 0))
            except CorruptStreamHeader as err:
                if is_last and size <= HEADER_SIZE:
                    path.unlink()  # a crash while the segment was being created
                    log.warning("stream %s: removed %s, cut short while being created", self.directory, path.name)
                    return None
                first = self.segments[-1].next_offset if self.segments else sid
                self._set_aside(path, first, f"{err}; segment set aside")
                return None
            if header.segment_id != sid:
                log.warning(
                    "stream %s: %s says segment %d; the file name wins", self.directory, path.name, header.segment_id
                )
            if self.segments and sid < self.segments[-1].next_offset:
                self._set_aside(path, None, "segment overlaps the one before it; set aside")  # a hand-edited directory
                return None
            seg = SegmentIndex(sid, path, header.header_length, header.created_at_ms, self.interval)
            start = header.header_length
            side = read_side_index(self.directory / index_file_name(sid), sid, header.header_length, size)
            if side is not None:
                seg.restore(side)
                start = side.checkpoint.covered_size
            seg.set_size(size)
            if start < size:
                self.scanned += size - start
                self._scan(fd, path, seg, start, size)
            return seg
        finally:
            os.close(fd)

    def _scan(self, fd: int, path: Path, seg: SegmentIndex, start: int, size: int) -> None:
        outcome = scan_records(fd, path, seg, start, size)
        for damage in outcome.skipped:
            self._report(damage)
        stop = outcome.stop
        if stop is None:
            return
        saved = cut_damaged_tail(path, outcome.good_end)
        cut = size - outcome.good_end
        kept = f" (kept in {saved.name})" if saved else ""
        log.warning(
            "stream %s: %s: %s at byte %d; cut off %d bytes%s",
            self.directory,
            path.name,
            stop.reason,
            stop.position,
            cut,
            kept,
        )
        self.truncated += cut
        seg.set_size(outcome.good_end)

    def _set_aside(self, path: Path, first_missing: int | None, reason: str) -> None:
        aside = path.with_name(path.name + ".corrupt")
        os.rename(path, aside)
        self._report(StreamDamage(str(aside), 0, first_missing, reason))

    def _report(self, damage: StreamDamage) -> None:
        self.damage.append(damage)
        log.warning(
            "stream %s: damaged data in %s at byte %d: %s", self.directory, damage.path, damage.position, damage.reason
        )
