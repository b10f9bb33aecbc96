"""``df.write.format("amqp-queue")`` and ``df.writeStream.format("amqp-queue")``: publish rows as messages.

    (df.selectExpr("to_json(struct(*)) AS body", "'alerts.high' AS routing_key")
       .writeStream.format("amqp-queue")
       .option("url", "amqp://guest:guest@broker:5672/%2F").option("exchange", "alerts")
       .option("checkpointLocation", "/checkpoints/alerts").start())

Each task publishes its rows over one AMQP connection with publisher confirms
(``confirmed_publisher``), keeping up to ``confirmWindow`` (5000) messages unconfirmed, and
succeeds only when the broker has confirmed every one of them: a nack, a message returned as unroutable (``mandatory``, on by default), a closed
channel or connection, or no confirm for ``confirmTimeout`` seconds fails the task, and Spark
runs it again.

**Idempotent per batch.** Every message gets a ``message_id`` that names the row: the query's id
(stable across restarts from the checkpoint), the batch id, the partition and the row's place in
it (``<query>:<batch>:<partition>:<row>``; a batch write uses a random id per write, or
``idPrefix``). A batch that Spark runs again, after a failed task or a driver restart, publishes
the same ids, and a queue declared with ``x-message-deduplication: true`` (docs/lifecycle.md)
drops the repeats. A ``message_id`` column, when there is one and its value is not null, is the
id instead. The ids are stable only if the batch's rows reach the same partitions in the same
order again: true of the ``amqp-queue`` source and of transformations row by row; after a
shuffle, give a ``message_id`` column.

Columns: ``body`` (binary or string, required), ``routing_key`` (else the ``routingKey`` option),
and the AMQP properties under the data source's own column names (``content_type``, ``headers``
as a map, ``delivery_mode``, ``priority``, ``correlation_id``, ``reply_to``, ``expiration``,
``message_id``, ``timestamp``, ``type``, ``user_id``, ``app_id``, ``cluster_id``). The data
source's other columns (``queue``, ``seq``, ...) are ignored, so a DataFrame read from
``amqp-queue`` can be published as it is; any other column is an error that names it.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any, Iterator, NamedTuple

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from spark.options import Options, parse_boolean, parse_positive
from spark.schema import COLUMN_NAMES, PROPERTY_COLUMNS

SINK_OPTIONS = frozenset({"url", "exchange", "routingkey", "mandatory", "persistent", "confirmwindow",
                          "confirmtimeout", "idprefix", "path", "checkpointlocation"})
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
                      "type", "user_id", "app_id", "cluster_id")


class SinkSettings(NamedTuple):
    """The sink's options, checked on the driver when the write starts."""

    url: str
    exchange: str
    routing_key: str
    mandatory: bool
    persistent: bool
    window: int
    timeout_s: int
    id_prefix: str | None
    columns: tuple[str, ...]  # the DataFrame's columns this sink publishes from


def sink_settings(given: Any, schema: StructType) -> SinkSettings:
    """The settings of a write of ``schema`` with options ``given``; a bad option or column is an
    error that names it."""
    options = Options(given)
    unknown = [name for name in options.names() if name not in SINK_OPTIONS]
    if unknown:
        raise ValueError(f"amqp-queue sink has no option {', '.join(unknown)}; its options are url, exchange, "
                         "routingKey, mandatory, persistent, confirmWindow, confirmTimeout, idPrefix")
    url = options.get("url")
    if not url:
        raise ValueError('amqp-queue sink needs option url, the broker to publish to: '
                         '.option("url", "amqp://user:password@host:5672/vhost")')
    if not str(url).startswith(("amqp://", "amqps://")):
        raise ValueError(f"amqp-queue sink option url must be an amqp:// or amqps:// URL, not {url!r}")
    used = _check_columns(schema)
    return SinkSettings(str(url), str(options.get("exchange", "")), str(options.get("routingKey", "")),
                        parse_boolean(options, "mandatory", True), parse_boolean(options, "persistent", True),
                        parse_positive(options, "confirmWindow", 5000, "number of messages"),
                        parse_positive(options, "confirmTimeout", 60, "number of seconds"),
                        options.get("idPrefix"), used)


def _check_columns(schema: StructType) -> tuple[str, ...]:
    fields = {field.name: field.dataType for field in schema.fields}
    if "body" not in fields:
        raise ValueError("amqp-queue sink needs a column body (binary or string), the message body; "
                         f"the DataFrame has {', '.join(fields) or 'no columns'}")
    used = []
    for name, data_type in fields.items():
        wanted = _COLUMN_TYPES.get(name)
        if wanted is None:
            if name in COLUMN_NAMES:
                continue  # a column of the amqp-queue source that is not published: ignored
            raise ValueError(f"amqp-queue sink has no column {name}; it publishes body, routing_key and the "
                             f"properties {', '.join(PROPERTY_COLUMNS)}")
        what, accepts = wanted
        if not accepts(data_type):
            raise ValueError(f"amqp-queue sink column {name} must be {what}, not {data_type.simpleString()}")
        used.append(name)
    return tuple(used)


