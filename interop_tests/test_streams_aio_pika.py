"""Stream queues through aio-pika (pamqp on the wire), as RabbitMQ 3.10.8 answers them.

A smaller set than test_streams_pika.py: declare, publish with confirms, consume from an offset
(pamqp encodes small integers as a short-short 'b', datetimes as 'T', floats as 'f'), the
x-stream-offset header on each delivery, a declare refusal on the channel and the 540s that close
the connection. Running it with INTEROP_BROKER_URL checks it against RabbitMQ itself.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Awaitable, Callable

import aio_pika
import pytest
import pytest_asyncio
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aiormq.exceptions import (ChannelPreconditionFailed, ConnectionClosed, ConnectionInternalError,
                               ConnectionNotImplemented)

from interop_tests.aio_pika_helpers import WAIT_S
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.broker_process import BrokerProcess

pytestmark = pytest.mark.asyncio

STREAM = {"x-queue-type": "stream"}


@pytest_asyncio.fixture
async def stream(connection, unique) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Declares durable streams on the test's connection and deletes them afterwards."""
    names: list[str] = []

    async def declare(prefix: str = "aiop-stream") -> str:
        name = unique(f"{prefix}{len(names)}")
        names.append(name)
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True, arguments=STREAM)
        await channel.close()
        return name

    yield declare
    channel = await connection.channel()
    for name in names:
        await channel.queue_delete(name)
    await channel.close()


async def append(connection: AbstractConnection, queue: str, bodies: list[bytes]) -> None:
    """Publish through the default exchange on a confirming channel; returns once each is confirmed."""
    channel = await connection.channel(publisher_confirms=True)
    for body in bodies:
        await asyncio.wait_for(channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue), WAIT_S)
    await channel.close()


async def read(channel: AbstractChannel, queue: str, offset, count: int, prefetch: int) -> list[tuple[bytes, object]]:
    """Consume from `offset` until `count` deliveries arrived (acking each); (body, x-stream-offset) each."""
    await channel.set_qos(prefetch_count=prefetch)
    received: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
    stream_queue = await channel.get_queue(queue, ensure=False)
    tag = await stream_queue.consume(received.put, arguments={"x-stream-offset": offset})
    found = []
    for _ in range(count):
        message = await asyncio.wait_for(received.get(), 2 * WAIT_S)
        found.append((message.body, (message.headers or {}).get("x-stream-offset")))
        await message.ack()
    await stream_queue.cancel(tag)
    return found


async def ignore(_message: AbstractIncomingMessage) -> None:
    """A consumer callback for consumes the broker must refuse."""


def bodies(count: int, start: int = 0) -> list[bytes]:
    return [f"m{index}".encode() for index in range(start, count)]


async def test_publish_with_confirms_then_read_from_an_offset(connection, stream) -> None:
    name = await stream()
    await append(connection, name, bodies(10))
    channel = await connection.channel()

    from_four = await read(channel, name, 4, 6, prefetch=2)  # acks return the credit
    from_first = await read(channel, name, "first", 10, prefetch=10)

    assert from_four == [(body, offset) for offset, body in enumerate(bodies(10)) if offset >= 4]
    assert from_first == list(zip(bodies(10), range(10)))
    assert all(type(offset) is int for _, offset in from_first)  # pamqp decodes the long ('l') as int


async def test_a_timestamp_offset_before_the_stream_reads_everything(connection, stream) -> None:
    name = await stream()
    await append(connection, name, bodies(3))
    channel = await connection.channel()

    before = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)  # pamqp sends a 'T' timestamp
    assert await read(channel, name, before, 3, prefetch=3) == list(zip(bodies(3), range(3)))


async def test_an_exclusive_stream_is_406_on_the_channel(connection, unique) -> None:
    channel = await connection.channel()
    name = unique("aiop-stream-exclusive")

    with pytest.raises(ChannelPreconditionFailed) as caught:
        await asyncio.wait_for(channel.declare_queue(name, durable=True, exclusive=True, arguments=STREAM), WAIT_S)

    assert caught.value.args[0] == (
        f"PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '{name}' in vhost '/'")
    assert not connection.is_closed


async def own_connection(broker: BrokerProcess) -> AbstractConnection:
    """A plain (not robust) connection: one a 540 closes for good."""
    return await asyncio.wait_for(aio_pika.connect(broker.url()), WAIT_S)


async def connection_close(operation: Callable[[], Awaitable[object]]) -> tuple[type, str]:
    """Await `operation`, which must close the connection: (aiormq's class for the reply code, reply text).
    aiormq raises ConnectionNotImplemented for 540 and ConnectionInternalError for 541, with the text."""
    with pytest.raises(ConnectionClosed) as caught:
        await asyncio.wait_for(operation(), WAIT_S)
    return type(caught.value), caught.value.args[0]


async def test_basic_get_is_540_and_closes_the_connection(broker, connection, stream) -> None:
    name = await stream()
    await append(connection, name, bodies(1))
    client = await own_connection(broker)
    try:
        channel = await client.channel()
        queue = await channel.get_queue(name, ensure=False)

        assert await connection_close(lambda: queue.get()) == (
            ConnectionNotImplemented, f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{name}' in vhost '/'")
    finally:
        await client.close()


async def test_a_no_ack_consumer_is_540_and_closes_the_connection(broker, stream) -> None:
    name = await stream()
    client = await own_connection(broker)
    try:
        channel = await client.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.get_queue(name, ensure=False)

        assert await connection_close(lambda: queue.consume(ignore, no_ack=True)) == (
            ConnectionNotImplemented,
            f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '{name}' in vhost '/'")
    finally:
        await client.close()


async def test_a_float_offset_is_refused_and_the_stream_still_serves(broker, connection, stream) -> None:
    """RabbitMQ 3.10.8 crashes on a float offset (541 INTERNAL_ERROR: osiris_log:init_offset_reader0 has no
    clause for it); this broker refuses it with 406 on the channel."""
    name = await stream()
    await append(connection, name, bodies(2))
    client = await own_connection(broker)
    try:
        channel = await client.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.get_queue(name, ensure=False)
        consume = queue.consume(ignore, arguments={"x-stream-offset": 1.5})
        if broker.is_external:
            assert await connection_close(lambda: consume) == (ConnectionInternalError, "INTERNAL_ERROR")
        else:
            with pytest.raises(ChannelPreconditionFailed) as caught:
                await asyncio.wait_for(consume, WAIT_S)
            assert caught.value.args[0].startswith(
                f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{name}' in vhost '/': ")
    finally:
        await client.close()
    channel = await connection.channel()
    assert await read(channel, name, "first", 2, prefetch=2) == list(zip(bodies(2), range(2)))
