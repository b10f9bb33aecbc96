"""``spark.readStream.format("amqp-queue")``: every publish of every matching durable queue and
stream, as one row each, exactly once (docs/spark.md, "Structured Streaming").

    df = (spark.readStream.format("amqp-queue")
          .option("queue", "orders*").option("startingOffsets", "earliest")
          .option("maxRecordsPerTrigger", 100000).load("/var/lib/amqp-server"))

Spark's micro-batch engine calls, on the driver (one long-lived Python process per query):
``initialOffset`` once for a query without a checkpoint; ``latestOffset(start, limit)`` for each
batch, whose answer it writes to the checkpoint before the batch runs; ``partitions(start, end)``
to plan it (again, after a restart, for a batch that did not finish); ``commit``. On executors,
``read(partition)`` reads one partition. The offsets and their JSON are ``streaming_offsets``;
the planning is ``streaming_plan``; the reading ``stream_reader`` (streams) and
``queue_range_reader`` (queues).

Options: the batch source's ``path``, ``vhost``, ``queue``, ``include_internal`` and
``partition_bytes``, and ``minPartitions`` (default 2: a batch of more than 2 MiB is cut into at
least that many partitions), ``startingOffsets`` (default ``latest``), ``maxRecordsPerTrigger``
(default: no limit), ``failOnDataLoss`` (default ``true``) and ``replicatedQueues`` (``fail``, the
default, or ``skip``: what a replicated quorum queue none of whose copies has a commit mark does
to the query; replicated streams and marked quorum queues are read, once for all their copies:
spark.replicated_streams, spark.replicated_queue_log). An option this source does not
know is an error that names it (a misspelt option would otherwise be silently ignored).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from spark.data_loss import LossPolicy, log
from spark.options import Options, parse_boolean, parse_optional_positive, parse_positive
from spark.partition_reader import ScanRequest
from spark.queue_range_reader import QueueRangePart, ReplicaQueuePart, read_queue_range, read_replica_queue_range
from spark.stream_reader import read_stream_partition
from spark.stream_snapshot import DEFAULT_PARTITION_BYTES, StreamPart
from spark.streaming_offsets import Offsets, Starting, decode, encode, parse_starting
from spark.streaming_plan import (
    Scope,
    list_sources,
    parse_nodes,
    plan_ends,
    plan_partitions,
    reconcile,
    starting_position,
    targets_now,
)

OPTIONS = frozenset({"path", "vhost", "queue", "include_internal", "partition_bytes", "minpartitions",
                     "startingoffsets", "maxrecordspertrigger", "failondataloss", "pushdown", "side_files",
                     "replicatedqueues"})


class StreamingPartition(InputPartition):
    """One partition of a streaming batch: a byte range of a stream segment (offsets ``low`` ..
    ``high`` of it) or of a queue segment."""

    def __init__(self, part: StreamPart | QueueRangePart | ReplicaQueuePart, low: int, high: int) -> None:
        super().__init__((part, low, high))


class AmqpQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming source; see the module docstring."""

    def __init__(self, given: dict[str, Any], columns: tuple[str, ...], not_null: frozenset[str]) -> None:
        options = Options(given)
        unknown = [name for name in options.names() if name not in OPTIONS]
        if unknown:
            raise ValueError(f"amqp-queue has no streaming option {', '.join(unknown)}; its options are path, vhost, "
                             "queue, include_internal, partition_bytes, minPartitions, startingOffsets, "
                             "maxRecordsPerTrigger, failOnDataLoss, replicatedQueues")
        path = options.get("path")
        if not path:
            raise ValueError('amqp-queue needs a data directory: .load("/path/to/data_dir") or .option("path", ...)')
        self.scope = Scope(parse_nodes(str(path)), options.get("vhost"), options.get("queue"),
                           parse_boolean(options, "include_internal", False),
                           parse_positive(options, "partition_bytes", DEFAULT_PARTITION_BYTES, "number of bytes"),
                           parse_positive(options, "minPartitions", 2, "number of partitions"),
                           _parse_replicated_queues(options.get("replicatedQueues", "fail")))
        self.starting: Starting = parse_starting(options.get("startingOffsets", "latest"))
        self.max_rows = parse_optional_positive(options, "maxRecordsPerTrigger", "number of records")
        self.policy = LossPolicy(parse_boolean(options, "failOnDataLoss", True))
        self.columns, self.not_null = columns, not_null
        self.target: Offsets | None = None  # Trigger.AvailableNow: where this run stops

    # ---- on the driver ----

    def initialOffset(self) -> dict:
        sources = list_sources(self.scope)
        offsets = {key: starting_position(source, self.starting, self.policy, self.scope.split)
                   for key, source in sorted(sources.items())}
        return encode(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if isinstance(limit, ReadAllAvailable):
            max_rows = None
        elif isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        else:
            raise ValueError(f"amqp-queue: read limit {limit!r} is not supported (maxRecordsPerTrigger is)")
        starts = decode(start)
        sources = list_sources(self.scope)
        reconciled: Offsets = {}
        for key in sorted(set(starts) | set(sources)):
            if self.target is not None and key not in self.target and key not in starts:
                continue  # appeared after this availableNow run began: the next run reads it
            position = reconcile(key, starts.get(key), sources.get(key), self.policy)
            if position is not None:
                reconciled[key] = position
        ends = plan_ends(sources, reconciled, max_rows, self.target, self.policy, self.scope.split, starts)
        return encode(ends)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = targets_now(list_sources(self.scope), self.policy, self.scope.split)
        log.info("amqp-queue: availableNow reads up to %s", encode(self.target))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = decode(start), decode(end)
        planned = plan_partitions(self.scope, begin, stop, self.policy)
        return [StreamingPartition(p.part, p.low, p.high) for p in planned]

    def commit(self, end: dict) -> None:
        pass  # the files are only read: nothing to release

    # ---- on executors ----

    def read(self, partition: InputPartition) -> Iterator[Any]:
        part, low, high = partition.value
        if isinstance(part, StreamPart):
            request = ScanRequest(self.columns, seq_min=low, seq_max=high, not_null=self.not_null)
            return read_stream_partition(part, request, self.policy)
        if isinstance(part, ReplicaQueuePart):
            return read_replica_queue_range(part, self.columns, self.not_null, self.policy)
        return read_queue_range(part, self.columns, self.not_null, self.policy)



def _parse_replicated_queues(value: object) -> bool:
    """The ``replicatedQueues`` option: ``fail`` (a replicated queue fails the query) or ``skip``
    (left out); whether to skip (spark.replicated_queues says why they are not read)."""
    text = str(value).strip().lower()
    if text not in ("fail", "skip"):
        raise ValueError(f"amqp-queue option replicatedQueues must be fail or skip, not {value!r}")
    return text == "skip"
