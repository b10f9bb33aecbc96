"""aioamqp 0.15 (asyncio, on pamqp): connect, publish with confirms, consume with acks, channel errors.

aioamqp opens with the AMQP 0-9 protocol header `AMQP 1 1 0 9`, announces only the
consumer_cancel_notify capability (connection.blocked explicitly off), logs in with PLAIN and
expects every reply in the order RabbitMQ 3.10 sends them (checked with INTEROP_BROKER_URL).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aioamqp
import pytest
import pytest_asyncio
from aioamqp.exceptions import ChannelClosed

from interop_tests.broker_process import BrokerProcess

pytestmark = pytest.mark.asyncio

WAIT_S = 5.0
MESSAGES = 20


@pytest_asyncio.fixture
async def protocol(broker: BrokerProcess) -> AsyncIterator[aioamqp.AmqpProtocol]:
    _transport, protocol = await asyncio.wait_for(
        aioamqp.connect(broker.host, broker.port, "guest", "guest", "/"), WAIT_S
    )
    yield protocol
    if protocol.state == aioamqp.protocol.OPEN:
        await asyncio.wait_for(protocol.close(), WAIT_S)


async def test_connect_reads_the_servers_properties_and_tuning(protocol):
    properties = protocol.server_properties
    assert (protocol.version_major, protocol.version_minor) == (0, 9)
    assert properties["capabilities"]["publisher_confirms"] is True
    assert properties["capabilities"]["consumer_cancel_notify"] is True
    assert protocol.server_frame_max == 131072
    assert protocol.server_channel_max == 2047
    channel = await protocol.channel()
    assert channel.is_open


async def test_publish_with_confirms_is_acked_for_every_message(protocol, unique):
    channel = await protocol.channel()
    await channel.confirm_select()
    queue = (await channel.queue_declare(unique("aioamqp-confirm"), exclusive=True))["queue"]
    for n in range(MESSAGES):
        # publish() returns once the broker's basic.ack for this delivery tag arrived.
        await asyncio.wait_for(channel.publish(b"m%d" % n, "", queue, properties={"delivery_mode": 2}), WAIT_S)

    declared = await channel.queue_declare(queue, passive=True)
    assert declared["message_count"] == MESSAGES


async def test_consume_and_ack_takes_every_message_once(protocol, unique):
    channel = await protocol.channel()
    queue = (await channel.queue_declare(unique("aioamqp-consume"), exclusive=True))["queue"]
    for n in range(MESSAGES):
        await channel.basic_publish(b"m%d" % n, "", queue, properties={"content_type": "text/plain"})
    await channel.basic_qos(prefetch_count=5)
    received: list[bytes] = []
    done = asyncio.Event()

    async def on_message(channel, body, envelope, properties):
        assert properties.content_type == "text/plain" and envelope.is_redeliver is False
        received.append(body)
        await channel.basic_client_ack(envelope.delivery_tag)
        if len(received) == MESSAGES:
            done.set()

    consumer = await channel.basic_consume(on_message, queue_name=queue)
    await asyncio.wait_for(done.wait(), WAIT_S)
    await channel.basic_cancel(consumer["consumer_tag"])

    assert received == [b"m%d" % n for n in range(MESSAGES)]
    assert (await channel.queue_declare(queue, passive=True))["message_count"] == 0


async def test_a_channel_error_closes_that_channel_only(protocol, unique):
    channel = await protocol.channel()
    missing = unique("aioamqp-missing")
    with pytest.raises(ChannelClosed) as closed:
        await asyncio.wait_for(channel.queue_declare(missing, passive=True), WAIT_S)

    assert (closed.value.code, closed.value.message) == (404, f"NOT_FOUND - no queue '{missing}' in vhost '/'")
    assert not channel.is_open
    other = await protocol.channel()  # the connection carries on
    assert (await other.queue_declare(unique("aioamqp-after"), exclusive=True))["message_count"] == 0
