"""The whole data source without Spark: every partition of a data directory read in this process.

For tests, small tools and a quick look from a Python prompt:

    table = read_table("/var/lib/amqp-server", columns=("queue", "state", "body_size"))

It plans and reads exactly as the Spark data source does (same snapshot, same rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa

from spark.partition_reader import ScanRequest, SegmentPart, part_overlaps, read_partition
from spark.queue_snapshot import plan
from spark.schema import COLUMN_NAMES, arrow_schema, check_columns
from spark.stream_reader import read_stream_partition
from spark.stream_snapshot import DEFAULT_PARTITION_BYTES, StreamPart, plan_stream_parts


def plan_parts(
    data_dir: str | Path, vhost: str | None = None, queue: str | None = None, include_internal: bool = False
) -> list[SegmentPart]:
    """One ``SegmentPart`` per segment file, as the data source's ``partitions()`` plans them."""
    parts = []
    for snapshot in plan(data_dir, vhost, queue, include_internal):
        for i, segment in enumerate(snapshot.segments):
            parts.append(SegmentPart(snapshot.vhost, snapshot.queue, segment, snapshot.segments[i + 1 :]))
    return parts


def read_batches(parts: list[SegmentPart] | list[StreamPart], request: ScanRequest) -> Iterator[pa.RecordBatch]:
    for part in parts:
        if isinstance(part, StreamPart):
            yield from read_stream_partition(part, request)
        elif part_overlaps(part, request):
            yield from read_partition(part, request)


def read_table(
    data_dir: str | Path,
    columns: tuple[str, ...] | list[str] = COLUMN_NAMES,
    *,
    vhost: str | None = None,
    queue: str | None = None,
    include_internal: bool = False,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    **filters,
) -> pa.Table:
    """All rows of the data directory, queues then streams (narrowed like the data source's
    options and filters)."""
    columns = tuple(columns)
    check_columns(list(columns))
    request = ScanRequest(columns, **filters)
    batches = list(read_batches(plan_parts(data_dir, vhost, queue, include_internal), request))
    streams = plan_stream_parts(data_dir, request, vhost, queue, partition_bytes)
    batches.extend(read_batches(streams, request))
    return pa.Table.from_batches(batches, schema=arrow_schema(columns, request.not_null))
