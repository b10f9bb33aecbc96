"""tx.commit-ok means on disk: a SIGKILL right after it loses nothing the commit covered.

The broker is killed the moment the client has read commit-ok, with no other request in
between, so only what was durable when commit-ok left the broker can survive.
"""

from __future__ import annotations

import hashlib

import pika
import pytest

from interop_tests.pika_helpers import connect

pytestmark = pytest.mark.timeout(60)

QUEUE = "tx-durable"


def body_for(index: int) -> bytes:
    """Sizes from empty to past pika's 128 KiB frame, each with a checkable content."""
    size = (0, 10, 4096, 131_072 + 7, 300_000)[index % 5]
    return hashlib.sha256(str(index).encode()).digest() * (size // 32) + bytes(size % 32)


def drain(broker) -> list[tuple[bytes, bool]]:
    connection = connect(broker)
    channel = connection.channel()
    taken = []
    while True:
        method, _, body = channel.basic_get(QUEUE, auto_ack=True)
        if method is None:
            connection.close()
            return taken
        taken.append((body, method.redelivered))


def test_committed_publishes_survive_sigkill_right_after_commit_ok(broker_factory):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.tx_select()
    for batch in range(5):
        for index in range(batch * 40, batch * 40 + 40):
            channel.basic_publish("", QUEUE, body_for(index), pika.BasicProperties(delivery_mode=2))
        channel.tx_commit()
    broker.kill()
    broker.start()

    assert drain(broker) == [(body_for(index), False) for index in range(200)]


def test_uncommitted_and_rolled_back_publishes_do_not_appear_after_a_crash(broker_factory):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.tx_select()
    channel.basic_publish("", QUEUE, b"rolled back", pika.BasicProperties(delivery_mode=2))
    channel.tx_rollback()
    channel.basic_publish("", QUEUE, b"committed", pika.BasicProperties(delivery_mode=2))
    channel.tx_commit()
    channel.basic_publish("", QUEUE, b"never committed", pika.BasicProperties(delivery_mode=2))
    channel.queue_declare(QUEUE, passive=True)  # a round trip: the publish has reached the broker
    broker.kill()
    broker.start()

    assert drain(broker) == [(b"committed", False)]


def test_committed_acks_survive_sigkill_right_after_commit_ok(broker_factory):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.confirm_delivery()
    for index in range(10):
        channel.basic_publish("", QUEUE, body_for(index), pika.BasicProperties(delivery_mode=2))
    acking = connect(broker).channel()
    acking.tx_select()
    tags = [acking.basic_get(QUEUE)[0].delivery_tag for _ in range(10)]
    for tag in tags[:6]:
        acking.basic_ack(tag)
    acking.tx_commit()  # acks of messages 0..5 committed; 6..9 delivered, never acked
    broker.kill()
    broker.start()

    assert drain(broker) == [(body_for(index), True) for index in range(6, 10)]
