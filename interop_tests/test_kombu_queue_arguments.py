"""kombu.Queue options that become x-arguments: the broker accepts the declare and applies them."""

from __future__ import annotations


import amqp.exceptions
import pytest
from kombu import Exchange, Producer, Queue

from interop_tests.kombu_helpers import connection  # noqa: F401 (fixture)


def test_ttl_expires_max_length_arguments_are_accepted(connection, unique) -> None:
    queue = Queue(
        unique("kombu-args"),
        exchange=Exchange(unique("kombu-args-x"), type="direct", auto_delete=True),
        routing_key="k",
        message_ttl=30.0,  # seconds -> x-message-ttl 30000
        expires=60.0,  # seconds -> x-expires 60000
        max_length=100,
        max_length_bytes=1_000_000,
        max_priority=5,
        queue_arguments={"x-overflow": "reject-publish"},
    )
    with connection.channel() as channel:
        bound = queue(channel)
        bound.declare()
        try:
            # Declaring again with equal arguments is fine.
            queue(channel).declare()
            # The broker recorded the arguments kombu derived (seconds became milliseconds):
            # a raw declare with exactly these is equivalent and passes, a different TTL is not.
            arguments = {
                "x-message-ttl": 30000, "x-expires": 60000, "x-max-length": 100,
                "x-max-length-bytes": 1_000_000, "x-max-priority": 5, "x-overflow": "reject-publish",
            }
            channel.queue_declare(queue.name, durable=True, auto_delete=False, arguments=arguments)
            with connection.channel() as other:
                with pytest.raises(amqp.exceptions.PreconditionFailed):
                    other.queue_declare(
                        queue.name, durable=True, auto_delete=False, arguments={**arguments, "x-message-ttl": 1}
                    )
        finally:
            bound.delete()


def test_max_length_drops_oldest(connection, unique) -> None:
    queue = Queue(unique("kombu-maxlen"), max_length=2)
    with connection.channel() as channel:
        bound = queue(channel)
        bound.declare()
        try:
            producer = Producer(channel)
            for i in range(4):
                producer.publish(i, routing_key=queue.name)
            assert [bound.get(no_ack=True).payload for _ in range(2)] == [2, 3]
            assert bound.get(no_ack=True) is None
        finally:
            bound.delete()


def test_redeclare_with_different_arguments_fails_406(connection, unique) -> None:
    name = unique("kombu-conflict")
    with connection.channel() as channel:
        Queue(name, max_length=10)(channel).declare()
        try:
            with pytest.raises(amqp.exceptions.PreconditionFailed) as caught:
                Queue(name, max_length=11)(channel).declare()
            assert caught.value.reply_code == 406
        finally:
            with connection.channel() as cleanup:
                Queue(name)(cleanup).delete()
