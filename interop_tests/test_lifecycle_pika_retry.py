"""Delayed redelivery, x-delivery-count and x-delivery-limit with pika (this broker's extensions).

RabbitMQ 3.10 has neither delayed retry nor delivery limits on classic queues, so these tests
run only against this project's broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from interop_tests.pika_helpers import channel_for_test
from interop_tests.waiting import poll

WAIT_S = 8.0


@pytest.fixture
def channel(broker) -> Iterator[BlockingChannel]:
    yield from channel_for_test(broker, extension="delayed retry and delivery limits are this broker's extensions")


class Recorder:
    """Collects deliveries: (monotonic time, body, redelivered, x-delivery-count)."""

    def __init__(self, decide: Callable[[bytes, int], str]) -> None:
        self.decide = decide  # body, number of earlier deliveries of it -> "ack" | "reject" | "nack"
        self.seen: list[tuple[float, bytes, bool, int | None]] = []

    def __call__(self, channel, method, properties, body: bytes) -> None:
        count = (properties.headers or {}).get("x-delivery-count")
        earlier = sum(1 for item in self.seen if item[1] == body)
        self.seen.append((time.monotonic(), body, method.redelivered, count))
        verdict = self.decide(body, earlier)
        if verdict == "ack":
            channel.basic_ack(method.delivery_tag)
        elif verdict == "reject":
            channel.basic_reject(method.delivery_tag, requeue=True)
        else:
            channel.basic_nack(method.delivery_tag, requeue=True)

    def of(self, body: bytes) -> list[tuple[float, bytes, bool, int | None]]:
        return [item for item in self.seen if item[1] == body]


def gaps(deliveries) -> list[float]:
    return [later[0] - earlier[0] for earlier, later in zip(deliveries, deliveries[1:])]


def test_linear_backoff_redelivers_after_min_times_count_with_x_delivery_count(channel, unique):
    queue = unique("retry-linear")
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": 300, "x-delayed-retry-max": 10_000,
    })
    recorder = Recorder(lambda body, earlier: "reject" if earlier < 3 else "ack")
    channel.basic_consume(queue, recorder)
    channel.basic_publish("", queue, b"job")
    assert poll(lambda: len(recorder.seen) == 4, WAIT_S, pump=channel.connection.process_data_events)
    deliveries = recorder.of(b"job")
    assert [(redelivered, count) for _t, _b, redelivered, count in deliveries] == [
        (False, None), (True, 1), (True, 2), (True, 3)
    ]
    for gap, expected in zip(gaps(deliveries), (0.3, 0.6, 0.9)):
        assert expected - 0.02 <= gap < expected + 0.8, gaps(deliveries)


def test_exponential_backoff_doubles_up_to_the_maximum(channel, unique):
    queue = unique("retry-exp")
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-delayed-retry-type": "all", "x-delayed-retry-min": 150, "x-delayed-retry-max": 500,
        "x-delayed-retry-backoff": "exponential",
    })
    recorder = Recorder(lambda body, earlier: "nack" if earlier < 4 else "ack")
    channel.basic_consume(queue, recorder)
    channel.basic_publish("", queue, b"job")
    assert poll(lambda: len(recorder.seen) == 5, WAIT_S, pump=channel.connection.process_data_events)
    # The upper bound leaves room for a loaded CI machine yet stays below the uncapped 1.2 s.
    for gap, expected in zip(gaps(recorder.of(b"job")), (0.15, 0.3, 0.5, 0.5)):
        assert expected - 0.02 <= gap < expected + 0.6, gaps(recorder.of(b"job"))


def test_a_waiting_message_does_not_block_the_ones_behind_it(channel, unique):
    queue = unique("retry-hol")
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": 1500,
    })
    recorder = Recorder(lambda body, earlier: "reject" if body == b"poison" and not earlier else "ack")
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(queue, recorder)
    for body in (b"poison", b"a", b"b", b"c"):
        channel.basic_publish("", queue, body)
    assert poll(lambda: len(recorder.seen) == 5, WAIT_S, pump=channel.connection.process_data_events)
    order = [body for _t, body, _r, _c in recorder.seen]
    assert order == [b"poison", b"a", b"b", b"c", b"poison"]
    assert recorder.seen[3][0] - recorder.seen[0][0] < 1.4  # the others did not wait for it
    assert recorder.seen[4][0] - recorder.seen[0][0] >= 1.45


def test_while_waiting_a_message_is_neither_ready_nor_unacked(channel, unique):
    queue = unique("retry-count")
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": 60_000,
    })
    channel.basic_publish("", queue, b"job")
    method, _properties, _body = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=True)
    declare_ok = channel.queue_declare(queue, passive=True)
    assert declare_ok.method.message_count == 0
    assert channel.basic_get(queue) == (None, None, None)
    # An ignored reject would leave the message unacked; closing the channel would then requeue it.
    channel.close()
    reopened = channel.connection.channel()
    assert reopened.queue_declare(queue, passive=True).method.message_count == 0


def test_past_its_delivery_limit_a_message_is_dead_lettered_with_reason_delivery_limit(channel, unique):
    queue, dead = unique("limited"), unique("limited-dead")
    channel.queue_declare(dead, auto_delete=True)
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": 50,
    })
    recorder = Recorder(lambda body, earlier: "reject")
    channel.basic_consume(queue, recorder)
    channel.basic_publish("", queue, b"poison", pika.BasicProperties(message_id="m-1"))
    assert poll(lambda: channel.queue_declare(dead, passive=True).method.message_count == 1, WAIT_S,
                pump=channel.connection.process_data_events)
    assert len(recorder.seen) == 3  # delivered limit + 1 times
    _method, properties, body = channel.basic_get(dead, auto_ack=True)
    assert (body, properties.message_id) == (b"poison", "m-1")
    death = properties.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", queue, 1)
    assert properties.headers["x-first-death-reason"] == "delivery_limit"


def test_without_a_dead_letter_exchange_the_message_past_its_limit_is_dropped(channel, unique):
    queue = unique("limited-drop")
    channel.queue_declare(queue, auto_delete=True, arguments={"x-delivery-limit": 0})
    channel.basic_publish("", queue, b"once")
    method, _properties, _body = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    # An ignored nack would leave the message unacked; closing the channel would then requeue it.
    channel.close()
    reopened = channel.connection.channel()
    assert reopened.queue_declare(queue, passive=True).method.message_count == 0


def test_returned_messages_wait_when_a_consumer_disconnects_without_acking(broker, channel, unique):
    queue = unique("retry-returned")
    channel.queue_declare(queue, arguments={
        "x-delayed-retry-type": "returned", "x-delayed-retry-min": 800,
    })
    channel.basic_publish("", queue, b"job")
    other = pika.BlockingConnection(pika.URLParameters(broker.url()))
    worker = other.channel()
    got = []
    worker.basic_consume(queue, lambda ch, m, p, b: got.append(b))
    assert poll(lambda: got == [b"job"], WAIT_S, pump=worker.connection.process_data_events)
    other.close()  # the worker died holding it
    closed_at = time.monotonic()
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    assert poll(lambda: channel.queue_declare(queue, passive=True).method.message_count == 1, WAIT_S,
                pump=channel.connection.process_data_events)
    assert time.monotonic() - closed_at >= 0.75
    method, properties, _body = channel.basic_get(queue, auto_ack=True)
    assert method.redelivered and properties.headers == {"x-delivery-count": 1}
    channel.queue_delete(queue)
