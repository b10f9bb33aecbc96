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

State records of a segment are kept in a per-process cache (``_EVENTS``) keyed
by the file's identity and measured size, so the several partitions of a
queue that a Spark worker reads walk each later segment once.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from persistence.queue_recovery import message_body_size
from persistence.record_format import STATE_OF_TYPE, MalformedRecord, RecordType, decode_payload, min_state_payload
from persistence.record_format import state_fields
from persistence.segment_file import CorruptSegmentHeader
from persistence.segment_reader import SnapshotScan, snapshot_scan
from spark import basic_properties
from spark.message_states import EVENT_NAMES, REASON_NAMES, STATE_NAMES, EventCollector, StateEvents, concat, replay
from spark.internal_stores import delayed_exchange_of
from spark.queue_snapshot import SegmentRef
from spark.schema import MESSAGE_COLUMNS, NOT_NULL, PROPERTY_COLUMNS, arrow_schema

_SEQ_AT = struct.Struct(">QQ")  # the first fields of a message record's payload: seq, published_at_ms
_MESSAGE = RecordType.MESSAGE
_DECODED = {"exchange", "routing_key", "body", *PROPERTY_COLUMNS}  # need the record decoded
_PROPERTY_INDEX = {name: i for i, name in enumerate(basic_properties.PROPERTY_NAMES)}
_TS = pa.timestamp("us", tz="UTC")
_STATE_DICT = pa.array(STATE_NAMES)
_EVENT_DICT = pa.array(EVENT_NAMES)
_REASON_DICT = pa.array(REASON_NAMES)
_CACHE_BYTES = 256 * 1024 * 1024
_EVENTS: "OrderedDict[tuple, StateEvents]" = OrderedDict()


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
    published_min_us: int | None = None
    published_max_us: int | None = None
    states: frozenset[str] | None = None
    batch_rows: int = 16384
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
    return not (request.seq_min is not None and high is not None and request.seq_min > high)


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
    key = ref.cache_key
    cached = _EVENTS.get(key)
    if cached is not None:
        _EVENTS.move_to_end(key)
        return cached
    from spark import side_files

    events = side_files.load_events(ref)
    if events is None:
        scan = _open(ref)
        events = _walk(scan, collect_messages=False)[0] if scan is not None else EventCollector().events()
    _remember(key, events)
    return events


def _remember(key: tuple, events: StateEvents) -> None:
    _EVENTS[key] = events
    total = sum(e.nbytes for e in _EVENTS.values())
    while total > _CACHE_BYTES and len(_EVENTS) > 1:
        _, dropped = _EVENTS.popitem(last=False)
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

        loaded = side_files.load_messages(ref, _message_columns(request.columns))
        if loaded is not None:
            table, events = loaded
            _remember(ref.cache_key, events)
            seqs = table.column("seq").to_numpy()
            published = table.column("published_at").cast(pa.int64()).to_numpy() // 1000
            empty = np.zeros(0, np.int64)
            return events, SegmentMessages(None, empty, empty, seqs, published), table
    scan = _open(ref)
    if scan is None:
        return None, None, None
    events, messages = _walk(scan, collect_messages=True)
    _remember(ref.cache_key, events)
    return events, messages, None


def _walk(scan: SnapshotScan, collect_messages: bool) -> tuple[StateEvents, SegmentMessages]:
    """One pass over the trusted records of a segment (damaged ones skipped, as recovery does)."""
    collector = EventCollector()
    starts, ends, seqs, published = (np.zeros(0, np.int64) for _ in range(4))
    starts_l: list[int] = []
    ends_l: list[int] = []
    data = scan.data
    state_types = STATE_OF_TYPE
    for _, rtype, payload, end in scan.records():
        if rtype == _MESSAGE:
            if collect_messages:
                starts_l.append(payload)
                ends_l.append(end)
        elif rtype in state_types:
            if end - payload >= min_state_payload(rtype):
                collector.add(rtype, state_fields(rtype, data, payload))
    if collect_messages and starts_l:
        starts, ends = np.array(starts_l, np.int64), np.array(ends_l, np.int64)
        fixed = np.array([_SEQ_AT.unpack_from(data, p) for p in starts_l], np.int64)
        seqs, published = fixed[:, 0].copy(), fixed[:, 1].copy()
        increasing = seqs > np.maximum.accumulate(np.concatenate(([-1], seqs[:-1])))
        if not increasing.all():  # out-of-order records are ignored, as by recovery
            starts, ends, seqs, published = starts[increasing], ends[increasing], seqs[increasing], published[increasing]
    return collector.events(), SegmentMessages(scan, starts, ends, seqs, published)


