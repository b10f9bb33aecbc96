"""Deliberately broken variants of the amqp-queue streaming source and sink, for the controls of the
exactly-once tests (interop_tests/test_spark_streaming.py). A driver registers them under names of
their own; Spark's workers import this module by name (the project root is on their PYTHONPATH).

* ``amqp-queue-reread``: a source whose batches start reading at the start of the segment their
  first record is in, so they read again records an earlier batch already read (and the sink
  already committed). The exactly-once test run with it (``AMQP_QUEUE_BROKEN=reread``) must fail.
* ``amqp-queue-every-copy``: a source that reads a replicated stream's or quorum queue's range from
  every copy that holds it, not from one: the test of replicated streams and queues run with it
  (``AMQP_QUEUE_BROKEN=every-copy``, interop_tests/test_spark_replicas.py) must fail with records
  read twice.
* ``amqp-queue-dies``: the sink, but its driver-side commit of batch ``AMQP_QUEUE_DIE_AT_BATCH``
  kills the driver's whole process group (its JVM too) the first time: after every message of the
  batch was published and confirmed, before Spark recorded the batch as done. The restarted query
  runs the batch again, publishing the same message ids. Each commit leaves a file
  ``<batch>.<pid>`` in ``AMQP_QUEUE_COMMIT_LOG`` so the test can see the batch was run twice.
* ``amqp-queue-fresh-ids``: the sink with message ids that change on every run (a new prefix per
  writer), which the broker cannot deduplicate: the pipeline test run with it
  (``AMQP_QUEUE_BROKEN=fresh-ids``) must fail.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

from spark.amqp_sink import AmqpStreamWriter, sink_settings
from spark.data_source import AmqpQueueDataSource
from spark.queue_range_reader import QueueRangePart, ReplicaQueuePart
from spark.stream_snapshot import StreamPart
from spark.streaming_source import AmqpQueueStreamReader, StreamingPartition


class RereadingReader(AmqpQueueStreamReader):
    def partitions(self, start: dict, end: dict) -> list:
        broken = []
        for partition in super().partitions(start, end):
            part, low, high = partition.value
            if isinstance(part, StreamPart) and part.start and part.start_offset == low:
                part, low = part._replace(start=0, start_offset=part.segment_id), part.segment_id
            elif isinstance(part, QueueRangePart) and part.start and part.seq_min == low:
                part = part._replace(start=0, seq_min=part.segment.segment_id)
                low = part.seq_min
            broken.append(StreamingPartition(part, low, high))
        return broken


class RereadingSource(AmqpQueueDataSource):
    @classmethod
    def name(cls) -> str:
        return "amqp-queue-reread"

    def _stream_reader_class(self) -> type[AmqpQueueStreamReader]:
        return RereadingReader


class EveryCopyReader(AmqpQueueStreamReader):
    def partitions(self, start: dict, end: dict) -> list:
        broken = []
        for partition in super().partitions(start, end):  # each copy read as if it were the only one
            part, low, high = partition.value
            if isinstance(part, StreamPart):
                broken.append(partition)
                broken.extend(StreamingPartition(part._replace(path=copy.path, identity=copy.identity,
                                                               stream_created_at_ms=copy.stream_created_at_ms,
                                                               alternatives=()), low, high)
                              for copy in part.alternatives)
            elif isinstance(part, ReplicaQueuePart):
                broken.extend(StreamingPartition(part._replace(copies=(copy,)), low, high) for copy in part.copies)
            else:
                broken.append(partition)
        return broken


class EveryCopySource(AmqpQueueDataSource):
    @classmethod
    def name(cls) -> str:
        return "amqp-queue-every-copy"

    def _stream_reader_class(self) -> type[AmqpQueueStreamReader]:
        return EveryCopyReader


class DyingWriter(AmqpStreamWriter):
    def commit(self, messages: list, batchId: int) -> None:
        log = Path(os.environ["AMQP_QUEUE_COMMIT_LOG"])
        log.mkdir(parents=True, exist_ok=True)
        first_time = not any(log.glob(f"{batchId}.*"))
        (log / f"{batchId}.{os.getpid()}").touch()
        if first_time and batchId == int(os.environ.get("AMQP_QUEUE_DIE_AT_BATCH", "-1")):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        super().commit(messages, batchId)


class DyingSink(AmqpQueueDataSource):
    @classmethod
    def name(cls) -> str:
        return "amqp-queue-dies"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return DyingWriter(sink_settings(self.options, schema))


class FreshIdsSink(DyingSink):
    @classmethod
    def name(cls) -> str:
        return "amqp-queue-fresh-ids"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        settings = sink_settings(self.options, schema)
        return DyingWriter(settings._replace(id_prefix=uuid.uuid4().hex))


SOURCES = {"reread": RereadingSource, "every-copy": EveryCopySource}
SINKS = {"fresh-ids": FreshIdsSink}
