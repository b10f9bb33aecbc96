"""What the shovel interop tests share (test_shovel_broker, test_shovel_faults, test_shovel_cluster):
filling a durable queue with numbered persistent messages, its depth, and draining it."""

from __future__ import annotations

import pika

from interop_tests.broker_process import BrokerProcess


def publish_numbered(url: str, queue: str, count: int) -> None:
    """Declare durable `queue` and publish b"0" ... b"<count-1>" to it, persistent and confirmed."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for i in range(count):
        channel.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    connection.close()


def depth(broker: BrokerProcess, queue: str) -> int:
    """The ready messages of durable `queue` (declared if missing); -1 while the broker is unreachable."""
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    except pika.exceptions.AMQPConnectionError:
        return -1
    try:
        return connection.channel().queue_declare(queue, durable=True).method.message_count
    finally:
        connection.close()


def drain_numbered(broker: BrokerProcess, queue: str) -> list[int]:
    """Consume (and ack) what `queue` holds until it stays empty for 2 s: the numbers of the bodies."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    got: list[int] = []
    for method, _properties, body in channel.consume(queue, inactivity_timeout=2):
        if method is None:
            break
        got.append(int(body))
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    connection.close()
    return got