def _is_map_of_values(t: DataType) -> bool:
    return isinstance(t, MapType) and isinstance(t.keyType, StringType) and isinstance(
        t.valueType, (StringType, BooleanType, FloatType, DoubleType, BinaryType, *_INTEGERS))


_COLUMN_TYPES: dict[str, tuple[str, Any]] = {
    "body": ("binary or string", lambda t: isinstance(t, (BinaryType, StringType))),
    "routing_key": ("string", lambda t: isinstance(t, StringType)),
    "headers": ("a map of strings to strings, numbers, booleans or binary", _is_map_of_values),
    "delivery_mode": ("an integer", lambda t: isinstance(t, _INTEGERS)),
    "priority": ("an integer", lambda t: isinstance(t, _INTEGERS)),
    "timestamp": ("a timestamp", lambda t: isinstance(t, TimestampType)),
    **{name: ("string", lambda t: isinstance(t, StringType)) for name in _STRING_PROPERTIES},
}


class Published(WriterCommitMessage):
    """What one task published."""

    def __init__(self, partition: int, count: int) -> None:
        self.partition = partition
        self.count = count


class AmqpBatchWriter(DataSourceArrowWriter):
    """``df.write.format("amqp-queue")``: ids ``<idPrefix or a random id>:0:<partition>:<row>``."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings
        self.prefix = settings.id_prefix or uuid.uuid4().hex  # made on the driver: every task (and retry) shares it

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        return Published(partition, publish_batches(self.settings, iterator, f"{self.prefix}:0:{partition}"))


class AmqpStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("amqp-queue")``: ids ``<query id>:<batch id>:<partition>:<row>``."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None, "a streaming write runs in a Spark task"
        partition = context.partitionId()
        query = self.settings.id_prefix or context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        if query is None or batch is None:
            raise RuntimeError("amqp-queue sink: Spark did not say which query and batch this task writes "
                               "(sql.streaming.queryId, streaming.sql.batchId)")
        return Published(partition, publish_batches(self.settings, iterator, f"{query}:{batch}:{partition}"))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # every task's messages were confirmed before the task succeeded

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # what was published stays published; the batch run again publishes the same ids


def publish_batches(settings: SinkSettings, batches: Iterator[Any], id_prefix: str) -> int:
    """Publish every row of the Arrow ``batches`` with confirms; how many were published."""
    from spark.confirmed_publisher import ConfirmedPublisher

    publisher = ConfirmedPublisher(settings.url, window=settings.window, timeout_s=settings.timeout_s,
                                   mandatory=settings.mandatory)
    return publisher.publish_all(_messages(settings, batches, id_prefix))


def _messages(settings: SinkSettings, batches: Iterator[Any], id_prefix: str) -> Iterator[tuple[str, str, bytes, bytes]]:
    """(exchange, routing key, encoded properties, body) of every row of the Arrow ``batches``."""
    from spark.confirmed_publisher import encode_properties

    exchange, default_key = settings.exchange, settings.routing_key
    mode = 2 if settings.persistent else 1
    # The usual case, only a delivery mode and a message id: the flags and the mode are the same for all.
    fast_head = bytes((0x10, 0x80, mode))
    row = 0
    for batch in batches:
        columns = {name: batch.column(name).to_pylist() for name in settings.columns if name in batch.schema.names}
        bodies = columns.pop("body")
        keys = columns.pop("routing_key", None)
        ids = columns.pop("message_id", None)
        stamps = columns.pop("timestamp", None)
        if stamps is not None:
            columns["timestamp"] = [None if t is None else int(t.replace(tzinfo=t.tzinfo or datetime.timezone.utc)
                                                               .timestamp()) for t in stamps]
        headers = columns.pop("headers", None)
        if headers is not None:
            columns["headers"] = [None if h is None else dict(h) for h in headers]
        for i, body in enumerate(bodies):
            message_id = f"{id_prefix}:{row}" if ids is None or ids[i] is None else ids[i]
            if columns:
                values = {name: values[i] for name, values in columns.items()}
                if values.get("delivery_mode") is None:
                    values["delivery_mode"] = mode
                values["message_id"] = message_id
                properties = encode_properties(values)
            else:
                raw_id = message_id.encode()
                if len(raw_id) > 255:
                    raise ValueError(f"amqp-queue sink: message_id is longer than 255 bytes: {message_id[:40]!r}...")
                properties = fast_head + bytes((len(raw_id),)) + raw_id
            key = default_key if keys is None or keys[i] is None else keys[i]
            payload = b"" if body is None else body.encode() if isinstance(body, str) else bytes(body)
            yield exchange, key, properties, payload
            row += 1