def _row_filter(messages: SegmentMessages, outcome, request: ScanRequest) -> np.ndarray | None:
    keep = None

    def narrow(mask: np.ndarray) -> None:
        nonlocal keep
        keep = mask if keep is None else keep & mask

    if request.seq_min is not None:
        narrow(messages.seqs >= request.seq_min)
    if request.seq_max is not None:
        narrow(messages.seqs <= request.seq_max)
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
    decoded = _decode_rows(messages, rows, columns) if side_table is None else {}
    if side_table is not None:
        taken = side_table.take(pa.array(rows))
        decoded = {name: taken.column(name) for name in _message_columns(columns)}
    arrays = []
    for name in columns:
        if name in decoded:
            arrays.append(decoded[name])
        elif name == "vhost":
            arrays.append(pa.array([part.vhost] * n, pa.string()))
        elif name == "queue":
            arrays.append(pa.array([part.queue] * n, pa.string()))
        elif name == "delayed_exchange":
            arrays.append(pa.array([delayed_exchange_of(part.queue)] * n, pa.string()))
        elif name == "segment":
            arrays.append(pa.array([part.segment.name] * n, pa.string()))
        elif name == "archived":
            arrays.append(pa.array(np.full(n, part.segment.archived)))
        else:
            arrays.append(_state_column(name, messages, outcome, rows))
    schema = arrow_schema(columns, request.not_null)
    return pa.RecordBatch.from_arrays([_conform(a, f.type) for a, f in zip(arrays, schema)], schema=schema)


def _conform(array, arrow_type: pa.DataType):
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array if array.type == arrow_type else array.cast(arrow_type)


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


def _decode_rows(messages: SegmentMessages, rows: np.ndarray, columns: tuple[str, ...]) -> dict[str, pa.Array]:
    out: dict[str, pa.Array] = {}
    if "seq" in columns:
        out["seq"] = pa.array(messages.seqs[rows])
    if "published_at" in columns:
        out["published_at"] = pa.array(messages.published_ms[rows] * 1000, _TS)
    wanted = [c for c in columns if c in _DECODED]
    if not wanted:
        if "body_size" in columns:
            data = messages.scan.data
            out["body_size"] = pa.array([message_body_size(data, p) for p in messages.starts[rows].tolist()], pa.int64())
        return out
    props = [c for c in wanted if c in _PROPERTY_INDEX]
    values: dict[str, list] = {c: [] for c in (*wanted, "body_size")}
    view = messages.scan.view
    decode_props = basic_properties.decode
    exchanges, keys, bodies, sizes = values["exchange"] if "exchange" in values else None, \
        values.get("routing_key"), values.get("body"), values["body_size"]
    prop_lists = [(values[c], _PROPERTY_INDEX[c]) for c in props]
    for start, end in zip(messages.starts[rows].tolist(), messages.ends[rows].tolist()):
        try:
            record = decode_payload(_MESSAGE, view[start:end])
        except MalformedRecord:
            record = None
        if record is None:  # a CRC-valid record that does not parse: keep the row, null its fields
            for column in values.values():
                column.append(None)
            continue
        if exchanges is not None:
            exchanges.append(record.exchange)
        if keys is not None:
            keys.append(record.routing_key)
        if bodies is not None:
            bodies.append(record.body)
        sizes.append(len(record.body))
        if prop_lists:
            try:
                decoded = decode_props(record.raw_properties)
            except basic_properties.MalformedProperties:
                decoded = basic_properties.decode(b"")
            for column, i in prop_lists:
                column.append(decoded[i])
    for name, column in values.items():
        if name == "timestamp":
            secs = np.array([-1 if v is None else v for v in column], np.int64)
            out[name] = pa.array(secs * 1_000_000, _TS, mask=secs < 0)
        elif name == "headers":
            out[name] = pa.array(column, pa.map_(pa.string(), pa.string()))
        elif name in ("delivery_mode", "priority"):
            out[name] = pa.array(column, pa.int32())
        elif name == "body":
            out[name] = pa.array(column, pa.binary())
        elif name == "body_size":
            out[name] = pa.array(column, pa.int64())
        else:
            out[name] = pa.array(column, pa.string())
    return out
