"""Read the message records of a byte range of one queue segment: a streaming batch's partition.

The streaming source reads a queue as a log of its publishes: one row per message record, once,
in ``seq`` order, whatever happens to the message afterwards. So unlike the batch source
(``partition_reader``, which replays the state records of later segments to say what became of
each message), a streaming row's state columns describe the message as published: ``state``
``ready``, ``state_event`` ``published``, ``delivery_count`` 0, ``redelivered`` false,
``state_at`` its publish time, ``reason`` and ``due_at`` null. A batch read again after a restart
then gives the same rows, even if consumers took the messages in between.

The range (``QueueRangePart``, planned by ``streaming_plan`` on the driver) starts at a record
boundary and ends at one (or at the segment's size measured at planning, for a segment the broker
no longer writes); only message records whose ``seq`` is in the part's range are returned. The
records are walked as recovery walks them (``segment_file.trusted_record_offsets``,
docs/queue-files.md section 4): a record whose CRC fails, or bytes that are not a record, are
damage: ``CorruptQueueRecord`` with ``failOnDataLoss=true``, skipped (one record when a trusted
record follows it, else the rest of the range) and logged with ``false``. A segment gone before the task reads it (all its messages
settled, archiving off) is data loss, handled the same way.

A replicated queue's partition (``ReplicaQueuePart``) names a range of log indices instead, read
from a copy that holds it committed (``spark.replicated_queue_log``); its rows are the same columns,
``segment`` being ``replica.log`` (the rows of a range come from whichever copy has it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from persistence.record_format import RECORD_HEAD, RecordType
from persistence.segment_file import CorruptSegmentHeader, Damage, decode_header, trusted_record_offsets
from persistence.segment_reader import file_identity
from persistence.stream_index import read_exactly
from spark.columnar import decode_columns, record_batch
from spark.data_loss import CorruptQueueRecord, LossPolicy
from spark.internal_stores import delayed_exchange_of
from persistence.replica_files import QUEUE_LOG_FILE
from spark.partition_reader import QUEUE_FILES_TYPE
from spark.queue_snapshot import SegmentRef
from spark.replicated_queue_log import NotCommitted, message_records
from spark.schema import arrow_schema
from spark.segment_index import be_uint

_TS = pa.timestamp("us", tz="UTC")
_MESSAGE = int(RecordType.MESSAGE)
_PUBLISHED = {"state": "ready", "state_event": "published", "delivery_count": 0, "redelivered": False,
              "reason": None, "due_at": None, "queue_type": QUEUE_FILES_TYPE}


class QueueRangePart(NamedTuple):
    """What one partition of a streaming batch reads of a queue: records ``seq_min`` .. ``seq_max``
    (inclusive) between file positions ``start`` (0: the first record) and ``end``."""

    vhost: str
    queue: str
    segment: SegmentRef
    start: int
    end: int
    seq_min: int
    seq_max: int


class ReplicaQueuePart(NamedTuple):
    """What one partition of a streaming batch reads of a replicated queue: the message records of
    log entries ``low`` .. ``high`` (inclusive), from one of the group directories ``copies``.
    Entries below ``stored_from`` were compacted away on every copy when the batch was planned
    (what the driver reported, or what a query from ``earliest`` starts after): not lost again."""

    vhost: str
    queue: str
    copies: tuple[str, ...]
    low: int
    high: int
    stored_from: int


def read_replica_queue_range(part: ReplicaQueuePart, columns: tuple[str, ...], not_null: frozenset[str],
                             policy: LossPolicy, batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``: one per message record, in log order."""
    what = f"entries {part.low}..{part.high} of replicated queue {part.queue!r} (vhost {part.vhost!r})"
    try:
        found = message_records(part.copies, part.low, part.high)
    except NotCommitted as error:
        policy.lost(f"{what} are gone: {error} (every copy that had them was removed or compacted)")
        return
    except ValueError as error:
        policy.damaged(CorruptQueueRecord(part.copies[0], 0, f"{what}: {error}"))
        return
    if found.gone is not None:
        first, last = max(found.gone[0], part.stored_from), found.gone[1]
        if first <= last:
            policy.lost(f"{what}: entries {first}..{last} were compacted away in {found.copy} before the query "
                        f"read them; the messages among them not settled then were read from its snapshot, "
                        f"the settled ones are gone")
    records = found.records
    for first_row in range(0, len(records), batch_rows):
        chosen = records[first_row:first_row + batch_rows]
        data = b"".join(record for _, record in chosen)
        lengths = np.fromiter((len(r) for _, r in chosen), np.int64, len(chosen))
        positions = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        d = np.frombuffer(data, np.uint8)
        ends = positions + 4 + be_uint(d, positions, 4)
        payloads = positions + RECORD_HEAD.size
        yield _batch(part.vhost, part.queue, QUEUE_LOG_FILE, False, columns, not_null, data, payloads, ends,
                     be_uint(d, payloads, 8), be_uint(d, payloads + 8, 8))


