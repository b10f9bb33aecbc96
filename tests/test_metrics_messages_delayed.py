"""`amqp_server_queue_messages_delayed`: per queue, the messages waiting for a delayed retry, on
/metrics/per-object and in the detailed family queue_coarse_metrics. RabbitMQ's own series keep
their names and meanings (waiting messages are in none of them)."""

from __future__ import annotations

import time

from amqp_server.broker.broker import Broker
from amqp_server.metrics.core_collector import PER_OBJECT, CoreCollector
from amqp_server.metrics.detailed_collector import DetailedCollector
from tests.test_management_messages_delayed import reject_two_of_three
from tests.test_metrics_values import FIXED_PROCESS, aggregated, scrape, value


def per_object(broker: Broker):
    return scrape(CoreCollector(broker, PER_OBJECT, lambda: FIXED_PROCESS))


def test_per_object_series_counts_waiting_messages_beside_rabbitmqs_unchanged_ones():
    broker = Broker()
    reject_two_of_three(broker)
    samples = per_object(broker)
    assert value(samples, "amqp_server_queue_messages_delayed", vhost="/", queue="jobs") == 2
    assert value(samples, "amqp_server_queue_messages_delayed", vhost="/", queue="plain") == 0
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue="jobs") == 1
    assert value(samples, "rabbitmq_queue_messages", vhost="/", queue="jobs") == 1

    broker.timers.run_due(time.time() + 61)
    samples = per_object(broker)
    assert value(samples, "amqp_server_queue_messages_delayed", vhost="/", queue="jobs") == 0
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue="jobs") == 3


def test_detailed_queue_coarse_metrics_carry_it_under_our_prefix():
    broker = Broker()
    reject_two_of_three(broker)
    samples = scrape(DetailedCollector(broker, ["queue_coarse_metrics"]))
    assert value(samples, "amqp_server_detailed_queue_messages_delayed", vhost="/", queue="jobs") == 2
    assert value(samples, "rabbitmq_detailed_queue_messages_ready", vhost="/", queue="jobs") == 1
    other_family = scrape(DetailedCollector(broker, ["queue_consumer_count"]))
    assert not any(name.startswith("amqp_server_") for name, _labels in other_family)


def test_the_aggregated_endpoint_serves_only_rabbitmqs_names():
    broker = Broker()
    reject_two_of_three(broker)
    assert not any(name.startswith("amqp_server_") for name, _labels in aggregated(broker))
