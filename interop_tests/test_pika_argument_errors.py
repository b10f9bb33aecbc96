"""The 406 texts a pika user gets for a bad message expiration, queue x-argument or consumer x-priority.

Each expected text is what RabbitMQ 3.10 sends for the same pika call; running this file with
INTEROP_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ checks it against RabbitMQ itself.
"""

from __future__ import annotations

from decimal import Decimal

import pika
import pytest

from interop_tests.pika_helpers import channel_error
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)


def publish_then_sync(channel, queue: str, expiration: str) -> None:
    channel.basic_publish("", queue, b"x", pika.BasicProperties(expiration=expiration))
    channel.queue_declare(queue, passive=True)  # the close arrives before this reply


@pytest.mark.parametrize(
    ("expiration", "reason"),
    [
        ("abc", "no_integer"),
        ("", "no_integer"),
        (" 100", "no_integer"),
        ("-1", "{value_negative,-1}"),
        ("1.5", '{leftover_string,".5"}'),
        ("315360000001", "{value_too_large,315360000001}"),
        ("99999999999999999999", "{value_too_large,\n" + " " * 44 + "99999999999999999999}"),
    ],
)
def test_an_unusable_expiration_closes_the_channel(connection, unique, expiration, reason):
    queue = unique("expiration")
    connection.channel().queue_declare(queue, auto_delete=True)
    channel = connection.channel()

    assert channel_error(lambda: publish_then_sync(channel, queue, expiration)) == (
        406, f"PRECONDITION_FAILED - invalid expiration '{expiration}': {reason}")


def test_a_usable_expiration_is_published(connection, unique):
    queue = unique("expiration-ok")
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=True)

    publish_then_sync(channel, queue, "60000")

    assert channel.basic_get(queue, auto_ack=True)[2] == b"x"


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"x-message-ttl": "abc"}, '"expected integer, got longstr"'),
        ({"x-message-ttl": True}, '"expected integer, got bool"'),
        ({"x-message-ttl": Decimal("1.5")}, '"expected integer, got decimal"'),
        ({"x-message-ttl": 2**40}, "{value_too_large,1099511627776}"),
        ({"x-expires": "abc"}, '"expected integer, got longstr"'),
        ({"x-max-length": True}, '"expected integer, got bool"'),
        ({"x-max-length-bytes": "abc"}, '"expected integer, got longstr"'),
        ({"x-max-priority": "abc"}, '"expected integer, got longstr"'),
        ({"x-overflow": "bogus"}, "invalid_overflow"),
        ({"x-overflow": 1}, "{unacceptable_type,signedint}"),
        ({"x-queue-mode": "bogus"}, "\"unsupported queue mode 'bogus'\""),
        ({"x-queue-type": "bogus"}, "\"unsupported queue type 'bogus'\""),
        ({"x-queue-version": 3}, "\"unsupported queue version '3'\""),
        ({"x-queue-version": "1"}, '"expected integer, got longstr"'),
        ({"x-dead-letter-routing-key": 1}, "{unacceptable_type,signedint}"),
        ({"x-single-active-consumer": 2**40}, "{unacceptable_type,long}"),
    ],
)
def test_a_refused_queue_argument_names_its_reason(connection, unique, arguments, reason):
    queue = unique("bad-arg")
    key = next(iter(arguments))

    assert channel_error(lambda: connection.channel().queue_declare(queue, auto_delete=True, arguments=arguments)) == (
        406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{queue}' in vhost '/': {reason}")


def test_a_dead_letter_exchange_that_is_not_a_string_is_an_invalid_type(connection, unique):
    queue = unique("bad-dlx")

    assert channel_error(
        lambda: connection.channel().queue_declare(
            queue, auto_delete=True, arguments={"x-expires": 0, "x-dead-letter-exchange": 1}
        )
    ) == (406, f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{queue}' in vhost '/'")


@pytest.mark.parametrize(("priority", "type_name"), [("abc", "longstr"), (True, "bool")])
def test_a_non_integer_consumer_priority_is_refused(connection, unique, priority, type_name):
    queue = unique("prio")
    connection.channel().queue_declare(queue, auto_delete=True)
    channel = connection.channel()

    def consume():
        channel.basic_consume(queue, lambda *_: None, arguments={"x-priority": priority})

    assert channel_error(consume) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{queue}' in vhost '/': "
        f'"expected integer, got {type_name}"',
    )
