"""Error replies a pika user gets: reply codes and RabbitMQ 3.10's exact texts.

Soft errors close only the channel (ChannelClosedByBroker) and leave the
connection and its other channels working; hard errors close the connection
(ConnectionClosedByBroker). Queue, ack and permission errors live in their
own files; consumer-tag reuse and immediate=true need raw frames
(test_raw_protocol.py) because pika refuses to send them.
"""

from __future__ import annotations

import pika
import pytest

from interop_tests.pika_helpers import channel_error, connection_error
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)


def test_passive_declare_of_a_missing_exchange_is_404(connection, unique):
    exchange = unique("missing-x")
    channel = connection.channel()

    assert channel_error(lambda: channel.exchange_declare(exchange, passive=True)) == (
        404, f"NOT_FOUND - no exchange '{exchange}' in vhost '/'")


def test_binding_to_a_missing_exchange_or_queue_is_404(connection, unique):
    exchange, queue = unique("missing-x"), unique("missing-q")
    first, second = connection.channel(), connection.channel()
    existing_queue = first.queue_declare("", exclusive=True).method.queue

    assert channel_error(lambda: first.queue_bind(existing_queue, exchange, "k")) == (
        404, f"NOT_FOUND - no exchange '{exchange}' in vhost '/'")
    assert channel_error(lambda: second.queue_bind(queue, "amq.direct", "k")) == (
        404, f"NOT_FOUND - no queue '{queue}' in vhost '/'")


def test_consuming_getting_or_purging_a_missing_queue_is_404(connection, unique):
    queue = unique("missing-q")
    text = f"NOT_FOUND - no queue '{queue}' in vhost '/'"

    consuming, getting, purging = connection.channel(), connection.channel(), connection.channel()
    assert channel_error(lambda: consuming.basic_consume(queue, lambda *args: None)) == (404, text)
    assert channel_error(lambda: getting.basic_get(queue)) == (404, text)
    assert channel_error(lambda: purging.queue_purge(queue)) == (404, text)


def test_exchange_bind_to_a_missing_destination_is_404(connection, unique):
    missing = unique("missing-x")
    channel = connection.channel()

    assert channel_error(lambda: channel.exchange_bind(missing, "amq.fanout")) == (
        404, f"NOT_FOUND - no exchange '{missing}' in vhost '/'")


def test_declaring_an_exchange_with_the_amq_prefix_is_403(connection):
    channel = connection.channel()

    assert channel_error(lambda: channel.exchange_declare("amq.custom", "direct")) == (
        403, "ACCESS_REFUSED - exchange name 'amq.custom' contains reserved prefix 'amq.*'")


def test_passive_declare_of_a_missing_amq_exchange_is_404_not_403(connection):
    channel = connection.channel()

    assert channel_error(lambda: channel.exchange_declare("amq.custom", passive=True)) == (
        404, "NOT_FOUND - no exchange 'amq.custom' in vhost '/'")


def test_deleting_a_predeclared_amq_exchange_is_403(connection):
    channel = connection.channel()

    assert channel_error(lambda: channel.exchange_delete("amq.direct")) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")


@pytest.mark.parametrize("operation", ["declare", "delete", "bind"])
def test_the_default_exchange_cannot_be_declared_deleted_or_bound(connection, operation):
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    operations = {
        "declare": lambda: channel.exchange_declare("", "direct"),
        "delete": lambda: channel.exchange_delete(""),
        "bind": lambda: channel.queue_bind(queue, "", "k"),
    }

    assert channel_error(operations[operation]) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")


INEQUIVALENT_EXCHANGES = [
    ({"exchange_type": "fanout"},
     "inequivalent arg 'type' for exchange '{x}' in vhost '/': received 'fanout' but current is 'direct'"),
    ({"durable": True},
     "inequivalent arg 'durable' for exchange '{x}' in vhost '/': received 'true' but current is 'false'"),
    ({"auto_delete": False},
     "inequivalent arg 'auto_delete' for exchange '{x}' in vhost '/': received 'false' but current is 'true'"),
    ({"internal": True},
     "inequivalent arg 'internal' for exchange '{x}' in vhost '/': received 'true' but current is 'false'"),
    ({"arguments": {"alternate-exchange": "other"}},
     "inequivalent arg 'alternate-exchange' for exchange '{x}' in vhost '/': "
     "received the value 'other' of type 'longstr' but current is none"),
]


