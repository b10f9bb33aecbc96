"""Frames too short to hold what their type starts with close the connection with RabbitMQ's 501
texts, on an open channel too, where the connection and content assembly read them inline."""

from __future__ import annotations

from pamqp import commands

from tests.frame_driver import methods, opened_client, publish_frames, raw_frame


def test_a_method_frame_too_short_for_its_ids_closes_the_connection_with_501():
    client = opened_client()
    [close] = methods(client.send_bytes(raw_frame(1, 1, b"\x00\x3c\x00")))
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (501, "FRAME_ERROR - type 1, all octets = <<0,60,0>>: {method_frame_too_short}")


def test_a_content_header_too_short_for_its_body_size_closes_the_connection_with_501():
    client = opened_client()
    client.call(1, commands.Queue.Declare(queue="q"))
    method = publish_frames(1, b"x", routing_key="q")
    method = method[: 8 + int.from_bytes(method[3:7], "big")]  # the basic.publish frame alone
    [close] = methods(client.send_bytes(method + raw_frame(2, 1, b"\x00\x3c\x00\x00\x00")))
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (
        501, "FRAME_ERROR - type 2, all octets = <<0,60,0,0,0>>: {content_header_too_short}")
