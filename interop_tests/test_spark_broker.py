"""Spark reads what a running broker wrote, and agrees exactly with what the broker says.

A dedicated broker (own data directory, management API and Prometheus metrics on) gets real
pika traffic: publishes with every basic property, acks, rejects into a dead-letter queue,
nack-requeues, messages left unacked on an open channel, x-max-length drops and TTL expiry.
While the broker runs (the unacked messages still held), one local SparkSession reads the
data directory with ``format("amqp-queue")``. Counts by state per queue must equal the
broker's own figures (management API, Prometheus counters), and bodies and properties must
equal byte for byte both what was published and what the broker then delivers.
"""

from __future__ import annotations

import datetime
import json
import random
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pika = pytest.importorskip("pika")

from interop_tests.broker_process import BrokerProcess, free_port, launch  # noqa: E402
from interop_tests.waiting import wait_until  # noqa: E402

UTC = datetime.timezone.utc
WORK, DLQ, CAPPED, TTL = "spark-work", "spark-work-dlq", "spark-capped", "spark-ttl"
LATER = "spark-later"  # a durable delayed exchange holding one message for an hour


@pytest.fixture(scope="session")
def spark_session() -> Iterator[object]:
    """One local SparkSession for every Spark test of the run (the JVM costs seconds to start)."""
    from spark.session import local_session

    session = local_session()
    yield session
    session.stop()


