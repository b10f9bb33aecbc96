"""The driver's side of the streaming source: what exists now, where a batch ends, its partitions.

Every batch is a pair of offsets (``streaming_offsets``): for each queue and stream, the record
it starts at and the record it ends before, each named exactly (``seq``, segment, byte position).
Spark writes the end to the checkpoint before it runs the batch, so a batch run again after a
crash (``partitions(start, end)`` with the same two offsets) reads the same records:

* a **stream**'s batch reads offsets ``start.next`` .. ``end.next - 1``, all committed when the
  end was chosen (its commit mark, docs/stream-files.md section 8.1), cut at side-index entries
  into byte ranges of about ``partition_bytes``;
* a **queue**'s batch reads the message records with ``seq`` in that range, from the start
  position on in the start segment, through the segments after it, up to the end position in
  the end segment. Queue segments have no index, so the driver walks the new bytes to find the
  end (``streaming_walk.walk_queue``) and keeps where records start, about every
  ``partition_bytes``, to cut a long segment into several partitions.

``latest(start, ...)`` first reconciles the start with what the files hold now (retention,
deletion, a queue or stream created or declared again: the outcomes of ``failOnDataLoss``, see
``data_loss``), then moves each end forward: to everything committed, or, with a read limit
(``maxRecordsPerTrigger``), by shares of it: every queue and stream with records waiting gets an
equal share, and what one cannot use goes to the others (always in key order, so the same files
give the same offsets).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple, Union

from persistence.segment_file import CorruptSegmentHeader, segment_file_name
from persistence.stream_cursor import CorruptStreamRecord
from persistence.segment_layout import QUEUE_META, queue_path
from persistence.segment_reader import FileIdentity
from persistence.stream_segment import HEADER_SIZE, stream_path
from spark.data_loss import CorruptQueueRecord, DataLoss, LossPolicy
from spark.options import parse_nodes
from spark.queue_range_reader import QueueRangePart, ReplicaQueuePart
from spark.queue_snapshot import SegmentRef, plan
from spark.stream_snapshot import StreamPart, StreamSegmentRef, StreamSnapshot, committed_end, plan_streams, \
    read_stream_meta, snapshot_stream
from spark.replicated_queue_log import ReplicatedQueue, first_published_at, plan_replicated_queues
from spark.replicated_queues import is_replicated, streaming_refusal
from spark.replicated_streams import covering, gone_part, plan_replicated_streams, sealed_size
from spark.streaming_offsets import QUEUE, REPLICATED, STREAM, Offsets, Position, SourceKey, Starting
from spark.streaming_walk import stream_boundaries, walk_queue, walk_stream


class Scope(NamedTuple):
    """What a query reads: ``nodes`` are (label, data directory) pairs; the rest as the options."""

    nodes: tuple[tuple[str, str], ...]
    vhost: str | None
    queue: str | None
    include_internal: bool
    partition_bytes: int
    min_partitions: int = 2
    skip_replicated_queues: bool = False  # the replicatedQueues option: skip, or (False) fail

    @property
    def split(self) -> "Split":
        return Split(self.partition_bytes, self.min_partitions)


class Split(NamedTuple):
    """How a batch is cut into partitions: pieces of about ``partition_bytes``, and at least
    ``min_partitions`` of them when the batch is large enough (pieces of ``MIN_PIECE`` at least)."""

    partition_bytes: int
    min_partitions: int = 2

    @property
    def smallest(self) -> int:
        """The smallest piece worth a partition of its own."""
        return min(MIN_PIECE, self.partition_bytes)


MIN_PIECE = 1024 * 1024


def choose_cuts(start: Position, end_segment: int, end_position: int, segment_starts: list[tuple[int, int, int]],
                candidates: list[tuple[int, int, int]], spans: int, split: Split) -> tuple[tuple[int, int, int], ...]:
    """The batch's cuts, the start first (docs/spark.md, "Offsets"): every segment start inside it,
    and of the candidate record boundaries inside a segment, those about every piece's length:
    ``partition_bytes``, or less so that a batch of ``spans`` bytes makes ``min_partitions``."""
    piece = max(split.smallest, min(split.partition_bytes, spans // max(split.min_partitions, 1)))
    low, high = (start.segment, start.position), (end_segment, end_position)
    points = sorted({c for c in segment_starts + candidates if low < (c[0], c[1]) < high})
    starts = {(c[0], c[1]) for c in segment_starts}
    cuts = [(start.segment, start.position, start.next)]
    last_segment, last_position = start.segment, max(start.position, HEADER_SIZE)
    for point in points:
        if (point[0], point[1]) in starts:
            cuts.append(point)
            last_segment, last_position = point[0], HEADER_SIZE
        elif point[0] == last_segment and point[1] - last_position >= piece and _leaves_room(point, piece, high):
            cuts.append(point)
            last_position = point[1]
    return tuple(cuts)


def _leaves_room(point: tuple[int, int, int], piece: int, high: tuple[int, int]) -> bool:
    """A cut this close to the batch's end in the same segment would leave a sliver: not worth it."""
    return point[0] != high[0] or high[1] - point[1] >= piece // 2


