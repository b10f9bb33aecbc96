"""The stream queue type (`x-queue-type: stream`): an append-only log each consumer replays.

A stream keeps every message it is published, in its log (persistence/stream_log.py), until
retention (x-max-length-bytes, x-max-age) drops whole segments from the front. A consumer does
not take messages away from others: each reads the log from its own offset (x-stream-offset,
queues/stream_offset.py) through a cursor of its own, which reads the files in chunks, so
history is never pulled into memory. Consumers reading the same history share it: the cursors
read it by blocks (persistence/stream_blocks.py), each read and checked once for all of them,
and the entries the stream makes of a block's records (a StreamEntry and its StreamMessage,
the offset spliced into the record's properties) are kept with the block, so each record is
decoded once whatever the number of consumers. A consumer gets its records in batches, up to
its credit, in one `deliver_many`. A consumer at the tail is pushed new messages once their
records are fsynced (the log's `on_committed`).

Over AMQP 0-9-1 this is RabbitMQ's stream: a consumer needs a per-consumer prefetch, acks
(nack and reject too) only return credit, nothing is requeued, and every delivery carries the
header `x-stream-offset`. Beyond RabbitMQ:

- Durable means durable: a publish is confirmed once its record is fsynced (RabbitMQ does not
  fsync streams).
- Server-side offset tracking: a consumer that names itself with
  `x-stream-automatic-offset-tracking: true` (LavinMQ's argument, keyed by the consumer tag)
  resumes after the last message it *acknowledged*, durably; LavinMQ resumes after the last one
  delivered, which skips messages prefetched but never acked.
- Exact filtering: `x-stream-filter` (a string or an array) and `x-stream-match-unfiltered`
  select messages by their publisher's `x-stream-filter-value` header, with no false positives;
  skipped records are stepped over without reading their bodies.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, Protocol

from queues.arguments import QueueArguments
from queues.arguments.queue_type_rules import STREAM
from queues.consumer import Consumer
from persistence.stream_blocks import RecordRun
from persistence.stream_cursor import CorruptStreamRecord
from persistence.stream_segment import split_envelope
from queues.message import CONTENT_HEADER_PREFIX_SIZE, FLAG_HEADERS, UNACKED, Message, QueueEntry, content_header
from queues.publish_outcome import ENQUEUED_DURABLY, WRITE_FAILED
from queues.queue import Queue
from queues.queue_type import ConsumeAnswer, CountsAnswer, GetAnswer, QueueTypeRefusal
from queues.raw_properties import RawProperties, encode_field
from queues.stream_offset import InvalidOffset, StartAt, parse_offset
from queues.timers import Timer, Timers

_logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from persistence.group_commit import GroupCommitter
    from persistence.stream_cursor import StreamCursor
    from persistence.stream_log import StreamLog

# AMQP reply codes a stream refuses with (the wire layer's names; queues/ sits below it).
PRECONDITION_FAILED = 406
NOT_IMPLEMENTED = 540

OFFSET_HEADER = "x-stream-offset"
FILTER_VALUE_HEADER = "x-stream-filter-value"
_FILTER_VALUE_KEY = FILTER_VALUE_HEADER.encode()
OFFSET_TRACKING = "x-stream-automatic-offset-tracking"
STREAM_MODULE = "rabbit_stream_queue"
# Consumer arguments of other queue types that a stream refuses (checked on RabbitMQ 3.10.8).
REFUSED_CONSUMER_ARGUMENTS = ("x-priority", "x-cancel-on-ha-failover")
READ_BATCH = 256  # records a consumer is sent at a time, at most (and at most its credit)
READ_BYTES = 1024 * 1024  # and the bytes of records, at most (at least one record)
RETENTION_CHECK_S = 60.0  # how often x-max-age is applied when no segment rolls over

_OFFSET_KEY = OFFSET_HEADER.encode()
_OFFSET_ENTRY_PREFIX = bytes((len(OFFSET_HEADER),)) + _OFFSET_KEY + b"l"
_OFFSET_ENTRY_SIZE = len(_OFFSET_ENTRY_PREFIX) + 8
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_i64 = struct.Struct(">q")
FLAG_CONTENT_TYPE = 0x8000
FLAG_CONTENT_ENCODING = 0x4000


def offset_header_parts(raw_properties: bytes) -> tuple[bytes, bytes] | None:
    """(before, after) such that `before + offset + after`, the offset a big-endian 64-bit
    integer, is `raw_properties` (a content header's property flags and list) with the header
    x-stream-offset set to that offset, an `l` integer as RabbitMQ sends it. Spliced as bytes,
    without decoding; None when the publisher set an x-stream-offset header of its own (then
    `with_offset_header` decodes the table to replace it)."""
    flags = _u16.unpack_from(raw_properties, 0)[0]
    pos = 2
    if flags & FLAG_CONTENT_TYPE:
        pos += 1 + raw_properties[pos]
    if flags & FLAG_CONTENT_ENCODING:
        pos += 1 + raw_properties[pos]
    if not flags & FLAG_HEADERS:
        return (_u16.pack(flags | FLAG_HEADERS) + raw_properties[2:pos] + _u32.pack(_OFFSET_ENTRY_SIZE)
                + _OFFSET_ENTRY_PREFIX, raw_properties[pos:])
    length = _u32.unpack_from(raw_properties, pos)[0]
    table = raw_properties[pos + 4:pos + 4 + length]
    if _OFFSET_KEY in table:
        return None
    return (raw_properties[:pos] + _u32.pack(length + _OFFSET_ENTRY_SIZE) + _OFFSET_ENTRY_PREFIX,
            table + raw_properties[pos + 4 + length:])


class StreamKeeper(Protocol):
    """Who keeps a stream's log when not the stream's queue object (a replicated stream: its
    replica, cluster/replication/replicated_streams.py)."""

    def released(self, deleted: bool) -> None:
        """The queue object goes: ``deleted`` when the stream itself is deleted, not when it is
        handed over to another node (`hand_over`) or the broker stops."""


def consume_refusal(consumer: Consumer, global_qos_active: bool, resource: str) -> QueueTypeRefusal | None:
    """What a stream refuses of a basic.consume before looking at its arguments, in RabbitMQ's
    order: no per-consumer prefetch, no-ack, a global basic.qos (a stand-in on another node
    refuses the same)."""
    if not consumer.prefetch_count:
        return QueueTypeRefusal(PRECONDITION_FAILED, f"consumer prefetch count is not set for '{resource}'")
    if consumer.no_ack:
        return QueueTypeRefusal(NOT_IMPLEMENTED, f"automatic acknowledgement not supported by stream queues {resource}")
    if global_qos_active:
        return QueueTypeRefusal(NOT_IMPLEMENTED, f"{resource} does not support global qos")
    return None


def check_consumer_arguments(arguments: dict[str, Any], resource: str, now_ms: int) -> None:
    """RabbitMQ's order: the offset, then the consumer arguments a stream does not take; raises
    QueueTypeRefusal."""
    try:
        parse_offset(arguments, now_ms)
    except InvalidOffset as invalid:
        raise QueueTypeRefusal(
            PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for {resource}: {invalid.reason}") from None
    for key in REFUSED_CONSUMER_ARGUMENTS:
        if key in arguments:
            raise QueueTypeRefusal(
                PRECONDITION_FAILED, f"invalid arg '{key}' for {resource} of queue type {STREAM_MODULE}")


def with_offset_header(raw_properties: bytes, offset: int) -> bytes:
    """`raw_properties` (a content header's property flags and list) with the header
    x-stream-offset set to `offset`, a 64-bit `l` integer as RabbitMQ sends it."""
    parts = offset_header_parts(raw_properties)
    if parts is not None:
        return parts[0] + _i64.pack(offset) + parts[1]
    # The publisher set one: replace it, decoding the table.
    raw = RawProperties(raw_properties)
    fields = [(name, value) for name, value in raw.header_fields() if name != OFFSET_HEADER]
    raw.set_header_fields([(OFFSET_HEADER, encode_field(offset)), *fields])
    return raw.encode()


HeaderMaker = Callable[[int, int, int, bytes, int, bytes], bytes]


class EnvelopeDeliveries:
    """What the deliveries of records with one envelope (exchange, routing key and properties,
    persistence/stream_segment.py) share, worked out once: a model Message (routing and
    property flags) and how a record's content header is made from its body size and offset
    (`header(60, 0, body_size, before, offset, after)`: one struct pack in the usual case)."""

    __slots__ = ("model", "header", "before", "after")

    def __init__(self, envelope: bytes) -> None:
        exchange_b, routing_key_b, raw_properties = split_envelope(envelope)
        exchange = exchange_b.decode("utf-8", "replace")
        routing_key = routing_key_b.decode("utf-8", "replace")
        parts = offset_header_parts(raw_properties)
        if parts is None:
            self.header: HeaderMaker = _header_with_own_offset
            self.before, self.after = raw_properties, b""
            sample = with_offset_header(raw_properties, 0)
        else:
            self.before, self.after = parts
            self.header = struct.Struct(f">HHQ{len(self.before)}sq{len(self.after)}s").pack
            sample = self.before + _i64.pack(0) + self.after
        routing_raw = bytes((len(exchange_b),)) + exchange_b + bytes((len(routing_key_b),)) + routing_key_b
        self.model = Message(exchange, routing_key, content_header(0, sample), b"", routing_raw)


def _header_with_own_offset(class_id: int, weight: int, body_size: int, raw_properties: bytes, offset: int,
                            _after: bytes) -> bytes:
    """EnvelopeDeliveries.header for properties whose headers name x-stream-offset already."""
    return content_header(body_size, with_offset_header(raw_properties, offset))


_consumer_of = itemgetter(2)  # of a (entry, queue, consumer) the channel settles
_seq_of = attrgetter("seq")  # of a QueueEntry
ENVELOPE_CACHE = 64  # envelopes a stream keeps the EnvelopeDeliveries of (most streams use one or a few)


class StreamMessage(Message):
    """A stream record's message as delivered: the exchange, routing key, property flags and
    publish time of its envelope's model (EnvelopeDeliveries), its own content header (with its
    offset) and body; made without reading the header again."""

    __slots__ = ()

    def __init__(self, model: Message, raw_header: bytes, body: bytes) -> None:  # (no super(): per delivery)
        self.exchange = model.exchange
        self.routing_key = model.routing_key
        self.raw_header = raw_header
        self.property_flags = model.property_flags
        self.body = body
        self.published_at = model.published_at
        self.routing_raw = model.routing_raw
        self._properties = None


class StreamEntry(QueueEntry):
    """A stream record as delivered (its `seq` is the record's offset), made delivered: a
    stream entry is never ready, settling it only returns credit, and nothing changes it, so
    one entry serves the deliveries of its record to every consumer reading its block."""

    __slots__ = ()

    def __init__(self, message: Message, offset: int) -> None:
        self.message = message
        self.seq = offset
        self.delivery_count = 0
        self.expires_at = 0.0
        self.state = UNACKED
        self.persisted = False


class StreamReading:
    """One consumer's place in the stream: its cursor and (with offset tracking) which of its
    deliveries are not acked yet."""

    __slots__ = ("consumer", "cursor", "tracked_name", "outstanding", "acked_early", "resume_at", "skip_below")

    def __init__(self, consumer: Consumer, cursor: "StreamCursor", tracked_name: str | None,
                 skip_below: int = 0) -> None:
        self.consumer = consumer
        self.cursor = cursor
        self.skip_below = skip_below  # an offset past the end when it consumed: records before it are not its
        self.tracked_name = tracked_name
        # Offset tracking: delivered and not acked, in delivery order; acked out of order.
        self.outstanding: deque[int] = deque()
        self.acked_early: set[int] = set()
        self.resume_at = cursor.next_offset  # where the consumer would resume: all before is acked

    @property
    def next_offset(self) -> int:
        """The offset of the next record it would be delivered."""
        return max(self.cursor.next_offset, self.skip_below)

    def next_run(self, credit: int) -> RecordRun:
        """Up to `credit` of its next records, `run.records[run.start:run.stop]` (offset,
        envelope, body); an empty run at the committed end. Raises CorruptStreamRecord for
        damage the cursor has stepped over (read again to go on)."""
        while True:
            run = self.cursor.read_run(credit, READ_BYTES)
            records, start, stop = run.records, run.start, run.stop
            if start == stop or records[start][0] >= self.skip_below:
                return run
            if records[stop - 1][0] >= self.skip_below:  # (a consumer that started past the end)
                while records[start][0] < self.skip_below:
                    start += 1
                return run._replace(start=start)

    def delivered(self, entries: list[QueueEntry]) -> None:
        if self.tracked_name is not None:
            self.outstanding.extend(map(_seq_of, entries))

    def acked(self, offset: int) -> bool:
        """The delivery of `offset` is acked; True when the resume point moved on."""
        if self.tracked_name is None:
            return False
        outstanding = self.outstanding
        if outstanding and outstanding[0] == offset:
            outstanding.popleft()
            while outstanding and outstanding[0] in self.acked_early:
                self.acked_early.discard(outstanding.popleft())
        elif offset in outstanding:
            self.acked_early.add(offset)
            return False
        resume = outstanding[0] if outstanding else self.next_offset
        if resume > self.resume_at:
            self.resume_at = resume
            return True
        return False

    def close(self) -> None:
        self.cursor.close()


class StreamQueue(Queue):
    """A stream (see the module docstring): the queue type behaviour over a StreamLog."""

    def __init__(self, name: str, vhost: str, *, log: "StreamLog", committer: "GroupCommitter", timers: Timers,
                 arguments: dict[str, Any] | None = None, settings: QueueArguments | None = None,
                 clock_ms: Callable[[], int] | None = None, keeper: StreamKeeper | None = None) -> None:
        """``keeper``: who keeps ``log`` (a replicated stream's replica), which this object then
        neither closes nor deletes."""
        super().__init__(name, vhost, durable=True, arguments=arguments, timers=timers, settings=settings)
        self.log = log
        self._committer = committer
        self._keeper = keeper
        self._handed_over = False
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._readings: dict[Consumer, StreamReading] = {}
        self._tracking = 0  # readings with offset tracking
        self._envelopes: dict[bytes, EnvelopeDeliveries] = {}  # at most ENVELOPE_CACHE
        self._retention_timer: Timer | None = None
        self.dedup = None  # a log keeps every message it is given
        self.adds_delivery_count = False
        log.notify_committed(self._committed)
        self._apply_retention_settings(self.settings)

    def __repr__(self) -> str:
        return f"<StreamQueue {self.name!r} vhost={self.vhost!r}>"

    # -- retention ---------------------------------------------------------------------

    def _apply_retention_settings(self, settings: QueueArguments) -> None:
        self.log.set_retention(settings.max_length_bytes, settings.max_age_ms)
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        if settings.max_age_ms is not None or settings.max_length_bytes is not None:
            self.log.apply_retention(self._clock_ms())
            if settings.max_age_ms is not None:
                self._retention_timer = self.timers.call_later(RETENTION_CHECK_S, self._retention_due)

    def _retention_due(self) -> None:
        self._retention_timer = None
        if self.deleted:
            return
        self.log.apply_retention(self._clock_ms())
        self._retention_timer = self.timers.call_later(RETENTION_CHECK_S, self._retention_due)

    def reconfigure(self, settings: QueueArguments) -> None:
        """A policy changed the stream's retention (max-length-bytes, max-age)."""
        self.settings = settings
        self._apply_retention_settings(settings)

    # -- counts ------------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        """Records the stream holds now (committed ones, first to last)."""
        return self.log.next_offset - self.log.first_offset

    @property
    def consumer_count(self) -> int:
        return len(self._readings)

    def consumers(self) -> list[Consumer]:
        return list(self._readings)

    def has_exclusive_consumer(self) -> bool:
        return any(consumer.exclusive for consumer in self._readings)

    def consumer_offsets(self) -> list[tuple[Consumer, int]]:
        """Each consumer and the offset it reads next (the management API shows them)."""
        return [(consumer, reading.next_offset) for consumer, reading in self._readings.items()]

    def count(self, answer: CountsAnswer) -> None:
        """queue.declare-ok and delete-ok carry 0 messages and 0 consumers for a stream, as in
        RabbitMQ (so delete's if-empty and if-unused never keep a stream); the management API
        and the metrics show the real figures."""
        answer.counted(0, 0)

    # -- publish -----------------------------------------------------------------------

    def publish(self, message: Message) -> int:
        filter_value = None
        # Decode the properties only for a publish that names the filter header: most carry
        # headers of other kinds, and a search of the raw bytes costs less than the decode.
        if message.property_flags & FLAG_HEADERS and _FILTER_VALUE_KEY in message.raw_header:
            value = (message.properties.headers or {}).get(FILTER_VALUE_HEADER)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if isinstance(value, str):
                filter_value = value
        try:
            self.log.append(message.exchange, message.routing_key, message.raw_header[CONTENT_HEADER_PREFIX_SIZE:],
                            message.body, filter_value=filter_value)
        except (OSError, ValueError):
            return WRITE_FAILED
        self.stats.published += 1
        return ENQUEUED_DURABLY

    def when_stored(self, callback: Callable[[OSError | None], None]) -> None:
        """Once every record appended so far is committed: fsynced (a confirm waits for this), on
        a majority of its replicas for a replicated stream."""
        self.log.request_commit(callback)

    def _committed(self, next_offset: int) -> None:
        """Records up to `next_offset` are fsynced and readable: consumers at the tail get them."""
        self.dispatch()

    # -- consume -----------------------------------------------------------------------

    def _resource(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost}'"

    def check_consumer_arguments(self, arguments: dict[str, Any]) -> None:
        """RabbitMQ's order: the offset, then the consumer arguments a stream does not take."""
        check_consumer_arguments(arguments, self._resource(), self._clock_ms())

    def exclusive_use_refused(self, exclusive: bool) -> bool:
        """Readers never take messages from each other: an exclusive consume keeps no one out
        (as in RabbitMQ)."""
        return False

    def consume(self, consumer: Consumer, answer: ConsumeAnswer) -> None:
        refusal = consume_refusal(consumer, answer.global_qos_active, self._resource()) or self._start_reading(consumer)
        if refusal is not None:
            answer.refused(refusal)
            return
        self.touch()
        answer.started()
        self.dispatch()

    def _start_reading(self, consumer: Consumer) -> QueueTypeRefusal | None:
        """Give `consumer` its reading, at the offset its arguments name (or its tracked one)."""
        arguments = consumer.arguments
        start = parse_offset(arguments, self._clock_ms())  # (checked: check_consumer_arguments)
        filters = arguments.get("x-stream-filter")
        if isinstance(filters, (str, bytes)):
            filters = [filters]
        filter_values = None
        if filters is not None:
            if not isinstance(filters, list) or not all(isinstance(value, (str, bytes)) for value in filters):
                return QueueTypeRefusal(PRECONDITION_FAILED, f"invalid arg 'x-stream-filter' for {self._resource()}: "
                                                             "a string or an array of strings")
            filter_values = [value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                             for value in filters]
        match_unfiltered = arguments.get("x-stream-match-unfiltered") is True
        tracked_name = consumer.tag if arguments.get(OFFSET_TRACKING) is True else None
        offset = None if tracked_name is None else self.log.offsets.get(tracked_name)
        if offset is None:
            offset = self._offset_of(start)
        cursor = self.log.reader(min(offset, self.log.next_offset), filter_values=filter_values,
                                 match_unfiltered=match_unfiltered)
        self._readings[consumer] = StreamReading(consumer, cursor, tracked_name, skip_below=offset)
        if tracked_name is not None:
            self._tracking += 1
        return None

    def continuation(self, consumer: Consumer) -> dict[str, Any] | None:
        """Its arguments to go on where it is on the stream's next form (a leader change): the
        offset of the next record it would get."""
        reading = self._readings.get(consumer)
        if reading is None:
            return None
        return {**consumer.arguments, OFFSET_HEADER: reading.next_offset}

    def _offset_of(self, start: StartAt) -> int:
        log = self.log
        if start.kind == "first":
            return log.first_offset
        if start.kind == "last":
            last = log.last_chunk_offset
            return log.next_offset if last is None else last
        if start.kind == "next":
            return log.next_offset
        if start.kind == "timestamp":
            return log.offset_at(start.value)
        # Below the first record retained: the first. Past the end: that very offset, once it
        # exists (RabbitMQ's consumer waits for it, and never sees the records before it).
        return max(start.value, log.first_offset)

    def add_consumer(self, consumer: Consumer) -> None:
        """A consumer of the stream's previous form on this node (its leader changed,
        cluster/definitions/apply.py) reads on from where its arguments say (`continuation`)."""
        if self._start_reading(consumer) is None:
            self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        reading = self._readings.pop(consumer, None)
        if reading is not None:
            if reading.tracked_name is not None:
                self._tracking -= 1
            reading.close()

    def prefetch_changed(self, consumer: Consumer) -> None:
        self.dispatch()

    # -- deliver -----------------------------------------------------------------------

    def dispatch(self, now: float | None = None, first: QueueEntry | None = None) -> None:
        """Each consumer with credit gets the next records from its own place in the log, a batch
        of them at a time in one `deliver_many`."""
        if self._dispatching or self.deleted:
            return
        self._dispatching = True
        try:
            stats = self.stats
            for consumer, reading in list(self._readings.items()):
                while consumer.has_capacity():
                    prefetch = consumer.prefetch_count
                    credit = min(prefetch - consumer.unacked, READ_BATCH) if prefetch else READ_BATCH
                    if consumer.sink.global_prefetch_count:
                        credit = 1  # (a channel-wide limit set after the consume: its room is the channel's to count)
                    try:
                        run = reading.next_run(credit)
                    except CorruptStreamRecord as damage:
                        # The cursor stepped over it: the consumer goes on after the damage.
                        _logger.warning("stream %s: consumer %r skips damaged data: %s", self._resource(), consumer.tag, damage)
                        continue
                    if run.start == run.stop:
                        break
                    entries = self._entries(run)
                    count = len(entries)
                    consumer.count_unacked_batch(count)
                    self.unacked_count += count
                    stats.delivered += count
                    reading.delivered(entries)
                    consumer.sink.deliver_many(consumer, entries)
                    if self.deleted or consumer not in self._readings:
                        break
        finally:
            self._dispatching = False

    def _entries(self, run: RecordRun) -> list[QueueEntry]:
        """The deliveries of the records of `run`. A record's entry (and message) is made once
        for all consumers reading its block, and kept with the block."""
        block = run.block
        if block is None:
            records = run.records
            return self._entries_of(records if run.start == 0 else records[run.start:run.stop])
        entries = block.derived
        if entries is None:
            entries = self._entries_of(run.records)
            block.keep_derived(entries)
        return entries[run.start:run.stop]  # type: ignore[no-any-return]

    def _entries_of(self, records: "list[tuple[int, bytes, bytes]]") -> list[QueueEntry]:
        """The entry of each record: its message like its envelope's model, with a content header
        carrying its x-stream-offset."""
        envelope = records[0][1]
        model, header, before, after = self._deliveries_of(envelope)
        entries: list[QueueEntry] = []
        append = entries.append
        for offset, record_envelope, body in records:
            if record_envelope is not envelope:
                envelope = record_envelope
                model, header, before, after = self._deliveries_of(envelope)
            append(StreamEntry(StreamMessage(model, header(60, 0, len(body), before, offset, after), body), offset))
        return entries

    def _deliveries_of(self, envelope: bytes) -> "tuple[Message, HeaderMaker, bytes, bytes]":
        cache = self._envelopes
        deliveries = cache.get(envelope)
        if deliveries is None:
            if len(cache) >= ENVELOPE_CACHE:
                cache.clear()
            deliveries = cache[envelope] = EnvelopeDeliveries(envelope)
        return deliveries.model, deliveries.header, deliveries.before, deliveries.after

    # -- settle: only credit comes back --------------------------------------------------

    def _settled(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        self.unacked_count -= 1
        if consumer is None:
            return
        consumer.count_settled()
        if self._tracking:
            reading = self._readings.get(consumer)
            if reading is not None and reading.acked(entry.seq) and reading.tracked_name is not None:
                self.log.offsets.store(reading.tracked_name, reading.resume_at)

    def ack(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        self.stats.acked += 1
        self._settled(entry, consumer)

    def ack_many(self, taken: "Sequence[tuple[QueueEntry, Any, Consumer | None]]") -> None:
        """A `multiple` ack: credit back to each consumer at once (without offset tracking, no
        step per delivery in Python)."""
        self.stats.acked += len(taken)
        if self._tracking:
            for entry, _queue, consumer in taken:
                self._settled(entry, consumer)
            return
        self.unacked_count -= len(taken)
        for consumer, count in Counter(map(_consumer_of, taken)).items():
            if consumer is not None:
                consumer.count_settled_batch(count)

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        self._settled(entry, consumer)

    def requeue(self, entries: Iterable[tuple[QueueEntry, Consumer | None]], cause: str | None = None) -> None:
        """A stream keeps every message: a requeue only returns the consumers' credit."""
        for entry, consumer in entries:
            self._settled(entry, consumer)

    # -- refused -----------------------------------------------------------------------

    def get_for(self, no_ack: bool, answer: GetAnswer) -> None:
        answer.refused(QueueTypeRefusal(
            NOT_IMPLEMENTED, f"basic.get not supported by stream queues queue '{self.name}' in vhost '{self.vhost}'"))

    def purge_for(self, answer: CountsAnswer) -> None:
        answer.refused(QueueTypeRefusal(
            NOT_IMPLEMENTED, f"queue.purge not supported by stream queues {self._resource()}"))

    def purge(self) -> int:
        return 0

    # -- recover, delete ---------------------------------------------------------------

    def recover(self) -> int:
        """The log recovered itself when it was opened; its records are the stream's messages."""
        return self.message_count

    def delete(self) -> list[Consumer]:
        self.deleted = True
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        consumers = list(self._readings)
        for reading in self._readings.values():
            reading.close()
        self._readings.clear()
        if self._keeper is None:
            self.log.delete()
        else:
            self._keeper.released(deleted=not self._handed_over)
        return consumers

    def hand_over(self) -> None:
        """The stream's queue object goes because another node leads the stream now: its files
        stay with its keeper (a replica)."""
        self._handed_over = True

    def close(self) -> None:
        """The broker stops: the log's buffers go to disk and its files close."""
        if self._keeper is None:
            self.log.close()
        else:
            self._keeper.released(deleted=False)
