"""aio-pika declaring exchanges of every type, queues and bindings, and seeing routing follow them."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
import pytest_asyncio
from aio_pika import ExchangeType
from aio_pika.abc import AbstractChannel, AbstractQueue

from interop_tests.aio_pika_helpers import WAIT_S
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def channel(connection) -> AbstractChannel:
    return await connection.channel()


async def bodies_in(queue: AbstractQueue) -> list[bytes]:
    """Everything ready in `queue`, taken with basic.get(no_ack) until it is empty."""
    found: list[bytes] = []
    while True:
        message = await asyncio.wait_for(queue.get(no_ack=True, fail=False), WAIT_S)
        if message is None:
            return found
        found.append(message.body)


async def temp_queue(channel: AbstractChannel) -> AbstractQueue:
    return await channel.declare_queue(exclusive=True)


async def test_direct_exchange_routes_by_exact_key(channel, unique) -> None:
    exchange = await channel.declare_exchange(unique("aiop-direct"), ExchangeType.DIRECT, auto_delete=True)
    red, blue = await temp_queue(channel), await temp_queue(channel)
    await red.bind(exchange, "red")
    await blue.bind(exchange, "blue")
    for key in ("red", "blue", "green", "red"):
        await exchange.publish(aio_pika.Message(key.encode()), routing_key=key)
    assert await bodies_in(red) == [b"red", b"red"]
    assert await bodies_in(blue) == [b"blue"]


async def test_fanout_exchange_ignores_routing_key(channel, unique) -> None:
    exchange = await channel.declare_exchange(unique("aiop-fanout"), ExchangeType.FANOUT, auto_delete=True)
    queues = [await temp_queue(channel) for _ in range(3)]
    for queue in queues:
        await queue.bind(exchange, routing_key="whatever")
    await exchange.publish(aio_pika.Message(b"all"), routing_key="other")
    for queue in queues:
        assert await bodies_in(queue) == [b"all"]


async def test_topic_exchange_wildcards(channel, unique) -> None:
    exchange = await channel.declare_exchange(unique("aiop-topic"), ExchangeType.TOPIC, auto_delete=True)
    star, hash_, exact = await temp_queue(channel), await temp_queue(channel), await temp_queue(channel)
    await star.bind(exchange, "stock.*.nyse")
    await hash_.bind(exchange, "stock.#")
    await exact.bind(exchange, "stock.ibm.nyse")
    for key in ("stock.ibm.nyse", "stock.msft.nasdaq", "stock", "stock.a.b.nyse", "bond.x.nyse"):
        await exchange.publish(aio_pika.Message(key.encode()), routing_key=key)
    assert await bodies_in(star) == [b"stock.ibm.nyse"]
    assert await bodies_in(hash_) == [b"stock.ibm.nyse", b"stock.msft.nasdaq", b"stock", b"stock.a.b.nyse"]
    assert await bodies_in(exact) == [b"stock.ibm.nyse"]


async def test_headers_exchange_all_and_any(channel, unique) -> None:
    exchange = await channel.declare_exchange(unique("aiop-headers"), ExchangeType.HEADERS, auto_delete=True)
    match_all, match_any = await temp_queue(channel), await temp_queue(channel)
    await match_all.bind(exchange, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    await match_any.bind(exchange, arguments={"x-match": "any", "format": "pdf", "type": "report"})
    await exchange.publish(aio_pika.Message(b"both", headers={"format": "pdf", "type": "report"}), "")
    await exchange.publish(aio_pika.Message(b"one", headers={"format": "pdf", "type": "log"}), "")
    await exchange.publish(aio_pika.Message(b"none", headers={"format": "zip"}), "")
    assert await bodies_in(match_all) == [b"both"]
    assert await bodies_in(match_any) == [b"both", b"one"]


async def test_exchange_to_exchange_binding_and_unbind(channel, unique) -> None:
    source = await channel.declare_exchange(unique("aiop-e2e-src"), ExchangeType.TOPIC)
    destination = await channel.declare_exchange(unique("aiop-e2e-dst"), ExchangeType.FANOUT)
    try:
        queue = await temp_queue(channel)
        await queue.bind(destination)
        await destination.bind(source, routing_key="logs.#")

        await source.publish(aio_pika.Message(b"routed"), routing_key="logs.error")
        await source.publish(aio_pika.Message(b"dropped"), routing_key="metrics.cpu")
        assert await bodies_in(queue) == [b"routed"]

        await destination.unbind(source, routing_key="logs.#")
        await source.publish(aio_pika.Message(b"after-unbind"), routing_key="logs.error")
        assert await bodies_in(queue) == []
    finally:
        await source.delete()
        await destination.delete()


async def test_queue_unbind_stops_routing(channel, unique) -> None:
    exchange = await channel.declare_exchange(unique("aiop-unbind"), ExchangeType.DIRECT)
    try:
        queue = await temp_queue(channel)
        await queue.bind(exchange, "k")
        await exchange.publish(aio_pika.Message(b"1"), "k")
        await queue.unbind(exchange, "k")
        await exchange.publish(aio_pika.Message(b"2"), "k")
        assert await bodies_in(queue) == [b"1"]
    finally:
        await exchange.delete()


async def test_auto_delete_exchange_goes_with_its_last_binding(connection, channel, unique) -> None:
    exchange = await channel.declare_exchange(unique("aiop-autodel-x"), ExchangeType.DIRECT, auto_delete=True)
    first, second = await temp_queue(channel), await temp_queue(channel)
    await first.bind(exchange, "a")
    await second.bind(exchange, "b")
    await first.unbind(exchange, "a")
    # Fresh channels, because a robust channel answers passive declares from its cache.
    probe = await connection.channel()
    assert (await probe.get_exchange(exchange.name)).name == exchange.name  # one binding left
    await second.unbind(exchange, "b")
    probe = await connection.channel()
    with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
        await probe.get_exchange(exchange.name)


async def test_redeclare_with_same_arguments_is_idempotent(channel, unique) -> None:
    name = unique("aiop-redeclare")
    first = await channel.declare_queue(name, exclusive=True, arguments={"x-max-length": 10})
    second = await channel.declare_queue(name, exclusive=True, arguments={"x-max-length": 10})
    assert first.name == second.name == name
    exchange_name = unique("aiop-redeclare-x")
    exchange = await channel.declare_exchange(exchange_name, ExchangeType.TOPIC)
    await channel.declare_exchange(exchange_name, ExchangeType.TOPIC)
    await exchange.delete()


async def test_server_named_queue(broker) -> None:
    # The robust channel names queues on the client side, so use a plain connection
    # to have queue.declare with an empty name reach the broker.
    conn = await asyncio.wait_for(aio_pika.connect(broker.url()), WAIT_S)
    try:
        plain = await conn.channel()
        queue = await plain.declare_queue("", exclusive=True)
        assert queue.name.startswith("amq.gen-")
        await plain.default_exchange.publish(aio_pika.Message(b"x"), routing_key=queue.name)
        assert await bodies_in(queue) == [b"x"]
    finally:
        await conn.close()


async def test_purge_reports_count_and_delete_removes_queue(connection, channel, unique) -> None:
    name = unique("aiop-purge")
    queue = await channel.declare_queue(name)
    for i in range(3):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=name)
    purged = await queue.purge()
    assert purged.message_count == 3
    assert await bodies_in(queue) == []

    await channel.default_exchange.publish(aio_pika.Message(b"left"), routing_key=name)
    deleted = await queue.delete(if_unused=False, if_empty=False)
    assert deleted.message_count == 1

    with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
        await channel.declare_queue(name, passive=True)


async def test_get_no_ack_and_get_empty(channel, unique) -> None:
    queue = await channel.declare_queue(unique("aiop-get"), exclusive=True)
    with pytest.raises(aio_pika.exceptions.QueueEmpty):
        await asyncio.wait_for(queue.get(no_ack=True), WAIT_S)
    await channel.default_exchange.publish(aio_pika.Message(b"once"), routing_key=queue.name)
    await channel.default_exchange.publish(aio_pika.Message(b"twice"), routing_key=queue.name)
    message = await asyncio.wait_for(queue.get(no_ack=True), WAIT_S)
    assert message.body == b"once"
    assert message.message_count == 1  # basic.get-ok says how many remain
    assert (await asyncio.wait_for(queue.get(no_ack=True), WAIT_S)).body == b"twice"
    assert await asyncio.wait_for(queue.get(no_ack=True, fail=False), WAIT_S) is None
