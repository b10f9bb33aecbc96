"""The Prometheus HTTP endpoint: paths, query parameters and formats, as Prometheus scrapes it."""

from __future__ import annotations

import asyncio

from aiohttp import test_utils
from pamqp import commands
from prometheus_client.parser import text_string_to_metric_families

from amqp_server.broker.broker import Broker
from amqp_server.metrics.http_endpoint import build_metrics_app
from tests.frame_driver import opened_client
from tests.test_metrics_values import FIXED_PROCESS


def fetch(broker: Broker, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(status, content type, body) of one GET against the metrics app."""
    async def scenario() -> tuple[int, str, str]:
        app = build_metrics_app(broker, process_stats=lambda: FIXED_PROCESS)
        async with test_utils.TestClient(test_utils.TestServer(app)) as client:
            response = await client.get(path, headers=headers or {})
            return response.status, response.headers["Content-Type"], await response.text()
    return asyncio.run(scenario())


def names_in(text: str) -> set[str]:
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def broker_with_a_queue() -> Broker:
    broker = Broker()
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="jobs"))
    client.publish(1, b"x", routing_key="jobs")
    return broker


def test_metrics_is_served_in_the_prometheus_text_format():
    status, content_type, body = fetch(broker_with_a_queue(), "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "rabbitmq_queue_messages_ready 1.0" in body
    assert 'rabbitmq_global_messages_routed_total{protocol="amqp091"} 1.0' in body


def test_openmetrics_is_served_when_asked_for():
    status, content_type, body = fetch(
        broker_with_a_queue(), "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert "rabbitmq_identity_info{" in body  # the metrics themselves, not only the terminator
    assert body.rstrip().endswith("# EOF")


def test_per_object_has_one_series_per_queue():
    status, _type, body = fetch(broker_with_a_queue(), "/metrics/per-object")
    assert status == 200
    assert 'rabbitmq_queue_messages_ready{queue="jobs",vhost="/"} 1.0' in body
    assert 'rabbitmq_endpoint="per-object"' in body


def test_detailed_takes_repeated_family_and_vhost_parameters():
    broker = broker_with_a_queue()
    status, _type, body = fetch(
        broker, "/metrics/detailed?family=queue_coarse_metrics&family=queue_consumer_count&vhost=%2F"
    )
    assert status == 200
    assert {"rabbitmq_detailed_queue_messages_ready", "rabbitmq_detailed_queue_consumers"} <= names_in(body)
    assert 'rabbitmq_detailed_queue_messages_ready{queue="jobs",vhost="/"} 1.0' in body
    status, _type, other = fetch(broker, "/metrics/detailed?family=queue_coarse_metrics&vhost=other")
    assert status == 200
    assert "rabbitmq_detailed_queue_messages_ready{" not in other


def test_unknown_paths_are_404():
    status, _type, _body = fetch(Broker(), "/metrics/nonsense")
    assert status == 404
