"""Transaction (amqp_server/channel/transaction.py) on its own: what it keeps for tx.commit, and the
delivery tags it refuses as RabbitMQ does. End to end through a channel: test_channel_tx.py."""

from __future__ import annotations

import pytest

from amqp_server.wire.errors import AMQPError
from amqp_server.channel.transaction import Transaction


class StubChannel:
    """What Transaction reads of a channel: its unacked tags, timed-out tags, next tag."""

    def __init__(self, unacked: set[int], timed_out: set[int] = frozenset()) -> None:
        self.unacked = unacked
        self.timed_out = set(timed_out)
        self.next_delivery_tag = max(unacked | self.timed_out, default=0) + 1


def test_publishes_and_settlements_are_kept_in_order_until_the_end():
    transaction = Transaction()
    channel = StubChannel({1, 2})
    transaction.publish("x", "m1", False)  # type: ignore[arg-type]
    transaction.settle(channel, "ack", 1, False, False)  # type: ignore[arg-type]
    transaction.publish("x", "m2", True)  # type: ignore[arg-type]
    assert transaction.end() == ([("x", "m1", False), ("x", "m2", True)], [("ack", 1, False, False)])
    assert transaction.end() == ([], [])


def test_a_tag_settled_twice_in_one_transaction_is_unknown_the_second_time():
    transaction = Transaction()
    channel = StubChannel({1})
    transaction.settle(channel, "ack", 1, False, False)  # type: ignore[arg-type]
    with pytest.raises(AMQPError) as refused:
        transaction.settle(channel, "reject", 1, False, True)  # type: ignore[arg-type]
    assert (refused.value.code, refused.value.reply_text, refused.value.method_id) == (
        406, "PRECONDITION_FAILED - unknown delivery tag 1", 90)


def test_a_multiple_ack_settles_every_tag_up_to_it():
    transaction = Transaction()
    channel = StubChannel({1, 2, 3})
    transaction.settle(channel, "ack", 2, True, False)  # type: ignore[arg-type]
    for tag in (1, 2):
        with pytest.raises(AMQPError):
            transaction.settle(channel, "ack", tag, False, False)  # type: ignore[arg-type]
    transaction.settle(channel, "ack", 3, False, False)  # type: ignore[arg-type]


def test_ending_a_transaction_makes_its_tags_known_again():
    transaction = Transaction()
    channel = StubChannel({1})
    transaction.settle(channel, "nack", 0, True, True)  # type: ignore[arg-type]
    transaction.end()  # tx.rollback
    transaction.settle(channel, "ack", 1, False, False)  # type: ignore[arg-type]


def test_an_unknown_tag_is_refused_and_a_timed_out_one_is_kept_without_complaint():
    transaction = Transaction()
    channel = StubChannel({1}, timed_out={5})
    with pytest.raises(AMQPError) as refused:
        transaction.settle(channel, "nack", 9, False, True)  # type: ignore[arg-type]
    assert (refused.value.reply_text, refused.value.method_id) == ("PRECONDITION_FAILED - unknown delivery tag 9", 120)
    transaction.settle(channel, "ack", 5, False, False)  # type: ignore[arg-type]
    assert transaction.end()[1] == [("ack", 5, False, False)]
