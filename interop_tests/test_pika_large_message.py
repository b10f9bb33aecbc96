"""Message bodies split across many body frames arrive intact.

A body larger than frame_max - 8 travels as several body frames each way; these
tests check sizes far above and right around that boundary, with the server's
default frame_max and with a client that negotiates the 4096-byte minimum.
"""

from __future__ import annotations

import hashlib
import os

import pika
import pytest

from interop_tests.pika_helpers import connect
from interop_tests.waiting import poll

FRAME_OVERHEAD = 8  # type (1) + channel (2) + size (4) + frame-end (1)


def negotiated_frame_max(connection: pika.BlockingConnection) -> int:
    return connection._impl.params.frame_max


def round_trip_by_get(connection: pika.BlockingConnection, queue: str, body: bytes) -> bytes:
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", queue, body)
    method, _, received = channel.basic_get(queue, auto_ack=True)
    assert method is not None
    channel.close()
    return received


def round_trip_by_consume(connection: pika.BlockingConnection, queue: str, body: bytes) -> bytes:
    channel = connection.channel()
    received = []
    channel.basic_consume(queue, lambda ch, method, props, data: received.append(data), auto_ack=True)
    channel.basic_publish("", queue, body)
    poll(lambda: received, 20, pump=connection.process_data_events)
    channel.close()
    assert received, "large message not delivered in time"
    return received[0]


def test_five_mib_message_round_trips_intact(broker, unique):
    body = os.urandom(5 * 1024 * 1024)
    with connect(broker) as connection:
        queue = unique("large")
        connection.channel().queue_declare(queue, exclusive=True)

        received = round_trip_by_consume(connection, queue, body)

    assert len(received) == len(body)
    assert hashlib.sha256(received).digest() == hashlib.sha256(body).digest()


def test_large_message_with_a_4096_byte_frame_max(broker, unique):
    body = os.urandom(1024 * 1024 + 17)
    with connect(broker.url() + "?frame_max=4096") as connection:
        assert negotiated_frame_max(connection) == 4096
        queue = unique("large-small-frames")
        connection.channel().queue_declare(queue, exclusive=True)

        assert round_trip_by_get(connection, queue, body) == body
        assert round_trip_by_consume(connection, queue, body) == body


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_bodies_around_the_frame_boundary(broker, unique, delta):
    with connect(broker.url() + "?frame_max=4096") as connection:
        payload_per_frame = negotiated_frame_max(connection) - FRAME_OVERHEAD
        queue = unique("boundary")
        connection.channel().queue_declare(queue, exclusive=True)
        for frames in (1, 2):
            body = os.urandom(frames * payload_per_frame + delta)
            assert round_trip_by_get(connection, queue, body) == body


def test_empty_body_round_trips(broker, unique):
    with connect(broker) as connection:
        queue = unique("empty-body")
        connection.channel().queue_declare(queue, exclusive=True)

        assert round_trip_by_get(connection, queue, b"") == b""
        assert round_trip_by_consume(connection, queue, b"") == b""


def test_properties_survive_alongside_a_multi_frame_body(broker, unique):
    properties = pika.BasicProperties(
        content_type="application/octet-stream", content_encoding="identity",
        headers={"x-trace": "abc", "count": 3, "nested": {"ok": True}},
        delivery_mode=2, priority=4, correlation_id="corr", reply_to="replies",
        expiration="60000", message_id="mid", timestamp=1_700_000_000, type="blob",
        user_id="guest", app_id="interop",
    )
    body = os.urandom(300_000)
    with connect(broker) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        queue = unique("props")
        channel.queue_declare(queue, exclusive=True)
        channel.basic_publish("", queue, body, properties)
        _, received_properties, received = channel.basic_get(queue, auto_ack=True)

    assert received == body
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(received_properties, name) == getattr(properties, name), name


@pytest.mark.skipif(bool(os.environ.get("INTEROP_BROKER_URL")), reason="needs this project's broker configuration")
def test_server_frame_max_from_config_is_negotiated_and_enforced_by_splitting(broker_factory, unique):
    from interop_tests.broker_process import TEST_CONFIG

    small_frames = broker_factory(TEST_CONFIG + "\n[limits]\nframe_max = 8192\n")
    body = os.urandom(200_000)
    with connect(small_frames) as connection:
        assert negotiated_frame_max(connection) == 8192
        queue = unique("config-frame-max")
        connection.channel().queue_declare(queue, exclusive=True)
        assert round_trip_by_get(connection, queue, body) == body
