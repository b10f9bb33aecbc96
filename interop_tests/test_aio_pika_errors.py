"""Channel-level errors as aio-pika surfaces them: the reply code picks the exception class."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika import ExchangeType
from aio_pika.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

from interop_tests.aio_pika_helpers import WAIT_S
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)

pytestmark = pytest.mark.asyncio


async def test_passive_queue_declare_of_missing_queue_is_404(connection, unique) -> None:
    channel = await connection.channel()
    name = unique("aiop-missing-q")
    with pytest.raises(ChannelNotFoundEntity) as caught:
        await asyncio.wait_for(channel.declare_queue(name, passive=True), WAIT_S)
    assert "NOT_FOUND" in str(caught.value)  # aiormq maps reply code 404 to this class
    assert name in str(caught.value)
    # The connection survives a channel error; a new channel works.
    fresh = await connection.channel()
    await fresh.declare_queue(exclusive=True)


async def test_passive_exchange_declare_of_missing_exchange_is_404(connection, unique) -> None:
    channel = await connection.channel()
    with pytest.raises(ChannelNotFoundEntity) as caught:
        await asyncio.wait_for(channel.get_exchange(unique("aiop-missing-x")), WAIT_S)
    assert "NOT_FOUND" in str(caught.value)


async def test_passive_declare_of_existing_entities_succeeds(connection, unique) -> None:
    channel = await connection.channel()
    exchange_name = unique("aiop-exists-x")
    exchange = await channel.declare_exchange(exchange_name, ExchangeType.FANOUT)
    queue = await channel.declare_queue(unique("aiop-exists-q"), exclusive=True)
    # A fresh channel: a robust channel answers passive declares of what it declared from its cache.
    fresh = await connection.channel()
    assert (await fresh.get_exchange(exchange_name)).name == exchange_name
    assert (await fresh.get_queue(queue.name)).name == queue.name
    await exchange.delete()


async def test_error_closes_channel_but_not_connection(connection, unique) -> None:
    channel = await connection.channel()
    closed = asyncio.get_running_loop().create_future()
    channel.close_callbacks.add(lambda _ch, exc: closed.done() or closed.set_result(exc))
    with pytest.raises(ChannelNotFoundEntity):
        await channel.declare_queue(unique("aiop-gone"), passive=True)
    reason = await asyncio.wait_for(closed, WAIT_S)
    assert isinstance(reason, ChannelNotFoundEntity)
    assert not connection.is_closed


async def test_publish_to_missing_exchange_closes_channel_404(connection, unique) -> None:
    channel = await connection.channel()
    exchange = aio_pika.Exchange(channel, unique("aiop-nowhere"), ExchangeType.DIRECT)
    with pytest.raises(ChannelNotFoundEntity):
        await asyncio.wait_for(exchange.publish(aio_pika.Message(b"lost"), routing_key="k"), WAIT_S)


async def test_redeclare_with_different_arguments_is_406(connection, unique) -> None:
    channel = await connection.channel()
    name = unique("aiop-conflict")
    await channel.declare_queue(name, exclusive=True, arguments={"x-max-length": 5})
    with pytest.raises(ChannelPreconditionFailed) as caught:
        await channel.declare_queue(name, exclusive=True, arguments={"x-max-length": 6})
    assert "PRECONDITION_FAILED" in str(caught.value)


async def test_redeclare_exchange_with_different_type_is_406(connection, unique) -> None:
    channel = await connection.channel()
    name = unique("aiop-conflict-x")
    exchange = await channel.declare_exchange(name, ExchangeType.DIRECT)
    other = await connection.channel()
    with pytest.raises(ChannelPreconditionFailed):
        await other.declare_exchange(name, ExchangeType.FANOUT)
    await exchange.delete()
