"""What the aio-pika interop tests share: connecting (the one `connect` of the aio-pika tests), a
connection per test and a ready-message count.

Test modules import the `connection` fixture from here by name. Every wait on
the broker is bounded by WAIT_S so that a broker that never answers fails the
test instead of hanging it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import pytest_asyncio
from aio_pika.abc import AbstractConnection, AbstractRobustConnection

from interop_tests.broker_process import BrokerProcess, Reachable

WAIT_S = 5.0


async def connect(to: Reachable | str, user: str = "guest", password: str = "guest", vhost: str = "/", *,
                  label: str | None = None, **options: Any) -> AbstractConnection:
    """aio_pika.connect to `to` (a broker, a cluster node, or an amqp:// URL, which then says the
    user and vhost) as `user` on `vhost`. `label` names the connection (the client property
    connection_name); `options` go to aio_pika.connect as they are."""
    if label is not None:
        options["client_properties"] = {"connection_name": label}
    return await aio_pika.connect(to if isinstance(to, str) else to.url(user, password, vhost), **options)


async def connection_for_test(
    connect: Callable[[str], Awaitable[AbstractConnection]], broker: BrokerProcess
) -> AsyncIterator[AbstractConnection]:
    """The body of a connection fixture: yields `connect(broker.url())`, then closes it."""
    conn = await asyncio.wait_for(connect(broker.url()), WAIT_S)
    try:
        yield conn
    finally:
        await asyncio.wait_for(conn.close(), WAIT_S)


@pytest_asyncio.fixture
async def connection(broker: BrokerProcess) -> AsyncIterator[AbstractRobustConnection]:
    """A robust aio-pika connection (aio_pika.connect_robust, as applications use) for one test."""
    async for conn in connection_for_test(aio_pika.connect_robust, broker):
        yield conn


async def ready_count(connection: AbstractConnection, name: str) -> int:
    """How many messages queue `name` holds ready, asked on a fresh channel (passive queue.declare)."""
    probe = await connection.channel()
    try:
        return (await probe.declare_queue(name, passive=True)).declaration_result.message_count
    finally:
        await probe.close()
