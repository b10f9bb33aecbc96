"""Every basic property and every header field type survives a trip through the broker unchanged."""

from __future__ import annotations

import asyncio
import datetime
from decimal import Decimal

import aio_pika
import pytest
from aio_pika import DeliveryMode

from interop_tests.aio_pika_helpers import WAIT_S
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)

pytestmark = pytest.mark.asyncio


# Every byte value, plus sequences that look like frame-end and UTF-8 trouble.
BINARY_BODY = bytes(range(256)) * 4 + b"\xce\xff\x00\xce" + "héllo ✓".encode()


async def round_trip(connection, unique, message: aio_pika.Message):
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("aiop-props"), exclusive=True)
    await channel.default_exchange.publish(message, routing_key=queue.name)
    return await asyncio.wait_for(queue.get(no_ack=True), WAIT_S)


async def test_all_basic_properties_round_trip(connection, unique) -> None:
    stamp = datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=datetime.timezone.utc)
    sent = aio_pika.Message(
        BINARY_BODY,
        content_type="application/octet-stream",
        content_encoding="identity",
        delivery_mode=DeliveryMode.PERSISTENT,
        priority=7,
        correlation_id="corr-42",
        reply_to="reply-queue",
        expiration=60,  # seconds; aio-pika sends the string "60000"
        message_id="msg-1",
        timestamp=stamp,
        type="order.created",
        user_id="guest",  # must equal the login user or the broker refuses it
        app_id="interop-tests",
    )
    got = await round_trip(connection, unique, sent)
    assert got.body == BINARY_BODY
    raw = got.properties  # the decoded pamqp Basic.Properties, before aio-pika reshapes them
    assert raw.content_type == "application/octet-stream"
    assert raw.content_encoding == "identity"
    assert raw.delivery_mode == 2
    assert raw.priority == 7
    assert raw.correlation_id == "corr-42"
    assert raw.reply_to == "reply-queue"
    assert raw.expiration == "60000"
    assert raw.message_id == "msg-1"
    assert raw.timestamp == stamp
    assert raw.message_type == "order.created"
    assert raw.user_id == "guest"
    assert raw.app_id == "interop-tests"
    assert got.expiration == 60.0
    assert got.delivery_mode == DeliveryMode.PERSISTENT


async def test_message_without_properties_arrives_without_them(connection, unique) -> None:
    got = await round_trip(connection, unique, aio_pika.Message(b""))
    assert got.body == b""
    raw = got.properties
    assert raw.content_type is None
    assert raw.correlation_id is None
    assert raw.expiration is None
    assert raw.user_id is None


async def test_header_field_types_round_trip(connection, unique) -> None:
    stamp = datetime.datetime(2023, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    headers = {
        "str": "text ✓",
        "empty": "",
        "true": True,
        "false": False,
        "small": 7,
        "negative": -42,
        "int32": 2_000_000_000,
        "int64": 9_000_000_000_000,
        "int64-neg": -9_000_000_000_000,
        "float": 1.5,
        "decimal": Decimal("3.14"),
        "bytes": bytearray(b"\x00\x01\xff"),  # pamqp sends bytearray as the 'x' byte-array type
        "timestamp": stamp,
        "none": None,
        "array": [1, "two", True, [3, 4], {"k": "v"}],
        "empty-array": [],
        "nested": {"level1": {"level2": {"n": 1, "list": ["a", "b"]}}, "flag": False},
        "empty-table": {},
    }
    got = await round_trip(connection, unique, aio_pika.Message(b"h", headers=headers))
    received = got.headers
    assert set(received) == set(headers)
    for key in ("str", "empty", "true", "false", "small", "negative", "int32", "int64", "int64-neg",
                "float", "decimal", "bytes", "timestamp", "none", "array", "empty-array", "nested", "empty-table"):
        assert received[key] == headers[key], key
    assert received["true"] is True and received["false"] is False
    assert received["decimal"] == Decimal("3.14")
    assert received["bytes"] == bytearray(b"\x00\x01\xff")


async def test_user_id_other_than_login_is_refused(connection, unique) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("aiop-userid"), exclusive=True)
    with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as caught:
        await asyncio.wait_for(
            channel.default_exchange.publish(aio_pika.Message(b"x", user_id="someone-else"), queue.name), WAIT_S
        )
    assert "user_id" in str(caught.value)


async def test_large_body_spans_many_frames(connection, unique) -> None:
    body = bytes(range(256)) * (2 * 1024 * 1024 // 256 + 3)  # 2 MiB + a bit, not frame aligned
    got = await round_trip(connection, unique, aio_pika.Message(body))
    assert got.body == body
