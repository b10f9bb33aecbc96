"""aio_pika.patterns.RPC end to end.

RPC does not use direct reply-to: the caller declares a server-named, auto-delete
reply queue (through the plain channel, so the broker names it), consumes it
exclusively with no-ack, binds it to the headers exchange "rpc.dlx" with
x-match=any on a "From" header, and publishes calls with mandatory=True. Method
queues carry x-dead-letter-exchange=rpc.dlx, so a call whose per-message TTL
runs out is dead-lettered back to the caller (who raises TimeoutError).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
import pytest_asyncio
from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import MessageProcessError
from aio_pika.patterns import RPC

from interop_tests.aio_pika_helpers import WAIT_S, connection_for_test

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def connection(broker) -> AsyncIterator[AbstractConnection]:
    """A plain aio_pika.connect connection, not a robust one."""
    async for conn in connection_for_test(aio_pika.connect, broker):
        yield conn


async def multiply(*, x: int, y: int) -> int:
    return x * y


async def fail(*, why: str) -> None:
    raise ValueError(why)


async def test_call_returns_result_across_connections(broker, connection, unique) -> None:
    method = unique("aiop-rpc-mul")
    server_conn = await asyncio.wait_for(aio_pika.connect(broker.url()), WAIT_S)
    try:
        server = await RPC.create(await server_conn.channel())
        await server.register(method, multiply, auto_delete=True)

        client = await RPC.create(await connection.channel())
        assert client.result_queue.name.startswith("amq.gen-")
        results = await asyncio.wait_for(
            asyncio.gather(*(client.call(method, {"x": i, "y": 3}) for i in range(10))), WAIT_S
        )
        assert results == [i * 3 for i in range(10)]
        await client.close()
        await server.close()
    finally:
        await server_conn.close()


async def test_remote_exception_reaches_caller(connection, unique) -> None:
    method = unique("aiop-rpc-fail")
    channel = await connection.channel()
    rpc = await RPC.create(channel)
    await rpc.register(method, fail, auto_delete=True)
    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(rpc.call(method, {"why": "boom"}), WAIT_S)
    await rpc.close()


async def test_call_to_unregistered_method_is_returned(connection, unique) -> None:
    rpc = await RPC.create(await connection.channel())
    with pytest.raises(MessageProcessError, match="returned"):
        await asyncio.wait_for(rpc.call(unique("aiop-rpc-nobody"), {}), WAIT_S)
    await rpc.close()


async def test_expired_call_is_dead_lettered_back_as_timeout(connection, unique) -> None:
    method = unique("aiop-rpc-slow")
    channel = await connection.channel()
    rpc = await RPC.create(channel)
    # A method queue as RPC.register declares it, but with nobody consuming, so the
    # call waits there until its per-message TTL expires and it is dead-lettered.
    await channel.declare_queue(method, exclusive=True, arguments={"x-dead-letter-exchange": RPC.DLX_NAME})
    with pytest.raises(asyncio.TimeoutError) as caught:
        await asyncio.wait_for(rpc.call(method, {}, expiration=0.2), WAIT_S)
    # RPC's own error (from the dead-lettered call), not wait_for giving up.
    assert caught.value.args[:1] == ("Message timed-out",), "the expired call was not dead-lettered back"
    assert caught.value.args[1].headers["x-death"][0]["reason"] == "expired"
    await rpc.close()
