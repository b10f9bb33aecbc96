"""ContentAssembly (amqp_server/wire/content_assembly.py) on its own: a publish's header and body
frames, and the frames it refuses with RabbitMQ's codes and texts."""

from __future__ import annotations

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from amqp_server.wire.codec import UnknownDeliveryMode
from amqp_server.wire.content_assembly import ContentAssembly
from amqp_server.wire.errors import AMQPError

MAX_SIZE = 1000


def header_payload(body_size: int, **properties) -> bytes:
    return ContentHeader(body_size=body_size, properties=commands.Basic.Properties(**properties)).marshal()


def assembly() -> ContentAssembly:
    return ContentAssembly(exchange=None, routing_key="q", mandatory=False, routing_raw=b"")  # type: ignore[arg-type]


def test_bodies_are_collected_until_the_declared_size():
    content = assembly()
    assert content.take_header(header_payload(10), MAX_SIZE) is False
    assert content.take_body(b"01234") is None
    assert content.take_body(b"56789") == b"0123456789"


def test_a_body_in_one_frame_is_that_frame():
    content = assembly()
    content.take_header(header_payload(4), MAX_SIZE)
    assert content.take_body(b"abcd") == b"abcd"


def test_an_empty_body_is_complete_with_its_header():
    content = assembly()
    assert content.take_header(header_payload(0), MAX_SIZE) is True


def test_a_body_larger_than_declared_is_a_frame_error():
    content = assembly()
    content.take_header(header_payload(3), MAX_SIZE)
    with pytest.raises(AMQPError) as refused:
        content.take_body(b"four")
    assert (refused.value.code, refused.value.reply_text) == (501, "FRAME_ERROR - content body larger than declared: 4 > 3")


def test_a_message_over_the_max_size_is_refused_before_its_body():
    with pytest.raises(AMQPError) as refused:
        assembly().take_header(header_payload(MAX_SIZE + 1), MAX_SIZE)
    assert (refused.value.code, refused.value.reply_text, refused.value.class_id, refused.value.method_id) == (
        406, f"PRECONDITION_FAILED - message size {MAX_SIZE + 1} is larger than configured max size {MAX_SIZE}", 60, 40)


def test_a_second_header_and_a_method_mid_content_are_unexpected_frames():
    content = assembly()
    refused = content.method_refused()
    assert (refused.code, refused.reply_text) == (
        505, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead")
    content.take_header(header_payload(5), MAX_SIZE)
    with pytest.raises(AMQPError) as second:
        content.take_header(header_payload(5), MAX_SIZE)
    assert second.value.reply_text == "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
    assert content.method_refused().reply_text == (
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead")


def test_a_header_of_another_class_is_refused():
    payload = bytearray(header_payload(1))
    payload[0:2] = (50).to_bytes(2, "big")
    with pytest.raises(AMQPError) as refused:
        assembly().take_header(bytes(payload), MAX_SIZE)
    assert refused.value.reply_text == (
        "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead")


def test_properties_consumers_cannot_decode_are_refused_before_the_body():
    payload = bytearray(header_payload(1, delivery_mode=2))
    payload[-1] = 7  # delivery_mode is the last property
    content = assembly()
    with pytest.raises(UnknownDeliveryMode):
        content.take_header(bytes(payload), MAX_SIZE)
    assert content.raw_header is None
