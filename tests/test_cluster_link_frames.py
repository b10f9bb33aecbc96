"""The link's hand-built frames read back as the broker's codec and pamqp read them."""

from __future__ import annotations

import pytest
from pamqp import commands, frame as pamqp_frame

from amqp_server.wire import codec
from cluster.links.frames import (
    FORWARD_TO_METHOD, ack_frame, decode_deliver, decode_forward_to, decode_get_ok, forward_to_frame, nack_frame,
    publish_frame, reject_frame, split_routing_raw,
)

ROUTING_RAW = codec.shortstr("orders") + codec.shortstr("order.créé")


def _payload(frame: bytes) -> bytes:
    return frame[7:-1]


def test_forward_to_round_trip_names_with_any_characters():
    names = ("orders", "queue with spaces", "ünïcode", "x" * 255)
    payload = _payload(forward_to_frame(3, names))
    assert codec.method_index(payload) == FORWARD_TO_METHOD
    assert decode_forward_to(payload) == list(names)


def test_a_forward_to_with_bytes_after_its_names_is_refused():
    payload = _payload(forward_to_frame(1, ("a",))) + b"junk"
    with pytest.raises(IndexError):
        decode_forward_to(payload)


def test_publish_frame_decodes_as_a_publish_keeping_the_raw_exchange_and_key():
    exchange, key, mandatory, immediate, raw = codec.decode_publish(_payload(publish_frame(1, ROUTING_RAW)))
    assert (exchange, key, mandatory, immediate, raw) == ("orders", "order.créé", False, False, ROUTING_RAW)


def test_deliver_and_get_ok_read_back():
    header = codec.method_frame(1, commands.Basic.Ack())  # any bytes stand for the content here
    wire = b"".join(codec.deliver_frames(5, codec.shortstr("ctag"), 42, True, ROUTING_RAW, header[7:-1], b"body", 4096))
    reader = codec.FrameReader(4096)
    reader.feed(wire)
    (_type, _channel, deliver), *_content = reader.frames()
    assert decode_deliver(deliver) == ("ctag", 42, True, ROUTING_RAW)
    get_ok = _payload(codec.get_ok_frame(5, 7, False, ROUTING_RAW, 12))
    assert decode_get_ok(get_ok) == (7, False, ROUTING_RAW, 12)
    assert split_routing_raw(ROUTING_RAW) == ("orders", "order.créé")


@pytest.mark.parametrize("built, expected", [
    (ack_frame(2, 9), commands.Basic.Ack(9, False)),
    (ack_frame(2, 9, multiple=True), commands.Basic.Ack(9, True)),
    (reject_frame(2, 9, False), commands.Basic.Reject(9, False)),
    (nack_frame(2, 9, False, True), commands.Basic.Nack(9, False, True)),
])
def test_settlement_frames_are_what_pamqp_reads(built, expected):
    _consumed, channel, method = pamqp_frame.unmarshal(built)
    assert channel == 2
    assert (type(method), dict(method)) == (type(expected), dict(expected))