class StreamSource(NamedTuple):
    """A stream as its files are now: its committed snapshot."""

    key: SourceKey
    directory: str
    created: int
    snapshot: StreamSnapshot
    first: int  # the first offset still stored
    next: int  # one past the last committed record
    end_segment: int  # where the committed records end
    end_position: int
    copies: tuple[tuple[str, StreamSnapshot], ...] = ()  # a replicated stream's: ``snapshot``'s first


class QueueSource(NamedTuple):
    """A durable queue as its files are now: its segments, live and archived, measured."""

    key: SourceKey
    created: int  # of its live directory's queue.json; 0 when only archived segments are left
    has_archive: bool  # its seqs then go on across a delete and declare again
    segments: tuple[SegmentRef, ...]


class ReplicatedQueueSource(NamedTuple):
    """A replicated queue as its copies are now (``spark.replicated_queue_log``); its positions are
    log indices (``segment`` is the index too, ``position`` 0)."""

    key: SourceKey
    created: int  # its group's incarnation, as a number
    queue: ReplicatedQueue

    @property
    def next(self) -> int:
        return self.queue.next


Source = Union[StreamSource, QueueSource, ReplicatedQueueSource]


def list_sources(scope: Scope) -> dict[SourceKey, Source]:
    """Every matching queue and stream of every node, as its files are now; a replicated stream or
    queue once, for all its copies (``spark.replicated_streams``, ``spark.replicated_queue_log``).
    A replicated queue no copy of which has a commit mark (a broker before marks) fails the query
    (``spark.replicated_queues``), or, with ``replicatedQueues=skip``, is left out."""
    found: dict[SourceKey, Source] = {}
    for label, directory in scope.nodes:
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"amqp-queue: no data directory {directory}")
        for snapshot in plan_streams(directory, scope.vhost, scope.queue):
            key = SourceKey(label, STREAM, snapshot.vhost, snapshot.stream)
            found[key] = _stream_source(key, snapshot)
        for queue in plan(directory, scope.vhost, scope.queue, scope.include_internal):
            if is_replicated(directory, queue.vhost, queue.queue):
                continue  # read from its replica logs, below
            key = SourceKey(label, QUEUE, queue.vhost, queue.queue)
            live = queue_path(Path(directory), queue.vhost, queue.queue)
            archive = queue_path(Path(directory), queue.vhost, queue.queue, archive=True)
            found[key] = QueueSource(key, _created(live), archive.is_dir(), queue.segments)
    for replicated in plan_replicated_streams(scope.nodes, scope.vhost, scope.queue):
        key = SourceKey(REPLICATED, STREAM, replicated.vhost, replicated.stream)
        found[key] = _stream_source(key, replicated.primary, replicated.identity)._replace(copies=replicated.copies)
    queues, unmarked = plan_replicated_queues(scope.nodes, scope.vhost, scope.queue, scope.include_internal)
    if unmarked and not scope.skip_replicated_queues:
        raise ValueError(streaming_refusal(*unmarked[0]))
    for queue_log in queues:
        key = SourceKey(REPLICATED, QUEUE, queue_log.vhost, queue_log.queue)
        found[key] = ReplicatedQueueSource(key, queue_log.identity, queue_log)
    return found


def _stream_source(key: SourceKey, snapshot: StreamSnapshot, created: int | None = None) -> StreamSource:
    end = committed_end(snapshot)
    first = snapshot.segments[0].segment_id if snapshot.segments else end.next
    return StreamSource(key, snapshot.directory, snapshot.created_at_ms if created is None else created, snapshot,
                        first, end.next, end.segment, end.position)


def _created(directory: Path) -> int:
    try:
        return int(json.loads((directory / QUEUE_META).read_bytes()).get("created_at_ms", 0))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return 0


# ---- starting positions ----------------------------------------------------------------------


