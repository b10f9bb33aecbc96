"""Spark Structured Streaming over a running broker: ``readStream.format("amqp-queue")`` reads every
message of a stream and a queue exactly once, through SIGKILLs of the driver and restarts from its
checkpoint, and through ``availableNow`` runs one after another, while the broker keeps publishing;
a queue or stream deleted, created or trimmed by retention during the query has its defined outcome;
``writeStream.format("amqp-queue")`` publishes back with confirms, and a batch run again after the
driver died between publishing and committing is dropped by the broker's deduplication.

The broker is this project's, on free ports. The drivers that are killed run in processes of their
own (interop_tests/spark_streaming_driver.py; the JVM is in their process group); the others share
one local[2] SparkSession. What a file sink committed is read through its ``_spark_metadata`` log
(files a killed batch left behind are not in it), with pyarrow.

Controls (a broken build must fail these tests; interop_tests/spark_faults.py):
``AMQP_QUEUE_BROKEN=reread python -m pytest interop_tests/test_spark_streaming.py -k killed`` runs
the kill test with a source that reads again a range an earlier batch read: it fails with records
read twice. ``AMQP_QUEUE_BROKEN=fresh-ids ... -k pipeline`` runs the pipeline test with a sink whose
message ids change when a batch is run again: it fails with alerts published twice.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pika = pytest.importorskip("pika")

from interop_tests.broker_process import BrokerProcess, launch  # noqa: E402
from interop_tests.pika_helpers import connect  # noqa: E402
from interop_tests.spark_streaming_checks import (  # noqa: E402
    QUEUE,
    SMALL_SEGMENTS,
    STREAM,
    Driver,
    Publisher,
    assert_exactly_once,
    batch_log,
    body,
    committed_rows,
    declare,
    kill_during_a_batch,
)
from interop_tests.waiting import wait_until  # noqa: E402



@pytest.fixture(scope="module")
def spark_session() -> Iterator[object]:
    from spark.session import local_session

    session = local_session()  # local[2]
    yield session
    session.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = launch(tmp_path / "broker")
    yield process
    process.stop()


# A local driver is a JVM and two Python workers on a shared 2-core machine: each run is bounded
# by its own timeouts above; the test as a whole by this one.
@pytest.mark.timeout(900)
def test_a_query_killed_at_any_moment_and_restarted_writes_every_message_once(broker, tmp_path):
    declare(broker)
    publisher = Publisher(broker, (STREAM, QUEUE))
    publisher.publish(1500)  # batches have records from the first one on
    publisher.start()
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
    settings = {"data_dir": str(broker.data_dir), "checkpoint": str(checkpoint), "output": str(output),
                "max_records": 400, "trigger": "200 milliseconds"}
    if os.environ.get("AMQP_QUEUE_BROKEN"):
        settings["env"] = {"AMQP_QUEUE_BROKEN": os.environ["AMQP_QUEUE_BROKEN"]}
    kills = []
    try:
        for run in range(2):
            driver = Driver(tmp_path, dict(settings), f"run{run}")
            kills.append(kill_during_a_batch(driver, checkpoint, after_commits=2))
    finally:
        published = publisher.finish()
    last = Driver(tmp_path, {**settings, "trigger": "available-now"}, "final")
    assert last.wait(within=400) == 0, last.tail()

    planned, done = batch_log(checkpoint)
    assert planned == done and len(done) >= 6, (planned, done)
    rows = committed_rows(output)
    assert_exactly_once(rows, {STREAM: published, QUEUE: published})
    assert published > 1500, "the broker was publishing while the query ran"
    print("killed:", kills)


@pytest.mark.timeout(600)
def test_available_now_runs_one_after_another_while_the_broker_publishes(spark_session, broker, tmp_path):
    declare(broker)
    publisher = Publisher(broker, (STREAM, QUEUE))
    publisher.publish(500)
    publisher.start()
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"

    def run(trigger: dict) -> object:
        df = (spark_session.readStream.format("amqp-queue").option("startingOffsets", "earliest")
              .option("maxRecordsPerTrigger", 300).load(str(broker.data_dir)))
        return (df.select("queue", "seq", "message_id", "body").writeStream.format("parquet")
                .option("path", str(output)).option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    try:
        live = run({"processingTime": "200 milliseconds"})  # rows appear while the broker writes
        wait_until(lambda: sum(p["numInputRows"] for p in live.recentProgress) > 800 and
                   live.lastProgress["numInputRows"] > 0, "rows read live", within=240)
        live.stop()
        for _ in range(3):
            query = run({"availableNow": True})
            query.awaitTermination()
            assert query.exception() is None
    finally:
        published = publisher.finish()
    query = run({"availableNow": True})
    query.awaitTermination()
    assert_exactly_once(committed_rows(output), {STREAM: published, QUEUE: published})


def run_available_now(session, data_dir: Path, checkpoint: Path, output: Path, **options: str):
    """One availableNow run of a query over ``data_dir``; the finished (or failed) query."""
    reader = session.readStream.format("amqp-queue").option("startingOffsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (reader.load(str(data_dir)).select("queue", "seq", "message_id", "body").writeStream.format("parquet")
             .option("path", str(output)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except Exception:  # a failed query: the test looks at query.exception()
        pass
    return query


@pytest.mark.timeout(600)
def test_queues_created_deleted_and_trimmed_during_the_query_have_their_outcomes(spark_session, broker, tmp_path):
    retained = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 16 * 1024,
                "x-max-length-bytes": 64 * 1024}
    declare(broker, **{"orders-kept": SMALL_SEGMENTS, "orders-trimmed": retained})
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
    publisher = Publisher(broker, ("orders-kept", "orders-trimmed"))
    publisher.publish(100)
    options = {"queue": "orders-*", "maxRecordsPerTrigger": "500"}
    assert run_available_now(spark_session, broker.data_dir, checkpoint, output, **options).exception() is None

    # Created during the query: read from its first message. Trimmed by retention before the query
    # read it: with failOnDataLoss=true the query fails and says what is gone ...
    with connect(broker) as connection:
        connection.channel().queue_declare("orders-new", durable=True)
    publisher.targets = ("orders-kept", "orders-trimmed", "orders-new")
    publisher.publish(1200)
    failed = run_available_now(spark_session, broker.data_dir, checkpoint, output, **options)
    assert failed.exception() is not None
    assert "'orders-trimmed'" in str(failed.exception()) and "retention removed offsets 100.." in str(failed.exception())
    # ... and with false it skips them, counts them in its offsets and goes on from the first one kept.
    query = run_available_now(spark_session, broker.data_dir, checkpoint, output, failOnDataLoss="false", **options)
    assert query.exception() is None
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in query.recentProgress if p["numInputRows"]]
    node = str(broker.data_dir)
    lost = ends[-1]["nodes"][node]["streams"]["/"]["orders-trimmed"]["lost"]
    rows = committed_rows(output)
    trimmed = sorted(r["seq"] for r in rows if r["queue"] == "orders-trimmed")
    assert lost > 0 and trimmed[:100] == list(range(100)) and trimmed[100] == 100 + lost
    assert trimmed[100:] == list(range(100 + lost, 1300)), "from the first offset kept on, every one"
    assert sorted(r["seq"] for r in rows if r["queue"] == "orders-kept") == list(range(1300))
    assert sorted(r["message_id"] for r in rows if r["queue"] == "orders-new") == sorted(f"m-{i}" for i in range(100, 1300))

    # Deleted during the query: with failOnDataLoss=true the query fails naming it; with false it
    # goes on without it.
    with connect(broker) as connection:
        connection.channel().queue_delete("orders-kept")
    publisher.targets = ("orders-new",)
    publisher.publish(10)
    failed = run_available_now(spark_session, broker.data_dir, checkpoint, output, **options)
    assert "'orders-kept'" in str(failed.exception()) and "was deleted" in str(failed.exception())
    query = run_available_now(spark_session, broker.data_dir, checkpoint, output, failOnDataLoss="false", **options)
    assert query.exception() is None
    publisher.finish()
    rows = committed_rows(output)
    assert sorted(r["message_id"] for r in rows if r["queue"] == "orders-new") == sorted(f"m-{i}" for i in range(100, 1310))
    assert len({(r["queue"], r["seq"]) for r in rows}) == len(rows)


@pytest.mark.timeout(600)
def test_a_damaged_stream_fails_the_query_with_the_file_and_place_or_is_skipped(spark_session, tmp_path):
    from pamqp import commands

    from persistence.stream_log import StreamLog
    from spark.synthetic_queue import raw_properties

    data = tmp_path / "data"
    log = StreamLog.open_in(data, "/", STREAM)
    props = raw_properties(commands.Basic.Properties(delivery_mode=2, message_id="m"))
    for i in range(200):
        log.append("", STREAM, props, body(i), timestamp_ms=1_700_000_000_000 + i)
    log.close()
    segment = next(data.rglob("*.seg"))
    damaged = bytearray(segment.read_bytes())
    damaged[40 + 50] ^= 0xFF  # inside the first record
    segment.write_bytes(bytes(damaged))
    failed = run_available_now(spark_session, data, tmp_path / "c1", tmp_path / "o1")
    assert failed.exception() is not None
    assert "CRC mismatch" in str(failed.exception()) and segment.name in str(failed.exception())
    query = run_available_now(spark_session, data, tmp_path / "c2", tmp_path / "o2", failOnDataLoss="false")
    assert query.exception() is None
    assert sorted(r["seq"] for r in committed_rows(tmp_path / "o2")) == list(range(1, 200))
    with pytest.raises(Exception, match="maxRecordsPerTrigger"):
        spark_session.readStream.format("amqp-queue").option("maxRecordsPerTrigger", "lots").load(str(data)) \
            .writeStream.format("noop").start().awaitTermination(60)


# ---- the sink ------------------------------------------------------------------------------------


def consume_all(broker: BrokerProcess, queue: str) -> list[tuple[object, bytes]]:
    got = []
    with connect(broker) as connection:
        channel = connection.channel()
        while True:
            method, properties, payload = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append((properties, payload))


@pytest.mark.timeout(900)
def test_a_pipeline_publishes_back_every_alert_once_though_the_driver_died_between_publish_and_commit(
        broker, tmp_path):
    declare(broker)
    with connect(broker) as connection:
        connection.channel().queue_declare("alerts", durable=True, arguments={
            "x-message-deduplication": True, "x-cache-size": 100_000})
    publisher = Publisher(broker, (STREAM,))
    publisher.publish(3000)
    published = publisher.finish()
    commits = tmp_path / "commits"
    settings = {"data_dir": str(broker.data_dir), "checkpoint": str(tmp_path / "checkpoint"), "sink": "amqp",
                "url": broker.url(), "routing_key": "alerts", "queue": STREAM, "max_records": 700,
                "trigger": "200 milliseconds",
                "env": {"AMQP_QUEUE_COMMIT_LOG": str(commits), "AMQP_QUEUE_DIE_AT_BATCH": "1",
                        **({"AMQP_QUEUE_BROKEN": os.environ["AMQP_QUEUE_BROKEN"]}
                           if os.environ.get("AMQP_QUEUE_BROKEN") else {})}}
    dying = Driver(tmp_path, dict(settings), "dies")
    dying.wait(within=400)  # it kills itself in batch 1's commit, after the batch was published
    assert sorted(p.name.split(".")[0] for p in commits.iterdir()) == ["0", "1"], dying.tail()
    again = Driver(tmp_path, {**settings, "trigger": "available-now"}, "again")
    assert again.wait(within=400) == 0, again.tail()
    assert len([p for p in commits.iterdir() if p.name.startswith("1.")]) == 2, "batch 1 was published twice"

    alerts = consume_all(broker, "alerts")
    expected = {f"alert:m-{i}" for i in range(published) if i % 3 == 0}
    bodies = Counter(payload.decode() for _, payload in alerts)
    assert not [b for b, n in bodies.items() if n > 1], "an alert published twice reached the queue"
    assert set(bodies) == expected
    properties = alerts[0][0]
    assert properties.delivery_mode == 2 and properties.message_id.count(":") == 3
    assert int(properties.headers["source_seq"]) % 3 == 0


@pytest.mark.timeout(600)
def test_a_batch_write_publishes_with_confirms_and_its_own_ids_deduplicate(spark_session, broker):
    with connect(broker) as connection:
        connection.channel().queue_declare("published", durable=True, arguments={"x-message-deduplication": True})
    rows = spark_session.createDataFrame(
        [(f"body {i}".encode(), "published", f"corr-{i}", {"n": str(i)}) for i in range(500)],
        "body binary, routing_key string, correlation_id string, headers map<string,string>")
    for _ in range(2):  # the same write twice, with the same idPrefix: the second adds nothing
        rows.write.format("amqp-queue").mode("append").option("url", broker.url()).option("idPrefix", "load-7").save()
    got = consume_all(broker, "published")
    assert sorted(payload for _, payload in got) == sorted(f"body {i}".encode() for i in range(500))
    properties = {p.correlation_id: p for p, _ in got}
    assert properties["corr-9"].headers == {"n": "9"} and properties["corr-9"].delivery_mode == 2
    assert properties["corr-9"].message_id.startswith("load-7:0:")

    with pytest.raises(Exception, match="no column weight"):
        spark_session.createDataFrame([(b"x", 1)], "body binary, weight int").write.format("amqp-queue") \
            .mode("append").option("url", broker.url()).save()
    with pytest.raises(Exception, match="returned as unroutable"):
        spark_session.createDataFrame([(b"x", "nowhere")], "body binary, routing_key string") \
            .write.format("amqp-queue").mode("append").option("url", broker.url()).save()
