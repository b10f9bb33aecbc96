"""aio-pika (aiormq underneath) publishing with confirms and consuming, end to end.

aio-pika turns publisher confirms on by default, so every publish here also
checks that the broker advertises and honours `publisher_confirms`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from pamqp.commands import Basic

from interop_tests.aio_pika_helpers import WAIT_S, ready_count
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)

pytestmark = pytest.mark.asyncio


async def ready_count_after_close(connection: AbstractRobustConnection, channel, name: str) -> int:
    """Close `channel` (requeueing anything it left unacked) and count what is ready in `name`."""
    await channel.close()
    return await ready_count(connection, name)


async def test_connect_robust_negotiates_confirms(connection: AbstractRobustConnection) -> None:
    channel = await connection.channel()
    assert channel.is_closed is False
    assert channel.publisher_confirms is True
    capabilities = connection.transport.connection.server_capabilities
    assert capabilities.get("publisher_confirms") is True
    assert capabilities.get("basic.nack") is True


async def test_confirmed_publish_then_iterator_consume(connection, unique: Callable[[str], str]) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("aiop-iter"), exclusive=True)
    bodies = [f"message {i}".encode() for i in range(5)]
    for body in bodies:
        confirmation = await asyncio.wait_for(
            channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name), WAIT_S
        )
        assert isinstance(confirmation, Basic.Ack)

    received: list[bytes] = []

    async def drain() -> None:
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    received.append(message.body)
                if len(received) == len(bodies):
                    return

    await asyncio.wait_for(drain(), WAIT_S)
    assert received == bodies
    assert await ready_count_after_close(connection, channel, queue.name) == 0


async def test_callback_consumer_receives_in_order(connection, unique) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("aiop-cb"), auto_delete=True)
    received: list[bytes] = []
    done = asyncio.get_running_loop().create_future()

    async def on_message(message: AbstractIncomingMessage) -> None:
        received.append(message.body)
        await message.ack()
        if len(received) == 3 and not done.done():
            done.set_result(None)

    tag = await queue.consume(on_message)
    for i in range(3):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
    await asyncio.wait_for(done, WAIT_S)
    assert received == [b"0", b"1", b"2"]
    await queue.cancel(tag)


async def test_reject_with_requeue_redelivers_and_without_drops(connection, unique) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("aiop-reject"), exclusive=True)
    await channel.default_exchange.publish(aio_pika.Message(b"bounce"), routing_key=queue.name)

    first = await asyncio.wait_for(queue.get(no_ack=False), WAIT_S)
    assert first.redelivered is False
    await first.reject(requeue=True)

    second = await asyncio.wait_for(queue.get(no_ack=False), WAIT_S)
    assert second.body == b"bounce"
    assert second.redelivered is True
    await second.reject(requeue=False)

    with pytest.raises(aio_pika.exceptions.QueueEmpty):
        await asyncio.wait_for(queue.get(no_ack=False), WAIT_S)


async def test_nack_requeue_and_nack_drop(connection, unique) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("aiop-nack"), exclusive=True)
    await channel.default_exchange.publish(aio_pika.Message(b"n"), routing_key=queue.name)

    message = await asyncio.wait_for(queue.get(), WAIT_S)
    await message.nack(requeue=True)
    again = await asyncio.wait_for(queue.get(), WAIT_S)
    assert again.redelivered is True
    await again.nack(requeue=False)
    assert await ready_count_after_close(connection, channel, queue.name) == 0


async def test_unacked_messages_return_to_queue_when_channel_closes(connection, unique) -> None:
    channel = await connection.channel()
    name = unique("aiop-unacked")
    queue = await channel.declare_queue(name)
    try:
        await channel.default_exchange.publish(aio_pika.Message(b"keep"), routing_key=name)
        consumer_channel = await connection.channel()
        consumer_queue = await consumer_channel.get_queue(name)
        message = await asyncio.wait_for(consumer_queue.get(), WAIT_S)
        assert message.body == b"keep"
        await consumer_channel.close()

        again = await asyncio.wait_for(queue.get(), WAIT_S)
        assert again.body == b"keep"
        assert again.redelivered is True
        await again.ack()
    finally:
        await queue.delete(if_unused=False, if_empty=False)


async def test_multiple_ack_settles_all_earlier_deliveries(connection, unique) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("aiop-multi"), exclusive=True)
    for i in range(4):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
    got = [await asyncio.wait_for(queue.get(), WAIT_S) for _ in range(4)]
    await got[-1].ack(multiple=True)
    # Had any delivery stayed unacked, closing the channel would requeue it.
    assert await ready_count_after_close(connection, channel, queue.name) == 0
