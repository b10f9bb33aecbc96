"""Scrape /metrics after a known pika workload and find exactly what happened.

A dedicated broker runs with --metrics-port. The workload, all published with confirms: 20
messages into one queue, 1 dropped as unroutable, 1 returned (mandatory); 3 fetched with
basic.get and acked, 2 fetched with auto-ack, 1 basic.get on an empty side queue; 5 consumed
with manual acks, 1 of them nacked back and fetched again (a redelivery); then 2 published
into the side queue and consumed with auto-ack. The same workload run against
RabbitMQ 3.10 with rabbitmq_prometheus gives the same numbers (after its 5 s stats lag).
"""

from __future__ import annotations

import time
import urllib.request

import pika
import pytest
from pika.exceptions import UnroutableError
from prometheus_client.parser import text_string_to_metric_families

from interop_tests.broker_process import free_port

AMQP = (("protocol", "amqp091"),)
CLASSIC = (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue"))


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def run_workload(amqp_url: str, queue: str, side_queue: str) -> pika.BlockingConnection:
    """The workload in the module docstring; returns the still-open connection."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    channel.queue_declare(side_queue)
    for index in range(20):
        channel.basic_publish("", queue, b"message %d" % index)
    channel.basic_publish("", "no-such-queue-anywhere", b"dropped")
    with pytest.raises(UnroutableError):
        channel.basic_publish("", "no-such-queue-anywhere", b"returned", mandatory=True)

    for _ in range(3):
        method, _props, _body = channel.basic_get(queue)
        channel.basic_ack(method.delivery_tag)
    for _ in range(2):
        channel.basic_get(queue, auto_ack=True)
    assert channel.basic_get(side_queue) == (None, None, None)

    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=5)
    received = []
    consumer.basic_consume(queue, lambda ch, method, props, body: received.append(method.delivery_tag),
                           consumer_tag="exact")
    while len(received) < 5:
        connection.process_data_events(time_limit=0.1)
    consumer.basic_cancel("exact")
    for tag in received[:4]:
        consumer.basic_ack(tag)
    consumer.basic_nack(received[4], requeue=True)
    method, _props, _body = channel.basic_get(queue)  # the nacked message, now redelivered
    assert method.redelivered
    channel.basic_ack(method.delivery_tag)

    channel.basic_publish("", side_queue, b"one")
    channel.basic_publish("", side_queue, b"two")
    auto = connection.channel()
    taken = []
    auto.basic_consume(side_queue, lambda ch, method, props, body: taken.append(body), auto_ack=True,
                       consumer_tag="auto")
    while len(taken) < 2:
        connection.process_data_events(time_limit=0.1)
    auto.basic_cancel("auto")
    return connection


def test_counters_are_exact_after_a_pika_workload(broker_factory, unique):
    port = free_port()
    broker = broker_factory(extra_args=("--metrics-port", str(port), "--management-port", "0"))
    url = f"http://127.0.0.1:{port}/metrics"
    connection = run_workload(broker.url(), unique("exact"), unique("side"))
    try:
        samples = scrape(url)
    finally:
        connection.close()

    def total(name: str, labels: tuple = ()) -> float:
        return samples[(name, labels)]

    assert total("rabbitmq_global_messages_received_total", AMQP) == 24
    assert total("rabbitmq_global_messages_received_confirm_total", AMQP) == 24
    assert total("rabbitmq_global_messages_confirmed_total", AMQP) == 24
    assert total("rabbitmq_global_messages_routed_total", AMQP) == 22
    assert total("rabbitmq_global_messages_unroutable_dropped_total", AMQP) == 1
    assert total("rabbitmq_global_messages_unroutable_returned_total", AMQP) == 1
    assert total("rabbitmq_global_messages_delivered_get_manual_ack_total", CLASSIC) == 4
    assert total("rabbitmq_global_messages_delivered_get_auto_ack_total", CLASSIC) == 2
    assert total("rabbitmq_global_messages_get_empty_total", CLASSIC) == 1
    assert total("rabbitmq_global_messages_delivered_consume_manual_ack_total", CLASSIC) == 5
    assert total("rabbitmq_global_messages_delivered_consume_auto_ack_total", CLASSIC) == 2
    assert total("rabbitmq_global_messages_delivered_total", CLASSIC) == 13
    assert total("rabbitmq_global_messages_redelivered_total", CLASSIC) == 1
    assert total("rabbitmq_global_messages_acknowledged_total", CLASSIC) == 8
    # 20 routed - 4 got with ack - 2 got without - 4 consumed and acked = 10 left; the side queue is empty.
    assert total("rabbitmq_queue_messages_ready") == 10
    assert total("rabbitmq_queue_messages_unacked") == 0
    assert total("rabbitmq_queue_messages") == 10
    assert total("rabbitmq_queue_messages_published_total") == 22
    assert total("rabbitmq_queues") == 2
    assert total("rabbitmq_connections") == 1
    assert total("rabbitmq_channels") == 3
    assert total("rabbitmq_consumers") == 0
    assert total("rabbitmq_connections_opened_total") == 1
    assert total("rabbitmq_channels_opened_total") == 3
    assert total("rabbitmq_queues_declared_total") == 2
    assert total("rabbitmq_queues_created_total") == 2
    # The names dashboards used before 2023.
    assert total("rabbitmq_channel_messages_published_total") == 24
    assert total("rabbitmq_channel_messages_confirmed_total") == 24
    assert total("rabbitmq_channel_get_ack_total") == 4
    assert total("rabbitmq_channel_get_total") == 2
    assert total("rabbitmq_channel_get_empty_total") == 1
    assert total("rabbitmq_channel_messages_delivered_ack_total") == 5
    assert total("rabbitmq_channel_messages_delivered_total") == 2
    assert total("rabbitmq_channel_messages_redelivered_total") == 1
    assert total("rabbitmq_channel_messages_acked_total") == 8


def test_closed_connections_and_deleted_queues_keep_their_counts(broker_factory, unique):
    port = free_port()
    broker = broker_factory(extra_args=("--metrics-port", str(port), "--management-port", "0"))
    url = f"http://127.0.0.1:{port}/metrics"
    queue = unique("gone")
    connection = run_workload(broker.url(), queue, unique("side"))
    connection.channel().queue_delete(queue)
    connection.close()
    deadline = time.monotonic() + 5
    while scrape(url)[("rabbitmq_connections", ())] != 0 and time.monotonic() < deadline:
        time.sleep(0.02)  # the broker notices the closed socket asynchronously
    samples = scrape(url)
    assert samples[("rabbitmq_connections", ())] == 0
    assert samples[("rabbitmq_connections_closed_total", ())] == 1
    assert samples[("rabbitmq_channels_closed_total", ())] == 4
    assert samples[("rabbitmq_queues_deleted_total", ())] == 1
    assert samples[("rabbitmq_global_messages_delivered_total", CLASSIC)] == 13
    assert samples[("rabbitmq_global_messages_acknowledged_total", CLASSIC)] == 8
    assert samples[("rabbitmq_queue_messages_published_total", ())] == 22
