"""Replicated streams: one stream, several copies (one per node directory in ``path``), read once.

On a cluster a stream's files are in each member's ``<data_dir>/replicas/<group>/stream/``
(``persistence.replica_files``; docs/replication.md "Streams"). Every copy holds the same records
at the same offsets, byte for byte, in segments of the same names: the leader's records are
appended verbatim by each follower, and every copy rolls its segments at the same records. Each
copy's commit mark (docs/stream-files.md section 8.1) names only records a majority of the group
fsynced: the leader's is its commit index; a follower's is the leader's commit index as far as the
follower holds it fsynced and checked against the leader's log (Raft's min(leaderCommit, last new
entry): ``FollowerReplication.committed_index``), so no copy's mark ever leads what a majority
holds, and what a mark covered is never cut from any copy (only records no mark covers are cut
at a failover). So a committed range is the same bytes on every copy that has it committed.

``plan_replicated_streams(nodes, ...)`` finds the copies, groups them by stream and by the
group's ``incarnation`` (the same on every member; a stream deleted and declared again is another
one: the newest declared is read, by its copies' ``stream.json`` times), and orders each
stream's copies by how far their marks reach, the furthest first: the *primary*, whose snapshot
the planners use. Offsets are the stream's, whatever copy a range is read from, so a failover
(another copy leading, the old leader's copy left behind or coming back) changes nothing in them.

``covering(copies, ...)`` says which copies hold a range committed now; a partition is read from
the first that still has the file planned (``StreamPart.alternatives``, ``stream_reader``).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from persistence.replica_files import incarnation_number, stream_copies
from persistence.segment_reader import FileIdentity
from persistence.stream_commit_mark import mark_unwritten
from persistence.stream_segment import segment_file_name
from spark.queue_snapshot import matches
from spark.stream_snapshot import (
    SegmentCopy,
    StreamPart,
    StreamSnapshot,
    committed_end,
    read_stream_meta,
    snapshot_stream,
)


class ReplicatedStream(NamedTuple):
    """A replicated stream as its copies are now; ``copies`` (node label, snapshot), the copy whose
    mark reaches furthest first."""

    vhost: str
    stream: str
    identity: int  # its group's incarnation, as a number (the offsets' ``created``)
    copies: tuple[tuple[str, StreamSnapshot], ...]

    @property
    def primary(self) -> StreamSnapshot:
        return self.copies[0][1]


def plan_replicated_streams(nodes: tuple[tuple[str, str], ...], vhost: str | None = None,
                            queue: str | None = None, identity: int | None = None) -> list[ReplicatedStream]:
    """Every replicated stream with a copy in one of ``nodes`` ((label, data directory) pairs),
    narrowed by the ``vhost`` name and the ``queue`` name or glob; with ``identity``, only copies of
    that incarnation (a batch planned again reads the stream it was planned on)."""
    found: dict[tuple[str, str], dict[int, list[tuple[str, StreamSnapshot]]]] = {}
    for label, directory in nodes:
        for copy in stream_copies(directory):
            meta = read_stream_meta(copy.directory)
            if meta is None or (vhost is not None and meta.vhost != vhost):
                continue
            if mark_unwritten(copy.directory):
                continue  # no mark yet (a copy being opened): nothing known committed in it
            if queue is not None and not matches(meta.stream, queue):
                continue
            number = incarnation_number(copy.incarnation)
            if identity is not None and number != identity:
                continue
            snapshot = snapshot_stream(copy.directory, meta)
            if snapshot is not None:
                found.setdefault((meta.vhost, meta.stream), {}).setdefault(number, []).append((label, snapshot))
    streams = []
    for (vhost_name, stream), by_identity in sorted(found.items()):
        # Copies of two incarnations: the old group's replicas are being removed; the newest declared is read.
        number, copies = max(by_identity.items(), key=lambda kv: (max(s.created_at_ms for _, s in kv[1]), kv[0]))
        ordered = sorted(copies, key=lambda c: (-committed_end(c[1]).next, c[0]))
        streams.append(ReplicatedStream(vhost_name, stream, number, tuple(ordered)))
    return streams


def covering(copies: tuple[tuple[str, StreamSnapshot], ...], segment_id: int, end: int) -> list[SegmentCopy]:
    """The copies that hold segment ``segment_id`` committed up to byte ``end`` at least, the
    furthest-reaching first."""
    found = []
    for _, snapshot in copies:
        ref = next((r for r in snapshot.segments if r.segment_id == segment_id), None)
        if ref is not None and ref.limit >= end:
            found.append(SegmentCopy(ref.path, ref.identity, snapshot.created_at_ms))
    return found


def sealed_size(copies: tuple[tuple[str, StreamSnapshot], ...], segment_id: int) -> int | None:
    """The size of segment ``segment_id`` on a copy where it is sealed (the same on every copy)."""
    for _, snapshot in copies:
        mark = snapshot.mark
        if mark is None or mark.segment_id is None or mark.segment_id <= segment_id:
            continue
        for ref in snapshot.segments:
            if ref.segment_id == segment_id:
                return ref.limit
    return None


def with_alternatives(part: StreamPart, copies: tuple[tuple[str, StreamSnapshot], ...]) -> StreamPart:
    """``part`` (planned on one copy), with the other copies that hold its range committed."""
    others = [c for c in covering(copies, part.segment_id, part.end) if c.path != part.path]
    return part._replace(alternatives=tuple(others))


def gone_part(vhost: str, stream: str, directory: str, segment_id: int, created: int, start: int, start_offset: int,
              end_offset: int | None) -> StreamPart:
    """A partition for a range no copy holds committed any more: reading it reports the segment gone."""
    return StreamPart(vhost, stream, segment_id, str(Path(directory) / segment_file_name(segment_id)),
                      FileIdentity(-1, -1), created, start, start_offset, max(start, 1), end_offset)
