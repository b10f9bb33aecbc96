"""What a pika user sees declaring and consuming quorum queues, as RabbitMQ 3.10 shows it.

Refusals (406 with RabbitMQ's texts and order), the arguments a quorum queue accepts, and the
x-delivery-count header and x-delivery-limit of its deliveries. Running this file with
INTEROP_BROKER_URL=amqp://guest:guest@127.0.0.1:5672/ checks it against RabbitMQ itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pika
import pytest

from interop_tests.pika_helpers import WAIT_S, channel_error, wait_ready
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import poll

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def quorum_queue(connection, unique) -> Iterator[Callable[..., str]]:
    """Declares durable quorum queues (they cannot auto-delete) and deletes them afterwards."""
    names: list[str] = []

    def declare(prefix: str, arguments: dict | None = None) -> str:
        name = unique(prefix)
        names.append(name)
        connection.channel().queue_declare(name, durable=True, arguments={**QUORUM, **(arguments or {})})
        return name

    yield declare
    if connection.is_open:
        channel = connection.channel()
        for name in names:
            channel.queue_delete(name)


def refusal(connection, name: str, arguments: dict, **flags) -> tuple[int, str]:
    channel = connection.channel()
    return channel_error(lambda: channel.queue_declare(name, arguments=arguments, **flags))


@pytest.mark.parametrize(
    ("flags", "extra", "text"),
    [
        ({"durable": False}, {}, "invalid property 'non-durable'"),
        ({"durable": True, "exclusive": True}, {}, "invalid property 'exclusive-owner'"),
        ({"durable": True, "auto_delete": True}, {}, "invalid property 'auto-delete'"),
        # The properties are checked auto-delete, exclusive, durable.
        ({"durable": False, "exclusive": True, "auto_delete": True}, {}, "invalid property 'auto-delete'"),
        ({"durable": False, "exclusive": True}, {}, "invalid property 'exclusive-owner'"),
        # Arguments come before properties; an unsupported one is refused whatever its value.
        ({"durable": False}, {"x-max-priority": 5}, "invalid arg 'x-max-priority' {where} of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-max-priority": 500}, "invalid arg 'x-max-priority' {where} of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-queue-mode": "lazy"}, "invalid arg 'x-queue-mode' {where} of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-queue-version": 2}, "invalid arg 'x-queue-version' {where} of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-queue-master-locator": "min-masters"},
         "invalid arg 'x-queue-master-locator' {where} of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-max-age": "1D"}, "invalid arg 'x-max-age' {where} of queue type rabbit_quorum_queue"),
        ({"durable": True}, {"x-initial-cluster-size": 1},
         "invalid arg 'x-initial-cluster-size' {where} of queue type rabbit_quorum_queue"),
        # The first unsupported argument in the client's order.
        ({"durable": True}, {"x-queue-mode": "lazy", "x-max-priority": 5},
         "invalid arg 'x-queue-mode' {where} of queue type rabbit_quorum_queue"),
        # Values of supported arguments are checked before unsupported ones and properties.
        ({"durable": False}, {"x-max-priority": 5, "x-expires": 0}, "invalid arg 'x-expires' {where}: {{value_zero,0}}"),
        ({"durable": True}, {"x-max-priority": 5, "x-message-ttl": -1},
         "invalid arg 'x-message-ttl' {where}: {{value_negative,-1}}"),
        ({"durable": True}, {"x-dead-letter-strategy": "bogus"}, "invalid arg 'x-dead-letter-strategy' {where}: invalid_dlx_strategy"),
        ({"durable": True}, {"x-quorum-initial-group-size": 0},
         "invalid arg 'x-quorum-initial-group-size' {where}: {{value_zero,0}}"),
        ({"durable": True}, {"x-max-in-memory-length": "x"},
         "invalid arg 'x-max-in-memory-length' {where}: \"expected integer, got longstr\""),
        ({"durable": True}, {"x-queue-leader-locator": "bogus"},
         "invalid arg 'x-queue-leader-locator' {where}: invalid_queue_locator_arg"),
    ],
)
def test_a_quorum_queue_refuses_what_rabbitmq_refuses(connection, unique, flags, extra, text):
    name = unique("qq-refused")
    where = f"for queue '{name}' in vhost '/'"
    expected = text.format(where=where) if "{where}" in text else f"{text} {where}"

    assert refusal(connection, name, {**QUORUM, **extra}, **flags) == (406, f"PRECONDITION_FAILED - {expected}")


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": 1000},
        {"x-expires": 60000},
        {"x-overflow": "reject-publish-dlx"},
        {"x-delivery-limit": "x"},
        {"x-delivery-limit": -1},
        {"x-quorum-initial-group-size": 3},
        {"x-dead-letter-strategy": "at-least-once"},
        {"x-max-in-memory-length": 0},
        {"x-queue-leader-locator": "balanced"},
        {"x-single-active-consumer": True},
        {"x-foo": 1},
    ],
)
def test_a_quorum_queue_takes_the_arguments_rabbitmq_takes(connection, quorum_queue, arguments):
    name = quorum_queue("qq-ok", arguments)

    assert connection.channel().queue_declare(name, passive=True).method.message_count == 0


def test_a_server_named_quorum_queue_is_refused(connection):
    assert refusal(connection, "", QUORUM, durable=True) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue")


def take(channel, queue: str) -> tuple[int, dict | None]:
    method, properties, _body = channel.basic_get(queue)
    assert method is not None
    return method.delivery_tag, properties.headers


def delivery_count(headers: dict | None) -> int | None:
    value = (headers or {}).get("x-delivery-count")
    if value is not None:
        assert type(value).__name__ == "long"  # RabbitMQ writes it as a 64-bit 'l' (pika's long)
    return value


def test_every_return_counts_and_redeliveries_carry_the_count(connection, quorum_queue):
    queue = quorum_queue("qq-count")
    channel = connection.channel()
    channel.basic_publish("", queue, b"m", pika.BasicProperties(headers={"x-delivery-count": 7, "k": 1}))
    wait_ready(channel, queue, 1)
    deliveries = []
    channel.basic_consume(queue, lambda _ch, method, properties, _body: deliveries.append((method, properties)))

    def next_delivery() -> tuple[int, bool, dict | None]:
        assert poll(lambda: deliveries, WAIT_S, pump=connection.process_data_events)
        method, properties = deliveries.pop()
        return method.delivery_tag, method.redelivered, properties.headers

    tag, redelivered, headers = next_delivery()
    assert (redelivered, headers) == (False, {"x-delivery-count": 7, "k": 1})  # the first delivery is untouched
    channel.basic_reject(tag, requeue=True)
    tag, redelivered, headers = next_delivery()
    assert (redelivered, delivery_count(headers), headers["k"]) == (True, 1, 1)
    channel.basic_nack(tag, requeue=True)
    tag, _, headers = next_delivery()
    assert delivery_count(headers) == 2
    channel.basic_recover(requeue=True)
    tag, _, headers = next_delivery()
    assert delivery_count(headers) == 3
    channel.close()  # the unacked delivery comes back again
    channel = connection.channel()
    tag, headers = take(channel, queue)
    assert delivery_count(headers) == 4
    channel.basic_ack(tag)


def test_basic_get_from_a_quorum_queue_always_carries_the_count(connection, quorum_queue):
    queue = quorum_queue("qq-get")
    channel = connection.channel()
    channel.basic_publish("", queue, b"m", pika.BasicProperties(headers={"x-delivery-count": 7}))
    wait_ready(channel, queue, 1)

    tag, headers = take(channel, queue)
    assert delivery_count(headers) == 0
    channel.basic_reject(tag, requeue=True)
    tag, headers = take(channel, queue)
    assert delivery_count(headers) == 1


@pytest.mark.parametrize(("limit", "deliveries"), [(0, 1), (1, 2), (-1, 1), ("x", None)])
def test_the_delivery_limit_dead_letters_after_limit_plus_one_deliveries(connection, quorum_queue, unique, limit, deliveries):
    channel = connection.channel()
    dead = quorum_queue("qq-dead")
    queue = quorum_queue("qq-limit", {"x-delivery-limit": limit, "x-dead-letter-exchange": "",
                                      "x-dead-letter-routing-key": dead})
    channel.basic_publish("", queue, b"m")
    wait_ready(channel, queue, 1)

    delivered = 0
    while delivered < 4:
        method, _properties, _body = channel.basic_get(queue)
        if method is None:
            break
        delivered += 1
        channel.basic_reject(method.delivery_tag, requeue=True)
        # Back in the queue, or dead-lettered (or dropped) past the limit.
        assert poll(lambda: ready_or_dead(channel, queue, dead), WAIT_S, pump=connection.process_data_events)
    if deliveries is None:
        assert delivered == 4
        return
    assert delivered == deliveries
    wait_ready(channel, dead, 1)
    _method, properties, _body = channel.basic_get(dead, auto_ack=True)
    assert [(death["reason"], death["queue"], death["count"]) for death in properties.headers["x-death"]] == [
        ("delivery_limit", queue, 1)]
    assert properties.headers["x-first-death-reason"] == "delivery_limit"


def ready_or_dead(channel, queue: str, dead: str) -> bool:
    counts = [channel.queue_declare(name, passive=True).method.message_count for name in (queue, dead)]
    return sum(counts) > 0
