"""Publishing and delivering through a channel: content assembly, limits, returns, confirms."""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.body import ContentBody

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import LimitsConfig, ServerConfig
from tests.frame_driver import bodies, marshal, methods, opened_client, publish_frames, raw_frame, split_raw


def declare(client, queue: str, channel: int = 1) -> None:
    declare_ok = client.call(channel, commands.Queue.Declare(queue=queue))
    assert isinstance(declare_ok, commands.Queue.DeclareOk)


def consume(client, queue: str, tag: str = "ctag", channel: int = 1, no_ack: bool = True):
    return client.send(channel, commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack))


def test_body_in_three_frames_is_reassembled():
    client = opened_client(frame_max=4096)
    declare(client, "q")
    body = bytes(range(256)) * 40  # 10240 bytes: three body frames at frame_max 4096
    wire = publish_frames(1, body, routing_key="q", frame_max=4096)
    assert [frame_type for frame_type, _channel, _payload in split_raw(wire)] == [1, 2, 3, 3, 3]
    assert client.send_bytes(wire) == []
    received = client.send(1, commands.Basic.Get(queue="q", no_ack=True))
    assert bodies(received) == [body]


def test_delivery_is_split_into_body_frames_at_the_negotiated_frame_max():
    client = opened_client(frame_max=4096)
    declare(client, "q")
    consume(client, "q")
    body = b"z" * 10000
    received = client.publish(1, body, routing_key="q", frame_max=4096)
    body_frames = [frame for _channel, frame in received if isinstance(frame, ContentBody)]
    assert [len(frame.value) for frame in body_frames] == [4088, 4088, 1824]
    assert bodies(received) == [body]


def test_empty_body_is_delivered_without_body_frames():
    client = opened_client()
    declare(client, "q")
    consume(client, "q")
    received = client.publish(1, b"", routing_key="q")
    assert [type(frame).__name__ for _channel, frame in received] == ["Deliver", "ContentHeader"]


def test_body_larger_than_max_message_size_gives_406():
    broker = Broker(ServerConfig(limits=LimitsConfig(max_message_size=1024)))
    client = opened_client(broker, channels=(1, 2))
    declare(client, "q")
    received = client.publish(1, b"x" * 1025, routing_key="q")
    channel, close = received[0]
    assert len(received) == 1
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 40)
    assert close.reply_text == "PRECONDITION_FAILED - message size 1025 is larger than configured max size 1024"
    assert broker.vhosts["/"].queues["q"].message_count == 0
    # The connection and its other channels carry on.
    assert client.publish(2, b"x" * 1024, routing_key="q") == []
    assert broker.vhosts["/"].queues["q"].message_count == 1


def test_mandatory_unroutable_publish_is_returned_before_its_confirm():
    client = opened_client()
    client.call(1, commands.Confirm.Select())
    received = client.publish(1, b"lost", exchange="amq.direct", routing_key="nowhere", mandatory=True)
    assert [type(frame).__name__ for _channel, frame in received] == ["Return", "ContentHeader", "ContentBody", "Ack"]
    returned = received[0][1]
    assert (returned.reply_code, returned.reply_text) == (312, "NO_ROUTE")
    assert (returned.exchange, returned.routing_key) == ("amq.direct", "nowhere")
    assert received[2][1].value == b"lost"
    ack = received[3][1]
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_unroutable_publish_without_mandatory_is_dropped_and_confirmed():
    client = opened_client()
    client.call(1, commands.Confirm.Select())
    received = client.publish(1, b"lost", exchange="amq.direct", routing_key="nowhere")
    assert [(type(frame).__name__, frame.delivery_tag) for _channel, frame in received] == [("Ack", 1)]


