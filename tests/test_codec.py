"""The codec's fast paths read and write exactly the bytes pamqp does."""

from __future__ import annotations

import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.wire import codec
from queues.message import content_header
from amqp_server.wire.errors import AMQPError

PROPERTIES = commands.Basic.Properties(
    content_type="application/json",
    headers={"x-retry": 3, "trace": "abc"},
    delivery_mode=2,
    priority=5,
    correlation_id="corr-1",
    reply_to="replies",
    message_id="m-1",
    timestamp=None,
    app_id="tests",
)


def payload_of(wire: bytes) -> bytes:
    """The payload of one marshalled frame (between the 7-byte header and the frame end)."""
    return wire[7:-1]


def pamqp_content(channel: int, body: bytes, frame_max: int, properties=PROPERTIES) -> bytes:
    step = frame_max - 8
    wire = frame.marshal(ContentHeader(body_size=len(body), properties=properties), channel)
    for start in range(0, len(body), step):
        wire += frame.marshal(ContentBody(body[start : start + step]), channel)
    return wire


def raw_header(body: bytes, properties=PROPERTIES) -> bytes:
    return payload_of(frame.marshal(ContentHeader(body_size=len(body), properties=properties), 1))


@pytest.mark.parametrize(
    "exchange, routing_key, mandatory, immediate",
    [
        ("", "q", False, False),
        ("amq.topic", "a.b.c", True, False),
        ("ex", "", False, True),
        ("ex", "ключ.ünïcode", True, True),
        ("e" * 127, "k" * 255, True, False),  # pamqp's longest exchange name, the longest key
    ],
)
def test_decode_publish_reads_what_pamqp_writes(exchange, routing_key, mandatory, immediate):
    method = commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate)
    payload = payload_of(frame.marshal(method, 1))
    decoded_exchange, decoded_key, decoded_mandatory, decoded_immediate, routing_raw = codec.decode_publish(payload)
    assert (decoded_exchange, decoded_key, decoded_mandatory, decoded_immediate) == (
        exchange, routing_key, mandatory, immediate
    )
    assert routing_raw == codec.shortstr(exchange) + codec.shortstr(routing_key)


@pytest.mark.parametrize("tag, multiple", [(1, False), (42, True), (2**63 - 1, True)])
def test_decode_ack_reads_what_pamqp_writes(tag, multiple):
    payload = payload_of(frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=multiple), 1))
    assert codec.method_index(payload) == codec.ACK_METHOD
    assert codec.decode_ack(payload) == (tag, multiple)


def test_publish_index_matches_pamqp():
    payload = payload_of(frame.marshal(commands.Basic.Publish(), 1))
    assert codec.method_index(payload) == codec.PUBLISH_METHOD


@pytest.mark.parametrize(
    "body, frame_max",
    [(b"", 4096), (b"small", 4096), (b"x" * 4088, 4096), (b"y" * 4089, 4096), (bytes(range(256)) * 100, 4096),
     (b"z" * 300000, 131072)],
)
@pytest.mark.parametrize("redelivered", [False, True])
def test_deliver_frames_are_byte_equal_to_pamqp(body, frame_max, redelivered):
    deliver = commands.Basic.Deliver(
        consumer_tag="amq.ctag-abc", delivery_tag=77, redelivered=redelivered, exchange="amq.direct", routing_key="rk"
    )
    expected = frame.marshal(deliver, 3) + pamqp_content(3, body, frame_max)
    ours = codec.deliver_frames(
        3,
        codec.shortstr("amq.ctag-abc"),
        77,
        redelivered,
        codec.shortstr("amq.direct") + codec.shortstr("rk"),
        raw_header(body),
        body,
        frame_max - codec.FRAME_OVERHEAD,
    )
    assert b"".join(ours) == expected


def test_a_batch_of_deliveries_is_byte_equal_to_pamqp():
    from queues.message import Message

    frame_max = 4096
    bodies = [b"a", b"bb", b"", b"z" * 9000, b"c", b"d"]
    routings = [("amq.direct", "rk"), ("amq.direct", "rk"), ("", "q"), ("", "q"), ("x", "other"), ("amq.direct", "rk")]
    messages = []
    shared = codec.shortstr("amq.direct") + codec.shortstr("rk")
    for body, (exchange, key) in zip(bodies, routings):
        raw = shared if (exchange, key) == ("amq.direct", "rk") else codec.shortstr(exchange) + codec.shortstr(key)
        messages.append(Message(exchange, key, raw_header(body), body, raw))
    out: list[bytes] = []
    total = codec.deliveries_frames(out, 5, codec.shortstr("ctag"), 40, messages, frame_max - codec.FRAME_OVERHEAD)
    expected = b"".join(
        frame.marshal(commands.Basic.Deliver(consumer_tag="ctag", delivery_tag=40 + n, redelivered=False,
                                             exchange=exchange, routing_key=key), 5)
        + pamqp_content(5, body, frame_max)
        for n, (body, (exchange, key)) in enumerate(zip(bodies, routings)))
    assert b"".join(out) == expected
    assert total == sum(map(len, bodies))