def read_queue_range(part: QueueRangePart, columns: tuple[str, ...], not_null: frozenset[str], policy: LossPolicy,
                     batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """The rows of ``part`` in record batches of at most ``batch_rows`` rows."""
    loaded = _load(part, policy)
    if loaded is None:
        return
    data, base = loaded
    starts, ends, seqs, published = _messages(part, data, base, policy)
    keep = (seqs >= part.seq_min) & (seqs <= part.seq_max)
    if len(seqs):
        keep &= seqs > np.maximum.accumulate(np.concatenate(([-1], seqs[:-1])))  # out of order: ignored, as by recovery
    rows = np.flatnonzero(keep)
    for first in range(0, len(rows), batch_rows):
        chosen = rows[first : first + batch_rows]
        yield _batch(part.vhost, part.queue, part.segment.name, part.segment.archived, columns, not_null, data,
                     starts[chosen], ends[chosen], seqs[chosen], published[chosen])


def _load(part: QueueRangePart, policy: LossPolicy) -> tuple[bytes, int] | None:
    ref = part.segment
    for path in (ref.path, ref.archive_path):
        if path is None:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            if file_identity(os.fstat(fd)) != ref.identity:
                continue  # another file by that name: the queue was deleted (and declared again)
            try:
                header = decode_header(path, read_exactly(fd, 64, 0))
            except CorruptSegmentHeader as err:
                policy.damaged(CorruptQueueRecord(path, 0, f"unreadable segment header: {err}"))
                return None
            start = part.start or header.header_length
            data = read_exactly(fd, max(part.end - start, 0), start)
        finally:
            os.close(fd)
        if start + len(data) < part.end:
            policy.damaged(CorruptQueueRecord(path, start + len(data), f"the file ends before byte {part.end}, "
                                              "which the query planned to read"))
        return data, start
    policy.lost(f"the segment {Path(ref.path).name} of queue {part.queue!r} (vhost {part.vhost!r}) holding messages "
                f"{part.seq_min}..{part.seq_max} is gone (its messages were settled and archiving is off)")
    return None


def _messages(part: QueueRangePart, data: bytes, base: int,
              policy: LossPolicy) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(payload starts, record ends, seqs, publish times) of the range's message records."""
    damage: list[Damage] = []
    positions = np.array(trusted_record_offsets(data, 0, damage), np.int64)  # recovery's walk
    for bad in damage:
        if bad.offset + bad.length < len(data):  # one record, a good one after it
            policy.damaged(CorruptQueueRecord(part.segment.path, base + bad.offset, "CRC mismatch"), 1)
        else:
            policy.damaged(CorruptQueueRecord(part.segment.path, base + bad.offset,
                                              f"{bad.reason}: the rest of the range is lost"))
    d = np.frombuffer(data, np.uint8)
    positions = positions[d[positions + RECORD_HEAD.size - 1] == _MESSAGE]
    ends = positions + 4 + be_uint(d, positions, 4)
    short = ends - positions < RECORD_HEAD.size + 16
    if short.any():  # a message record too short for its seq and time: malformed, as recovery sees it
        i = int(np.argmax(short))
        policy.damaged(CorruptQueueRecord(part.segment.path, base + int(positions[i]),
                                          "message record too short for its fields"), int(short.sum()))
        positions, ends = positions[~short], ends[~short]
    payloads = positions + RECORD_HEAD.size
    return payloads, ends, be_uint(d, payloads, 8), be_uint(d, payloads + 8, 8)


def _batch(vhost: str, queue: str, segment: str, archived: bool, columns: tuple[str, ...], not_null: frozenset[str],
           data: bytes, starts: np.ndarray, ends: np.ndarray, seqs: np.ndarray,
           published_ms: np.ndarray) -> pa.RecordBatch:
    at = pa.array(published_ms * 1000, _TS)
    values = {**_PUBLISHED, "seq": pa.array(seqs), "published_at": at, "state_at": at, "vhost": vhost,
              "queue": queue, "segment": segment, "archived": archived,
              "delayed_exchange": delayed_exchange_of(queue), **decode_columns(data, starts, ends, columns)}
    return record_batch(arrow_schema(columns, not_null), len(starts), values)