def earliest(source: Source) -> Position:
    """Every record still stored (a replicated queue: from index 1, its snapshot's live messages
    standing for the entries compacted away)."""
    if isinstance(source, ReplicatedQueueSource):
        return Position(source.created, 1, 1, 1, 0)
    if isinstance(source, StreamSource):
        return Position(source.created, source.first, source.first, source.first, 0)
    first = source.segments[0].segment_id if source.segments else 0
    return Position(source.created, first, first, first, 0)


def starting_position(source: Source, starting: Starting, policy: LossPolicy, split: Split) -> Position:
    """Where a query that has no checkpoint starts reading ``source`` (the ``startingOffsets`` option)."""
    mode, value = starting.for_source(source.key.vhost, source.key.name)
    if mode == "earliest":
        return earliest(source)
    if mode == "latest":
        position = end_now(source, policy, split)
        return position._replace(first=position.next)
    if isinstance(source, ReplicatedQueueSource):
        # A log index ("seq" in startingOffsets JSON), or the first message published at or after it.
        index = value if mode == "seq" else first_published_at(source.queue, value)
        index = max(1, min(index, source.next))
        return Position(source.created, index, index, index, 0)
    if isinstance(source, StreamSource):
        return _stream_start_at(source, mode, value)
    return _queue_start_at(source, mode, value, policy, split)


def _stream_start_at(source: StreamSource, mode: str, value: int) -> Position:
    """The first record at or after offset ``value`` ("seq") or timestamp ``value`` ("timestamp")."""
    for k, seg in enumerate(source.snapshot.segments):
        seg_end = seg.end_offset if seg.end_offset is not None else (
            source.snapshot.segments[k + 1].segment_id if k + 1 < len(source.snapshot.segments) else source.next)
        if mode == "seq":
            if value >= seg_end:
                continue
            target = max(value, seg.segment_id)
            boundary = _best_boundary(seg, target, None)
            position, offset = walk_stream(seg.path, boundary[1], boundary[0], seg.limit, to_offset=target)
        else:
            side = seg.side
            if side is not None and side.checkpoint.record_count and side.checkpoint.covered_size >= seg.limit \
                    and side.checkpoint.last_timestamp < value:
                continue
            boundary = (seg.segment_id, 0)
            if side is not None:
                for offset_, timestamp, position_ in zip(side.offsets, side.timestamps, side.positions):
                    if timestamp >= value or position_ >= seg.limit:
                        break
                    boundary = (int(offset_), int(position_))
            position, offset = walk_stream(seg.path, boundary[1], boundary[0], seg.limit, min_timestamp_ms=value)
            if position >= seg.limit:
                continue
        return Position(source.created, offset, offset, seg.segment_id, 0 if position <= HEADER_SIZE else position)
    return Position(source.created, source.next, source.next, source.end_segment, source.end_position)


def _queue_start_at(source: QueueSource, mode: str, value: int, policy: LossPolicy, split: Split) -> Position:
    """The first message record with ``seq >= value`` ("seq") or published at or after ``value``
    ("timestamp"); a queue's publish times follow its seqs (the broker's clock permitting)."""
    from persistence.segment_reader import snapshot_scan
    from spark.segment_index import index_segment

    for k, seg in enumerate(source.segments):
        if mode == "seq":
            if k + 1 < len(source.segments) and source.segments[k + 1].segment_id <= value:
                continue  # every seq in it is below the next segment's id
            walk = walk_queue(seg.path, 0, seg.size, min_seq=value, max_count=1, tail=True, split=MIN_PIECE)
            if walk is not None and walk.found:
                at, seq = walk.boundaries[0]
                return Position(source.created, seq, seq, seg.segment_id, at)
            continue
        scan = snapshot_scan(Path(seg.path), seg.size, seg.identity)
        if scan is None:
            continue
        index = index_segment(scan.data, scan.header.header_length)
        later = index.published_ms >= value
        if later.any():
            k = int(later.argmax())
            seq = int(index.seqs[k])
            at = int(index.starts[k]) - 9  # the record starts 9 bytes before its payload
            return Position(source.created, seq, seq, seg.segment_id, at)
    end = end_now(source, policy, split)
    return end._replace(first=end.next)


# ---- reconciling a start offset with the files -------------------------------------------------