def test_deliver_frames_unmarshal_with_pamqp():
    body = b"hello"
    wire = b"".join(
        codec.deliver_frames(
            1, codec.shortstr("c"), 5, True, codec.shortstr("") + codec.shortstr("q"), raw_header(body), body, 4088
        )
    )
    consumed, channel, deliver = frame.unmarshal(wire)
    assert channel == 1
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("c", 5, True)
    assert (deliver.exchange, deliver.routing_key) == ("", "q")
    consumed_header, _channel, header = frame.unmarshal(wire[consumed:])
    assert header.body_size == 5
    assert header.properties.headers == {"x-retry": 3, "trace": "abc"}
    assert frame.unmarshal(wire[consumed + consumed_header :])[2].value == body


@pytest.mark.parametrize("size", [0, 1, 4087, 4088, 4089, 8176, 8177, 20000])
def test_content_frames_split_bodies_like_pamqp(size):
    body = bytes(index % 251 for index in range(size))
    out: list[bytes] = []
    codec.content_frames(out, 9, raw_header(body), body, 4088)
    assert b"".join(out) == pamqp_content(9, body, 4096)


def test_content_header_matches_pamqp():
    properties = PROPERTIES.marshal()
    assert content_header(123, properties) == raw_header(b"x" * 123)


def test_content_header_body_size_reads_pamqp_headers():
    assert codec.content_header_body_size(raw_header(b"x" * 1000)) == (60, 1000)


def test_method_frame_is_pamqps_marshal():
    method = commands.Queue.DeclareOk(queue="q", message_count=3, consumer_count=1)
    assert codec.method_frame(4, method) == frame.marshal(method, 4)


@pytest.mark.parametrize("redelivered", [False, True])
def test_name_repeating_replies_are_byte_equal_to_pamqp(redelivered):
    routing_raw = codec.shortstr("amq.direct") + codec.shortstr("rk")
    assert codec.queue_declare_ok_frame(4, "q.1", 3, 1) == frame.marshal(
        commands.Queue.DeclareOk(queue="q.1", message_count=3, consumer_count=1), 4
    )
    assert codec.get_ok_frame(2, 9, redelivered, routing_raw, 7) == frame.marshal(
        commands.Basic.GetOk(delivery_tag=9, redelivered=redelivered, exchange="amq.direct", routing_key="rk",
                             message_count=7), 2
    )
    assert codec.return_frame(5, 312, "NO_ROUTE", routing_raw) == frame.marshal(
        commands.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="amq.direct", routing_key="rk"), 5
    )


def test_decode_method_reads_pamqp_methods():
    method = commands.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 10})
    decoded = codec.decode_method(payload_of(frame.marshal(method, 1)))
    assert isinstance(decoded, commands.Queue.Declare)
    assert (decoded.queue, decoded.durable, decoded.arguments) == ("q", True, {"x-max-length": 10})


def test_decode_method_refuses_an_unknown_method_with_503():
    with pytest.raises(AMQPError) as raised:
        codec.decode_method(b"\x00\x3c\x03\xe7")
    assert (raised.value.code, raised.value.class_id, raised.value.method_id) == (503, 60, 999)


def test_heartbeat_frame_is_pamqps():
    from pamqp.heartbeat import Heartbeat

    assert codec.HEARTBEAT_FRAME == frame.marshal(Heartbeat(), 0)


def test_frame_reader_yields_frames_only_once_complete():
    wire = frame.marshal(commands.Basic.Qos(prefetch_count=7), 2) + frame.marshal(ContentBody(b"abc"), 2)
    reader = codec.FrameReader(4096)
    seen = []
    for index in range(len(wire)):
        reader.feed(wire[index : index + 1])
        seen.extend(reader.frames())
    assert seen == [
        (codec.FRAME_METHOD, 2, payload_of(frame.marshal(commands.Basic.Qos(prefetch_count=7), 2))),
        (codec.FRAME_BODY, 2, b"abc"),
    ]


def test_frame_reader_takes_the_protocol_header_first():
    reader = codec.FrameReader(4096)
    reader.feed(codec.PROTOCOL_HEADER[:5])
    assert reader.take_protocol_header() is None
    reader.feed(codec.PROTOCOL_HEADER[5:] + codec.HEARTBEAT_FRAME)
    assert reader.take_protocol_header() == codec.PROTOCOL_HEADER
    assert list(reader.frames()) == [(codec.FRAME_HEARTBEAT, 0, b"")]


def test_access_request_ok_frame_is_class_30_method_11_with_ticket_1():
    assert codec.access_request_ok_frame(5) == b"\x01\x00\x05\x00\x00\x00\x06\x00\x1e\x00\x0b\x00\x01\xce"


def test_frame_reader_cleared_while_its_frames_are_handled_stays_empty():
    wire = frame.marshal(commands.Basic.Qos(prefetch_count=7), 2) * 3
    reader = codec.FrameReader(4096)
    reader.feed(wire)
    frames = reader.frames()
    next(frames)
    reader.clear()  # the connection's input broke while handling the first frame
    frames.close()
    assert list(reader.frames()) == []
    reader.feed(wire)
    assert len(list(reader.frames())) == 3


def test_frame_reader_joins_a_frame_sent_a_byte_at_a_time_once_it_is_complete():
    body = ContentBody(bytes(range(256)) * 64)  # a 16 KiB payload
    wire = frame.marshal(body, 1)
    reader = codec.FrameReader(131072)
    for index in range(len(wire) - 1):
        reader.feed(wire[index : index + 1])
        assert list(reader.frames()) == []
    reader.feed(wire[-1:])
    assert list(reader.frames()) == [(codec.FRAME_BODY, 1, body.value)]
