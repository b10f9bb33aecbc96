"""Transactions: publishes and acks take effect at tx.commit, and tx.rollback discards them."""

from __future__ import annotations

from pamqp import commands

from tests.frame_driver import opened_client, publish_frames


def tx_client():
    client = opened_client(channels=(1, 2))
    client.call(1, commands.Queue.Declare(queue="q"))
    assert isinstance(client.call(1, commands.Tx.Select()), commands.Tx.SelectOk)
    return client


def ready_count(client) -> int:
    return client.call(2, commands.Queue.Declare(queue="q", passive=True)).message_count


def test_publishes_are_invisible_until_commit():
    client = tx_client()
    client.send_bytes(publish_frames(1, b"a", routing_key="q") + publish_frames(1, b"b", routing_key="q"))
    assert ready_count(client) == 0
    assert isinstance(client.call(2, commands.Basic.Get(queue="q")), commands.Basic.GetEmpty)
    assert isinstance(client.call(1, commands.Tx.Commit()), commands.Tx.CommitOk)
    assert ready_count(client) == 2


def test_rollback_discards_the_publishes():
    client = tx_client()
    client.publish(1, b"a", routing_key="q")
    assert isinstance(client.call(1, commands.Tx.Rollback()), commands.Tx.RollbackOk)
    client.call(1, commands.Tx.Commit())
    assert ready_count(client) == 0


def test_publishes_after_a_rollback_are_committed():
    client = tx_client()
    client.publish(1, b"dropped", routing_key="q")
    client.call(1, commands.Tx.Rollback())
    client.publish(1, b"kept", routing_key="q")
    client.call(1, commands.Tx.Commit())
    received = client.send(2, commands.Basic.Get(queue="q", no_ack=True))
    assert received[-1][1].value == b"kept"
    assert received[0][1].message_count == 0


def test_acks_take_effect_at_commit():
    client = tx_client()
    client.publish(2, b"a", routing_key="q")
    client.send(1, commands.Basic.Get(queue="q"))
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    queue = client.broker.vhosts["/"].queues["q"]
    assert queue.unacked_count == 1
    client.call(1, commands.Tx.Commit())
    assert queue.unacked_count == 0


def test_rolled_back_ack_leaves_the_message_unacked():
    client = tx_client()
    client.publish(2, b"a", routing_key="q")
    client.send(1, commands.Basic.Get(queue="q"))
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    client.call(1, commands.Tx.Rollback())
    client.call(1, commands.Tx.Commit())
    assert client.broker.vhosts["/"].queues["q"].unacked_count == 1


def test_commit_without_select_gives_406():
    client = opened_client()
    close = client.call(1, commands.Tx.Commit())
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - channel is not transactional")


def test_confirm_select_on_a_transactional_channel_gives_406():
    client = tx_client()
    close = client.call(1, commands.Confirm.Select())
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


def test_tx_select_on_a_confirm_channel_gives_406():
    client = opened_client()
    client.call(1, commands.Confirm.Select())
    close = client.call(1, commands.Tx.Select())
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
