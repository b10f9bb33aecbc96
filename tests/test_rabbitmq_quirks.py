"""Small protocol behaviours where RabbitMQ 3.10 answers in a particular way, checked frame by
frame (each was compared against a running RabbitMQ 3.10)."""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.frame_driver import methods, opened_client, raw_frame


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


# -- frames out of place -------------------------------------------------------------------


def hard_close_of(received) -> tuple[int, str, int, int]:
    channel, close = received[-1]
    assert channel == 0 and isinstance(close, commands.Connection.Close), received
    return close.reply_code, close.reply_text, close.class_id, close.method_id


def test_a_content_header_of_another_class_after_publish_is_505():
    client = opened_client()
    client.send(1, commands.Basic.Publish(exchange="", routing_key="q"))
    header = struct.pack(">HHQH", 50, 0, 1, 0)
    received = client.send_bytes(raw_frame(2, 1, header))
    assert hard_close_of(received) == (
        505, "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead", 60, 40)


def test_content_on_an_unopened_channel_is_505_like_content_without_a_method():
    client = opened_client()
    client.send(1, commands.Basic.Publish(exchange="", routing_key="q"))
    received = client.send(2, ContentHeader(body_size=1))
    assert hard_close_of(received) == (505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)
    client = opened_client()
    received = client.send(3, ContentBody(b"x"))
    assert hard_close_of(received) == (505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)


def test_connection_close_on_an_unopened_channel_is_504_and_on_an_open_one_503():
    close = commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
    client = opened_client()
    assert hard_close_of(client.send(2, close)) == (504, "CHANNEL_ERROR - expected 'channel.open'", 10, 50)
    client = opened_client()
    assert hard_close_of(client.send(1, close)) == (503, "COMMAND_INVALID - unimplemented method", 10, 50)


# -- CC and BCC headers --------------------------------------------------------------------


def publish_with_headers(client, headers, routing_key="q"):
    return client.publish(1, b"x", routing_key=routing_key, properties=commands.Basic.Properties(headers=headers))


def test_a_cc_or_bcc_header_that_is_not_an_array_closes_the_channel():
    cases = [
        ({"CC": "other"}, '{unacceptable_type_in_header,"CC",longstr}'),
        ({"BCC": 5}, '{unacceptable_type_in_header,"BCC",signedint}'),
        ({"CC": {"a": 1}}, '{unacceptable_type_in_header,"CC",table}'),
        ({"CC": True}, '{unacceptable_type_in_header,"CC",bool}'),
    ]
    for headers, reason in cases:
        client = opened_client()
        client.call(1, commands.Queue.Declare(queue="q"))
        close = methods(publish_with_headers(client, headers))[-1]
        assert close_of(close) == (406, f"PRECONDITION_FAILED - invalid message: {reason}", 60, 40)
        assert client.broker.vhosts["/"].queues["q"].message_count == 0


def test_a_bad_cc_header_is_refused_at_publish_even_when_unroutable_or_in_a_transaction():
    client = opened_client()
    close = methods(publish_with_headers(client, {"CC": "x"}, routing_key="nowhere"))[-1]
    assert close_of(close)[0] == 406
    client = opened_client()
    client.call(1, commands.Tx.Select())
    close = methods(publish_with_headers(client, {"CC": "x"}))[-1]
    assert close_of(close)[0] == 406


def test_cc_array_items_that_are_not_strings_are_skipped():
    client = opened_client()
    for name in ("q", "5"):
        client.call(1, commands.Queue.Declare(queue=name))
    assert publish_with_headers(client, {"CC": [5]}) == []
    queues = client.broker.vhosts["/"].queues
    assert (queues["q"].message_count, queues["5"].message_count) == (1, 0)


# -- alternate-exchange argument -----------------------------------------------------------


def declare_with_alternate(client, value, **options):
    return client.call(
        1,
        commands.Exchange.Declare(
            exchange="x", exchange_type="direct", arguments={"alternate-exchange": value}, **options
        ),
    )


def test_a_new_exchange_with_a_non_string_alternate_exchange_is_406():
    for value, type_name in ((5, "signedint"), (2**40, "long"), (True, "bool"), ({"a": 1}, "table"), (["ae"], "array")):
        client = opened_client()
        close = declare_with_alternate(client, value)
        assert close_of(close) == (
            406,
            f"PRECONDITION_FAILED - invalid type '{type_name}' for arg 'alternate-exchange' in exchange 'x' in vhost '/'",
            40,
            10,
        )
        assert "x" not in client.broker.vhosts["/"].exchanges


def test_alternate_exchange_type_is_not_checked_on_passive_or_existing_exchanges():
    client = opened_client()
    assert isinstance(declare_with_alternate(client, "ae"), commands.Exchange.DeclareOk)
    assert isinstance(declare_with_alternate(client, 5, passive=True), commands.Exchange.DeclareOk)
    close = declare_with_alternate(client, 5)
    assert close_of(close)[1].startswith("PRECONDITION_FAILED - inequivalent arg 'alternate-exchange'")


# -- publisher confirm nacks ---------------------------------------------------------------


def test_a_confirm_nack_for_an_overflowing_queue_has_requeue_set():
    client = opened_client()
    client.call(1, commands.Queue.Declare(queue="q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}))
    client.call(1, commands.Confirm.Select())
    client.publish(1, b"a", routing_key="q")
    nack = methods(client.publish(1, b"b", routing_key="q"))[-1]
    assert isinstance(nack, commands.Basic.Nack)
    assert (nack.delivery_tag, nack.requeue) == (2, True)