@dataclass
class Scenario:
    broker: BrokerProcess
    management_port: int
    metrics_port: int
    published: dict[str, tuple[bytes, pika.BasicProperties]] = field(default_factory=dict)
    holder: pika.BlockingConnection | None = None  # keeps 5 messages unacked while Spark reads
    requeued_ids: set[str] = field(default_factory=set)

    def api(self, path: str) -> object:
        request = urllib.request.Request(f"http://127.0.0.1:{self.management_port}/api/{path}")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def properties(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type="application/octet-stream",
        content_encoding="identity" if i % 2 else None,
        headers={"tenant": f"t{i % 3}", "attempt": i, "flag": i % 2 == 0, "nested": {"k": "v"}},
        delivery_mode=2,
        priority=i % 10,
        correlation_id=f"corr-{i}",
        reply_to="replies" if i % 4 == 0 else None,
        expiration="3600000" if i % 5 == 0 else None,
        message_id=f"msg-{i}",
        timestamp=1_700_000_000 + i,
        type="order.created",
        user_id="guest",
        app_id="spark-interop",
    )


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    management_port, metrics_port = free_port(), free_port()
    broker = launch(tmp_path_factory.mktemp("spark-broker"), extra_args=(
        "--management-port", str(management_port), "--metrics-port", str(metrics_port)))
    scene = Scenario(broker, management_port, metrics_port)
    rng = random.Random(5)
    # Neither connection is pumped while Spark reads (minutes on a loaded machine): no heartbeats,
    # or the broker closes them after two intervals and requeues what the holder holds.
    connection = pika.BlockingConnection(pika.URLParameters(broker.url() + "?heartbeat=0"))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(DLQ, durable=True)
        channel.queue_declare(WORK, durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": DLQ})
        channel.queue_declare(CAPPED, durable=True, arguments={"x-max-length": 5})
        channel.queue_declare(TTL, durable=True)
        sizes = [0, 1, 200_000] + [rng.randrange(1, 3000) for _ in range(37)]
        for i, size in enumerate(sizes):
            body = bytes(rng.randrange(256) for _ in range(size))
            props = properties(i)
            channel.basic_publish("", WORK, body, props)
            scene.published[props.message_id] = (body, props)
        for i in range(8):
            channel.basic_publish("", CAPPED, f"capped {i}".encode(), pika.BasicProperties(delivery_mode=2))
        for i in range(4):
            channel.basic_publish("", TTL, f"short-lived {i}".encode(),
                                  pika.BasicProperties(delivery_mode=2, expiration="1"))
        channel.exchange_declare(LATER, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        channel.basic_publish(LATER, "reminder", b"in an hour",
                              pika.BasicProperties(delivery_mode=2, headers={"x-delay": 3_600_000}))

        for _ in range(15):
            method, _, _ = channel.basic_get(WORK)
            channel.basic_ack(method.delivery_tag)
        for _ in range(6):
            method, _, _ = channel.basic_get(WORK)
            channel.basic_reject(method.delivery_tag, requeue=False)
        scene.holder = pika.BlockingConnection(pika.URLParameters(broker.url() + "?heartbeat=0"))
        holder_channel = scene.holder.channel()
        for _ in range(5):
            assert holder_channel.basic_get(WORK)[0] is not None
        taken = [channel.basic_get(WORK) for _ in range(4)]
        for method, props, _ in taken:
            scene.requeued_ids.add(props.message_id)
            channel.basic_nack(method.delivery_tag, requeue=True)
        # Expiry happens at the broker's pace: wait until it reports the TTL queue empty.
        wait_until(lambda: channel.queue_declare(TTL, passive=True).method.message_count == 0, "TTL expiry")
        wait_until(lambda: channel.queue_declare(DLQ, passive=True).method.message_count == 6, "dead letters")
        holder_channel.queue_declare(WORK, passive=True)  # round trips: the records above are written
        channel.queue_declare(WORK, passive=True)
        yield scene
    finally:
        if scene.holder is not None and scene.holder.is_open:
            scene.holder.close()
        if connection.is_open:
            connection.close()
        broker.stop()


def test_counts_by_state_per_queue_equal_the_brokers(spark_session, scenario):
    df = spark_session.read.format("amqp-queue").load(str(scenario.broker.data_dir))
    counts = Counter({(r["queue"], r["state"]): r["count"] for r in df.groupBy("queue", "state").count().collect()})
    assert counts == Counter({
        (WORK, "acked"): 15, (WORK, "dead_lettered"): 6, (WORK, "unacked"): 5, (WORK, "ready"): 14,
        (DLQ, "ready"): 6, (CAPPED, "ready"): 5, (CAPPED, "dead_lettered"): 3, (TTL, "expired"): 4,
    })
    for queue in (WORK, DLQ, CAPPED, TTL):
        info = scenario.api(f"queues/%2F/{queue}")
        assert info["messages_ready"] == counts[(queue, "ready")], queue
        assert info["messages_unacknowledged"] == counts[(queue, "unacked")], queue
        assert info.get("message_stats", {}).get("ack", 0) == counts[(queue, "acked")], queue
    assert scenario.api(f"queues/%2F/{WORK}")["message_stats"]["publish"] == 40

    by_reason = Counter(
        (r["state_event"], r["reason"]) for r in df.where("state = 'dead_lettered' or state = 'expired'")
        .select("state_event", "reason").collect())
    assert by_reason == Counter({("dead_lettered", "rejected"): 6, ("dropped", "maxlen"): 3, ("expired", None): 4})
    metric = "rabbitmq_global_messages_dead_lettered_{}_total"
    assert scenario.metric(metric.format("rejected")) == 6
    assert scenario.metric(metric.format("maxlen"), dead_letter_strategy="disabled") == 3
    assert scenario.metric(metric.format("expired"), dead_letter_strategy="disabled") == 4


def test_a_delayed_exchanges_store_is_read_only_when_asked_for(spark_session, scenario):
    data_dir = str(scenario.broker.data_dir)
    default = spark_session.read.format("amqp-queue").load(data_dir)
    assert default.where("delayed_exchange is not null").count() == 0  # also not in the counts above
    df = spark_session.read.format("amqp-queue").option("include_internal", "true").load(data_dir)
    [row] = df.where("delayed_exchange is not null").collect()
    assert (row["queue"], row["delayed_exchange"]) == (f"amq.x-delayed-message.{LATER}", LATER)
    assert (row["exchange"], row["routing_key"], row["body"]) == (LATER, "reminder", b"in an hour")
    assert (row["state"], dict(row["headers"])) == ("waiting_retry", {"x-delay": "3600000"})
    assert row["due_at"] - row["published_at"] == datetime.timedelta(hours=1)


def test_bodies_and_properties_equal_what_was_published_byte_for_byte(spark_session, scenario):
    df = spark_session.read.format("amqp-queue").option("queue", WORK).load(str(scenario.broker.data_dir))
    rows = {r["message_id"]: r for r in df.collect()}
    assert set(rows) == set(scenario.published)
    for message_id, (body, props) in scenario.published.items():
        row = rows[message_id]
        assert row["body"] == body and row["body_size"] == len(body)
        assert (row["exchange"], row["routing_key"]) == ("", WORK)
        assert row["content_type"] == props.content_type and row["content_encoding"] == props.content_encoding
        assert dict(row["headers"]) == {"tenant": props.headers["tenant"], "attempt": str(props.headers["attempt"]),
                                        "flag": "true" if props.headers["flag"] else "false",
                                        "nested": '{"k": "v"}'}
        assert (row["delivery_mode"], row["priority"]) == (2, props.priority)
        assert (row["correlation_id"], row["reply_to"], row["expiration"]) == (
            props.correlation_id, props.reply_to, props.expiration)
        assert row["timestamp"] == datetime.datetime.fromtimestamp(props.timestamp)  # PySpark: naive, local time
        assert (row["type"], row["user_id"], row["app_id"]) == (props.type, props.user_id, props.app_id)
    for message_id in scenario.requeued_ids:
        assert rows[message_id]["state"] == "ready" and rows[message_id]["state_event"] == "requeued"
        assert rows[message_id]["redelivered"] and rows[message_id]["delivery_count"] == 1


def test_dead_lettered_copies_carry_x_death_and_the_original_body(spark_session, scenario):
    df = spark_session.read.format("amqp-queue").load(str(scenario.broker.data_dir))
    dead = df.where(f"queue = '{WORK}' and state = 'dead_lettered'").select("message_id", "body").collect()
    copies = df.where(f"queue = '{DLQ}'").select("message_id", "body", "headers").collect()
    assert sorted((r["message_id"], r["body"]) for r in copies) == sorted((r["message_id"], r["body"]) for r in dead)
    for row in copies:
        [death] = json.loads(dict(row["headers"])["x-death"])
        assert (death["queue"], death["reason"], death["count"]) == (WORK, "rejected", 1)


def test_ready_rows_equal_what_the_broker_then_delivers(spark_session, scenario):
    df = spark_session.read.format("amqp-queue").option("queue", WORK).load(str(scenario.broker.data_dir))
    ready = {r["message_id"]: r for r in df.where("state = 'ready'").collect()}
    connection = pika.BlockingConnection(pika.URLParameters(scenario.broker.url()))
    try:
        channel = connection.channel()
        delivered = {}
        while True:  # held without ack until the connection closes, which puts them back
            method, props, body = channel.basic_get(WORK)
            if method is None:
                break
            delivered[props.message_id] = (body, props, method.redelivered)
    finally:
        connection.close()
    assert set(delivered) == set(ready)
    for message_id, (body, props, redelivered) in delivered.items():
        row = ready[message_id]
        assert row["body"] == body and row["redelivered"] == redelivered
        assert (row["priority"], row["correlation_id"], row["app_id"]) == (props.priority, props.correlation_id,
                                                                          props.app_id)


def test_pruned_schema_and_pushed_filters_give_the_same_answers(spark_session, scenario):
    from spark import columns

    data_dir = str(scenario.broker.data_dir)
    full = spark_session.read.format("amqp-queue").load(data_dir)
    narrow = spark_session.read.format("amqp-queue").schema(columns("queue", "seq", "state")).load(data_dir)
    assert narrow.columns == ["queue", "seq", "state"]
    assert sorted(narrow.groupBy("queue", "state").count().collect()) == sorted(
        full.groupBy("queue", "state").count().collect())
    query = f"queue = '{WORK}' and seq between 3 and 7 and state in ('acked', 'ready')"
    pushed = full.where(query).select("seq", "state")
    unpushed = spark_session.read.format("amqp-queue").option("pushdown", "false").load(data_dir).where(query)
    assert sorted(pushed.collect()) == sorted(unpushed.select("seq", "state").collect())
    assert pushed.rdd.getNumPartitions() == 1  # only the one segment of that queue and seq range
    spark_session.conf.set("spark.sql.python.filterPushdown.enabled", "false")  # Spark's default
    try:  # the data source then takes no filters, and answers the same
        assert sorted(full.where(query).select("seq", "state").collect()) == sorted(pushed.collect())
    finally:
        spark_session.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    later = datetime.datetime.now(UTC) + datetime.timedelta(days=1)
    assert full.where(full.published_at > later.replace(tzinfo=None)).count() == 0
    # ...and the opposite bound keeps every row: the time filter compares, it does not just drop.
    yesterday = datetime.datetime.now(UTC) - datetime.timedelta(days=1)
    assert full.where(full.published_at > yesterday.replace(tzinfo=None)).count() == full.count() > 0


def test_report_summarises_each_queue_and_draws_rates(spark_session, scenario, tmp_path):
    from spark import report

    summary = report.summarize(spark_session, str(scenario.broker.data_dir))
    work = summary.queues[("/", WORK)]
    assert (work.by_state["acked"], work.by_state["dead_lettered"], work.by_state["unacked"]) == (15, 6, 5)
    assert work.messages == 40 and work.redelivered >= 4 and work.dead_lettered == 6
    assert work.bytes == sum(len(body) for body, _ in scenario.published.values())
    assert work.top_routing_keys[0] == (WORK, 40)
    assert work.oldest_ready_age_s is not None and 0 <= work.oldest_ready_age_s < 600  # published minutes ago
    png = tmp_path / "rates.png"
    report.plot_rates(summary, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = report.format_summary(summary)
    assert WORK in text and "dead_lettered" in text


def test_report_command_prints_the_summary_and_writes_the_chart(spark_session, scenario, tmp_path, capsys):
    from spark import report

    png = tmp_path / "chart.png"
    assert report.main([str(scenario.broker.data_dir), "--queue", "spark-*", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"queue '{WORK}': 40 messages" in out and f"queue '{DLQ}'" in out
    assert png.stat().st_size > 10_000
