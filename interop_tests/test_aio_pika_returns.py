"""Mandatory publishes that no queue takes come back as basic.return, as aio-pika reports them."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika import ExchangeType
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import DeliveryError, PublishError
from pamqp.commands import Basic

from interop_tests.aio_pika_helpers import WAIT_S
from interop_tests.aio_pika_helpers import connection  # noqa: F401  (a fixture)

pytestmark = pytest.mark.asyncio


async def test_unroutable_mandatory_publish_raises_with_on_return_raises(connection, unique) -> None:
    channel = await connection.channel(on_return_raises=True)
    with pytest.raises(DeliveryError) as caught:
        await asyncio.wait_for(
            channel.default_exchange.publish(
                aio_pika.Message(b"nobody", message_id="m-1"), routing_key=unique("aiop-noq"), mandatory=True
            ),
            WAIT_S,
        )
    assert isinstance(caught.value, PublishError)
    returned = caught.value.message
    assert returned.body == b"nobody"
    frame = caught.value.frame
    assert frame.reply_code == 312
    assert frame.reply_text == "NO_ROUTE"


async def test_return_callback_gets_message_and_publish_still_completes(connection, unique) -> None:
    channel = await connection.channel()  # on_return_raises=False: returns go to callbacks
    exchange = await channel.declare_exchange(unique("aiop-ret-x"), ExchangeType.DIRECT)
    returned = asyncio.get_running_loop().create_future()

    def on_return(_channel, message: AbstractIncomingMessage) -> None:
        if not returned.done():
            returned.set_result(message)

    channel.return_callbacks.add(on_return)
    key = unique("aiop-ret-key")
    await asyncio.wait_for(
        exchange.publish(
            aio_pika.Message(b"bounced", headers={"why": "test"}, correlation_id="c-9"),
            routing_key=key,
            mandatory=True,
        ),
        WAIT_S,
    )
    message = await asyncio.wait_for(returned, WAIT_S)
    assert message.body == b"bounced"
    assert message.headers["why"] == "test"
    assert message.correlation_id == "c-9"
    assert message.exchange == exchange.name
    assert message.routing_key == key
    await exchange.delete()


async def test_routable_mandatory_publish_is_acked_not_returned(connection, unique) -> None:
    channel = await connection.channel(on_return_raises=True)
    queue = await channel.declare_queue(unique("aiop-ret-ok"), exclusive=True)
    result = await asyncio.wait_for(
        channel.default_exchange.publish(aio_pika.Message(b"fine"), routing_key=queue.name, mandatory=True),
        WAIT_S,
    )
    assert isinstance(result, Basic.Ack)
    assert (await asyncio.wait_for(queue.get(no_ack=True), WAIT_S)).body == b"fine"


async def test_unroutable_non_mandatory_publish_is_silently_acked(connection, unique) -> None:
    channel = await connection.channel(on_return_raises=True)
    result = await asyncio.wait_for(
        channel.default_exchange.publish(aio_pika.Message(b"void"), routing_key=unique("aiop-void"), mandatory=False),
        WAIT_S,
    )
    assert isinstance(result, Basic.Ack)
