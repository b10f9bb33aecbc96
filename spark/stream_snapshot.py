"""Which committed records of which streams a scan reads, and how they split into partitions.

``plan_streams(data_dir, vhost, queue)`` lists every stream under
``<data_dir>/streams`` (docs/stream-files.md section 1) whose names match, and
for each takes a committed snapshot, without writing anything: first its commit
mark (``persistence.stream_commit_mark``: where the committed records end), then
its segment files and their side index files (``persistence.stream_index``).
A segment before the mark's segment is committed whole, the mark's segment up to
the mark's position, and a later segment not at all; so a scan never returns a
record the broker has not committed, even while it appends. Without a mark (a
directory no broker with commit marks has opened) only what side files cover is
known to be committed, and only that is read.

``stream_parts(snapshot, request)`` turns a snapshot into partitions: byte ranges
of segments, each starting and ending at a known record boundary (a side index
entry, the segment's start, the end of what a side file covers, or the committed
end). Pushed-down offset and timestamp ranges skip whole segments by their facts
(first and last offset and timestamp, from the side files and the segment names)
and move a range's start and end to the nearest index entries, so a partition
reads at most one index interval (64 KiB) outside what was asked for. A long
range is cut at index entries into pieces of about ``partition_bytes``, so the
cores of an executor share one large segment.
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

from persistence.segment_reader import FileIdentity, file_identity
from persistence.stream_commit_mark import CommitMark, read_commit_mark
from persistence.stream_index import SideIndex, read_side_index
from persistence.stream_segment import (
    HEADER_SIZE,
    STREAM_META,
    STREAMS_DIR,
    check_stream_format_version,
    index_file_name,
    parse_segment_file_name,
    segment_file_name,
)
from spark.message_states import STREAM_STATE
from spark.queue_snapshot import matches

if TYPE_CHECKING:
    from spark.partition_reader import ScanRequest

DEFAULT_PARTITION_BYTES = 32 * 1024 * 1024
_INF = math.inf


class StreamSegmentRef(NamedTuple):
    """One segment file as measured at planning time."""

    segment_id: int  # the offset of its first record
    path: str
    limit: int  # the committed bytes of the file (header included); only these are read
    identity: FileIdentity
    end_offset: int | None  # one past the last committed record in it, when known
    side: SideIndex | None  # its side index, when valid (entries below side.checkpoint.covered_size)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class StreamSnapshot(NamedTuple):
    vhost: str
    stream: str
    directory: str
    created_at_ms: int  # from stream.json: tells this stream from one deleted and declared again
    mark: CommitMark | None
    segments: tuple[StreamSegmentRef, ...]  # in offset order, only those holding committed records


class StreamPart(NamedTuple):
    """What one partition reads: a byte range of a segment, between two record boundaries."""

    vhost: str
    stream: str
    segment_id: int
    path: str
    identity: FileIdentity
    stream_created_at_ms: int  # the stream's stream.json then (an inode number is reused at once)
    start: int  # file position of its first record; 0: the first record after the header
    start_offset: int  # the offset of the record at ``start``
    end: int  # file position just past its last record
    end_offset: int | None  # the offset of the record at ``end`` (one past its last), when known
    # A replicated stream's other copies that held the range committed at planning, each the same
    # bytes at the same positions (spark.replicated_streams): read when ``path`` is not the file planned.
    alternatives: tuple["SegmentCopy", ...] = ()

    @property
    def segment_name(self) -> str:
        return os.path.basename(self.path)

    def copies(self) -> tuple["SegmentCopy", ...]:
        """Where the range can be read, the planned file first."""
        return (SegmentCopy(self.path, self.identity, self.stream_created_at_ms), *self.alternatives)


class SegmentCopy(NamedTuple):
    """One copy of a segment file: its path, its identity and its stream.json's ``created_at_ms``."""

    path: str
    identity: FileIdentity
    stream_created_at_ms: int


