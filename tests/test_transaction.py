"""Transaction (amqp_server/channel/transaction.py) on its own: what it keeps for tx.commit, and the
delivery tags it refuses as RabbitMQ does. End to end through a channel: test_channel_tx.py."""

from __future__ import annotations

import pytest

from amqp_server.wire.errors import AMQPError
from amqp_server.channel.transaction import Transaction


class StubTimeouts:
    """What Transaction reads of a channel's DeliveryTimeouts: which tags timed out."""

    def __init__(self, timed_out: set[int]) -> None:
        self.timed_out = set(timed_out)

    def has_timed_out(self, tag: int) -> bool:
        return tag in self.timed_out


class StubChannel:
    """What Transaction reads of a channel: its unacked tags, timed-out tags, next tag."""

    def __init__(self, unacked: set[int], timed_out: set[int] = frozenset()) -> None:
        self.unacked = unacked
        self.timeouts = StubTimeouts(timed_out)
        self.next_delivery_tag = max(unacked | self.timeouts.timed_out, default=0) + 1


def settle(transaction: Transaction, channel: StubChannel, kind: str, tag: int, multiple: bool, requeue: bool) -> None:
    transaction.settle(channel.unacked, channel.timeouts, channel.next_delivery_tag,  # type: ignore[arg-type]
                       kind, tag, multiple, requeue)


def test_publishes_and_settlements_are_kept_in_order_until_the_end():
    transaction = Transaction()
    channel = StubChannel({1, 2})
    transaction.publish("x", "m1", False)  # type: ignore[arg-type]
    settle(transaction, channel, "ack", 1, False, False)
    transaction.publish("x", "m2", True)  # type: ignore[arg-type]
    assert transaction.end() == ([("x", "m1", False), ("x", "m2", True)], [("ack", 1, False, False)])
    assert transaction.end() == ([], [])


def test_a_tag_settled_twice_in_one_transaction_is_unknown_the_second_time():
    transaction = Transaction()
    channel = StubChannel({1})
    settle(transaction, channel, "ack", 1, False, False)
    with pytest.raises(AMQPError) as refused:
        settle(transaction, channel, "reject", 1, False, True)
    assert (refused.value.code, refused.value.reply_text, refused.value.method_id) == (
        406, "PRECONDITION_FAILED - unknown delivery tag 1", 90)


def test_a_multiple_ack_settles_every_tag_up_to_it():
    transaction = Transaction()
    channel = StubChannel({1, 2, 3})
    settle(transaction, channel, "ack", 2, True, False)
    for tag in (1, 2):
        with pytest.raises(AMQPError):
            settle(transaction, channel, "ack", tag, False, False)
    settle(transaction, channel, "ack", 3, False, False)


def test_ending_a_transaction_makes_its_tags_known_again():
    transaction = Transaction()
    channel = StubChannel({1})
    settle(transaction, channel, "nack", 0, True, True)
    transaction.end()  # tx.rollback
    settle(transaction, channel, "ack", 1, False, False)


def test_an_unknown_tag_is_refused_and_a_timed_out_one_is_kept_without_complaint():
    transaction = Transaction()
    channel = StubChannel({1}, timed_out={5})
    with pytest.raises(AMQPError) as refused:
        settle(transaction, channel, "nack", 9, False, True)
    assert (refused.value.reply_text, refused.value.method_id) == ("PRECONDITION_FAILED - unknown delivery tag 9", 120)
    settle(transaction, channel, "ack", 5, False, False)
    assert transaction.end()[1] == [("ack", 5, False, False)]