def test_many_publishes_in_one_chunk_get_one_multiple_ack():
    client = opened_client()
    declare(client, "q")
    client.call(1, commands.Confirm.Select())
    chunk = b"".join(publish_frames(1, b"m%d" % n, routing_key="q") for n in range(100))
    received = client.send_bytes(chunk)
    assert len(received) == 1
    ack = received[0][1]
    assert isinstance(ack, commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (100, True)
    next_batch = client.send_bytes(chunk[: len(chunk) // 50])  # two more publishes
    assert [(frame.delivery_tag, frame.multiple) for _channel, frame in next_batch] == [(102, True)]


def test_confirms_on_two_channels_are_counted_per_channel():
    client = opened_client(channels=(1, 2))
    declare(client, "q")
    client.call(1, commands.Confirm.Select())
    client.call(2, commands.Confirm.Select())
    chunk = publish_frames(1, b"a", routing_key="q") * 3 + publish_frames(2, b"b", routing_key="q")
    acks = {channel: (frame.delivery_tag, frame.multiple) for channel, frame in client.send_bytes(chunk)}
    assert acks == {1: (3, True), 2: (1, False)}


def _odd_header(body_size: int) -> bytes:
    """A content header pamqp would not reproduce byte for byte: a tiny int as long-long ('l')."""
    content_type = b"text/x-odd"
    table = b"\x01n" + b"l" + struct.pack(">q", 5) + b"\x01s" + b"S" + struct.pack(">I", 1) + b"v"
    properties = (
        struct.pack(">H", (1 << 15) | (1 << 13))
        + bytes((len(content_type),))
        + content_type
        + struct.pack(">I", len(table))
        + table
    )
    return struct.pack(">HHQ", 60, 0, body_size) + properties


def test_deliveries_carry_the_exact_property_bytes_that_were_published():
    client = opened_client()
    declare(client, "q")
    consume(client, "q")
    header = _odd_header(3)
    client.connection.receive_data(
        marshal(1, commands.Basic.Publish(routing_key="q")) + raw_frame(2, 1, header) + marshal(1, ContentBody(b"abc"))
    )
    delivered = client.take_raw()
    assert [frame_type for frame_type, _channel, _payload in delivered] == [1, 2, 3]
    assert delivered[1][2] == header


def test_basic_get_carries_the_exact_property_bytes_that_were_published():
    client = opened_client()
    declare(client, "q")
    header = _odd_header(3)
    client.send_bytes(
        marshal(1, commands.Basic.Publish(routing_key="q")) + raw_frame(2, 1, header) + marshal(1, ContentBody(b"abc"))
    )
    client.connection.receive_data(marshal(1, commands.Basic.Get(queue="q")))
    assert client.take_raw()[1][2] == header


def test_deliver_names_consumer_tag_exchange_and_routing_key_with_growing_delivery_tags():
    client = opened_client()
    declare(client, "q")
    client.send(1, commands.Queue.Bind(queue="q", exchange="amq.topic", routing_key="a.#"))
    consume(client, "q", tag="my-consumer")
    first = methods(client.publish(1, b"1", exchange="amq.topic", routing_key="a.b"))[0]
    second = methods(client.publish(1, b"2", routing_key="q"))[0]
    assert (first.consumer_tag, first.delivery_tag, first.redelivered) == ("my-consumer", 1, False)
    assert (first.exchange, first.routing_key) == ("amq.topic", "a.b")
    assert (second.delivery_tag, second.exchange, second.routing_key) == (2, "", "q")


def test_publish_to_a_missing_exchange_gives_404():
    client = opened_client()
    received = client.publish(1, b"x", exchange="nope", routing_key="q")
    close = received[0][1]
    assert len(received) == 1
    assert (close.reply_code, close.class_id, close.method_id) == (404, 60, 40)
    assert close.reply_text == "NOT_FOUND - no exchange 'nope' in vhost '/'"


def test_publish_with_immediate_gives_540():
    client = opened_client()
    publish = marshal(1, commands.Basic.Publish(routing_key="q", immediate=True))
    close = client.send_bytes(publish)[0][1]
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 540


def test_publish_to_an_internal_exchange_gives_403():
    client = opened_client()
    close = client.publish(1, b"x", exchange="amq.rabbitmq.trace", routing_key="q")[0][1]
    assert isinstance(close, commands.Channel.Close)
    assert close.reply_code == 403


def test_user_id_other_than_the_login_gives_406():
    client = opened_client()
    declare(client, "q")
    received = client.publish(1, b"x", routing_key="q", properties=commands.Basic.Properties(user_id="mallory"))
    close = received[0][1]
    assert close.reply_code == 406
    assert close.reply_text == "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'"


def test_user_id_equal_to_the_login_is_delivered():
    client = opened_client()
    declare(client, "q")
    assert client.publish(1, b"x", routing_key="q", properties=commands.Basic.Properties(user_id="guest")) == []
    assert client.broker.vhosts["/"].queues["q"].message_count == 1


def test_ack_of_an_unknown_delivery_tag_gives_406():
    client = opened_client()
    close = client.send(1, commands.Basic.Ack(delivery_tag=7))[0][1]
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 80)
    assert close.reply_text == "PRECONDITION_FAILED - unknown delivery tag 7"


def test_nack_with_requeue_redelivers_to_the_consumer():
    client = opened_client()
    declare(client, "q")
    consume(client, "q", no_ack=False)
    client.publish(1, b"again", routing_key="q")
    received = client.send(1, commands.Basic.Nack(delivery_tag=1, requeue=True))
    deliver = methods(received)[0]
    assert (deliver.delivery_tag, deliver.redelivered) == (2, True)
    assert bodies(received) == [b"again"]
