"""aio-pika transactions (tx.select / commit / rollback) on a channel without confirms."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika.abc import AbstractQueue

from interop_tests.aio_pika_helpers import WAIT_S, ready_count
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)

pytestmark = pytest.mark.asyncio


async def test_transactions_need_confirms_off(connection) -> None:
    channel = await connection.channel()  # confirms on by default
    with pytest.raises(RuntimeError):
        channel.transaction()


async def test_commit_makes_publishes_visible(connection, unique) -> None:
    observer = await connection.channel()
    queue = await observer.declare_queue(unique("aiop-tx-commit"), exclusive=True)
    channel = await connection.channel(publisher_confirms=False)
    tx = channel.transaction()
    await tx.select()
    for i in range(3):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
    # Publishes inside an open transaction are held back until commit. A round trip on
    # the same channel (queue.declare) orders after the publishes, so the count is settled.
    await (await channel.get_underlay_channel()).queue_declare(queue.name, passive=True)
    assert await ready_count(connection, queue.name) == 0
    await tx.commit()
    assert await ready_count(connection, queue.name) == 3


async def test_rollback_discards_publishes(connection, unique) -> None:
    observer = await connection.channel()
    queue = await observer.declare_queue(unique("aiop-tx-rollback"), exclusive=True)
    channel = await connection.channel(publisher_confirms=False)
    tx = channel.transaction()
    await tx.select()
    await channel.default_exchange.publish(aio_pika.Message(b"gone"), routing_key=queue.name)
    await tx.rollback()
    await channel.default_exchange.publish(aio_pika.Message(b"kept"), routing_key=queue.name)
    await tx.commit()
    message = await asyncio.wait_for(queue.get(no_ack=True), WAIT_S)
    assert message.body == b"kept"
    assert await asyncio.wait_for(queue.get(no_ack=True, fail=False), WAIT_S) is None


async def test_acks_inside_transaction_apply_on_commit(connection, unique) -> None:
    name = unique("aiop-tx-ack")
    setup = await connection.channel()
    await setup.declare_queue(name, exclusive=True)
    await setup.default_exchange.publish(aio_pika.Message(b"work"), routing_key=name)

    channel = await connection.channel(publisher_confirms=False)
    queue: AbstractQueue = await channel.get_queue(name)
    tx = channel.transaction()
    await tx.select()
    message = await asyncio.wait_for(queue.get(), WAIT_S)
    await message.ack()
    await tx.rollback()  # the ack is discarded: the delivery stays unacked
    await channel.close()  # so closing the channel requeues it
    assert await ready_count(connection, name) == 1

    channel = await connection.channel(publisher_confirms=False)
    queue = await channel.get_queue(name)
    async with channel.transaction():  # the context manager commits on success
        message = await asyncio.wait_for(queue.get(), WAIT_S)
        assert message.redelivered is True
        await message.ack()
    await channel.close()
    assert await ready_count(connection, name) == 0
