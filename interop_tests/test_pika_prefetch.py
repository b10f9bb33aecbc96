"""Prefetch (basic.qos), fair dispatch and requeue of unacked messages on close.

RabbitMQ 3.10 semantics pinned here:
- global=false: a limit per consumer, fixed when the consumer starts; a later
  basic.qos(global=false) only affects consumers started after it.
- global=true: one limit shared by all consumers on the channel; changing it
  takes effect immediately for running consumers.
- Closing a channel or connection requeues its unacked messages, marked
  redelivered, ahead of messages that were never delivered.
"""

from __future__ import annotations

import os

import pytest

from interop_tests.pika_helpers import (
    WAIT_S, assert_ready_messages, connect, filled_queue, numbered_bodies, publish_confirmed,
)
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import poll

SETTLE_S = 0.3  # how long to keep delivering (connection.sleep) when asserting that nothing more arrives


def test_fair_dispatch_sends_everything_else_to_the_consumer_that_keeps_acking(connection, unique):
    queue = unique("fair")
    connection.channel().queue_declare(queue, exclusive=True)
    slow, fast = connection.channel(), connection.channel()
    slow.basic_qos(prefetch_count=1)
    fast.basic_qos(prefetch_count=1)
    slow_got, fast_got = [], []
    slow.basic_consume(queue, lambda ch, method, props, body: slow_got.append(body))  # never acks

    def ack_at_once(ch, method, props, body):
        fast_got.append(body)
        ch.basic_ack(method.delivery_tag)

    fast.basic_consume(queue, ack_at_once)
    publish_confirmed(connection, queue, numbered_bodies(20))

    assert poll(lambda: len(slow_got) + len(fast_got) == 20, WAIT_S, pump=connection.process_data_events)
    assert len(slow_got) == 1
    assert len(fast_got) == 19
    assert sorted(slow_got + fast_got) == sorted(numbered_bodies(20))


def test_acking_frees_a_prefetch_slot_for_the_next_message(connection, unique):
    queue = unique("slot")
    channel = connection.channel()
    filled_queue(channel, queue, numbered_bodies(5))
    channel.basic_qos(prefetch_count=2)
    got = []
    channel.basic_consume(queue, lambda ch, method, props, body: got.append(method))

    assert poll(lambda: len(got) == 2, WAIT_S, pump=connection.process_data_events)
    connection.sleep(SETTLE_S)
    assert len(got) == 2
    channel.basic_ack(got[0].delivery_tag)
    assert poll(lambda: len(got) == 3, WAIT_S, pump=connection.process_data_events)
    connection.sleep(SETTLE_S)
    assert len(got) == 3


def test_per_consumer_prefetch_limits_each_consumer_separately(connection, unique):
    channel = connection.channel()
    first, second = unique("per-consumer-a"), unique("per-consumer-b")
    for queue in (first, second):
        filled_queue(channel, queue, numbered_bodies(10))
    channel.basic_qos(prefetch_count=2, global_qos=False)
    got = {first: 0, second: 0}
    for queue in (first, second):
        channel.basic_consume(queue, lambda ch, method, props, body, q=queue: got.__setitem__(q, got[q] + 1))

    assert poll(lambda: got[first] == 2 and got[second] == 2, WAIT_S, pump=connection.process_data_events)
    connection.sleep(SETTLE_S)
    assert got == {first: 2, second: 2}


def test_global_prefetch_is_shared_by_all_consumers_on_the_channel(connection, unique):
    channel = connection.channel()
    first, second = unique("global-a"), unique("global-b")
    for queue in (first, second):
        filled_queue(channel, queue, numbered_bodies(10))
    channel.basic_qos(prefetch_count=3, global_qos=True)
    got = []
    for queue in (first, second):
        channel.basic_consume(queue, lambda ch, method, props, body: got.append(body))

    assert poll(lambda: len(got) == 3, WAIT_S, pump=connection.process_data_events)
    connection.sleep(SETTLE_S)
    assert len(got) == 3
    ready = sum(channel.queue_declare(q, passive=True).method.message_count for q in (first, second))
    assert ready == 17