def reconcile(key: SourceKey, start: Position | None, source: Source | None, policy: LossPolicy) -> Position | None:
    """The position to go on from for ``key``, given what the files hold now (None: nothing to
    read of it). Records that are gone are ``policy.lost``: an error, or skipped and counted."""
    if start is None:
        return None if source is None else earliest(source)
    start = start._replace(cuts=())  # the previous batch's
    if source is None:
        what = "offset" if key.kind == STREAM else "seq"
        policy.lost(f"{key.describe()} was deleted; records published to it after the query's last look "
                    f"({what} {start.next}) may not have been read")
        return None
    if isinstance(source, ReplicatedQueueSource):
        return _reconcile_replicated_queue(key, start, source, policy)
    if isinstance(source, StreamSource):
        if source.created != start.created:
            policy.lost(f"{key.describe()} was deleted and declared again; records of the old one after offset "
                        f"{start.next} may not have been read")
            return earliest(source)._replace(lost=start.lost)
        if start.next < source.first:
            gone = source.first - start.next
            policy.lost(f"{key.describe()}: retention removed offsets {start.next}..{source.first - 1} before the "
                        f"query read them", gone)
            return Position(start.created, start.first, source.first, source.first, 0, start.lost + gone)
        return start
    if source.created != start.created and source.created and start.created and not source.has_archive:
        policy.lost(f"{key.describe()} was deleted and declared again; messages of the old one after seq "
                    f"{start.next} may not have been read")
        return earliest(source)._replace(lost=start.lost)
    if source.created != start.created and source.created:
        start = start._replace(created=source.created)  # archived: its seqs go on
    ids = [seg.segment_id for seg in source.segments]
    if start.segment in ids or not ids:
        return start
    after = [i for i in ids if i > start.segment]
    if not after:
        return start
    resume = after[0]
    gone = max(0, resume - start.next)
    if gone:
        policy.lost(f"{key.describe()}: the segment it was reading ({start.segment}) was removed (its messages "
                    f"were settled; archiving is off) before the query read it to the end: messages "
                    f"{start.next}..{resume - 1}, those of them that were persistent, were not read", gone)
    return Position(start.created, start.first, max(start.next, resume), resume, 0, start.lost + gone)


def _reconcile_replicated_queue(key: SourceKey, start: Position, source: ReplicatedQueueSource,
                                policy: LossPolicy) -> Position:
    if source.created != start.created:
        policy.lost(f"{key.describe()} was deleted and declared again; entries of the old one after index "
                    f"{start.next} may not have been read")
        return earliest(source)._replace(lost=start.lost)
    stored_from = source.queue.stored_from
    if start.next < stored_from and not start.next == start.first == 1:  # (earliest starts with what is stored)
        policy.lost(f"{key.describe()}: compaction removed entries {start.next}..{stored_from - 1} from every copy "
                    f"before the query read them; the messages among them not settled then are read from the "
                    f"snapshot, the settled ones are gone")
    return start


# ---- where a batch ends ----------------------------------------------------------------------


class _NumberedEnd:
    """A batch end over records numbered with no gaps (a stream's offsets, a replicated queue's log
    indices): it moves by counting, up to ``cap``."""

    def __init__(self, start: Position, cap: int) -> None:
        self.start, self.cap, self.next = start, cap, start.next

    def advance(self, records: int | None) -> int:
        """Move the end forward by up to ``records`` records (None: all there are); how many it moved."""
        new = self.cap if records is None else min(self.cap, self.next + records)
        moved = max(new - self.next, 0)
        self.next += moved
        return moved


