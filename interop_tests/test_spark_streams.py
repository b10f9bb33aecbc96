"""Spark reads a stream a running broker is writing: every message once, with its offset.

A dedicated broker gets a stream (`x-queue-type: stream`, 64 KiB segments, so there are many),
published with pika and publisher confirms. While another connection keeps publishing (with
confirms) into the same stream, a `local[2]` SparkSession reads the data directory with
`format("amqp-queue")`. The rows must be exactly the committed prefix of the stream: offsets
0..k-1 with no gap and no repeat, k at least the number confirmed before the read, each row the
message published at that offset (body and properties), and each offset the one the broker
itself delivers the message with (its `x-stream-offset` header, consuming from `first`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pika = pytest.importorskip("pika")

from interop_tests.broker_process import launch  # noqa: E402
from interop_tests.pika_helpers import connect  # noqa: E402

STREAM = "spark-orders"
CONFIRMED_BEFORE = 1500


@pytest.fixture(scope="module")
def spark_session() -> Iterator[object]:
    from spark.session import local_session

    session = local_session()  # local[2]
    yield session
    session.stop()


def body(tag: str, i: int) -> bytes:
    return f"{tag}-{i}:".encode() + bytes(range(256))[: 40 + i % 150]


class LivePublisher(threading.Thread):
    """Publishes with confirms into the stream until stopped."""

    def __init__(self, broker) -> None:
        super().__init__(daemon=True)
        self.connection = connect(broker, heartbeat=0)  # not pumped while Spark reads: no heartbeats
        self.stop = threading.Event()
        self.confirmed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            channel = self.connection.channel()
            channel.confirm_delivery()
            while not self.stop.is_set():
                i = self.confirmed
                channel.basic_publish("", STREAM, body("live", i),
                                      pika.BasicProperties(message_id=f"live-{i}", delivery_mode=2))
                self.confirmed += 1
        except BaseException as err:  # reported by the test
            self.error = err
        finally:
            self.connection.close()


def test_a_live_stream_is_read_every_message_once_with_its_offset(spark_session, tmp_path_factory):
    broker = launch(tmp_path_factory.mktemp("spark-stream-broker"))
    try:
        connection = connect(broker, heartbeat=0)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(STREAM, durable=True, arguments={
            "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 64 * 1024})
        for i in range(CONFIRMED_BEFORE):
            channel.basic_publish("", STREAM, body("m", i), pika.BasicProperties(
                message_id=f"m-{i}", headers={"i": i}, content_type="application/octet-stream", delivery_mode=2))

        live = LivePublisher(broker)
        live.start()
        try:
            df = spark_session.read.format("amqp-queue").option("queue", STREAM).load(str(broker.data_dir))
            assert df.rdd.getNumPartitions() >= 2
            rows = df.select("seq", "queue_type", "state", "message_id", "body", "headers").collect()
            tail = df.where(f"queue = '{STREAM}' AND seq >= 1000").select("seq").collect()
        finally:
            live.stop.set()
            live.join(timeout=60)
        assert live.error is None, live.error
        assert live.confirmed > 0, "the broker was writing while Spark read"

        offsets = [r["seq"] for r in rows]
        assert sorted(offsets) == list(range(len(rows))), "a committed prefix: no gap, no repeat"
        assert len(rows) >= CONFIRMED_BEFORE
        by_offset = {r["seq"]: r for r in rows}
        for i in range(CONFIRMED_BEFORE):
            row = by_offset[i]
            assert (row["queue_type"], row["state"], row["message_id"]) == ("stream", "in_stream", f"m-{i}")
            assert row["body"] == body("m", i) and dict(row["headers"]) == {"i": str(i)}
        for j, offset in enumerate(range(CONFIRMED_BEFORE, len(rows))):
            assert (by_offset[offset]["message_id"], by_offset[offset]["body"]) == (f"live-{j}", body("live", j))
        tail_offsets = sorted(r["seq"] for r in tail)
        assert tail_offsets[0] == 1000 and tail_offsets == list(range(1000, 1000 + len(tail_offsets)))

        # The broker delivers each message with the offset Spark gave it.
        channel.basic_qos(prefetch_count=200)
        delivered = {}
        for method, props, payload in channel.consume(STREAM, arguments={"x-stream-offset": "first"},
                                                      inactivity_timeout=10):
            if method is None:
                break
            delivered[props.headers["x-stream-offset"]] = props.message_id
            channel.basic_ack(method.delivery_tag)
            if len(delivered) == len(rows):
                break
        channel.cancel()
        assert delivered == {r["seq"]: r["message_id"] for r in rows}
        connection.close()
    finally:
        broker.stop()
