"""Transactions (tx.select / commit / rollback) as a pika user sees them.

Publishes, acks and rejects in a transaction take effect only at commit;
rollback discards them (a rolled-back ack leaves the message unacked on the
channel, it is not requeued).
"""

from __future__ import annotations

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

from interop_tests.pika_helpers import numbered_bodies, publish_confirmed, ready_count, wait_ready
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)


@pytest.fixture
def queue(connection, unique) -> str:
    name = unique("tx")
    connection.channel().queue_declare(name, exclusive=True)
    return name


def get_in_transaction(connection: pika.BlockingConnection, queue: str,
                       count: int) -> tuple[BlockingChannel, pika.spec.Basic.GetOk]:
    """Publish b"m1" ... b"m<count>" to `queue`, then basic.get the first one on a new channel in tx mode."""
    publish_confirmed(connection, queue, numbered_bodies(count))
    tx = connection.channel()
    tx.tx_select()
    method, _, _ = tx.basic_get(queue)
    return tx, method


def test_published_messages_are_invisible_until_commit(connection, queue):
    tx, observer = connection.channel(), connection.channel()
    tx.tx_select()

    tx.basic_publish("", queue, b"one")
    tx.basic_publish("", queue, b"two")
    assert ready_count(observer, queue) == 0

    tx.tx_commit()
    assert ready_count(observer, queue) == 2
    assert [observer.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"one", b"two"]


def test_rollback_discards_publishes(connection, queue):
    tx, observer = connection.channel(), connection.channel()
    tx.tx_select()

    tx.basic_publish("", queue, b"discarded")
    tx.tx_rollback()
    tx.basic_publish("", queue, b"kept")
    tx.tx_commit()

    assert ready_count(observer, queue) == 1
    assert observer.basic_get(queue, auto_ack=True)[2] == b"kept"


def test_channel_stays_transactional_after_commit(connection, queue):
    tx, observer = connection.channel(), connection.channel()
    tx.tx_select()
    tx.basic_publish("", queue, b"first")
    tx.tx_commit()

    tx.basic_publish("", queue, b"second")
    assert ready_count(observer, queue) == 1
    tx.tx_commit()
    assert ready_count(observer, queue) == 2


def test_acks_take_effect_at_commit(connection, queue):
    tx, first = get_in_transaction(connection, queue, 2)
    tx.basic_ack(first.delivery_tag)
    tx.tx_commit()
    tx.close()  # would requeue anything still unacked

    observer = connection.channel()
    assert observer.basic_get(queue, auto_ack=True)[2] == b"m2"
    assert ready_count(observer, queue) == 0


def test_rollback_discards_acks_and_leaves_messages_unacked(connection, queue):
    tx, method = get_in_transaction(connection, queue, 1)
    tx.basic_ack(method.delivery_tag)
    tx.tx_rollback()

    observer = connection.channel()
    assert ready_count(observer, queue) == 0  # not requeued by the rollback: still unacked
    tx.close()
    assert wait_ready(observer, queue, 1) == 1
    redelivered, _, body = observer.basic_get(queue, auto_ack=True)
    assert (body, redelivered.redelivered) == (b"m1", True)


def test_rolled_back_ack_can_be_sent_again_and_committed(connection, queue):
    tx, method = get_in_transaction(connection, queue, 1)
    tx.basic_ack(method.delivery_tag)
    tx.tx_rollback()

    tx.basic_ack(method.delivery_tag)
    tx.tx_commit()
    tx.close()

    assert ready_count(connection.channel(), queue) == 0


def test_reject_with_requeue_takes_effect_at_commit(connection, queue):
    tx, method = get_in_transaction(connection, queue, 1)
    observer = connection.channel()

    tx.basic_reject(method.delivery_tag, requeue=True)
    assert ready_count(observer, queue) == 0
    tx.tx_commit()
    assert wait_ready(observer, queue, 1) == 1


@pytest.mark.parametrize(
    ("first", "second", "text"),
    [
        ("tx_select", "confirm_delivery", "PRECONDITION_FAILED - cannot switch from tx to confirm mode"),
        ("confirm_delivery", "tx_select", "PRECONDITION_FAILED - cannot switch from confirm to tx mode"),
    ],
)
def test_tx_and_confirm_mode_exclude_each_other(connection, first, second, text):
    channel = connection.channel()
    getattr(channel, first)()

    with pytest.raises(ChannelClosedByBroker) as error:
        getattr(channel, second)()

    assert (error.value.reply_code, error.value.reply_text) == (406, text)


@pytest.mark.parametrize("operation", ["tx_commit", "tx_rollback"])
def test_commit_or_rollback_without_select_is_406(connection, operation):
    channel = connection.channel()

    with pytest.raises(ChannelClosedByBroker) as error:
        getattr(channel, operation)()

    assert (error.value.reply_code, error.value.reply_text) == (406, "PRECONDITION_FAILED - channel is not transactional")


def test_tx_select_twice_is_fine(connection, queue):
    channel = connection.channel()
    channel.tx_select()
    channel.tx_select()
    channel.basic_publish("", queue, b"x")
    channel.tx_commit()

    assert ready_count(channel, queue) == 1
