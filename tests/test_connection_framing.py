"""Broken framing closes the connection with RabbitMQ's codes; good framing in any split works."""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.body import ContentBody

from amqp_server.connection import connection as connection_module
from tests.frame_driver import marshal, opened_client, raw_frame


def connection_close(received):
    assert len(received) == 1, received
    channel, close = received[0]
    assert channel == 0
    assert isinstance(close, commands.Connection.Close), close
    return close


def test_frame_larger_than_negotiated_frame_max_gives_501():
    client = opened_client(frame_max=4096)
    close = connection_close(client.send_bytes(raw_frame(3, 1, b"x" * 5000)))
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR - ")


def test_frame_of_exactly_frame_max_is_accepted():
    client = opened_client(frame_max=4096)
    client.send(1, commands.Queue.Declare(queue="q"))
    body = b"x" * (4096 - 8)
    received = client.publish(1, body, routing_key="q", frame_max=4096)
    assert received == []
    get_ok = client.send(1, commands.Basic.Get(queue="q", no_ack=True))
    assert isinstance(get_ok[0][1], commands.Basic.GetOk)
    assert get_ok[-1][1].value == body


def test_bad_frame_end_byte_gives_501():
    client = opened_client()
    payload = marshal(1, commands.Basic.Qos(prefetch_count=1))[7:-1]
    close = connection_close(client.send_bytes(raw_frame(1, 1, payload, frame_end=0x00)))
    assert close.reply_code == 501
    assert "invalid_frame_end_marker" in close.reply_text


def test_input_after_a_framing_error_is_ignored():
    client = opened_client()
    client.send_bytes(raw_frame(1, 1, b"\x00\x3c\x00\x0a", frame_end=0x00))
    assert client.send(1, commands.Queue.Declare(queue="q")) == []
    assert client.send(0, commands.Connection.CloseOk()) == []


def test_unknown_frame_type_gives_501():
    client = opened_client()
    close = connection_close(client.send_bytes(raw_frame(5, 1, b"abc")))
    assert close.reply_code == 501


def test_heartbeat_on_channel_1_gives_505():
    client = opened_client()
    close = connection_close(client.send_bytes(raw_frame(8, 1, b"")))
    assert close.reply_code == 505
    assert close.reply_text.startswith("UNEXPECTED_FRAME - ")


def test_heartbeat_on_channel_0_is_accepted_silently():
    client = opened_client()
    assert client.send_bytes(raw_frame(8, 0, b"")) == []
    assert client.connection.state == connection_module.OPEN


def test_content_frame_on_channel_0_gives_505():
    client = opened_client()
    close = connection_close(client.send(0, ContentBody(b"abc")))
    assert close.reply_code == 505


def test_unknown_method_on_channel_0_gives_503():
    client = opened_client()
    close = connection_close(client.send_bytes(raw_frame(1, 0, struct.pack(">HH", 10, 99))))
    assert (close.reply_code, close.class_id, close.method_id) == (503, 10, 99)


def test_frames_after_a_connection_error_are_dropped_until_close_ok():
    client = opened_client()
    client.send_bytes(raw_frame(8, 1, b""))
    assert client.send(1, commands.Queue.Declare(queue="q")) == []
    assert client.connection.state == connection_module.CLOSING
    assert client.send(0, commands.Connection.CloseOk()) == []
    assert client.connection.state == connection_module.CLOSED


def test_connection_close_crossing_the_servers_close_is_answered_with_close_ok():
    client = opened_client()
    client.send_bytes(raw_frame(8, 1, b""))
    received = client.send(0, commands.Connection.Close(200, "bye", 0, 0))
    assert isinstance(received[0][1], commands.Connection.CloseOk)
    # As in RabbitMQ, the broker still waits for the close-ok of its own close.
    assert client.connection.state == connection_module.CLOSING
    assert client.send(0, commands.Connection.CloseOk()) == []
    assert client.connection.state == connection_module.CLOSED


def test_a_connection_error_requeues_the_unacked_messages():
    client = opened_client()
    client.send(1, commands.Queue.Declare(queue="q"))
    client.publish(1, b"m", routing_key="q")
    client.send(1, commands.Basic.Get(queue="q"))
    client.send_bytes(raw_frame(8, 1, b""))
    queue = client.broker.vhosts["/"].queues["q"]
    assert queue.message_count == 1
