"""Every metric the reference notes ask for (../shared/reference/rabbitmq-compat.md §6) is served,
with the labels named there, on the endpoint named there.

The list below is §6 transcribed: the current RabbitMQ-Overview set (rows 1-31), the legacy
names of dashboards up to 2022, the dead-letter counters and the detailed per-queue family.
Scraped over HTTP from the metrics app with the real process figures, as Prometheus would.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import test_utils
from pamqp import commands
from prometheus_client.parser import text_string_to_metric_families

from amqp_server.broker.broker import Broker
from amqp_server.metrics.http_endpoint import build_metrics_app
from tests.frame_driver import opened_client

AMQP = {"protocol"}
# name -> label names every one of its series must carry (beyond those listed, any may appear).
CURRENT = {
    "rabbitmq_identity_info": {"rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id",
                               "rabbitmq_endpoint"},
    "rabbitmq_build_info": {"rabbitmq_version", "erlang_version", "prometheus_plugin_version",
                            "prometheus_client_version"},
    "rabbitmq_erlang_uptime_seconds": set(),
    "rabbitmq_connections": set(),
    "rabbitmq_channels": set(),
    "rabbitmq_queues": set(),
    "rabbitmq_global_consumers": AMQP,
    "rabbitmq_global_publishers": AMQP,
    "rabbitmq_queue_messages_ready": set(),
    "rabbitmq_queue_messages_unacked": set(),
    "rabbitmq_queue_messages": set(),
    "rabbitmq_global_messages_received_total": AMQP,
    "rabbitmq_global_messages_received_confirm_total": AMQP,
    "rabbitmq_global_messages_confirmed_total": AMQP,
    "rabbitmq_global_messages_routed_total": AMQP,
    "rabbitmq_global_messages_unroutable_dropped_total": AMQP,
    "rabbitmq_global_messages_unroutable_returned_total": AMQP,
    "rabbitmq_global_messages_delivered_total": AMQP,
    "rabbitmq_global_messages_delivered_consume_auto_ack_total": AMQP,
    "rabbitmq_global_messages_delivered_consume_manual_ack_total": AMQP,
    "rabbitmq_global_messages_delivered_get_auto_ack_total": AMQP,
    "rabbitmq_global_messages_delivered_get_manual_ack_total": AMQP,
    "rabbitmq_global_messages_redelivered_total": AMQP,
    "rabbitmq_global_messages_acknowledged_total": AMQP,
    "rabbitmq_global_messages_get_empty_total": AMQP,
    "rabbitmq_connections_opened_total": set(),
    "rabbitmq_connections_closed_total": set(),
    "rabbitmq_channels_opened_total": set(),
    "rabbitmq_channels_closed_total": set(),
    "rabbitmq_queues_declared_total": set(),
    "rabbitmq_queues_created_total": set(),
    "rabbitmq_queues_deleted_total": set(),
    "rabbitmq_process_resident_memory_bytes": set(),
    "rabbitmq_resident_memory_limit_bytes": set(),
    "rabbitmq_disk_space_available_bytes": set(),
    "rabbitmq_disk_space_available_limit_bytes": set(),
    "rabbitmq_process_open_fds": set(),
    "rabbitmq_process_max_fds": set(),
    "rabbitmq_message_size_bytes_bucket": AMQP | {"le"},
    "rabbitmq_message_size_bytes_sum": AMQP,
    "rabbitmq_message_size_bytes_count": AMQP,
}
LEGACY = {
    name: set() for name in (
        "rabbitmq_channel_messages_published_total", "rabbitmq_channel_messages_confirmed_total",
        "rabbitmq_channel_messages_unroutable_dropped_total", "rabbitmq_channel_messages_unroutable_returned_total",
        "rabbitmq_channel_messages_delivered_total", "rabbitmq_channel_messages_delivered_ack_total",
        "rabbitmq_channel_messages_redelivered_total", "rabbitmq_channel_messages_acked_total",
        "rabbitmq_channel_messages_unconfirmed", "rabbitmq_channel_get_total", "rabbitmq_channel_get_ack_total",
        "rabbitmq_channel_get_empty_total", "rabbitmq_channel_consumers", "rabbitmq_queue_messages_published_total",
        "rabbitmq_process_open_tcp_sockets", "rabbitmq_process_max_tcp_sockets",
    )
}
DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit", "confirmed")
DEAD_LETTERED = {
    f"rabbitmq_global_messages_dead_lettered_{reason}_total": {"queue_type", "dead_letter_strategy"}
    for reason in DEAD_LETTER_REASONS
}
# Histogram buckets from 100 bytes to 100 MB, as rabbitmq_prometheus.
SIZE_BUCKETS = {"100", "1000", "10000", "100000", "1000000", "10000000", "50000000", "100000000", "+Inf"}


def scrape(broker: Broker, path: str) -> dict[str, list[dict[str, str]]]:
    """metric name -> the labels of each of its series."""
    async def fetch() -> str:
        async with test_utils.TestClient(test_utils.TestServer(build_metrics_app(broker))) as client:
            response = await client.get(path)
            assert response.status == 200
            return await response.text()
    series: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(asyncio.run(fetch())):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(dict(sample.labels))
    return series


@pytest.fixture(scope="module")
def broker() -> Broker:
    broker = Broker()
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="jobs"))
    client.publish(1, b"x", routing_key="jobs")
    return broker


@pytest.mark.parametrize("endpoint,path", [("aggregated", "/metrics"), ("per-object", "/metrics/per-object")])
def test_every_reference_metric_is_served_with_its_labels(broker, endpoint, path):
    series = scrape(broker, path)
    wanted = {**CURRENT, **LEGACY, **DEAD_LETTERED}
    missing = sorted(name for name in wanted if name not in series)
    assert not missing, f"{path} lacks {missing}"
    for name, labels in wanted.items():
        for sample_labels in series[name]:
            assert labels <= set(sample_labels), f"{name} on {path} lacks {labels - set(sample_labels)}"
    [identity] = series["rabbitmq_identity_info"]
    assert identity["rabbitmq_endpoint"] == endpoint
    assert {labels["protocol"] for labels in series["rabbitmq_global_messages_received_total"]} == {"amqp091"}
    assert {labels["le"] for labels in series["rabbitmq_message_size_bytes_bucket"]} == SIZE_BUCKETS


def test_detailed_endpoint_serves_per_queue_series(broker):
    series = scrape(broker, "/metrics/detailed?family=queue_coarse_metrics&vhost=%2F")
    assert {"vhost": "/", "queue": "jobs"} in series["rabbitmq_detailed_queue_messages_ready"]
