"""The columns of the ``amqp-queue`` data source: one row per message of a durable queue or stream.

Defined once, as (name, kind) pairs, so that the Spark ``StructType`` and the
Arrow schema of the batches ``read()`` yields always agree (Spark rejects a
batch whose schema differs from ``to_arrow_schema(schema, timezone="UTC")``
in any way). Building the ``StructType`` here also avoids DDL parsing, which
needs a JVM: the reader runs as plain Python in tests and side-file writing.

Column meanings are documented in docs/spark.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

# kind: "string", "long", "int", "bool", "timestamp", "binary", "map"
COLUMNS: tuple[tuple[str, str], ...] = (
    ("vhost", "string"),
    ("queue", "string"),
    ("queue_type", "string"),
    ("delayed_exchange", "string"),
    ("seq", "long"),
    ("segment", "string"),
    ("published_at", "timestamp"),
    ("exchange", "string"),
    ("routing_key", "string"),
    ("content_type", "string"),
    ("content_encoding", "string"),
    ("headers", "map"),
    ("delivery_mode", "int"),
    ("priority", "int"),
    ("correlation_id", "string"),
    ("reply_to", "string"),
    ("expiration", "string"),
    ("message_id", "string"),
    ("timestamp", "timestamp"),
    ("type", "string"),
    ("user_id", "string"),
    ("app_id", "string"),
    ("cluster_id", "string"),
    ("body_size", "long"),
    ("body", "binary"),
    ("state", "string"),
    ("delivery_count", "int"),
    ("state_at", "timestamp"),
    ("redelivered", "bool"),
    ("state_event", "string"),
    ("reason", "string"),
    ("due_at", "timestamp"),
    ("archived", "bool"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _ in COLUMNS)
KIND: dict[str, str] = dict(COLUMNS)
NOT_NULL = frozenset({"vhost", "queue", "queue_type", "seq", "segment", "published_at", "exchange", "routing_key", "body_size",
                      "state", "delivery_count", "state_at", "redelivered", "state_event", "archived"})

# Columns that come from the AMQP basic properties (decoding them is the costly part of a scan).
PROPERTY_COLUMNS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                    "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")
# Columns known from the message records alone, before any state record is replayed.
MESSAGE_COLUMNS = ("seq", "published_at", "exchange", "routing_key", *PROPERTY_COLUMNS, "body_size", "body")
STATE_COLUMNS = ("state", "delivery_count", "state_at", "redelivered", "state_event", "reason", "due_at")


def spark_schema(names: tuple[str, ...] | list[str] = COLUMN_NAMES) -> "StructType":
    """The Spark schema of the given columns (all of them by default)."""
    from pyspark.sql.types import (
        BinaryType,
        BooleanType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {
        "string": StringType(),
        "long": LongType(),
        "int": IntegerType(),
        "bool": BooleanType(),
        "timestamp": TimestampType(),
        "binary": BinaryType(),
        "map": MapType(StringType(), StringType(), True),
    }
    return StructType([StructField(name, types[KIND[name]], name not in NOT_NULL) for name in names])


def arrow_type(kind: str) -> "pa.DataType":
    import pyarrow as pa

    if kind == "map":
        return pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()))
    return {
        "string": pa.string(),
        "long": pa.int64(),
        "int": pa.int32(),
        "bool": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "binary": pa.binary(),
    }[kind]


def arrow_schema(names: tuple[str, ...] | list[str] = COLUMN_NAMES, not_null: frozenset[str] = NOT_NULL) -> "pa.Schema":
    """The Arrow schema Spark expects for these columns (equal to pyspark's ``to_arrow_schema``);
    ``not_null`` names the columns declared NOT NULL (a user-given schema usually has none)."""
    import pyarrow as pa

    return pa.schema([pa.field(name, arrow_type(KIND[name]), nullable=name not in not_null) for name in names])


def check_columns(names: list[str]) -> None:
    unknown = [name for name in names if name not in KIND]
    if unknown:
        raise ValueError(f"amqp-queue has no column {', '.join(unknown)}; its columns are {', '.join(COLUMN_NAMES)}")
