"""Read one segment of one queue (one Spark partition) into Arrow record batches.

Plain Python and pyarrow: Spark calls ``read_partition`` from its Python
workers, and tests, the report and the side-file writer call it directly.

For a segment S of a queue, the rows are S's message records; their state
comes from replaying the state records of S and of every later segment of the
queue (``message_states``). Each file is read only up to the size measured at
planning (``queue_snapshot``), newest first: the broker removes a segment only
after the older segments its state records talk about, so a message segment
that is still there when it is read cannot have lost the later state records
that were read before it.

Only the columns asked for are decoded. Decoding the AMQP properties (the
``headers`` table above all) is most of the cost of a full scan, so a query
that selects no property column never decodes them. Row filters (seq range,
publish time, state) are applied before any message is decoded.

The record index of a segment (where its messages are, and its state records:
``segment_index``) is kept in a per-process cache keyed by the file's identity
and measured size, so the several partitions of a queue that a Spark worker
reads walk each segment once, and later queries in the same session (Spark
reuses its Python workers) walk none again. Decoding (``columnar``) is done
for every query.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from persistence.segment_file import CorruptSegmentHeader
from persistence.segment_reader import SnapshotScan, snapshot_scan
from spark.columnar import decode_columns, record_batch
from spark.message_states import EVENT_NAMES, REASON_NAMES, STATE_NAMES, EventCollector, StateEvents, concat, replay
from spark.internal_stores import delayed_exchange_of
from spark.queue_snapshot import SegmentRef
from spark.schema import MESSAGE_COLUMNS, NOT_NULL, arrow_schema
from spark.segment_index import RecordIndex, index_segment

_TS = pa.timestamp("us", tz="UTC")
_STATE_DICT = pa.array(STATE_NAMES)
_EVENT_DICT = pa.array(EVENT_NAMES)
_REASON_DICT = pa.array(REASON_NAMES)
# The queue_type of a queue's rows: its files do not say whether it is a classic or a quorum queue.
QUEUE_FILES_TYPE = "queue"
_CACHE_BYTES = 256 * 1024 * 1024
_CACHE: "OrderedDict[tuple, StateEvents | RecordIndex]" = OrderedDict()


class SegmentPart(NamedTuple):
    """What one partition reads: a segment, and the later segments of its queue (for states)."""

    vhost: str
    queue: str
    segment: SegmentRef
    later: tuple[SegmentRef, ...]


class ScanRequest(NamedTuple):
    """Columns to produce and row filters (bounds inclusive; None = unbounded)."""

    columns: tuple[str, ...]
    seq_min: int | None = None
    seq_max: int | None = None
    seq_values: tuple[int, ...] | None = None  # sorted; None: any (``seq IN (...)``)
    published_min_us: int | None = None
    published_max_us: int | None = None
    states: frozenset[str] | None = None
    batch_rows: int = 65536  # fewer, larger Arrow batches cost Spark less per row (bench/spark_scan.py)
    side_files: bool = True
    not_null: frozenset[str] = NOT_NULL  # columns the Spark schema declares NOT NULL


class SegmentMessages(NamedTuple):
    """The message records of a segment: where they are, and their seq and publish time."""

    scan: SnapshotScan | None
    starts: np.ndarray  # payload start offsets
    ends: np.ndarray
    seqs: np.ndarray
    published_ms: np.ndarray


def part_overlaps(part: SegmentPart, request: ScanRequest) -> bool:
    """False when the seq range of the request cannot meet this segment (prune it at planning)."""
    low = part.segment.segment_id
    high = part.later[0].segment_id - 1 if part.later else None
    if request.seq_max is not None and request.seq_max < low:
        return False
    if request.seq_min is not None and high is not None and request.seq_min > high:
        return False
    values = request.seq_values
    if values is not None:
        k = bisect_left(values, low)
        return k < len(values) and (high is None or values[k] <= high)
    return True


def read_partition(part: SegmentPart, request: ScanRequest) -> Iterator[pa.RecordBatch]:
    """The rows of ``part`` as record batches of at most ``request.batch_rows`` rows."""
    later_events = [events_of(ref) for ref in reversed(part.later)][::-1]
    own_events, messages, side_table = _load_own(part.segment, request)
    if messages is None:
        return  # the segment is gone: all its messages were settled and it was deleted
    outcome = replay(messages.seqs, concat([own_events, *later_events]))
    keep = _row_filter(messages, outcome, request)
    rows = np.flatnonzero(keep) if keep is not None else np.arange(len(messages.seqs))
    for start in range(0, len(rows), request.batch_rows):
        chosen = rows[start : start + request.batch_rows]
        yield _batch(part, request, messages, outcome, chosen, side_table)


def events_of(ref: SegmentRef) -> StateEvents:
    """The state records of a segment, from the cache, a side file, or a walk of the file."""
    cached = _cached(ref)
    if cached is not None:
        return cached.events if isinstance(cached, RecordIndex) else cached
    from spark import side_files

    events = side_files.load_events(ref)
    if events is None:
        scan = _open(ref)
        if scan is None:
            events = EventCollector().events()
        else:
            index = index_segment(scan.data, scan.header.header_length)
            _remember(ref.cache_key, index)  # kept whole: the segment's own partition needs it too
            return index.events
    _remember(ref.cache_key, events)
    return events


def clear_cache() -> None:
    """Forget every cached record index and state records (benchmarks measure cold reads with it)."""
    _CACHE.clear()


def _cached(ref: SegmentRef) -> StateEvents | RecordIndex | None:
    cached = _CACHE.get(ref.cache_key)
    if cached is not None:
        _CACHE.move_to_end(ref.cache_key)
    return cached


def _remember(key: tuple, entry: StateEvents | RecordIndex) -> None:
    _CACHE[key] = entry
    total = sum(e.nbytes for e in _CACHE.values())
    while total > _CACHE_BYTES and len(_CACHE) > 1:
        _, dropped = _CACHE.popitem(last=False)
        total -= dropped.nbytes


def _open(ref: SegmentRef) -> SnapshotScan | None:
    try:
        scan = snapshot_scan(Path(ref.path), ref.size, ref.identity)
        if scan is None and ref.archive_path is not None:
            scan = snapshot_scan(Path(ref.archive_path), ref.size, ref.identity)
    except CorruptSegmentHeader:
        return None  # recovery sets such a file aside; its messages are not in the queue
    return scan


def _load_own(ref: SegmentRef, request: ScanRequest):
    if request.side_files:
        from spark import side_files

        cached = _cached(ref)
        known = cached.events if isinstance(cached, RecordIndex) else cached
        loaded = side_files.load_messages(ref, _message_columns(request.columns), known)
        if loaded is not None:
            table, events = loaded
            if cached is None:
                _remember(ref.cache_key, events)
            seqs = table.column("seq").to_numpy()
            published = table.column("published_at").cast(pa.int64()).to_numpy() // 1000
            empty = np.zeros(0, np.int64)
            return events, SegmentMessages(None, empty, empty, seqs, published), table
    scan = _open(ref)
    if scan is None:
        return None, None, None
    index = _cached(ref)
    if not isinstance(index, RecordIndex):
        index = index_segment(scan.data, scan.header.header_length)
        _remember(ref.cache_key, index)
    return index.events, SegmentMessages(scan, index.starts, index.ends, index.seqs, index.published_ms), None


def _row_filter(messages: SegmentMessages, outcome, request: ScanRequest) -> np.ndarray | None:
    keep = None

    def narrow(mask: np.ndarray) -> None:
        nonlocal keep
        keep = mask if keep is None else keep & mask

    if request.seq_min is not None:
        narrow(messages.seqs >= request.seq_min)
    if request.seq_max is not None:
        narrow(messages.seqs <= request.seq_max)
    if request.seq_values is not None:
        narrow(np.isin(messages.seqs, np.array(request.seq_values, np.int64)))
    if request.published_min_us is not None:
        narrow(messages.published_ms * 1000 >= request.published_min_us)
    if request.published_max_us is not None:
        narrow(messages.published_ms * 1000 <= request.published_max_us)
    if request.states is not None:
        codes = [i for i, name in enumerate(STATE_NAMES) if name in request.states]
        narrow(np.isin(outcome.state, codes))
    return keep


def _message_columns(columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c for c in MESSAGE_COLUMNS if c in columns)


def _batch(part: SegmentPart, request: ScanRequest, messages: SegmentMessages, outcome, rows: np.ndarray,
           side_table: pa.Table | None) -> pa.RecordBatch:
    columns = request.columns
    n = len(rows)
    if side_table is None:
        assert messages.scan is not None  # no side table: the records are read from the segment
        decoded = decode_columns(messages.scan.data, messages.starts[rows], messages.ends[rows], columns)
        if "seq" in columns:
            decoded["seq"] = pa.array(messages.seqs[rows])
        if "published_at" in columns:
            decoded["published_at"] = pa.array(messages.published_ms[rows] * 1000, _TS)
    else:
        contiguous = n and rows[-1] - rows[0] + 1 == n
        taken = side_table.slice(int(rows[0]), n) if contiguous else side_table.take(pa.array(rows))
        decoded = {name: taken.column(name) for name in _message_columns(columns)}
    values = {"vhost": part.vhost, "queue": part.queue, "queue_type": QUEUE_FILES_TYPE,
              "delayed_exchange": delayed_exchange_of(part.queue), "segment": part.segment.name,
              "archived": part.segment.archived, **decoded}
    for name in columns:
        if name not in values:
            values[name] = _state_column(name, messages, outcome, rows)
    return record_batch(arrow_schema(columns, request.not_null), n, values)


def _state_column(name: str, messages: SegmentMessages, outcome, rows: np.ndarray) -> pa.Array:
    if name == "state":
        return pa.DictionaryArray.from_arrays(pa.array(outcome.state[rows]), _STATE_DICT).cast(pa.string())
    if name == "state_event":
        return pa.DictionaryArray.from_arrays(pa.array(outcome.event[rows]), _EVENT_DICT).cast(pa.string())
    if name == "reason":
        codes = outcome.reason[rows]
        indices = pa.array(codes, mask=codes < 0)
        return pa.DictionaryArray.from_arrays(indices, _REASON_DICT).cast(pa.string())
    if name == "delivery_count":
        return pa.array(outcome.delivery_count[rows].astype(np.int32))
    if name == "redelivered":
        return pa.array(outcome.redelivered[rows])
    if name == "state_at":
        at = outcome.at_ms[rows]
        return pa.array(np.where(at < 0, messages.published_ms[rows], at) * 1000, _TS)
    if name == "due_at":
        due = outcome.due_at_ms[rows]
        return pa.array(due * 1000, _TS, mask=due < 0)
    raise KeyError(name)
