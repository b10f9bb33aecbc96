"""Small protocol behaviours where RabbitMQ 3.10 answers in a particular way, checked frame by
frame (each was compared against a running RabbitMQ 3.10)."""

from __future__ import annotations

from pamqp import commands

from tests.frame_driver import methods, opened_client


def close_of(method) -> tuple[int, str, int, int]:
    assert isinstance(method, commands.Channel.Close), method
    return method.reply_code, method.reply_text, method.class_id, method.method_id


# -- settling unknown delivery tags --------------------------------------------------------


def test_reject_of_an_unknown_tag_closes_the_channel_naming_basic_reject():
    client = opened_client()
    close = client.call(1, commands.Basic.Reject(delivery_tag=9))
    assert close_of(close) == (406, "PRECONDITION_FAILED - unknown delivery tag 9", 60, 90)


def test_nack_of_an_unknown_tag_closes_the_channel_naming_basic_nack():
    client = opened_client()
    close = client.call(1, commands.Basic.Nack(delivery_tag=9, multiple=True))
    assert close_of(close) == (406, "PRECONDITION_FAILED - unknown delivery tag 9", 60, 120)


# -- settling twice inside a transaction ---------------------------------------------------


def tx_client_with_two_gets():
    client = opened_client()
    client.call(1, commands.Queue.Declare(queue="q"))
    client.publish(1, b"a", routing_key="q")
    client.publish(1, b"b", routing_key="q")
    client.call(1, commands.Tx.Select())
    client.send(1, commands.Basic.Get(queue="q"))
    client.send(1, commands.Basic.Get(queue="q"))
    return client


def test_a_second_ack_of_a_tag_in_one_transaction_is_an_unknown_tag():
    client = tx_client_with_two_gets()
    assert client.send(1, commands.Basic.Ack(delivery_tag=1)) == []
    close = client.call(1, commands.Basic.Ack(delivery_tag=1))
    assert close_of(close) == (406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80)


def test_nack_or_reject_of_a_tag_acked_in_the_transaction_is_an_unknown_tag():
    for method, method_id in (
        (commands.Basic.Nack(delivery_tag=1), 120),
        (commands.Basic.Reject(delivery_tag=1), 90),
    ):
        client = tx_client_with_two_gets()
        client.send(1, commands.Basic.Ack(delivery_tag=1))
        assert close_of(client.call(1, method)) == (406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, method_id)


def test_a_tag_covered_by_a_multiple_ack_in_the_transaction_is_unknown():
    client = tx_client_with_two_gets()
    client.send(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    close = client.call(1, commands.Basic.Ack(delivery_tag=1))
    assert close_of(close) == (406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80)


def test_a_multiple_ack_up_to_a_tag_acked_in_the_transaction_is_unknown():
    client = tx_client_with_two_gets()
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    close = client.call(1, commands.Basic.Ack(delivery_tag=1, multiple=True))
    assert close_of(close) == (406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80)


def test_after_a_rollback_the_tag_can_be_acked_again_and_committed():
    client = tx_client_with_two_gets()
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    client.call(1, commands.Tx.Rollback())
    assert client.send(1, commands.Basic.Ack(delivery_tag=1)) == []
    assert isinstance(client.call(1, commands.Tx.Commit()), commands.Tx.CommitOk)
    assert client.broker.vhosts["/"].queues["q"].unacked_count == 1  # tag 2 is still out


def test_after_a_commit_a_tag_acked_in_it_is_unknown():
    client = tx_client_with_two_gets()
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    client.call(1, commands.Tx.Commit())
    close = client.call(1, commands.Basic.Ack(delivery_tag=1))
    assert close_of(close) == (406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80)


def test_a_multiple_ack_of_an_acked_tag_is_unknown_even_with_higher_tags_unacked():
    client = opened_client()
    client.call(1, commands.Queue.Declare(queue="q"))
    client.publish(1, b"a", routing_key="q")
    client.publish(1, b"b", routing_key="q")
    client.send(1, commands.Basic.Get(queue="q"))
    client.send(1, commands.Basic.Get(queue="q"))
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    close = client.call(1, commands.Basic.Ack(delivery_tag=1, multiple=True))
    assert close_of(close) == (406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80)


# -- bindings with missing ends ------------------------------------------------------------


def test_queue_bind_with_queue_and_exchange_missing_names_the_exchange():
    client = opened_client()
    close = client.call(1, commands.Queue.Bind(queue="nq", exchange="nx", routing_key="k"))
    assert close_of(close) == (404, "NOT_FOUND - no exchange 'nx' in vhost '/'", 50, 20)


def test_exchange_bind_with_both_missing_names_the_source():
    client = opened_client()
    close = client.call(1, commands.Exchange.Bind(destination="nd", source="ns", routing_key="k"))
    assert close_of(close) == (404, "NOT_FOUND - no exchange 'ns' in vhost '/'", 40, 30)


# -- queue.delete with consumers -----------------------------------------------------------


def test_queue_delete_answers_delete_ok_before_cancelling_consumers():
    client = opened_client(channels=(1, 2))
    client.call(1, commands.Queue.Declare(queue="q"))
    client.call(1, commands.Basic.Consume(queue="q", consumer_tag="same"))
    client.call(2, commands.Basic.Consume(queue="q", consumer_tag="other"))
    received = client.send(1, commands.Queue.Delete(queue="q"))
    assert [(channel, type(method).__name__) for channel, method in received] == [
        (1, "DeleteOk"),
        (1, "Cancel"),
        (2, "Cancel"),
    ]


# -- basic.recover -------------------------------------------------------------------------


def test_recover_answers_recover_ok_before_the_redeliveries():
    client = opened_client()
    client.call(1, commands.Queue.Declare(queue="q"))
    client.publish(1, b"a", routing_key="q")
    client.send(1, commands.Basic.Consume(queue="q", consumer_tag="t"))
    received = methods(client.send(1, commands.Basic.Recover(requeue=True)))
    assert isinstance(received[0], commands.Basic.RecoverOk)
    assert isinstance(received[1], commands.Basic.Deliver) and received[1].redelivered
