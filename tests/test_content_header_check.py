"""The content header check at the door: what RabbitMQ 3.10 decodes is accepted, the rest is
refused with RabbitMQ's close, before the message reaches a queue."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.wire.codec import NestedTooDeep, UndecodableProperties, UnknownDeliveryMode, check_content_header
from persistence.properties_format import FIELD_TYPES, MAX_NESTING_DEPTH
from queues.message import FLAG_DELIVERY_MODE, FLAG_HEADERS
from tests.frame_driver import marshal, opened_client, raw_frame

# One value of every type RabbitMQ 3.10 accepts (checked against it with raw frames).
VALID_VALUES = {
    "t": b"\x01", "b": b"\xff", "B": b"\xff", "s": b"\x00\x01", "u": b"\x00\x01", "I": b"\x00\x00\x00\x01",
    "i": b"\x00\x00\x00\x01", "f": b"\x00" * 4, "D": b"\x02\x00\x00\x00\x05", "l": b"\x00" * 8, "L": b"\x00" * 8,
    "d": b"\x00" * 8, "T": b"\x00" * 8, "V": b"", "S": b"\x00\x00\x00\x02hi", "x": b"\x00\x00\x00\x02\xff\x00",
    "F": b"\x00\x00\x00\x00", "A": b"\x00\x00\x00\x00",
}


def table(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def field(name: bytes, value: bytes) -> bytes:
    return bytes((len(name),)) + name + value


def header(properties: bytes, body_size: int = 0) -> bytes:
    return struct.pack(">HHQ", 60, 0, body_size) + properties


def with_headers(body: bytes) -> bytes:
    return header(struct.pack(">H", FLAG_HEADERS) + table(body))


def nested_tables(depth: int) -> bytes:
    """A headers table holding tables `depth` levels deep, the headers table being level 1."""
    inner = table(b"")
    for _ in range(depth - 1):
        inner = table(field(b"a", b"F" + inner))
    return header(struct.pack(">H", FLAG_HEADERS) + inner)


def nested_arrays(depth: int) -> bytes:
    inner = table(b"")
    for _ in range(depth - 2):
        inner = table(b"A" + inner)
    return with_headers(field(b"a", b"A" + inner))


def test_every_field_type_rabbitmq_decodes_is_accepted_in_tables_and_arrays():
    assert FIELD_TYPES == set(VALID_VALUES)
    for letter, value in VALID_VALUES.items():
        check_content_header(with_headers(field(b"k", letter.encode() + value)))
        check_content_header(with_headers(field(b"k", b"A" + table(letter.encode() + value))))


@pytest.mark.parametrize("letter", ["Z", "U", "c", "o", "q", "Q", "\x00"])
def test_a_type_rabbitmq_does_not_decode_is_refused_at_any_depth(letter):
    value = letter.encode() + b"\x00" * 8
    for body in (
        field(b"k", value),
        field(b"ok", b"t\x01") + field(b"k", value),
        field(b"k", b"A" + table(value)),
        field(b"k", b"F" + table(field(b"n", b"F" + table(field(b"m", value))))),
    ):
        with pytest.raises(UndecodableProperties, match="unknown field type"):
            check_content_header(with_headers(body))


def test_nesting_is_accepted_up_to_the_limit_and_refused_beyond_it():
    check_content_header(nested_tables(MAX_NESTING_DEPTH))
    check_content_header(nested_arrays(MAX_NESTING_DEPTH))
    with pytest.raises(NestedTooDeep):
        check_content_header(nested_tables(MAX_NESTING_DEPTH + 1))
    with pytest.raises(NestedTooDeep):
        check_content_header(nested_arrays(MAX_NESTING_DEPTH + 1))
    with pytest.raises(NestedTooDeep):  # a thousand levels: refused without a RecursionError
        check_content_header(nested_tables(1000))


@pytest.mark.parametrize(
    "properties",
    [
        b"",  # no flag word
        b"\x80",  # half a flag word
        struct.pack(">H", 1),  # a continuation with no second word (pika cannot read it)
        struct.pack(">HH", 1, 0),  # an empty second word (RabbitMQ: 541)
        struct.pack(">HH", 1, 0x8000),
        struct.pack(">H", 1 << 15) + b"\x05abc",  # short string past the end
        struct.pack(">H", 1 << 15) + b"\x03abcXYZ",  # bytes after the property list
        struct.pack(">H", FLAG_HEADERS) + b"\x00\x00",  # table length cut short
        struct.pack(">H", FLAG_HEADERS) + struct.pack(">I", 100) + b"\x01a",  # table longer than the frame
        struct.pack(">H", FLAG_HEADERS) + table(field(b"k", b"S\x00\x00\x00\x10ab")),  # value past its table
        struct.pack(">H", FLAG_HEADERS) + table(field(b"k", b"l\x00\x00")),  # fixed value past its table
        struct.pack(">H", FLAG_HEADERS) + table(b"\x05ab"),  # name past its table
        struct.pack(">H", FLAG_HEADERS) + table(field(b"k", b"A" + table(b"S\x00\x00\x00\x09"))),
        struct.pack(">H", FLAG_DELIVERY_MODE),  # octet missing
        struct.pack(">H", 1 << 6) + b"\x00" * 7,  # timestamp cut short
    ],
)
def test_sizes_and_flags_that_do_not_fit_the_frame_are_refused(properties):
    with pytest.raises(UndecodableProperties):
        check_content_header(header(properties))


def test_what_rabbitmq_relays_as_sent_is_accepted():
    check_content_header(header(struct.pack(">H", 0)))
    check_content_header(header(struct.pack(">H", 1 << 1)))  # the reserved bit: every client ignores it
    check_content_header(header(struct.pack(">H", 1 << 2) + b"\x03abc"))  # cluster_id
    check_content_header(header(struct.pack(">H", 1 << 15) + b"\x02\xff\xfe"))  # bytes, not UTF-8
    check_content_header(with_headers(field(b"", b"V") + field(b"k", b"V") + field(b"k", b"V")))
    every = commands.Basic.Properties(
        content_type="a", content_encoding="b", headers={"h": [1, {"x": "y"}]}, delivery_mode=2, priority=3,
        correlation_id="c", reply_to="r", expiration="10", message_id="m", timestamp=None, message_type="t",
        user_id="u", app_id="p", cluster_id="",
    )
    check_content_header(header(every.marshal()))


@pytest.mark.parametrize("mode", [0, 3, 255])
def test_a_delivery_mode_other_than_1_or_2_is_refused(mode):
    with pytest.raises(UnknownDeliveryMode):
        check_content_header(header(struct.pack(">H", FLAG_DELIVERY_MODE | (1 << 11)) + bytes((mode, 9))))
    check_content_header(header(struct.pack(">H", 1 << 11) + bytes((mode,))))  # priority is any octet


def _publish_raw(client, header_payload: bytes, body: bytes = b"") -> list:
    frames = marshal(1, commands.Basic.Publish(routing_key="q")) + raw_frame(2, 1, header_payload)
    if body:
        frames += raw_frame(3, 1, body)
    return client.send_bytes(frames)


def _declared_client() -> tuple:
    broker = Broker()
    client = opened_client(broker, channels=(1, 2))
    client.send(1, commands.Queue.Declare(queue="q"))
    return broker, client


def test_an_undecodable_header_closes_the_connection_with_rabbitmqs_541_and_nothing_is_queued():
    broker, client = _declared_client()
    received = _publish_raw(client, with_headers(field(b"k", b"Z\x00\x00\x00\x01")), b"poison")
    assert [(channel, type(frame)) for channel, frame in received] == [(0, commands.Connection.Close)]
    close = received[0][1]
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (541, "INTERNAL_ERROR", 0, 0)
    assert broker.vhosts["/"].queues["q"].message_count == 0


def test_headers_nested_too_deep_close_only_the_channel_with_406():
    broker, client = _declared_client()
    received = _publish_raw(client, nested_tables(MAX_NESTING_DEPTH + 1))
    channel, close = received[0]
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 40)
    assert close.reply_text == "PRECONDITION_FAILED - invalid message: tables and arrays nested deeper than 64"
    assert client.publish(2, b"fine", routing_key="q") == []
    assert broker.vhosts["/"].queues["q"].message_count == 1


def test_an_unknown_delivery_mode_closes_the_channel_as_rabbitmq_does():
    broker, client = _declared_client()
    received = _publish_raw(client, header(struct.pack(">H", FLAG_DELIVERY_MODE) + b"\x07", 3), b"abc")
    close = received[0][1]
    assert close.reply_text == "PRECONDITION_FAILED - invalid message: {delivery_mode_unknown,7}"
    assert broker.vhosts["/"].queues["q"].message_count == 0
