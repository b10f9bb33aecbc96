"""Prefetch (basic.qos) limits how many unacked deliveries a consumer holds, as seen from aio-pika."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from interop_tests.aio_pika_helpers import WAIT_S
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import wait_until_async

pytestmark = pytest.mark.asyncio


async def test_prefetch_caps_unacked_deliveries(connection, unique) -> None:
    publisher = await connection.channel()
    name = unique("aiop-qos")
    await publisher.declare_queue(name, exclusive=True)
    for i in range(10):
        await publisher.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=name)

    channel = await connection.channel()
    await channel.set_qos(prefetch_count=3)
    queue = await channel.get_queue(name)
    held: list[AbstractIncomingMessage] = []
    three = asyncio.Event()

    async def hold(message: AbstractIncomingMessage) -> None:
        held.append(message)
        if len(held) == 3:
            three.set()

    await queue.consume(hold)
    await asyncio.wait_for(three.wait(), WAIT_S)
    # The broker must stop at 3: a round trip on the consuming channel orders after any
    # delivery it would have sent, and the queue still holds the other 7 as ready.
    assert await ready_in(channel, name) == 7
    assert len(held) == 3

    # Acking one frees one slot and exactly one more message arrives.
    await held[0].ack()
    await wait_until_async(lambda: len(held) == 4, "a fourth delivery", WAIT_S, every=0.005)
    assert await ready_in(channel, name) == 6
    assert len(held) == 4
    assert [m.body for m in held] == [b"0", b"1", b"2", b"3"]


async def test_prefetch_one_dispatches_fairly_between_consumers(connection, unique) -> None:
    setup = await connection.channel()
    name = unique("aiop-fair")
    await setup.declare_queue(name, exclusive=True)
    total = 20
    seen: dict[str, list[bytes]] = {"a": [], "b": []}
    all_done = asyncio.Event()

    async def start_worker(label: str) -> None:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1)
        queue = await channel.get_queue(name)

        async def work(message: AbstractIncomingMessage) -> None:
            seen[label].append(message.body)
            await message.ack()
            if sum(len(v) for v in seen.values()) == total:
                all_done.set()

        await queue.consume(work)

    await start_worker("a")
    await start_worker("b")
    for i in range(total):
        await setup.default_exchange.publish(aio_pika.Message(b"%02d" % i), routing_key=name)
    await asyncio.wait_for(all_done.wait(), WAIT_S)
    processed = sorted(seen["a"] + seen["b"])
    assert processed == [b"%02d" % i for i in range(total)]  # each exactly once
    assert seen["a"] and seen["b"]  # both workers took part


async def test_global_and_per_consumer_qos_accepted(connection, unique) -> None:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=5, global_=True)
    await channel.set_qos(prefetch_count=2)
    await channel.set_qos(prefetch_count=0)  # 0 means unlimited


async def ready_in(channel, name: str) -> int:
    """Ready count from a real queue.declare(passive) round trip on `channel`.

    RobustChannel.declare_queue(passive=True) answers from its cache for queues it
    knows, so go to the underlying aiormq channel.
    """
    underlay = await channel.get_underlay_channel()
    return (await underlay.queue_declare(name, passive=True)).message_count
