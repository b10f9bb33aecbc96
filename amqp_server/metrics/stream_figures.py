"""What a stream (`x-queue-type: stream`) shows operators: its offsets, segments, bytes on disk
and where each consumer reads, read from its log when the management API or Prometheus asks.

One definition for both, so `/api/queues/...` (`stream_first_offset`, ...) and `/metrics/per-object`
(`amqp_server_stream_first_offset`, ...) never disagree. Only committed (fsynced, readable)
records count: `last_offset` is the newest one a consumer can be given, None while the stream
holds none (then `first_offset` is where the next record will be).

On a cluster the node leading a replicated stream holds it (a `StreamQueue` over its replica's
files); another member node holds a stand-in and a replica of its own, whose figures
(`replica_figures`) are the leader's as of the last round of replication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from queues.arguments.queue_type_rules import STREAM
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from persistence.stream_log import StreamLog
    from queues.consumer import Consumer
    from queues.queue import Queue


@dataclass(frozen=True)
class StreamFigures:
    first_offset: int  # the first offset still stored (retention drops whole segments before it)
    last_offset: int | None  # the last committed record's offset; None when the stream holds none
    segments: int  # segment files
    disk_bytes: int  # bytes of the segment files (index side files not included)
    messages: int  # committed records stored, first to last (a stream's `messages`)


def stream_figures(queue: "Queue") -> StreamFigures | None:
    """The figures of a stream; None for a queue of another type (and for a stand-in of a
    stream another node leads: `log_figures` of this node's replica gives those)."""
    if not isinstance(queue, StreamQueue):
        return None
    return log_figures(queue.log)


def log_figures(log: "StreamLog") -> StreamFigures:
    """The figures of a stream's files: the stream's own, or a replica's of a replicated stream."""
    return StreamFigures(
        first_offset=log.first_offset,
        last_offset=log.last_offset,
        segments=len(log.segments()),
        disk_bytes=log.disk_bytes(),
        messages=log.next_offset - log.first_offset,
    )


def replica_figures(broker: "Broker", vhost: str, queue: "Queue") -> StreamFigures | None:
    """The figures of this node's replica of the replicated stream `queue` that another node
    leads (`queue` is its stand-in here); None for any other queue, or with no replica here."""
    if isinstance(queue, StreamQueue) or queue.settings.queue_type != STREAM or broker.replicated is None:
        return None
    log = broker.replicated.replica_stream(vhost, queue.name)
    return log_figures(log) if log is not None else None


def segment_details(queue: "Queue") -> list[dict[str, int]] | None:
    """A stream's segments, oldest first, in the management API's JSON shape; None for other
    queues. `next_offset` is one past the segment's last record; timestamps are epoch milliseconds."""
    if not isinstance(queue, StreamQueue):
        return None
    return [
        {"first_offset": s.first_offset, "next_offset": s.next_offset, "bytes": s.size,
         "first_timestamp": s.first_timestamp_ms, "last_timestamp": s.last_timestamp_ms}
        for s in queue.log.segments()
    ]


def consumer_offsets(queue: "Queue") -> dict["Consumer", int]:
    """Each consumer of a stream and the offset it reads next, also the consumers on this node of
    a stream another node leads (Queue.consumer_offsets); {} for other queues."""
    return dict(queue.consumer_offsets())
