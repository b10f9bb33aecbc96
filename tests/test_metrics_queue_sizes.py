"""Per-queue bytes, paging and consumer utilisation, exact after a known workload, in the
management API's queue JSON and on /metrics/per-object and /metrics/detailed (queue_metrics)."""

from __future__ import annotations

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.metrics.core_collector import PER_OBJECT, CoreCollector
from amqp_server.metrics.detailed_collector import DetailedCollector
from queues.memory_budget import PER_MESSAGE_OVERHEAD
from tests.frame_driver import methods, opened_client
from tests.test_management_client import ManagementClient
from tests.test_metrics_values import FIXED_PROCESS, get, scrape, value


@pytest.fixture
def workload() -> Broker:
    """q gets bodies of 10, 20, 30 and 40 bytes: the 10 is got without ack, the 20 delivered to a
    prefetch-1 consumer (both unacked), 70 bytes stay ready; idle holds 5 bytes and no consumer;
    drained has a consumer and nothing waiting."""
    broker = Broker()
    client = opened_client(broker, channels=(1, 2))
    for name in ("q", "idle", "drained"):
        client.call(1, commands.Queue.Declare(queue=name))
    for size in (10, 20, 30, 40):
        client.publish(1, b"x" * size, routing_key="q")
    client.publish(1, b"y" * 5, routing_key="idle")
    assert isinstance(get(client, "q", no_ack=False), commands.Basic.GetOk)
    client.call(2, commands.Basic.Qos(prefetch_count=1))
    received = methods(client.send(2, commands.Basic.Consume(queue="q", consumer_tag="c")))
    assert sum(isinstance(m, commands.Basic.Deliver) for m in received) == 1
    client.send(2, commands.Basic.Consume(queue="drained", consumer_tag="d"))
    return broker


EXPECTED = {  # queue -> (bytes, unacked bytes, paged out, consumer utilisation)
    "q": (100, 30, 0, 0.0),
    "idle": (5, 0, 0, 0.0),
    "drained": (0, 0, 0, 1.0),
}


def test_per_object_metrics_carry_rabbitmqs_queue_size_series(workload: Broker):
    samples = scrape(CoreCollector(workload, PER_OBJECT, lambda: FIXED_PROCESS))
    for queue, (total, unacked, paged_out, utilisation) in EXPECTED.items():
        labels = {"vhost": "/", "queue": queue}
        assert value(samples, "rabbitmq_queue_messages_bytes", **labels) == total
        assert value(samples, "rabbitmq_queue_messages_unacked_bytes", **labels) == unacked
        assert value(samples, "rabbitmq_queue_messages_paged_out", **labels) == paged_out
        assert value(samples, "rabbitmq_queue_consumer_utilisation", **labels) == utilisation


def test_detailed_queue_metrics_carry_them_under_the_detailed_prefix(workload: Broker):
    samples = scrape(DetailedCollector(workload, ["queue_metrics"]))
    assert value(samples, "rabbitmq_detailed_queue_messages_bytes", vhost="/", queue="q") == 100
    assert value(samples, "rabbitmq_detailed_queue_messages_unacked_bytes", vhost="/", queue="q") == 30
    assert value(samples, "rabbitmq_detailed_queue_messages_paged_out", vhost="/", queue="idle") == 0
    assert value(samples, "rabbitmq_detailed_queue_consumer_utilisation", vhost="/", queue="drained") == 1.0


def test_queue_json_has_the_byte_fields_alerts_use(workload: Broker):
    api = ManagementClient(workload)
    try:
        listed = {q["name"]: q for q in api.get("/api/queues")}
        shown = api.get("/api/queues/%2F/q")
    finally:
        api.close()
    for queue, (total, unacked, paged_out, utilisation) in EXPECTED.items():
        item = listed[queue]
        assert (item["message_bytes"], item["message_bytes_unacknowledged"]) == (total, unacked)
        assert item["message_bytes_ready"] == total - unacked
        assert (item["messages_paged_out"], item["consumer_utilisation"]) == (paged_out, utilisation)
    assert shown["message_bytes_unacknowledged"] == 30
    # Estimate: bodies in memory plus the memory budget's overhead for each of the 4 messages held.
    assert listed["q"]["memory"] == 100 + 4 * PER_MESSAGE_OVERHEAD