class StreamEnd(_NumberedEnd):
    """A stream's batch end, moved forward by ``advance``; ``position`` names it exactly, with the
    batch's cuts."""

    def __init__(self, source: StreamSource, start: Position, target: Position | None, split: Split,
                 policy: LossPolicy) -> None:
        super().__init__(start, source.next if target is None else min(source.next, target.next))
        self.source, self.target, self.split, self.policy = source, target, split, policy

    def position(self) -> Position:
        start, source = self.start, self.source
        if self.next <= start.next:
            return start
        if self.next == source.next:
            segment, position = source.end_segment, source.end_position
        elif self.target is not None and self.next == self.target.next:
            segment, position = self.target.segment, self.target.position
        else:
            try:
                segment, position = self._locate(self.next)
            except CorruptStreamRecord as err:  # the walk to the end met damage
                self.policy.damaged(err)  # raises with failOnDataLoss=true
                segment, position = self._known_end_near(self.next)
        end = Position(start.created, start.first, self.next, segment, position, start.lost)
        return end._replace(cuts=self._cuts(end))

    def _locate(self, offset: int) -> tuple[int, int]:
        seg = next(s for s in reversed(self.source.snapshot.segments) if s.segment_id <= offset)
        if seg.segment_id == offset:
            return seg.segment_id, 0
        at_offset, at_position = _best_boundary(seg, offset, self.start)
        position, found = walk_stream(seg.path, at_position, at_offset, seg.limit, to_offset=offset)
        if found != offset:
            raise DataLoss(f"amqp-queue: {self.source.key.describe()}: offset {offset} not found in {seg.path}")
        return seg.segment_id, position

    def _known_end_near(self, offset: int) -> tuple[int, int]:
        """A known record boundary to end at instead of ``offset`` (damage lies between them): the
        last before it, or if that is the start, the first after it (so the query moves on). Sets
        ``next`` to its offset."""
        known = [(self.source.next, self.source.end_segment, self.source.end_position)]
        for seg in self.source.snapshot.segments:
            known.append((seg.segment_id, seg.segment_id, 0))
            if seg.side is not None:
                covered = min(seg.side.checkpoint.covered_size, seg.limit)
                known.extend((int(o), seg.segment_id, int(p)) for o, p in zip(seg.side.offsets, seg.side.positions)
                             if p < covered)
        before = [k for k in known if self.start.next < k[0] <= offset]
        chosen = max(before) if before else min(k for k in known if k[0] > offset)
        self.next = chosen[0]
        return chosen[1], chosen[2]

    def _cuts(self, end: Position) -> tuple[tuple[int, int, int], ...]:
        """The start, every segment start up to ``end``, and record boundaries about every piece
        inside a segment: side-index entries, and where the side index does not reach (the newest
        part of the newest segment), boundaries a walk of the records finds."""
        start = self.start
        segment_starts: list[tuple[int, int, int]] = []
        candidates: list[tuple[int, int, int]] = []
        spans = 0
        for seg in self.source.snapshot.segments:
            if seg.segment_id < start.segment or seg.segment_id > end.segment:
                continue
            if seg.segment_id == end.segment and not end.position:
                continue
            if seg.segment_id > start.segment:
                segment_starts.append((seg.segment_id, 0, seg.segment_id))
            low = start.position if seg.segment_id == start.segment else 0
            high = end.position if seg.segment_id == end.segment else seg.limit
            spans += high - max(low, HEADER_SIZE)
            known = (max(low, HEADER_SIZE), start.next if seg.segment_id == start.segment else seg.segment_id)
            side = seg.side
            if side is not None:
                covered = min(side.checkpoint.covered_size, high)
                for entry_offset, entry_position in zip(side.offsets, side.positions):
                    if low < entry_position < covered:
                        candidates.append((seg.segment_id, int(entry_position), int(entry_offset)))
                if covered > known[0] and covered < high:
                    known = (covered, side.checkpoint.next_offset)
            if high - known[0] > self.split.smallest and (side is None or side.checkpoint.covered_size < high):
                try:
                    found = stream_boundaries(seg.path, known[0], known[1], high, self.split.smallest)
                except CorruptStreamRecord:
                    found = []  # the partition reading it reports the damage
                candidates.extend((seg.segment_id, p, o) for p, o in found)
        return choose_cuts(start, end.segment, end.position, segment_starts, candidates, spans, self.split)


def _best_boundary(seg: StreamSegmentRef, offset: int, start: Position | None) -> tuple[int, int]:
    """The known record boundary (offset, position) of ``seg`` closest before ``offset``."""
    best = (seg.segment_id, 0)
    if start is not None and start.segment == seg.segment_id and best[0] <= start.next <= offset:
        best = (start.next, start.position)
    side = seg.side
    if side is not None:
        covered = min(side.checkpoint.covered_size, seg.limit)
        for entry_offset, entry_position in zip(side.offsets, side.positions):
            if entry_offset > offset or entry_position >= covered:
                break
            if entry_offset > best[0]:
                best = (int(entry_offset), int(entry_position))
    return best


