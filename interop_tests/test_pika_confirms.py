"""Publisher confirms and mandatory returns, through pika's BlockingChannel.

In confirm mode BlockingChannel.basic_publish waits for the broker's ack and
raises UnroutableError (basic.return then ack) or NackError (basic.nack).
"""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError

from interop_tests.pika_helpers import WAIT_S
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import poll


def test_confirmed_publishes_all_land_in_the_queue(connection, unique):
    channel = connection.channel()
    channel.confirm_delivery()
    queue = unique("confirmed")
    channel.queue_declare(queue, exclusive=True)

    for index in range(200):
        channel.basic_publish("", queue, f"m{index}".encode())  # raises unless acked

    assert channel.queue_declare(queue, passive=True).method.message_count == 200


def test_mandatory_unroutable_publish_raises_unroutable_error_with_312_no_route(connection, unique):
    channel = connection.channel()
    channel.confirm_delivery()
    exchange = unique("nowhere")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    channel.queue_bind(channel.queue_declare("", exclusive=True).method.queue, exchange, "bound")

    with pytest.raises(UnroutableError) as error:
        channel.basic_publish(exchange, "unbound", b"lost", pika.BasicProperties(message_id="m-1"), mandatory=True)

    [returned] = error.value.messages
    assert returned.method.reply_code == 312
    assert returned.method.reply_text == "NO_ROUTE"
    assert returned.method.exchange == exchange
    assert returned.method.routing_key == "unbound"
    assert returned.properties.message_id == "m-1"
    assert returned.body == b"lost"
    # The channel stays usable after a return.
    channel.basic_publish(exchange, "bound", b"routed", mandatory=True)


def test_mandatory_routable_publish_is_simply_confirmed(connection, unique):
    channel = connection.channel()
    channel.confirm_delivery()
    queue = unique("mandatory-ok")
    channel.queue_declare(queue, exclusive=True)

    channel.basic_publish("", queue, b"fine", mandatory=True)

    assert channel.queue_declare(queue, passive=True).method.message_count == 1


def test_non_mandatory_unroutable_publish_is_confirmed_and_dropped(connection, unique):
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", unique("no-such-queue"), b"dropped")  # no exception: acked


def test_mandatory_return_without_confirms_reaches_the_return_callback(connection, unique):
    channel = connection.channel()
    returns = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returns.append((method, body)))

    channel.basic_publish("", unique("no-such-queue"), b"bounce", mandatory=True)

    assert poll(lambda: returns, WAIT_S, pump=connection.process_data_events)
    method, body = returns[0]
    assert (method.reply_code, method.reply_text, method.exchange, body) == (312, "NO_ROUTE", "", b"bounce")


def test_reject_publish_overflow_nacks_the_publish(connection, unique):
    channel = connection.channel()
    channel.confirm_delivery()
    queue = unique("full")
    channel.queue_declare(queue, exclusive=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})

    channel.basic_publish("", queue, b"fits")
    with pytest.raises(NackError):
        channel.basic_publish("", queue, b"overflows")

    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    _, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"fits"


def test_publish_to_missing_exchange_closes_the_channel_with_404(connection, unique):
    channel = connection.channel()
    channel.confirm_delivery()
    exchange = unique("missing-x")

    with pytest.raises(ChannelClosedByBroker) as error:
        channel.basic_publish(exchange, "k", b"x")

    assert error.value.reply_code == 404
    assert error.value.reply_text == f"NOT_FOUND - no exchange '{exchange}' in vhost '/'"
    assert connection.is_open  # a channel error leaves the connection alone

