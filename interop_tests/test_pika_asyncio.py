"""A few core flows through pika's asyncio adapter (AsyncioConnection).

pika's asyncio API is callback based; the helpers below turn each callback into
a future so the tests read top to bottom. Every wait is bounded by TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pika
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAuthenticationError

TIMEOUT_S = 5.0


async def bounded(future: asyncio.Future) -> Any:
    return await asyncio.wait_for(future, TIMEOUT_S)


async def open_connection(url: str) -> tuple[AsyncioConnection, asyncio.Future]:
    """Open a connection; also return a future resolved with the reason when it closes."""
    loop = asyncio.get_running_loop()
    opened, closed = loop.create_future(), loop.create_future()
    AsyncioConnection(
        pika.URLParameters(url),
        on_open_callback=lambda connection: opened.set_result(connection),
        on_open_error_callback=lambda connection, error: opened.set_exception(error),
        on_close_callback=lambda connection, reason: closed.done() or closed.set_result(reason),
        custom_ioloop=loop,
    )
    return await bounded(opened), closed


async def open_channel(connection: AsyncioConnection) -> tuple[Any, asyncio.Future]:
    """Open a channel; also return a future resolved with the reason when it closes."""
    loop = asyncio.get_running_loop()
    opened, closed = loop.create_future(), loop.create_future()
    channel = connection.channel(on_open_callback=opened.set_result)
    channel.add_on_close_callback(lambda ch, reason: closed.done() or closed.set_result(reason))
    return await bounded(opened), closed


async def call(method: Callable, *args: Any, **kwargs: Any) -> Any:
    """Invoke a pika method that reports completion through `callback=`; return the reply frame."""
    done = asyncio.get_running_loop().create_future()
    method(*args, callback=lambda *reply: done.done() or done.set_result(reply[-1] if reply else None), **kwargs)
    return await bounded(done)


async def close_connection(connection: AsyncioConnection, closed: asyncio.Future) -> None:
    if connection.is_open:
        connection.close()
    await bounded(closed)


def test_publish_with_confirm_and_consume(broker, unique):
    async def scenario():
        connection, closed = await open_connection(broker.url())
        try:
            channel, _ = await open_channel(connection)
            queue = unique("asyncio-q")
            await call(channel.queue_declare, queue, exclusive=True)
            acks: asyncio.Queue = asyncio.Queue()
            await call(channel.confirm_delivery, ack_nack_callback=acks.put_nowait)
            deliveries: asyncio.Queue = asyncio.Queue()
            await call(channel.basic_consume, queue,
                       lambda ch, method, props, body: deliveries.put_nowait((method, props, body)))

            channel.basic_publish("", queue, b"hello", pika.BasicProperties(message_id="m-1"))

            ack = await asyncio.wait_for(acks.get(), TIMEOUT_S)
            assert isinstance(ack.method, pika.spec.Basic.Ack)
            assert ack.method.delivery_tag == 1
            method, props, body = await asyncio.wait_for(deliveries.get(), TIMEOUT_S)
            assert (body, props.message_id, method.redelivered, method.routing_key) == (b"hello", "m-1", False, queue)
            channel.basic_ack(method.delivery_tag)
        finally:
            await close_connection(connection, closed)

    asyncio.run(scenario())


def test_channel_error_reaches_the_close_callback_and_connection_survives(broker, unique):
    async def scenario():
        connection, closed = await open_connection(broker.url())
        try:
            failing, failing_closed = await open_channel(connection)
            missing = unique("missing")
            failing.queue_declare(missing, passive=True)

            reason = await bounded(failing_closed)
            assert isinstance(reason, ChannelClosedByBroker)
            assert (reason.reply_code, reason.reply_text) == (404, f"NOT_FOUND - no queue '{missing}' in vhost '/'")

            healthy, _ = await open_channel(connection)
            declare_ok = await call(healthy.queue_declare, "", exclusive=True)
            assert declare_ok.method.queue.startswith("amq.gen-")
        finally:
            await close_connection(connection, closed)

    asyncio.run(scenario())


def test_consumer_is_cancelled_when_its_queue_is_deleted(broker, unique):
    async def scenario():
        connection, closed = await open_connection(broker.url())
        try:
            consumer, _ = await open_channel(connection)
            queue = unique("asyncio-cancel")
            await call(consumer.queue_declare, queue)
            cancelled = asyncio.get_running_loop().create_future()
            consumer.add_on_cancel_callback(lambda frame: cancelled.set_result(frame.method))
            consume_ok = await call(consumer.basic_consume, queue, lambda *args: None)

            admin, _ = await open_channel(connection)
            await call(admin.queue_delete, queue)

            cancel = await bounded(cancelled)
            assert cancel.consumer_tag == consume_ok.method.consumer_tag
            assert consumer.is_open
        finally:
            await close_connection(connection, closed)

    asyncio.run(scenario())


def test_mandatory_unroutable_message_is_returned(broker, unique):
    async def scenario():
        connection, closed = await open_connection(broker.url())
        try:
            channel, _ = await open_channel(connection)
            returned = asyncio.get_running_loop().create_future()
            channel.add_on_return_callback(lambda ch, method, props, body: returned.set_result((method, body)))
            routing_key = unique("nobody-home")

            channel.basic_publish("amq.direct", routing_key, b"bounce", mandatory=True)

            method, body = await bounded(returned)
            assert (method.reply_code, method.reply_text, method.exchange, method.routing_key, body) == (
                312, "NO_ROUTE", "amq.direct", routing_key, b"bounce")
        finally:
            await close_connection(connection, closed)

    asyncio.run(scenario())


def test_hard_error_closes_the_connection_with_its_code(broker):
    async def scenario():
        connection, closed = await open_connection(broker.url())
        channel, _ = await open_channel(connection)

        channel.basic_recover(requeue=False)

        reason = await bounded(closed)
        assert isinstance(reason, ConnectionClosedByBroker)
        assert (reason.reply_code, reason.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")

    asyncio.run(scenario())


def test_failed_login_reports_a_probable_authentication_error(broker):
    async def scenario():
        try:
            await open_connection(broker.url("guest", "wrong"))
        except ProbableAuthenticationError as error:
            return error
        raise AssertionError("login with a wrong password succeeded")

    error = asyncio.run(scenario())
    assert error.args[0] == (
        "ConnectionClosedByBroker: (403) 'ACCESS_REFUSED - Login was refused using authentication "
        "mechanism PLAIN. For details see the broker logfile.'"
    )
