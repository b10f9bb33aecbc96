"""The free-disk alarm over real TCP: a broker whose limit is above the free space blocks
publishers with connection.blocked "low on disk" on their first publish, and only them."""

from __future__ import annotations

import os
import time

import pika
import pytest

from interop_tests.broker_process import TEST_CONFIG

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("INTEROP_BROKER_URL")), reason="needs this project's broker with its own disk limit"
)

WAIT_S = 10.0


def test_publisher_is_blocked_while_free_disk_is_below_the_limit_and_consumers_are_not(broker_factory):
    # No disk has this much free space, so the alarm is set from the first check on.
    config = TEST_CONFIG + '\n[limits]\ndisk_free_limit = "1000000000GB"\n'
    broker = broker_factory(config_text=config, extra_args=("--management-port", "0", "--metrics-port", "0"))
    deadline = time.monotonic() + WAIT_S
    while "disk resource limit alarm set" not in broker.log_text():
        assert time.monotonic() < deadline, broker.log_text()
        time.sleep(0.05)

    consumer = pika.BlockingConnection(pika.URLParameters(broker.url()))
    consumer_channel = consumer.channel()
    consumer_channel.queue_declare("disk-q")
    consumer_blocked: list[str] = []
    consumer.add_on_connection_blocked_callback(lambda _c, frame: consumer_blocked.append(frame.method.reason))

    publisher = pika.BlockingConnection(pika.URLParameters(broker.url()))
    reasons: list[str] = []
    publisher.add_on_connection_blocked_callback(lambda _c, frame: reasons.append(frame.method.reason))
    publisher_channel = publisher.channel()
    publisher_channel.basic_publish("", "disk-q", b"first")  # no confirms: returns at once
    while not reasons:
        assert time.monotonic() < deadline, "no connection.blocked"
        publisher.process_data_events(0.05)
    assert reasons == ["low on disk"]

    # Once blocked, nothing more from this publisher reaches the queue: give "second" time to
    # arrive if the broker were (wrongly) still reading.
    publisher_channel.basic_publish("", "disk-q", b"second")
    publisher.process_data_events(0.5)

    # The consumer's connection is still served. (Whether "first" is in the queue depends on
    # whether its body frame arrived before the broker stopped reading, as with RabbitMQ,
    # which blocks on the content header too.)
    assert consumer_channel.queue_declare("disk-q", passive=True).method.message_count <= 1
    method, _properties, body = consumer_channel.basic_get("disk-q", auto_ack=True)
    assert method is None or body == b"first"
    assert consumer_channel.basic_get("disk-q", auto_ack=True) == (None, None, None)  # never "second"
    assert consumer_channel.queue_declare("disk-q-2").method.message_count == 0
    consumer.process_data_events(0.2)
    assert consumer_blocked == []
    consumer.close()