def plan_streams(data_dir: str | Path, vhost: str | None = None, queue: str | None = None) -> list[StreamSnapshot]:
    """Every stream under ``data_dir`` (narrowed by the ``vhost`` name and the ``queue`` name or
    glob), each with a committed snapshot of its segments taken now."""
    root = Path(data_dir) / STREAMS_DIR
    snapshots = []
    for directory, meta in sorted(_stream_directories(root).items(), key=lambda kv: kv[1]):
        if vhost is not None and meta.vhost != vhost:
            continue
        if queue is not None and not matches(meta.stream, queue):
            continue
        snapshot = snapshot_stream(directory, meta)
        if snapshot is not None:
            snapshots.append(snapshot)
    return snapshots


class StreamMeta(NamedTuple):
    """What a stream directory's ``stream.json`` says."""

    vhost: str
    stream: str
    created_at_ms: int


def read_stream_meta(directory: Path) -> StreamMeta | None:
    """The ``stream.json`` of ``directory``; None when there is none (not a stream directory, or
    one deleted meanwhile). Raises ``UnsupportedStreamFormatVersion`` for a version it does not read."""
    meta = Path(directory) / STREAM_META
    try:
        document = json.loads(meta.read_bytes().decode("utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    check_stream_format_version(str(meta), document.get("format_version"))
    return StreamMeta(document["vhost"], document["stream"], int(document.get("created_at_ms", 0)))


def snapshot_stream(directory: Path, meta: StreamMeta) -> StreamSnapshot | None:
    """The committed snapshot of one stream directory; None when it was deleted meanwhile."""
    mark = read_commit_mark(directory)  # first: everything it names is in the files listed after it
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    ids = sorted(sid for sid in map(parse_segment_file_name, names) if sid is not None)
    refs = []
    for sid in ids:
        if mark is not None and (mark.segment_id is None or sid > mark.segment_id):
            break  # no record of it was committed when the mark was written
        path = directory / segment_file_name(sid)
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            continue  # dropped by retention since the listing: the stream starts later
        side = read_side_index(directory / index_file_name(sid), sid, HEADER_SIZE, stat.st_size)
        if mark is not None and sid == mark.segment_id:
            # (A file shorter than that is damage, which the partition reading it reports.)
            limit, end_offset = mark.position, mark.next_offset
        elif mark is not None:
            limit, end_offset = stat.st_size, None  # sealed before the mark's segment began
        elif side is not None:
            limit, end_offset = side.checkpoint.covered_size, side.checkpoint.next_offset
        else:
            continue  # no mark, no side file: nothing known to be committed
        if side is not None and side.checkpoint.covered_size == limit:
            end_offset = side.checkpoint.next_offset
        if limit > HEADER_SIZE:
            refs.append(StreamSegmentRef(sid, str(path), limit, file_identity(stat), end_offset, side))
    return StreamSnapshot(meta.vhost, meta.stream, str(directory), meta.created_at_ms, mark, tuple(refs))


class CommittedEnd(NamedTuple):
    """Where a snapshot's committed records end: ``next`` is one past the last one, at byte
    ``position`` of segment ``segment`` (0: the segment's first record)."""

    next: int
    segment: int
    position: int


def committed_end(snapshot: StreamSnapshot) -> CommittedEnd:
    mark, segments = snapshot.mark, snapshot.segments
    if mark is not None:
        next_offset = mark.next_offset
        end_segment = mark.segment_id if mark.segment_id is not None else mark.next_offset
        end_position = mark.position if mark.segment_id is not None else 0
    elif segments:
        last = segments[-1]
        next_offset = last.end_offset if last.end_offset is not None else last.segment_id
        end_segment, end_position = last.segment_id, last.limit
    else:
        next_offset, end_segment, end_position = 0, 0, 0
    return CommittedEnd(next_offset, end_segment, 0 if end_position <= HEADER_SIZE else end_position)


def _stream_directories(root: Path) -> dict[Path, StreamMeta]:
    found: dict[Path, StreamMeta] = {}
    try:
        vhost_dirs = sorted(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return found
    for vhost_dir in vhost_dirs:
        try:
            stream_dirs = sorted(vhost_dir.iterdir()) if vhost_dir.is_dir() else []
        except FileNotFoundError:
            continue
        for stream_dir in stream_dirs:
            meta = read_stream_meta(stream_dir)
            if meta is not None:
                found[stream_dir] = meta
    return found


# ---- partitions --------------------------------------------------------------------------


def plan_stream_parts(
    data_dir: str | Path,
    request: ScanRequest,
    vhost: str | None = None,
    queue: str | None = None,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    accepts: Callable[[str, str], bool] | None = None,
) -> list[StreamPart]:
    """The partitions of every matching stream (``accepts(vhost, stream)`` narrows further) that
    hold rows ``request`` asks for; none when its states leave out streams' ``in_stream``."""
    parts = []
    for snapshot in plan_streams(data_dir, vhost, queue):
        if accepts is None or accepts(snapshot.vhost, snapshot.stream):
            parts.extend(stream_parts_of(snapshot, request, partition_bytes))
    return parts


def stream_parts_of(snapshot: StreamSnapshot, request: ScanRequest,
                    partition_bytes: int = DEFAULT_PARTITION_BYTES) -> list[StreamPart]:
    """The partitions of one stream's snapshot that hold rows ``request`` asks for."""
    if request.states is not None and STREAM_STATE not in request.states:
        return []
    intervals = offset_intervals(request.seq_min, request.seq_max, request.seq_values)
    if intervals == []:
        return []
    time_min = -_INF if request.published_min_us is None else -(-request.published_min_us // 1000)
    time_max = _INF if request.published_max_us is None else request.published_max_us // 1000
    return stream_parts(snapshot, intervals, time_min, time_max, partition_bytes)


class _Boundary(NamedTuple):
    """A file position where a record starts (or the committed end), with what is known there."""

    position: int  # 0: the first record after the header
    offset: int | None  # the record's offset (None: unknown, only at the end)
    timestamp: float  # the record's timestamp; a lower bound where not known exactly (-inf)


def offset_intervals(seq_min: int | None, seq_max: int | None,
                     seq_values: tuple[int, ...] | None) -> list[tuple[float, float]] | None:
    """The offsets asked for as sorted disjoint closed intervals; None for all of them."""
    if seq_values is None:
        if seq_min is None and seq_max is None:
            return None
        low = -_INF if seq_min is None else seq_min
        high = _INF if seq_max is None else seq_max
        return [(low, high)] if low <= high else []
    intervals: list[tuple[float, float]] = []
    for value in seq_values:
        if (seq_min is not None and value < seq_min) or (seq_max is not None and value > seq_max):
            continue
        if intervals and intervals[-1][1] + 1 >= value:
            intervals[-1] = (intervals[-1][0], max(intervals[-1][1], value))
        else:
            intervals.append((value, value))
    return intervals


def stream_parts(
    snapshot: StreamSnapshot,
    intervals: list[tuple[float, float]] | None = None,
    time_min_ms: float = -_INF,
    time_max_ms: float = _INF,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
) -> list[StreamPart]:
    """The partitions that read the records of ``snapshot`` with an offset in ``intervals`` (None:
    any) and a timestamp in [``time_min_ms``, ``time_max_ms``] (see the module docstring)."""
    parts: list[StreamPart] = []
    for seg, span in zip(snapshot.segments, _spans(snapshot.segments)):
        if span.last_ts < time_min_ms or span.first_ts > time_max_ms:
            continue
        wanted = [(-_INF, _INF)] if intervals is None else intervals
        wanted = [(a, b) for a, b in wanted if a <= span.high and b >= span.low]
        if not wanted:
            continue
        bounds = _boundaries(seg, span.first_ts)
        for first, last in _ranges(bounds, wanted, time_min_ms, time_max_ms):
            for a, b in _split(bounds, first, last, partition_bytes):
                start, end = bounds[a], bounds[b]
                assert start.offset is not None
                parts.append(StreamPart(snapshot.vhost, snapshot.stream, seg.segment_id, seg.path, seg.identity,
                                        snapshot.created_at_ms, start.position, start.offset, end.position,
                                        end.offset))
    return parts


class _Span(NamedTuple):
    """What is known of a segment's offsets and timestamps, bounds included."""

    low: int
    high: float  # its last offset, or a bound above it
    first_ts: float  # its first timestamp, or a bound below it
    last_ts: float  # its last timestamp, or a bound above it


def _spans(segments: tuple[StreamSegmentRef, ...]) -> list[_Span]:
    """The ``_Span`` of each segment, from its side file and its neighbours' (offsets and
    timestamps never decrease from one segment to the next)."""
    exact: list[tuple[float, float]] = []
    for seg in segments:
        side = seg.side
        if side is None or not side.checkpoint.record_count:
            exact.append((-_INF, _INF))
            continue
        # A side file may cover more than was committed at planning: its last timestamp still bounds.
        covers_all = side.checkpoint.covered_size >= seg.limit
        exact.append((side.checkpoint.first_timestamp, side.checkpoint.last_timestamp if covers_all else _INF))
    spans = []
    for k, seg in enumerate(segments):
        first_ts, last_ts = exact[k]
        if first_ts == -_INF and k > 0 and exact[k - 1][1] != _INF:
            first_ts = exact[k - 1][1]
        if last_ts == _INF and k + 1 < len(segments) and exact[k + 1][0] != -_INF:
            last_ts = exact[k + 1][0]
        if seg.end_offset is not None:
            high: float = seg.end_offset - 1
        elif k + 1 < len(segments):
            high = segments[k + 1].segment_id - 1
        else:
            high = _INF
        spans.append(_Span(seg.segment_id, high, first_ts, last_ts))
    return spans


def _boundaries(seg: StreamSegmentRef, first_ts: float) -> list[_Boundary]:
    """The known record boundaries of ``seg`` in file order, ending with its committed end;
    ``first_ts`` is its first record's timestamp or a bound below it."""
    side = seg.side
    bounds = [_Boundary(0, seg.segment_id, first_ts)]
    end_position = seg.limit
    if side is not None:
        covered = side.checkpoint.covered_size
        below = min(covered, end_position)  # entries past the committed end are not used
        for offset, timestamp, position in zip(side.offsets, side.timestamps, side.positions):
            if position >= below:
                break
            if position <= HEADER_SIZE and offset == seg.segment_id:
                bounds[0] = _Boundary(0, offset, timestamp)  # the first record is an entry
            else:
                bounds.append(_Boundary(position, offset, timestamp))
        if covered < end_position:
            bounds.append(_Boundary(covered, side.checkpoint.next_offset, side.checkpoint.last_timestamp))
    bounds.append(_Boundary(end_position, seg.end_offset, _INF))
    return bounds


def _ranges(bounds: list[_Boundary], intervals: list[tuple[float, float]],
            time_min: float, time_max: float) -> list[tuple[int, int]]:
    """Ranges of boundary indexes [first, last) that hold every record asked for, merged."""
    n = len(bounds) - 1  # the last boundary is the end: no record starts there
    offsets = [b.offset for b in bounds[:n] if b.offset is not None]  # all known (only the end may not be)
    timestamps = [b.timestamp for b in bounds[:n]]
    # Timestamps: records before the last boundary with a timestamp below time_min are all older;
    # records from the first boundary with a timestamp above time_max on are all newer.
    t_first = max(bisect_left(timestamps, time_min) - 1, 0)
    t_last = bisect_right(timestamps, time_max)
    if t_first >= t_last:
        return []
    ranges: list[tuple[int, int]] = []
    for low, high in intervals:
        first = max(bisect_right(offsets, low) - 1, 0)
        last = bisect_right(offsets, high)  # the first boundary whose offset is above ``high``
        first, last = max(first, t_first), min(last, t_last)
        if first >= last:
            continue
        if ranges and first <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], last))
        else:
            ranges.append((first, last))
    return ranges


def _split(bounds: list[_Boundary], first: int, last: int, partition_bytes: int) -> list[tuple[int, int]]:
    """Cut the boundary range [first, last) at boundaries into pieces of about ``partition_bytes``."""
    pieces = []
    a = first
    while a < last:
        start = max(bounds[a].position, HEADER_SIZE)
        b = a + 1
        while b < last and bounds[b].position - start < partition_bytes:
            b += 1
        pieces.append((a, b))
        a = b
    return pieces