class QueueEnd:
    """A queue's batch end, moved forward by ``advance`` (which walks the segments from the start);
    ``position`` names it exactly, with the batch's cuts."""

    def __init__(self, source: QueueSource, start: Position, target: Position | None, policy: LossPolicy,
                 split: Split) -> None:
        self.source, self.start, self.target, self.policy, self.split = source, start, target, policy, split
        segments = [s for s in source.segments if s.segment_id >= start.segment]
        if target is not None:
            segments = [s for s in segments if s.segment_id < target.segment
                        or (s.segment_id == target.segment and target.position)]
        self.segments = segments
        self.k = 0  # the segment the walk is in
        resumes = bool(segments) and segments[0].segment_id == start.segment and start.position <= segments[0].size
        self.at = start.position if resumes else 0  # (a hint: past the end, the segment was cut back)
        self.next = start.next
        self.end = start  # the end so far
        self.segment_starts: list[tuple[int, int, int]] = []
        self.candidates: list[tuple[int, int, int]] = []  # message records about every split.smallest bytes
        self.done = not segments

    def advance(self, records: int | None) -> int:
        """Move the end forward by up to ``records`` message records (None: all there are); how many."""
        moved = 0
        while not self.done and (records is None or moved < records):
            seg = self.segments[self.k]
            last = self.k == len(self.segments) - 1
            limit = seg.size
            if self.target is not None and seg.segment_id == self.target.segment:
                limit = min(limit, self.target.position)
            try:
                walk = walk_queue(seg.path, self.at, limit, min_seq=self.next,
                                  max_count=None if records is None else records - moved,
                                  tail=last and self.target is None, split=self.split.smallest)
            except CorruptSegmentHeader as err:
                self.policy.damaged(CorruptQueueRecord(seg.path, 0, f"unreadable segment header: {err}"))
                walk = None  # failOnDataLoss=false: its messages are skipped, as recovery sets it aside
            if walk is None:  # removed since it was listed: what follows is in later segments
                self._next_segment()
                continue
            moved += walk.found
            if walk.found:
                assert walk.last_seq is not None
                self.candidates.extend((seg.segment_id, position, seq) for position, seq in walk.boundaries)
                self.next = walk.last_seq + 1
                self.end = Position(self.start.created, self.start.first, self.next, seg.segment_id, walk.end,
                                    self.start.lost)
            self.at = walk.walked_to
            if walk.damage is not None:
                self.policy.damaged(CorruptQueueRecord(seg.path, walk.damage.position, walk.damage.reason))
                if walk.damage.resumes_at is not None:  # (only with failOnDataLoss=false: it raised otherwise)
                    self.at = walk.damage.resumes_at
                    continue
                if last:
                    self.done = True  # the newest segment: nothing after the damage can be read yet
                else:
                    self._next_segment()
                continue
            if records is not None and moved >= records:
                break
            if last:
                self.done = True
            else:
                self._next_segment()
        return moved

    def _next_segment(self) -> None:
        self.k += 1
        self.at = 0
        if self.k >= len(self.segments):
            self.done = True
            return
        seg = self.segments[self.k]
        # Every message before this segment has a lower seq than its id (docs/queue-files.md section 1).
        self.next = max(self.next, seg.segment_id)
        self.segment_starts.append((seg.segment_id, 0, self.next))
        self.end = Position(self.start.created, self.start.first, self.next, seg.segment_id, 0, self.start.lost)

    def position(self) -> Position:
        if self.end is self.start:
            return self.start
        end, start = self.end, self.start
        spans = 0
        for seg in self.segments:
            if seg.segment_id > end.segment:
                break
            low = start.position if seg.segment_id == start.segment else 0
            high = end.position if seg.segment_id == end.segment else seg.size
            spans += max(high - max(low, HEADER_SIZE), 0)
        cuts = choose_cuts(start, end.segment, end.position, self.segment_starts, self.candidates, spans, self.split)
        return end._replace(cuts=cuts)


