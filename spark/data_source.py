"""The PySpark data source ``amqp-queue``: one row per message of every durable queue and stream of a broker.

    df = spark.read.format("amqp-queue").load("/var/lib/amqp-server")
    df = spark.read.format("amqp-queue").option("queue", "orders-*").load(data_dir)

Spark finds it with no setup through the top-level module ``pyspark_amqp_queue``
(Spark imports every ``pyspark_*`` module on the Python path that defines
``DefaultSource``), or after ``spark.register(session)``.

Options: ``path`` (or the argument of ``load``), ``vhost`` (a vhost name),
``queue`` (a queue name or a glob), ``include_internal`` (``true`` to also read
the broker's internal stores: the pending messages of durable delayed
exchanges), ``pushdown`` (``false`` to never take filters), ``side_files``
(``false`` to ignore Parquet side files), ``partition_bytes`` (how much of a
stream one partition reads, 32 MiB by default).

Planning (``partitions``, on the driver) lists the queues and measures every
segment file (``queue_snapshot``); there is one partition per segment, read by
``read`` on an executor into Arrow batches (``partition_reader``). It also takes
a committed snapshot of every stream (``stream_snapshot``), cut into byte
ranges of its segments, read by ``stream_reader``.

``readStream`` (``streamReader``) is ``spark.streaming_source``; ``write`` and ``writeStream``
(``writer``, ``streamWriter``) publish rows over AMQP: ``spark.amqp_sink``.

Filter pushdown needs ``spark.sql.python.filterPushdown.enabled=true`` (off by
default in Spark 4.1-4.3, and a reader that takes filters while it is off
fails every query). ``reader`` therefore offers ``pushFilters`` only when it
runs inside Spark's pushdown planner, which Spark uses only when the setting
is on; ``spark.register`` turns it on.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import TYPE_CHECKING, Any, Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from spark.options import parse_boolean, parse_nodes, parse_positive
from spark.partition_reader import ScanRequest, SegmentPart, part_overlaps, read_partition
from spark.pushdown import Pushed, translate
from spark.partition_reader import QUEUE_FILES_TYPE
from spark.replicated_queues import node_queues
from spark.replicated_streams import plan_replicated_streams, with_alternatives
from spark.schema import KIND, arrow_schema, check_columns, spark_schema
from spark.stream_reader import STREAM_QUEUE_TYPE, read_stream_partition
from spark.stream_snapshot import DEFAULT_PARTITION_BYTES, StreamPart, plan_stream_parts, stream_parts_of

if TYPE_CHECKING:
    from spark.streaming_source import AmqpQueueStreamReader

NAME = "amqp-queue"
_PUSHDOWN_PLANNER = "data_source_pushdown_filters.py"


class SegmentPartition(InputPartition):
    """A Spark partition: one segment file of one queue (plus its queue's later segments for states)."""

    def __init__(self, part: SegmentPart | None) -> None:
        super().__init__(part)


class StreamPartition(InputPartition):
    """A Spark partition: a byte range of one segment of one stream."""

    def __init__(self, part: StreamPart) -> None:
        super().__init__(part)


class AmqpQueueDataSource(DataSource):
    """Reads the queue and stream files of an amqp-server data directory (docs/spark.md)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        columns = _requested_columns(schema)
        not_null = frozenset(field.name for field in schema.fields if not field.nullable)
        options = dict(self.options)
        wants_pushdown = str(options.get("pushdown", "true")).lower() != "false"
        if wants_pushdown and _in_pushdown_planner():
            return PushdownQueueReader(options, columns, not_null)
        return QueueReader(options, columns, not_null)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("amqp-queue")``: publish the rows (spark.amqp_sink)."""
        from spark.amqp_sink import AmqpBatchWriter, sink_settings

        return AmqpBatchWriter(sink_settings(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("amqp-queue")``: publish each batch's rows (spark.amqp_sink)."""
        from spark.amqp_sink import AmqpStreamWriter, sink_settings

        return AmqpStreamWriter(sink_settings(self.options, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``spark.readStream.format("amqp-queue")``: spark.streaming_source."""
        columns = _requested_columns(schema)
        not_null = frozenset(field.name for field in schema.fields if not field.nullable)
        return self._stream_reader_class()(dict(self.options), columns, not_null)

    def _stream_reader_class(self) -> type[AmqpQueueStreamReader]:
        """The streaming reader (interop_tests/spark_faults.py's broken sources give their own)."""
        from spark.streaming_source import AmqpQueueStreamReader

        return AmqpQueueStreamReader


class QueueReader(DataSourceReader):
    """Plans one partition per queue segment and per stream byte range, and reads them; see the
    module docstring."""

    def __init__(self, options: dict[str, Any], columns: tuple[str, ...], not_null: frozenset[str]) -> None:
        path = options.get("path")
        if not path:
            raise ValueError('amqp-queue needs a data directory: .load("/path/to/data_dir") or .option("path", ...)')
        self.path = str(path)
        self.nodes = parse_nodes(self.path)
        self.vhost = options.get("vhost")
        self.queue = options.get("queue")
        self.side_files = str(options.get("side_files", "true")).lower() != "false"
        self.include_internal = parse_boolean(options, "include_internal", False)
        self.partition_bytes = parse_positive(options, "partition_bytes", DEFAULT_PARTITION_BYTES, "number of bytes")
        self.columns = columns
        self.not_null = not_null
        self.pushed = Pushed()

    def partitions(self) -> list[InputPartition]:
        request = self.request()
        parts: list[InputPartition] = []
        if self.pushed.accepts_type(QUEUE_FILES_TYPE):
            for found in node_queues(self.nodes, self.vhost, self.queue, self.include_internal):
                snapshot = found.snapshot
                if not self.pushed.accepts_queue(snapshot.vhost, snapshot.queue):
                    continue
                segments = snapshot.segments
                for i, segment in enumerate(segments):
                    part = SegmentPart(snapshot.vhost, snapshot.queue, segment, segments[i + 1 :])
                    if part_overlaps(part, request):
                        parts.append(SegmentPartition(part))
        if self.pushed.accepts_type(STREAM_QUEUE_TYPE):
            for _, directory in self.nodes:
                for stream_part in plan_stream_parts(directory, request, self.vhost, self.queue, self.partition_bytes,
                                                     self.pushed.accepts_queue):
                    parts.append(StreamPartition(stream_part))
            for replicated in plan_replicated_streams(self.nodes, self.vhost, self.queue):
                if not self.pushed.accepts_queue(replicated.vhost, replicated.stream):
                    continue
                # Each copy's committed records are a prefix of the same records: the furthest
                # reaching copy's are all of them, each read once (spark.replicated_streams).
                for stream_part in stream_parts_of(replicated.primary, request, self.partition_bytes):
                    parts.append(StreamPartition(with_alternatives(stream_part, replicated.copies)))
        return parts or [SegmentPartition(None)]  # Spark needs at least one partition

    def request(self) -> ScanRequest:
        p = self.pushed
        seq_values = None if p.seq_values is None else tuple(sorted(p.seq_values))
        return ScanRequest(self.columns, p.seq_min, p.seq_max, seq_values, p.published_min_us, p.published_max_us,
                           p.states, side_files=self.side_files, not_null=self.not_null)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        part = partition.value
        if part is None:
            return iter(())
        if isinstance(part, StreamPart):
            return read_stream_partition(part, self.request())
        return read_partition(part, self.request())


class PushdownQueueReader(QueueReader):
    """``QueueReader`` that also takes the filters it can apply exactly (``spark.pushdown``)."""

    def pushFilters(self, filters: list[Any]) -> Any:
        self.pushed, rest = translate(list(filters))
        return iter(rest)


def _requested_columns(schema: StructType) -> tuple[str, ...]:
    names = [field.name for field in schema.fields]
    check_columns(names)
    expected = spark_schema(names)
    for field, wanted in zip(schema.fields, expected.fields):
        if field.dataType != wanted.dataType:
            raise ValueError(
                f"amqp-queue column {field.name} is {wanted.dataType.simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
    arrow_schema(names)  # fails early if pyarrow is missing
    return tuple(names)


def _in_pushdown_planner() -> bool:
    """True when called from Spark's planner that offers filters (only used when pushdown is enabled)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PUSHDOWN_PLANNER):
            return True
        frame = frame.f_back
    return False


def register(session: Any, pushdown: bool = True) -> None:
    """Register ``amqp-queue`` with ``session``; with ``pushdown`` also enable Python filter pushdown."""
    session.dataSource.register(AmqpQueueDataSource)
    if pushdown:
        session.conf.set("spark.sql.python.filterPushdown.enabled", "true")


__all__ = ["AmqpQueueDataSource", "register", "NAME", "KIND"]
