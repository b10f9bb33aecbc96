"""Consumer timeout, single active consumer and deduplication with pika."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

from interop_tests.broker_process import TEST_CONFIG
from interop_tests.pika_helpers import channel_for_test
from interop_tests.waiting import poll

WAIT_S = 8.0


@pytest.fixture
def channel(broker) -> Iterator[BlockingChannel]:
    yield from channel_for_test(broker, extension="uses this broker's lifecycle extensions")


def test_a_slow_consumer_is_cancelled_alone_and_its_delivery_goes_to_another(channel, unique):
    queue = unique("slow-work")
    channel.queue_declare(queue, auto_delete=False, arguments={"x-consumer-timeout": 700})
    cancelled, slow, quick = [], [], []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    slow_tag = channel.basic_consume(queue, lambda ch, m, p, b: slow.append(m))
    channel.basic_publish("", queue, b"long task")
    assert poll(lambda: len(slow) == 1, WAIT_S, pump=channel.connection.process_data_events)
    started = time.monotonic()
    assert poll(lambda: cancelled == [slow_tag], WAIT_S, pump=channel.connection.process_data_events)
    assert 0.6 <= time.monotonic() - started < 3.0
    assert channel.is_open
    channel.basic_consume(queue, lambda ch, m, p, b: (quick.append((b, m.redelivered)), ch.basic_ack(m.delivery_tag)))
    assert poll(lambda: len(quick) == 1, WAIT_S, pump=channel.connection.process_data_events)
    assert quick == [(b"long task", True)]
    channel.basic_ack(slow[0].delivery_tag)  # finishing the long task late is harmless
    channel.basic_publish("", queue, b"next")
    assert poll(lambda: len(quick) == 2, WAIT_S, pump=channel.connection.process_data_events)
    assert channel.is_open
    channel.queue_delete(queue)


def test_a_server_default_consumer_timeout_applies_to_every_queue(broker_factory):
    broker = broker_factory(TEST_CONFIG + "\n[[queue_defaults]]\nconsumer_timeout = 500\n")
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare("any-queue")
    cancelled = []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = channel.basic_consume("any-queue", lambda ch, m, p, b: None)
    channel.basic_publish("", "any-queue", b"task")
    assert poll(lambda: cancelled == [tag], WAIT_S, pump=channel.connection.process_data_events)
    assert channel.queue_declare("any-queue", passive=True).method.message_count == 1
    connection.close()


def test_basic_get_on_a_single_active_consumer_queue_is_refused(channel, unique):
    queue = unique("sac")
    channel.queue_declare(queue, auto_delete=True, arguments={"x-single-active-consumer": True})
    with pytest.raises(ChannelClosedByBroker) as caught:
        channel.basic_get(queue)
    assert caught.value.reply_code == 405
    assert caught.value.reply_text == (
        f"RESOURCE_LOCKED - cannot obtain access to locked queue '{queue}' in vhost '/'. "
        "basic.get operations are not supported by quorum queues with single active consumer"
    )


def test_single_active_consumer_keeps_every_message_on_one_consumer(broker, channel, unique):
    queue = unique("sac-order")
    channel.queue_declare(queue, auto_delete=True, arguments={"x-single-active-consumer": True})
    got: list[tuple[str, bytes]] = []
    for tag in ("a", "b", "c"):
        channel.basic_consume(queue, lambda ch, m, p, b: (got.append((m.consumer_tag, b)), ch.basic_ack(m.delivery_tag)),
                              consumer_tag=tag)
    for n in range(6):
        channel.basic_publish("", queue, b"%d" % n)
    assert poll(lambda: len(got) == 6, WAIT_S, pump=channel.connection.process_data_events)
    assert got == [("a", b"%d" % n) for n in range(6)]
    channel.basic_cancel("a")
    channel.basic_publish("", queue, b"after")
    assert poll(lambda: len(got) == 7, WAIT_S, pump=channel.connection.process_data_events)
    assert got[-1] == ("b", b"after")


def test_a_duplicate_publish_is_confirmed_but_enqueued_once(channel, unique):
    queue = unique("dedup")
    channel.queue_declare(queue, auto_delete=True, arguments={
        "x-message-deduplication": True, "x-deduplication-header": "order-id",
    })
    channel.confirm_delivery()
    for order in ("o-1", "o-1", "o-2", "o-1"):
        channel.basic_publish("", queue, order.encode(), pika.BasicProperties(headers={"order-id": order}))
    assert channel.queue_declare(queue, passive=True).method.message_count == 2