class ReplicatedQueueEnd(_NumberedEnd):
    """A replicated queue's batch end, by log index: every entry up to the furthest commit mark
    (or ``records`` more entries: a limit counts entries, so a batch has at most that many rows)."""

    def __init__(self, source: ReplicatedQueueSource, start: Position, target: Position | None, split: Split) -> None:
        super().__init__(start, source.next if target is None else min(source.next, target.next))
        self.split = split

    def position(self) -> Position:
        start = self.start
        if self.next <= start.next:
            return start
        count = self.next - start.next
        piece = max(MIN_ENTRIES, min(ENTRIES_PER_PARTITION, -(-count // max(self.split.min_partitions, 1))))
        cuts = tuple((i, 0, i) for i in range(start.next, self.next, piece))
        return Position(start.created, start.first, self.next, self.next, 0, start.lost, cuts)


# A replicated queue's batch is cut by entries (their sizes are not known without reading them):
# pieces of at most ENTRIES_PER_PARTITION, and min_partitions of them once a batch has more than
# min_partitions * MIN_ENTRIES.
ENTRIES_PER_PARTITION = 65536
MIN_ENTRIES = 4096


def plan_ends(sources: dict[SourceKey, Source], starts: Offsets, max_rows: int | None,
              targets: Offsets | None, policy: LossPolicy, split: Split, previous: Offsets | None = None) -> Offsets:
    """The end of the next batch for every key of ``starts`` (already reconciled), at most
    ``max_rows`` records in all (None: everything), none past ``targets`` (availableNow). Where
    nothing changed since ``previous`` (the batch's start as Spark has it), its position is kept
    as it was, so that Spark sees the same offsets and runs no batch."""
    ends: dict[SourceKey, StreamEnd | QueueEnd | ReplicatedQueueEnd] = {}
    for key in sorted(starts):
        source = sources.get(key)
        target = None if targets is None else targets.get(key)
        if source is None or (targets is not None and target is None):
            continue
        if isinstance(source, ReplicatedQueueSource):
            ends[key] = ReplicatedQueueEnd(source, starts[key], target, split)
        elif isinstance(source, StreamSource):
            ends[key] = StreamEnd(source, starts[key], target, split, policy)
        else:
            ends[key] = QueueEnd(source, starts[key], target, policy, split)
    if max_rows is None:
        for end in ends.values():
            end.advance(None)
    else:
        _share(list(ends.values()), max_rows)
    result = dict(starts)
    for key, end in ends.items():
        result[key] = end.position()
    for key, position in result.items():
        before = (previous or {}).get(key)
        if before is not None and _same_place(before, position) and not position.cuts:
            result[key] = before
    return result


def _same_place(a: Position, b: Position) -> bool:
    return (a.created, a.next, a.segment, a.position, a.lost) == (b.created, b.next, b.segment, b.position, b.lost)


def _share(ends: list, budget: int) -> None:
    """Give each end an equal share of ``budget`` records; what one cannot take goes to the rest."""
    pending = ends
    while pending and budget > 0:
        share = max(budget // len(pending), 1)
        still = []
        for end in pending:
            if budget <= 0:
                break
            want = min(share, budget)
            got = end.advance(want)
            budget -= got
            if got == want:
                still.append(end)
        pending = still


# ---- partitions ------------------------------------------------------------------------------


class Planned(NamedTuple):
    """One partition of a batch: what it reads, and the seqs (offsets) of the batch it keeps."""

    part: StreamPart | QueueRangePart | ReplicaQueuePart
    low: int
    high: int  # inclusive


def plan_partitions(scope: Scope, start: Offsets, end: Offsets, policy: LossPolicy) -> list[Planned]:
    """The partitions that read the records of the batch from ``start`` to ``end``: one between each
    two of the end's cuts (the first is where the batch starts reading: ``start``, or where
    ``latest`` went on from when records were gone) and the end, in that order, whatever the files
    hold now (a segment gone since gives a partition that reports it); the files give only paths
    and sizes."""
    directories = dict(scope.nodes)
    parts: list[Planned] = []
    for key in sorted(end):
        stop = end[key]
        begin = start.get(key)
        if not stop.cuts or (begin is not None and _same_place(begin, stop)):
            continue  # nothing read of it in this batch (its cuts, if any, are an earlier batch's)
        points = [*stop.cuts, (stop.segment, stop.position, stop.next)]
        ranges = [(a, b) for a, b in zip(points, points[1:]) if (a[0], a[1]) != (b[0], b[1])]
        if key.node == REPLICATED and key.kind == QUEUE:
            found: list = _replicated_queue_parts(key, scope, ranges, stop)
            parts.extend(Planned(part, part.low, part.high) for part in found)
            continue
        if key.node == REPLICATED:
            found = _replicated_stream_parts(key, scope, ranges, stop)
            parts.extend(Planned(part, stop.cuts[0][2], stop.next - 1) for part in found)
            continue
        directory = directories.get(key.node)
        if directory is None:
            continue
        if key.kind == STREAM:
            found = _stream_parts(key, directory, ranges, stop)
        else:
            found = _queue_parts(key, directory, ranges)
        parts.extend(Planned(part, stop.cuts[0][2], stop.next - 1) for part in found)
    return parts


Point = tuple[int, int, int]  # (segment, position, seq)


def _stream_parts(key: SourceKey, directory: str, ranges: list[tuple[Point, Point]], stop: Position) -> list[StreamPart]:
    stream_dir = stream_path(Path(directory), key.vhost, key.name)
    meta = read_stream_meta(stream_dir)
    snapshot = snapshot_stream(stream_dir, meta) if meta is not None and meta.created_at_ms == stop.created else None
    segments = {seg.segment_id: seg for seg in snapshot.segments} if snapshot is not None else {}
    parts = []
    for (seg_id, a, a_offset), (b_seg, b, b_offset) in ranges:
        seg = segments.get(seg_id)
        if seg is None:  # gone (retention, deletion): the partition reports it
            parts.append(StreamPart(key.vhost, key.name, seg_id, str(stream_dir / segment_file_name(seg_id)),
                                    FileIdentity(-1, -1), stop.created, a, a_offset, max(a, 1), b_offset))
            continue
        end = b if b_seg == seg_id else seg.limit
        parts.append(StreamPart(key.vhost, key.name, seg_id, seg.path, seg.identity, stop.created, a, a_offset, end,
                                b_offset))
    return parts


def _replicated_stream_parts(key: SourceKey, scope: Scope, ranges: list[tuple[Point, Point]],
                             stop: Position) -> list[StreamPart]:
    """A replicated stream's ranges, each read from a copy (of the incarnation the batch was planned
    on) that holds it committed now, with the others that do as alternatives; a range no copy holds
    committed any more (retention dropped it) gives a partition that reports it gone."""
    streams = plan_replicated_streams(scope.nodes, key.vhost, _exact(key.name), identity=stop.created)
    copies = next((r.copies for r in streams if r.vhost == key.vhost and r.stream == key.name), ())
    parts = []
    for (seg_id, a, a_offset), (b_seg, b, b_offset) in ranges:
        end = b if b_seg == seg_id else sealed_size(copies, seg_id)
        holders = [] if end is None else covering(copies, seg_id, end)
        if not holders:
            directory = copies[0][1].directory if copies else scope.nodes[0][1]
            parts.append(gone_part(key.vhost, key.name, directory, seg_id, stop.created, a, a_offset, b_offset))
            continue
        first, *others = holders
        assert end is not None
        parts.append(StreamPart(key.vhost, key.name, seg_id, first.path, first.identity, first.stream_created_at_ms,
                                a, a_offset, end, b_offset, tuple(others)))
    return parts


def _replicated_queue_parts(key: SourceKey, scope: Scope, ranges: list[tuple[Point, Point]],
                            stop: Position) -> list[ReplicaQueuePart]:
    """A replicated queue's ranges of log indices, each read from whichever copy (of the
    incarnation the batch was planned on) holds it committed when the task runs."""
    queues, _ = plan_replicated_queues(scope.nodes, key.vhost, _exact(key.name), True, identity=stop.created)
    queue = next((q for q in queues if q.vhost == key.vhost and q.queue == key.name), None)
    copies = tuple(c.directory for c in queue.copies) if queue is not None else ()
    stored_from = queue.stored_from if queue is not None else 1
    return [ReplicaQueuePart(key.vhost, key.name, copies, a[0], b[0] - 1, stored_from) for a, b in ranges]


def _queue_parts(key: SourceKey, directory: str, ranges: list[tuple[Point, Point]]) -> list[QueueRangePart]:
    segments: dict[int, SegmentRef] = {}
    for snapshot in plan(directory, key.vhost, _exact(key.name), include_internal=True):
        if snapshot.vhost == key.vhost and snapshot.queue == key.name:
            segments = {seg.segment_id: seg for seg in snapshot.segments}
    live = queue_path(Path(directory), key.vhost, key.name)
    parts = []
    for (seg_id, a, a_seq), (b_seg, b, b_seq) in ranges:
        seg = segments.get(seg_id)
        if seg is None:  # gone (settled and deleted): the partition reports it
            seg = SegmentRef(seg_id, 0, str(live / segment_file_name(seg_id)), None, 0, FileIdentity(-1, -1), 0,
                             False)
        end = b if b_seg == seg_id else seg.size
        start = a if a <= seg.size else 0  # past the end: cut back, read it from its start (seqs filter)
        parts.append(QueueRangePart(key.vhost, key.name, seg, start, max(end, start), a_seq, b_seq - 1))
    return parts


def _exact(name: str) -> str:
    """A queue name as the ``queue`` option's exact match (a name with glob characters too)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def end_now(source: Source, policy: LossPolicy, split: Split) -> Position:
    """Where the records of ``source`` stored now end (for a queue, only its newest segment is
    walked: every message before it has a lower seq than its id)."""
    if isinstance(source, ReplicatedQueueSource):
        return Position(source.created, source.next, source.next, source.next, 0)
    if isinstance(source, StreamSource):
        return Position(source.created, source.first, source.next, source.end_segment, source.end_position)
    if not source.segments:
        return earliest(source)
    tail = source.segments[-1]
    start = Position(source.created, tail.segment_id, tail.segment_id, tail.segment_id, 0)
    end = QueueEnd(source._replace(segments=(tail,)), start._replace(next=0), None, policy, split)
    end.advance(None)
    found = end.position()
    return start if found.next == 0 else found._replace(cuts=())


def targets_now(sources: dict[SourceKey, Source], policy: LossPolicy, split: Split) -> Offsets:
    """Where everything stored now ends, per queue and stream (``Trigger.AvailableNow``'s target)."""
    return {key: end_now(source, policy, split) for key, source in sorted(sources.items())}
