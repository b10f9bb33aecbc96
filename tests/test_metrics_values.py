"""Exact Prometheus values after a known AMQP workload, driven through the real connection and
channel code by feeding frames (no sockets): what a dashboard would show."""

from __future__ import annotations

import time

import pytest
from pamqp import commands
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from amqp_server.broker.broker import Broker
from amqp_server.metrics import process_stats
from amqp_server.metrics.core_collector import AGGREGATED, PER_OBJECT, CoreCollector
from amqp_server.metrics.detailed_collector import DetailedCollector
from amqp_server.metrics.process_stats import ProcessStats
from tests.frame_driver import marshal, methods, opened_client

FIXED_PROCESS = ProcessStats(
    resident_memory_bytes=100, memory_limit_bytes=1000, open_fds=7, max_fds=1024, disk_free_bytes=10**9,
    disk_free_limit_bytes=50_000_000, total_memory_bytes=2500,
)
AMQP = {"protocol": "amqp091"}
CLASSIC = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}


def scrape(collector) -> dict[tuple[str, frozenset], float]:
    """Every sample of one scrape, parsed back from the text format as Prometheus reads it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def aggregated(broker: Broker):
    return scrape(CoreCollector(broker, AGGREGATED, lambda: FIXED_PROCESS))


def get(client, queue: str, no_ack: bool, channel: int = 1):
    return methods(client.send(channel, commands.Basic.Get(queue=queue, no_ack=no_ack)))[0]


@pytest.fixture
def workload() -> Broker:
    """10 published in confirm mode into q, 1 dropped, 1 returned; 3 got with ack, 1 got
    without ack, 1 get on an empty queue; 4 consumed with manual ack of which 1 nacked back
    and redelivered; 1 rejected to a dead-letter-less queue (dropped as 'rejected')."""
    broker = Broker()
    client = opened_client(broker, channels=(1, 2))
    client.call(1, commands.Queue.Declare(queue="q"))
    client.call(1, commands.Queue.Declare(queue="empty"))
    client.call(1, commands.Confirm.Select())
    for index in range(10):
        client.publish(1, b"m%d" % index, routing_key="q")
    client.publish(1, b"nowhere", routing_key="no-such-queue")
    client.publish(1, b"back", routing_key="no-such-queue", mandatory=True)
    for _ in range(3):
        ok = get(client, "q", no_ack=False)
        client.send(1, commands.Basic.Ack(delivery_tag=ok.delivery_tag))
    get(client, "q", no_ack=True)
    assert isinstance(get(client, "empty", no_ack=False), commands.Basic.GetEmpty)
    client.call(2, commands.Basic.Qos(prefetch_count=4))
    received = methods(client.send(2, commands.Basic.Consume(queue="q", consumer_tag="c")))
    delivered = [m for m in received if isinstance(m, commands.Basic.Deliver)]
    assert len(delivered) == 4
    client.send(2, commands.Basic.Nack(delivery_tag=delivered[0].delivery_tag, requeue=True))
    client.send(2, commands.Basic.Ack(delivery_tag=delivered[1].delivery_tag))
    client.send(2, commands.Basic.Reject(delivery_tag=delivered[2].delivery_tag, requeue=False))
    # Left: deliveries 4 and the redelivered first unacked (prefetch 4: 2 more fill the room).
    return broker


def test_global_counters_are_exact_after_the_workload(workload: Broker):
    samples = aggregated(workload)
    assert value(samples, "rabbitmq_global_messages_received_total", **AMQP) == 12
    assert value(samples, "rabbitmq_global_messages_received_confirm_total", **AMQP) == 12
    assert value(samples, "rabbitmq_global_messages_routed_total", **AMQP) == 10
    assert value(samples, "rabbitmq_global_messages_unroutable_dropped_total", **AMQP) == 1
    assert value(samples, "rabbitmq_global_messages_unroutable_returned_total", **AMQP) == 1
    assert value(samples, "rabbitmq_global_messages_delivered_get_manual_ack_total", **CLASSIC) == 3
    assert value(samples, "rabbitmq_global_messages_delivered_get_auto_ack_total", **CLASSIC) == 1
    assert value(samples, "rabbitmq_global_messages_get_empty_total", **CLASSIC) == 1
    # 4 consumed at first, then the nack, ack and reject freed 3 slots: 2 more ready plus the redelivery.
    assert value(samples, "rabbitmq_global_messages_delivered_consume_manual_ack_total", **CLASSIC) == 7
    assert value(samples, "rabbitmq_global_messages_delivered_consume_auto_ack_total", **CLASSIC) == 0
    assert value(samples, "rabbitmq_global_messages_delivered_total", **CLASSIC) == 11
    assert value(samples, "rabbitmq_global_messages_redelivered_total", **CLASSIC) == 1
    assert value(samples, "rabbitmq_global_messages_acknowledged_total", **CLASSIC) == 4
    dropped = {"queue_type": "rabbit_classic_queue", "dead_letter_strategy": "disabled"}
    assert value(samples, "rabbitmq_global_messages_dead_lettered_rejected_total", **dropped) == 1
    assert value(samples, "rabbitmq_global_consumers", **AMQP) == 1
    assert value(samples, "rabbitmq_global_publishers", **AMQP) == 1


def test_queue_and_object_gauges_are_exact_after_the_workload(workload: Broker):
    samples = aggregated(workload)
    # q: 10 - 3 got - 1 got without ack - 1 acked - 1 rejected = 4 left, all delivered and unacked.
    assert value(samples, "rabbitmq_queue_messages_ready") == 0
    assert value(samples, "rabbitmq_queue_messages_unacked") == 4
    assert value(samples, "rabbitmq_queue_messages") == 4
    assert value(samples, "rabbitmq_queue_messages_published_total") == 10
    assert value(samples, "rabbitmq_queues") == 2
    assert value(samples, "rabbitmq_connections") == 1
    assert value(samples, "rabbitmq_channels") == 2
    assert value(samples, "rabbitmq_consumers") == 1
    assert value(samples, "rabbitmq_channel_consumers") == 1
    assert value(samples, "rabbitmq_channel_messages_unacked") == 4
    assert value(samples, "rabbitmq_consumer_prefetch") == 4
    assert value(samples, "rabbitmq_queues_declared_total") == 2
    assert value(samples, "rabbitmq_queues_created_total") == 2
    assert value(samples, "rabbitmq_connections_opened_total") == 1
    assert value(samples, "rabbitmq_channels_opened_total") == 2


def test_legacy_channel_counters_match_the_global_ones(workload: Broker):
    samples = aggregated(workload)
    assert value(samples, "rabbitmq_channel_messages_published_total") == 12
    assert value(samples, "rabbitmq_channel_messages_unroutable_dropped_total") == 1
    assert value(samples, "rabbitmq_channel_messages_unroutable_returned_total") == 1
    assert value(samples, "rabbitmq_channel_get_ack_total") == 3
    assert value(samples, "rabbitmq_channel_get_total") == 1
    assert value(samples, "rabbitmq_channel_get_empty_total") == 1
    assert value(samples, "rabbitmq_channel_messages_delivered_ack_total") == 7
    assert value(samples, "rabbitmq_channel_messages_delivered_total") == 0
    assert value(samples, "rabbitmq_channel_messages_redelivered_total") == 1
    assert value(samples, "rabbitmq_channel_messages_acked_total") == 4


def test_counters_survive_closing_the_connection_and_deleting_the_queue(workload: Broker):
    before = aggregated(workload)
    for connection in list(workload.connections):
        connection.close_by_broker(320, "test")
        connection.transport_closed()
    vhost = workload.vhosts["/"]
    vhost.delete_queue(vhost.queues["q"])
    after = aggregated(workload)
    for name in ("rabbitmq_global_messages_delivered_total", "rabbitmq_global_messages_acknowledged_total",
                 "rabbitmq_global_messages_redelivered_total"):
        assert value(after, name, **CLASSIC) == value(before, name, **CLASSIC)
    assert value(after, "rabbitmq_queue_messages_published_total") == 10
    assert value(after, "rabbitmq_connections") == 0
    assert value(after, "rabbitmq_connections_closed_total") == 1
    assert value(after, "rabbitmq_channels_closed_total") == 2
    assert value(after, "rabbitmq_queues") == 1


def test_per_object_endpoint_labels_each_queue_and_channel(workload: Broker):
    samples = scrape(CoreCollector(workload, PER_OBJECT, lambda: FIXED_PROCESS))
    assert value(samples, "rabbitmq_queue_messages_unacked", vhost="/", queue="q") == 4
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue="empty") == 0
    assert value(samples, "rabbitmq_queue_consumers", vhost="/", queue="q") == 1
    channel_rows = {labels for (name, labels) in samples if name == "rabbitmq_channel_consumers"}
    assert len(channel_rows) == 2
    identity = [labels for (name, labels) in samples if name == "rabbitmq_identity_info"]
    assert ("rabbitmq_endpoint", "per-object") in identity[0]


def test_detailed_endpoint_returns_only_the_families_and_vhosts_asked_for(workload: Broker):
    workload.add_vhost("other")
    workload.vhosts["other"].declare_queue("elsewhere", connection=None)
    samples = scrape(DetailedCollector(workload, ["queue_coarse_metrics"], ["/"]))
    names = {name for name, _labels in samples}
    assert "rabbitmq_detailed_queue_messages_unacked" in names
    assert "rabbitmq_detailed_queue_consumers" not in names
    assert value(samples, "rabbitmq_detailed_queue_messages_unacked", vhost="/", queue="q") == 4
    assert not any(("queue", "elsewhere") in labels for _name, labels in samples)

    everything = scrape(DetailedCollector(
        workload, ["queue_consumer_count", "exchange_names", "exchange_bindings", "vhost_status"]))
    assert value(everything, "rabbitmq_detailed_queue_consumers", vhost="other", queue="elsewhere") == 0
    # The cluster-wide families keep RabbitMQ's rabbitmq_cluster_ names on this endpoint too.
    assert value(everything, "rabbitmq_cluster_vhost_status", vhost="other") == 1
    assert value(everything, "rabbitmq_cluster_exchange_name", vhost="other", exchange="amq.topic", type="topic") == 1
    assert value(everything, "rabbitmq_cluster_exchange_bindings", vhost="other", exchange="amq.topic",
                 type="topic") == 0
    bare = scrape(DetailedCollector(workload, []))
    assert {name for name, _labels in bare} == {"rabbitmq_identity_info", "rabbitmq_build_info"}


def test_dead_lettering_is_labelled_by_whether_the_queue_has_a_dead_letter_exchange():
    broker = Broker()
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="dlq"))
    client.call(1, commands.Queue.Declare(queue="limited", arguments={
        "x-max-length": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}))
    client.call(1, commands.Queue.Declare(queue="short", arguments={"x-max-length": 1}))
    for queue in ("limited", "limited", "limited", "short", "short"):
        client.publish(1, b"x", routing_key=queue)
    samples = aggregated(broker)
    republished = {"queue_type": "rabbit_classic_queue", "dead_letter_strategy": "at_most_once"}
    dropped = {"queue_type": "rabbit_classic_queue", "dead_letter_strategy": "disabled"}
    assert value(samples, "rabbitmq_global_messages_dead_lettered_maxlen_total", **republished) == 2
    assert value(samples, "rabbitmq_global_messages_dead_lettered_maxlen_total", **dropped) == 1
    assert value(samples, "rabbitmq_queue_messages_ready") == 4  # dlq 2, limited 1, short 1


def test_process_figures_and_identity_come_through(monkeypatch):
    # The node started 42 s ago, whenever this test runs.
    monkeypatch.setattr(process_stats, "_STARTED_AT", time.monotonic() - 42)
    broker = Broker()
    samples = aggregated(broker)
    assert value(samples, "rabbitmq_process_open_fds") == 7
    assert value(samples, "rabbitmq_process_max_fds") == 1024
    assert value(samples, "rabbitmq_resident_memory_limit_bytes") == 1000
    assert value(samples, "rabbitmq_disk_space_available_limit_bytes") == 50_000_000
    assert 42 <= value(samples, "rabbitmq_erlang_uptime_seconds") < 52
    assert value(samples, "rabbitmq_identity_info", rabbitmq_node=broker.node_name,
                 rabbitmq_cluster=broker.cluster_name,
                 rabbitmq_cluster_permanent_id=next(
                     dict(labels)["rabbitmq_cluster_permanent_id"]
                     for name, labels in samples if name == "rabbitmq_identity_info"),
                 rabbitmq_endpoint="aggregated") == 1


def test_message_size_histogram_counts_every_published_size():
    broker = Broker()
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="q"))
    sizes = (10, 100, 101, 5000, 150_000)  # the last one in two body frames
    for size in sizes:
        client.publish(1, b"x" * size, routing_key="q")
    samples = aggregated(broker)
    bucket = "rabbitmq_message_size_bytes_bucket"
    assert value(samples, bucket, protocol="amqp091", le="100") == 2
    assert value(samples, bucket, protocol="amqp091", le="1000") == 3
    assert value(samples, bucket, protocol="amqp091", le="10000") == 4
    assert value(samples, bucket, protocol="amqp091", le="100000") == 4
    assert value(samples, bucket, protocol="amqp091", le="1000000") == 5
    assert value(samples, bucket, protocol="amqp091", le="100000000") == 5
    assert value(samples, bucket, protocol="amqp091", le="+Inf") == 5
    assert value(samples, "rabbitmq_message_size_bytes_count", protocol="amqp091") == 5
    assert value(samples, "rabbitmq_message_size_bytes_sum", protocol="amqp091") == sum(sizes)


def test_limits_and_alarms_are_the_brokers_own():
    from amqp_server.metrics.broker_view import process_stats_of

    broker = Broker()
    broker.alarms.set_memory_high_watermark(absolute=123_456_789)
    broker.alarms.set("memory", True)
    samples = scrape(CoreCollector(broker, AGGREGATED, lambda: process_stats_of(broker)))
    assert value(samples, "rabbitmq_resident_memory_limit_bytes") == 123_456_789
    assert value(samples, "rabbitmq_disk_space_available_limit_bytes") == broker.alarms.disk_free_limit
    assert value(samples, "rabbitmq_alarms_memory_used_watermark") == 1
    assert value(samples, "rabbitmq_alarms_free_disk_space_watermark") == 0


def test_memory_and_disk_figures_are_the_alarms_measurements():
    """What the dashboards plot (used vs limit) is what the alarm compares."""
    from amqp_server.broker.alarms import MemoryGauge, ResourceMonitor
    from amqp_server.metrics.broker_view import process_stats_of

    broker = Broker()
    broker.alarms.set_memory_high_watermark(absolute=50_000_000)
    monitor = ResourceMonitor(broker, gauge=MemoryGauge(read_rss=lambda: 60_000_000, trim=None),
                              read_disk_free=lambda: 40_000_000)
    monitor.check()
    samples = scrape(CoreCollector(broker, AGGREGATED, lambda: process_stats_of(broker)))
    assert value(samples, "rabbitmq_process_resident_memory_bytes") == 60_000_000
    assert value(samples, "rabbitmq_resident_memory_limit_bytes") == 50_000_000
    assert value(samples, "rabbitmq_alarms_memory_used_watermark") == 1
    assert value(samples, "rabbitmq_disk_space_available_bytes") == 40_000_000
    assert value(samples, "rabbitmq_disk_space_available_limit_bytes") == 50_000_000
    assert value(samples, "rabbitmq_alarms_free_disk_space_watermark") == 1


def test_queues_deleted_counts_every_way_a_queue_goes():
    broker = Broker()
    owner = opened_client(broker)
    owner.call(1, commands.Queue.Declare(queue="mine", exclusive=True))
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="gone"))
    client.call(1, commands.Queue.Declare(queue="auto", auto_delete=True))
    client.call(1, commands.Basic.Consume(queue="auto", consumer_tag="c"))
    client.call(1, commands.Queue.Delete(queue="gone"))  # queue.delete
    client.call(1, commands.Basic.Cancel(consumer_tag="c"))  # auto-delete: its last consumer left
    # Exclusive: its owner's connection closed.
    owner.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert not broker.vhosts["/"].queues
    assert value(aggregated(broker), "rabbitmq_queues_deleted_total") == 3


def test_connection_traffic_counts_every_byte_read_and_written():
    broker = Broker()
    opened_client(broker, channels=(1, 2))
    second = opened_client(broker)
    payload = second.publish_bytes(1, b"x" * 500, routing_key="nowhere") + marshal(1, commands.Basic.Qos())
    before = aggregated(broker)
    second.connection.receive_data(payload)
    written = second.connection.take_output()
    after = aggregated(broker)
    assert value(after, "rabbitmq_connection_incoming_bytes_total") - value(
        before, "rabbitmq_connection_incoming_bytes_total") == len(payload)
    assert value(after, "rabbitmq_connection_outgoing_bytes_total") - value(
        before, "rabbitmq_connection_outgoing_bytes_total") == len(written) > 0
    assert value(after, "rabbitmq_connection_incoming_packets_total") - value(
        before, "rabbitmq_connection_incoming_packets_total") == 1
    assert value(after, "rabbitmq_connection_channels") == 3

    alone = opened_client(channels=(1, 2))  # its own broker: fake clients share one peer address
    per_object = scrape(CoreCollector(alone.broker, PER_OBJECT, lambda: FIXED_PROCESS))
    name = alone.connection.name
    assert value(per_object, "rabbitmq_connection_channels", channel=name) == 2
    assert value(per_object, "rabbitmq_connection_incoming_bytes_total", channel=name) == alone.connection.received_bytes
