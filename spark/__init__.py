"""Spark analytics over the broker's queue files: the ``amqp-queue`` PySpark data source.

Batch reads (``spark.read``), streaming reads (``spark.readStream``: ``streaming_source``) and a
sink that publishes rows back over AMQP (``write`` / ``writeStream``: ``amqp_sink``).

``spark.register(session)`` registers the data source with a SparkSession (Spark also finds
it with no call at all, through the top-level module ``pyspark_amqp_queue``). The reader
itself (``spark.partition_reader``) needs only pyarrow and numpy, not Spark. docs/spark.md.
"""

from __future__ import annotations

from typing import Any


def register(session: Any, pushdown: bool = True) -> None:
    """Register the ``amqp-queue`` data source with ``session`` (and enable filter pushdown)."""
    from spark.data_source import register as register_data_source

    register_data_source(session, pushdown)


def columns(*names: str) -> Any:
    """A Spark schema of some of the data source's columns, to pass to ``.schema(...)``: Spark does
    not prune the columns of a Python data source itself, so naming them makes scans much faster.

        spark.read.format("amqp-queue").schema(columns("queue", "state")).load(data_dir)
    """
    from spark.schema import check_columns, spark_schema

    check_columns(list(names))
    return spark_schema(names)