def test_raising_global_prefetch_applies_to_running_consumers(connection, unique):
    queue = unique("global-raise")
    channel = connection.channel()
    filled_queue(channel, queue, numbered_bodies(10))
    channel.basic_qos(prefetch_count=1, global_qos=True)
    got = []
    channel.basic_consume(queue, lambda ch, method, props, body: got.append(body))
    assert poll(lambda: len(got) == 1, WAIT_S, pump=connection.process_data_events)

    channel.basic_qos(prefetch_count=4, global_qos=True)

    assert poll(lambda: len(got) == 4, WAIT_S, pump=connection.process_data_events)
    connection.sleep(SETTLE_S)
    assert got == numbered_bodies(4)


@pytest.mark.skipif(
    bool(os.environ.get("INTEROP_BROKER_URL")),
    reason="RabbitMQ 3.10 fixes a consumer's prefetch when it starts; we apply a new one (rabbitmq-server#11948)",
)
def test_per_consumer_prefetch_change_applies_to_running_consumers(connection, unique):
    # Celery raises prefetch at run time (ETA tasks); RabbitMQ ignores that for running
    # consumers (rabbitmq-server#11948). The issue asks us to apply it, and we do.
    early, late = unique("qos-early"), unique("qos-late")
    channel = connection.channel()
    for queue in (early, late):
        filled_queue(channel, queue, numbered_bodies(10))
    channel.basic_qos(prefetch_count=1)
    got = {early: 0, late: 0}
    channel.basic_consume(early, lambda ch, method, props, body: got.__setitem__(early, got[early] + 1))
    assert poll(lambda: got[early] == 1, WAIT_S, pump=connection.process_data_events)

    channel.basic_qos(prefetch_count=4)
    channel.basic_consume(late, lambda ch, method, props, body: got.__setitem__(late, got[late] + 1))

    assert poll(lambda: got[late] == 4 and got[early] == 4, WAIT_S, pump=connection.process_data_events)
    connection.sleep(SETTLE_S)
    assert got == {early: 4, late: 4}


def test_prefetch_zero_means_unlimited(connection, unique):
    queue = unique("unlimited")
    channel = connection.channel()
    filled_queue(channel, queue, numbered_bodies(50))
    channel.basic_qos(prefetch_count=0)
    got = []
    channel.basic_consume(queue, lambda ch, method, props, body: got.append(body))

    assert poll(lambda: len(got) == 50, WAIT_S, pump=connection.process_data_events)


def test_unacked_messages_return_redelivered_ahead_of_later_ones_when_the_channel_closes(connection, unique):
    queue = unique("requeue-channel")
    filled_queue(connection.channel(), queue, numbered_bodies(5))
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=2)
    got = []
    consumer.basic_consume(queue, lambda ch, method, props, body: got.append(body))
    assert poll(lambda: len(got) == 2, WAIT_S, pump=connection.process_data_events)

    consumer.close()

    assert_ready_messages(connection.channel(), queue, [
        (b"m1", True), (b"m2", True), (b"m3", False), (b"m4", False), (b"m5", False),
    ])


def test_unacked_messages_return_redelivered_when_the_connection_closes(broker, connection, unique):
    queue = unique("requeue-connection")
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=False)
    try:
        publish_confirmed(connection, queue, numbered_bodies(4))
        with connect(broker) as consumer_connection:
            consumer = consumer_connection.channel()
            consumer.basic_qos(prefetch_count=2)
            got = []
            consumer.basic_consume(queue, lambda ch, method, props, body: got.append(body))
            assert poll(lambda: len(got) == 2, WAIT_S, pump=consumer_connection.process_data_events)
            # leaving the block closes the connection without acking

        assert_ready_messages(channel, queue, [(b"m1", True), (b"m2", True), (b"m3", False), (b"m4", False)])
    finally:
        channel.queue_delete(queue)


def test_requeued_messages_go_to_the_remaining_consumer(connection, unique):
    queue = unique("handover")
    connection.channel().queue_declare(queue, exclusive=True)
    leaving, staying = connection.channel(), connection.channel()
    leaving.basic_qos(prefetch_count=1)
    left_with, received = [], []
    leaving.basic_consume(queue, lambda ch, method, props, body: left_with.append(body))
    publish_confirmed(connection, queue, [b"first"])
    assert poll(lambda: left_with == [b"first"], WAIT_S, pump=connection.process_data_events)

    staying.basic_consume(queue, lambda ch, method, props, body: received.append((body, method.redelivered)))
    leaving.close()

    assert poll(lambda: received, WAIT_S, pump=connection.process_data_events)
    assert received == [(b"first", True)]
