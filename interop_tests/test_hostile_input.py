"""Hostile publishers: a content header consumers cannot decode is refused at the door.

A raw client publishes a poison header to a queue a pika consumer is reading. The broker must
close the publisher as RabbitMQ 3.10 does (541 INTERNAL_ERROR on the connection for what it
cannot decode, 406 on the channel for a delivery_mode it refuses), keep the message out of the
queue, and the consumer must stay alive and get only the good message published after it.
The depth limit is this broker's own (RabbitMQ has none), so that case needs this broker; the
deepest headers it accepts must decode in pika, aio-pika and kombu.
"""

from __future__ import annotations

import asyncio
import struct

import aio_pika
import kombu
import pytest
from pamqp import commands

from interop_tests.kombu_helpers import kombu_url
from interop_tests.pika_helpers import connect
from interop_tests.waiting import poll
from interop_tests.raw_client import RawClient, raw_frame

FLAG_HEADERS = 1 << 13
FLAG_CONTENT_TYPE = 1 << 15
FLAG_DELIVERY_MODE = 1 << 12
MAX_NESTING_DEPTH = 64


def table(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def field(name: bytes, value: bytes) -> bytes:
    return bytes((len(name),)) + name + value


def headers(body: bytes) -> bytes:
    return struct.pack(">H", FLAG_HEADERS) + table(body)


def nested(depth: int) -> bytes:
    """Headers holding tables and arrays in turn, `depth` levels counting the headers table,
    with a string "leaf" in the innermost table."""
    kind, value = b"F", table(field(b"leaf", b"S" + table(b"deep")))
    for level in range(depth - 1):
        if level % 2 == depth % 2:
            kind, value = b"F", table(field(b"t", kind + value))
        else:
            kind, value = b"A", table(kind + value)
    assert kind == b"F"
    return struct.pack(">H", FLAG_HEADERS) + value


UNDECODABLE = (541, "INTERNAL_ERROR", 0, 0)
POISON = {
    "unknown field type Z": headers(field(b"ok", b"t\x01") + field(b"poison", b"Z\x00\x00\x00\x01")),
    "Z inside an array": headers(field(b"list", b"A" + table(b"S" + table(b"a") + b"Z\x00"))),
    "continuation flag word": struct.pack(">HH", FLAG_CONTENT_TYPE | 1, 0) + b"\x04text",
    "headers table longer than the frame": struct.pack(">H", FLAG_HEADERS) + struct.pack(">I", 4096) + b"\x01a",
    "short string longer than the frame": struct.pack(">H", FLAG_CONTENT_TYPE) + b"\xfftext",
    "value longer than its table": headers(field(b"k", b"S" + struct.pack(">I", 1000) + b"short")),
}


def publish_raw(client: RawClient, queue: str, properties: bytes, body: bytes) -> None:
    client.send(commands.Basic.Publish(exchange="", routing_key=queue), 1)
    client.send_bytes(raw_frame(2, 1, struct.pack(">HHQ", 60, 0, len(body)) + properties))
    client.send_bytes(raw_frame(3, 1, body))


@pytest.fixture
def consumer(broker, unique):
    """A pika consumer on a fresh queue: (connection, channel, queue, bodies received)."""
    connection = connect(broker)
    channel = connection.channel()
    queue = unique("hostile")
    channel.queue_declare(queue, auto_delete=True)
    received: list[bytes] = []

    def on_message(ch, method, _properties, body):
        received.append(body)
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    yield connection, channel, queue, received
    if connection.is_open:
        connection.close()


def refused_publish(broker, queue: str, properties: bytes) -> tuple[int, int, str, int, int]:
    """Publish `properties` from a raw client; return (channel, code, text, class, method) of the close."""
    with RawClient(broker.host, broker.port) as client:
        client.handshake()
        client.open_channel(1)
        publish_raw(client, queue, properties, b"poison")
        channel, close = client.read_method()
        assert isinstance(close, (commands.Connection.Close, commands.Channel.Close)), close
        return channel, close.reply_code, close.reply_text, close.class_id, close.method_id


def assert_consumer_gets_only_good_messages(broker, consumer) -> None:
    connection, channel, queue, received = consumer
    channel.basic_publish("", queue, b"good")
    assert poll(lambda: received, 8.0, pump=channel.connection.process_data_events)
    connection.process_data_events(time_limit=0.2)  # anything else queued would arrive now
    assert received == [b"good"]
    assert connection.is_open and channel.is_open
    with RawClient(broker.host, broker.port) as witness:  # the broker is still up and answering
        witness.handshake()
        witness.open_channel(1)
        assert witness.is_alive()


@pytest.mark.parametrize("case", sorted(POISON))
def test_undecodable_properties_close_the_publisher_with_541_and_never_reach_the_consumer(broker, consumer, case):
    _connection, _channel, queue, _received = consumer
    assert refused_publish(broker, queue, POISON[case]) == (0, *UNDECODABLE)
    assert_consumer_gets_only_good_messages(broker, consumer)


def test_an_unknown_delivery_mode_closes_the_channel_with_rabbitmqs_406(broker, consumer):
    _connection, _channel, queue, _received = consumer
    properties = struct.pack(">H", FLAG_DELIVERY_MODE) + b"\x07"
    assert refused_publish(broker, queue, properties) == (
        1, 406, "PRECONDITION_FAILED - invalid message: {delivery_mode_unknown,7}", 60, 40
    )
    assert_consumer_gets_only_good_messages(broker, consumer)


def test_headers_nested_beyond_the_limit_close_the_channel_with_406(broker, consumer):
    if broker.is_external:
        pytest.skip("the nesting limit is this broker's own: RabbitMQ accepts any depth")
    _connection, _channel, queue, _received = consumer
    for depth in (MAX_NESTING_DEPTH + 1, 1000):
        assert refused_publish(broker, queue, nested(depth)) == (
            1, 406, "PRECONDITION_FAILED - invalid message: tables and arrays nested deeper than 64", 60, 40
        )
    assert_consumer_gets_only_good_messages(broker, consumer)


def _pika_headers(broker, queue: str) -> tuple[bytes, dict]:
    connection = connect(broker)
    try:
        _method, properties, body = connection.channel().basic_get(queue, auto_ack=True)
        return body, properties.headers
    finally:
        connection.close()


def _aio_pika_headers(broker, queue: str) -> tuple[bytes, dict]:
    async def get() -> tuple[bytes, dict]:
        connection = await aio_pika.connect(broker.url())
        async with connection:
            channel = await connection.channel()
            message = await (await channel.get_queue(queue)).get(no_ack=True)
            return message.body, message.headers

    return asyncio.run(get())


def _kombu_headers(broker, queue: str) -> tuple[bytes, dict]:
    with kombu.Connection(kombu_url(broker)) as connection:
        message = connection.default_channel.basic_get(queue, no_ack=True)
        return message.body, message.headers


@pytest.mark.parametrize("client", [_pika_headers, _aio_pika_headers, _kombu_headers],
                         ids=["pika", "aio-pika", "kombu"])
def test_headers_at_the_nesting_limit_reach_python_clients_intact(broker, unique, client):
    """The deepest headers the broker accepts decode in pika, pamqp (aio-pika) and py-amqp
    (kombu), which all decode tables recursively."""
    queue = unique("deep")
    with RawClient(broker.host, broker.port) as publisher:
        publisher.handshake()
        publisher.open_channel(1)
        publisher.send(commands.Queue.Declare(queue=queue, auto_delete=False), 1)
        publisher.expect(commands.Queue.DeclareOk)
        publish_raw(publisher, queue, nested(MAX_NESTING_DEPTH), b"deep")
        assert publisher.is_alive()  # the publish was taken
    try:
        body, value = client(broker, queue)
    finally:
        with RawClient(broker.host, broker.port) as cleaner:
            cleaner.handshake()
            cleaner.open_channel(1)
            cleaner.send(commands.Queue.Delete(queue=queue), 1)
            cleaner.expect(commands.Queue.DeleteOk)
    depth = 1
    while "leaf" not in value:
        value = value["t"] if isinstance(value, dict) else value[0]
        depth += 1
    leaf = value["leaf"].decode() if isinstance(value["leaf"], bytes) else value["leaf"]
    assert (body, depth, leaf) == (b"deep", MAX_NESTING_DEPTH, "deep")
