"""AMQPStorm 3 (threaded, on pamqp): connect, publish with confirms, consume with acks, channel errors.

AMQPStorm picks EXTERNAL whenever the broker offers it and PLAIN otherwise, splits bodies into
frames whose payload is the whole negotiated frame_max (8 bytes over the spec's limit, which
RabbitMQ accepts), expects a mandatory publish's basic.return before its basic.ack, and never
answers a broker's connection.close with close-ok. Checked against RabbitMQ 3.10 with
INTEROP_BROKER_URL.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import amqpstorm
import pytest
from amqpstorm import AMQPChannelError, AMQPMessageError

from interop_tests.broker_process import BrokerProcess

MESSAGES = 20
LARGE_BODY = os.urandom(3 * 131072 + 10)  # four body frames, three of them frame_max bytes long


@pytest.fixture
def connection(broker: BrokerProcess) -> Iterator[amqpstorm.Connection]:
    connection = amqpstorm.Connection(broker.host, "guest", "guest", port=broker.port, timeout=5)
    yield connection
    if connection.is_open:
        connection.close()


def test_connect_logs_in_with_plain_and_reads_the_servers_properties(connection):
    capabilities = connection.server_properties["capabilities"]
    assert capabilities["publisher_confirms"] is True and capabilities["basic.nack"] is True
    channel = connection.channel(rpc_timeout=5)
    assert channel.is_open
    assert connection.max_frame_size == 131072
    assert connection.max_allowed_channels == 2047


def test_publish_with_confirms_is_acked_for_every_message_large_ones_included(connection, unique):
    channel = connection.channel(rpc_timeout=5)
    channel.confirm_deliveries()
    queue = channel.queue.declare(unique("amqpstorm-confirm"), exclusive=True)["queue"]
    bodies = [b"m%d" % n for n in range(MESSAGES)] + [LARGE_BODY]
    for body in bodies:
        assert amqpstorm.Message.create(channel, body, {"delivery_mode": 2}).publish(queue) is True

    got = [channel.basic.get(queue, no_ack=True, auto_decode=False).body for _ in bodies]
    assert got == bodies


def test_an_unroutable_mandatory_publish_is_returned_before_its_confirm(connection, unique):
    channel = connection.channel(rpc_timeout=5)
    channel.confirm_deliveries()
    with pytest.raises(AMQPMessageError) as returned:
        amqpstorm.Message.create(channel, b"nowhere").publish(unique("amqpstorm-no-queue"), mandatory=True)
    assert returned.value.error_code == 312


def test_consume_and_ack_takes_every_message_once(connection, unique):
    channel = connection.channel(rpc_timeout=5)
    queue = channel.queue.declare(unique("amqpstorm-consume"), exclusive=True)["queue"]
    for n in range(MESSAGES):
        amqpstorm.Message.create(channel, b"m%d" % n, {"content_type": "text/plain"}).publish(queue)
    channel.basic.qos(prefetch_count=5)
    received: list[bytes] = []

    def on_message(message: amqpstorm.Message) -> None:
        assert message.content_type == "text/plain" and message.redelivered is False
        received.append(message.body)
        message.ack()
        if len(received) == MESSAGES:
            channel.stop_consuming()

    channel.basic.consume(on_message, queue, no_ack=False)
    timer = threading.Timer(10, channel.stop_consuming)  # never hang the suite
    timer.start()
    try:
        channel.start_consuming(to_tuple=False, auto_decode=False)
    finally:
        timer.cancel()

    assert received == [b"m%d" % n for n in range(MESSAGES)]
    assert channel.queue.declare(queue, passive=True)["message_count"] == 0


def test_a_channel_error_closes_that_channel_only(connection, unique):
    channel = connection.channel(rpc_timeout=5)
    missing = unique("amqpstorm-missing")
    with pytest.raises(AMQPChannelError) as closed:
        channel.queue.declare(missing, passive=True)

    assert closed.value.error_code == 404
    assert str(closed.value) == (
        f"Channel {channel.channel_id} was closed by remote server: NOT_FOUND - no queue '{missing}' in vhost '/'"
    )
    other = connection.channel(rpc_timeout=5)  # the connection carries on
    assert other.queue.declare(unique("amqpstorm-after"), exclusive=True)["message_count"] == 0
