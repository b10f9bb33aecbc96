"""connection.update-secret from the clients that expose it: pika, aio-pika and amqplib.

A client renewing its secret (an OAuth token, say) on a live connection gets
update-secret-ok and carries on, as on RabbitMQ 3.10 (checked with INTEROP_BROKER_URL), whatever
the secret: RabbitMQ's internal user database accepts any (only expiring backends such as
OAuth 2 check it). With `[server] verify_updated_secret = true` a secret that is not the
password closes the connection with 530; that test starts this project's broker with it.
"""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from interop_tests.broker_process import TEST_CONFIG
from interop_tests.node_runner import run_scenario
from interop_tests.pika_helpers import connect

WAIT_S = 5.0


def test_pika_update_secret_keeps_the_connection_working(broker, unique):
    connection = connect(broker)
    try:
        connection.update_secret("guest", "pika token refresh")
        channel = connection.channel()
        queue = unique("pika-update-secret")
        channel.queue_declare(queue, exclusive=True)
        channel.basic_publish("", queue, b"after update")
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"after update"
    finally:
        connection.close()


@pytest.mark.asyncio
async def test_aio_pika_update_secret_keeps_the_connection_working(broker, unique):
    connection = await asyncio.wait_for(aio_pika.connect(broker.url()), WAIT_S)
    try:
        await connection.update_secret("guest", reason="aio-pika token refresh", timeout=WAIT_S)
        channel = await connection.channel()  # publisher confirms on, aio-pika's default
        queue = await channel.declare_queue(unique("aio-pika-update-secret"), exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"after update"), routing_key=queue.name)
        message = await queue.get(timeout=WAIT_S)
        await message.ack()
        assert message.body == b"after update"
    finally:
        await asyncio.wait_for(connection.close(), WAIT_S)


def test_amqplib_update_secret_keeps_the_connection_working(broker):
    assert run_scenario("update_secret.js", broker.url())["body"] == "after update"


def test_a_secret_that_is_not_the_password_is_accepted_as_by_rabbitmq(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    connection.update_secret("an OAuth token, not the password", "pika token refresh")
    channel = connection.channel()
    channel.queue_declare("", exclusive=True)  # the connection carries on
    connection.close()


def test_with_verify_updated_secret_a_refused_secret_closes_the_connection_with_530(broker_factory):
    own = broker_factory(config_text=TEST_CONFIG.replace("[server]\n", "[server]\nverify_updated_secret = true\n", 1))
    connection = pika.BlockingConnection(pika.URLParameters(own.url()))
    with pytest.raises(ConnectionClosedByBroker) as closed:
        connection.update_secret("not the password", "pika token refresh")

    assert (closed.value.reply_code, closed.value.reply_text) == (
        530, "NOT_ALLOWED - New secret was refused by one of the backends")
    assert "Secret update was refused for user 'guest'" in own.log_text()