@pytest.mark.parametrize(("change", "text"), INEQUIVALENT_EXCHANGES)
def test_redeclaring_an_exchange_differently_is_406(connection, unique, change, text):
    exchange = unique("x")
    channel = connection.channel()
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    # keep the auto-delete exchange alive for the duration of the test
    channel.queue_bind(channel.queue_declare("", exclusive=True).method.queue, exchange, "k")
    redeclare = {"exchange_type": "direct", "auto_delete": True, **change}
    other = connection.channel()

    assert channel_error(lambda: other.exchange_declare(exchange, **redeclare)) == (
        406, "PRECONDITION_FAILED - " + text.format(x=exchange))


def test_redeclaring_a_predeclared_exchange_with_another_type_is_406(connection):
    channel = connection.channel()

    assert channel_error(lambda: channel.exchange_declare("amq.direct", "fanout", durable=True)) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in vhost '/': "
             "received 'fanout' but current is 'direct'")


def test_unknown_exchange_type_is_a_503_connection_error(connection, unique):
    channel = connection.channel()

    assert connection_error(lambda: channel.exchange_declare(unique("x"), "bogus")) == (
        503, "COMMAND_INVALID - unknown exchange type 'bogus'")


def test_exchange_delete_if_unused_refuses_while_bound(connection, unique):
    exchange = unique("x-in-use")
    channel = connection.channel()
    channel.exchange_declare(exchange, "direct")
    try:
        channel.queue_bind(channel.queue_declare("", exclusive=True).method.queue, exchange, "k")
        other = connection.channel()
        assert channel_error(lambda: other.exchange_delete(exchange, if_unused=True)) == (
            406, f"PRECONDITION_FAILED - exchange '{exchange}' in vhost '/' in use")
    finally:
        connection.channel().exchange_delete(exchange)


def test_deleting_a_missing_exchange_is_ok(connection, unique):
    connection.channel().exchange_delete(unique("never-existed"))


def test_exclusive_consume_on_a_queue_with_consumers_is_403(connection):
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_consume(queue, lambda *args: None)
    other = connection.channel()

    assert channel_error(lambda: other.basic_consume(queue, lambda *args: None, exclusive=True)) == (
        403, f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")


def test_consume_on_a_queue_with_an_exclusive_consumer_is_403(connection):
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_consume(queue, lambda *args: None, exclusive=True)
    other = connection.channel()

    assert channel_error(lambda: other.basic_consume(queue, lambda *args: None)) == (
        403, f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")


def test_prefetch_size_is_not_implemented(connection):
    channel = connection.channel()

    assert connection_error(lambda: channel.basic_qos(prefetch_size=10)) == (
        540, "NOT_IMPLEMENTED - prefetch_size!=0 (10)")


def test_direct_reply_to_without_a_reply_consumer_is_406(connection):
    channel = connection.channel()

    def publish_with_reply_to():
        channel.basic_publish("", "anything", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        channel.queue_declare("", exclusive=True)

    assert channel_error(publish_with_reply_to) == (
        406, "PRECONDITION_FAILED - fast reply consumer does not exist")


def test_a_channel_error_leaves_the_connection_and_other_channels_working(connection, unique):
    healthy, failing = connection.channel(), connection.channel()
    queue = healthy.queue_declare("", exclusive=True).method.queue

    channel_error(lambda: failing.queue_declare(unique("missing"), passive=True))

    assert connection.is_open
    assert healthy.is_open
    healthy.basic_publish("", queue, b"still fine")
    assert healthy.basic_get(queue, auto_ack=True)[2] == b"still fine"
    replacement = connection.channel()
    assert replacement.queue_declare(queue, passive=True).method.queue == queue


def test_a_connection_error_closes_every_channel(connection):
    bystander, failing = connection.channel(), connection.channel()

    connection_error(lambda: failing.basic_recover(requeue=False))

    assert connection.is_closed
    assert bystander.is_closed
