"""basic.get, ack, nack, reject and recover as a pika user sees them.

Requeued messages must come back marked redelivered and in their original
position, ahead of messages published after them.
"""

from __future__ import annotations

import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from interop_tests.pika_helpers import WAIT_S, assert_ready_messages, filled_queue
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import poll


def test_basic_get_on_an_empty_queue_answers_get_empty(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("empty"), [])

    assert channel.basic_get(queue) == (None, None, None)


def test_get_ok_carries_the_number_of_messages_still_ready(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("get-ok"), [b"m1", b"m2", b"m3"])

    seen = []
    for _ in range(3):
        method, _, body = channel.basic_get(queue)
        seen.append((body, method.message_count, method.delivery_tag, method.redelivered,
                     method.exchange, method.routing_key))

    assert seen == [
        (b"m1", 2, 1, False, "", queue),
        (b"m2", 1, 2, False, "", queue),
        (b"m3", 0, 3, False, "", queue),
    ]


def test_acked_message_is_gone_and_unacked_one_returns_when_the_channel_closes(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("ack"), [b"acked", b"unacked"])
    first, _, _ = channel.basic_get(queue)
    channel.basic_get(queue)
    channel.basic_ack(first.delivery_tag)
    channel.close()

    assert_ready_messages(connection.channel(), queue, [(b"unacked", True)])


def test_reject_with_requeue_puts_the_message_back_at_its_original_position(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("reject"), [b"m1", b"m2", b"m3", b"m4"])
    m1, _, _ = channel.basic_get(queue)
    m2, _, _ = channel.basic_get(queue)

    # Requeue out of order: the queue still restores publication order.
    channel.basic_reject(m2.delivery_tag, requeue=True)
    channel.basic_reject(m1.delivery_tag, requeue=True)

    assert_ready_messages(channel, queue, [(b"m1", True), (b"m2", True), (b"m3", False), (b"m4", False)])


def test_reject_without_requeue_drops_the_message(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("reject-drop"), [b"m1", b"m2"])
    m1, _, _ = channel.basic_get(queue)

    channel.basic_reject(m1.delivery_tag, requeue=False)

    assert_ready_messages(channel, queue, [(b"m2", False)])


def test_nack_multiple_with_requeue_returns_every_message_up_to_the_tag(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("nack-multi"), [b"m1", b"m2", b"m3", b"m4"])
    tags = [channel.basic_get(queue)[0].delivery_tag for _ in range(3)]

    channel.basic_nack(tags[1], multiple=True, requeue=True)  # m1 and m2 back; m3 stays unacked

    assert_ready_messages(channel, queue, [(b"m1", True), (b"m2", True), (b"m4", False)])
    channel.basic_nack(tags[2], requeue=True)
    assert_ready_messages(channel, queue, [(b"m3", True)])


def test_nack_without_requeue_drops_the_messages(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("nack-drop"), [b"m1", b"m2", b"m3"])
    tags = [channel.basic_get(queue)[0].delivery_tag for _ in range(2)]

    channel.basic_nack(tags[1], multiple=True, requeue=False)

    assert_ready_messages(channel, queue, [(b"m3", False)])


def test_ack_multiple_settles_everything_up_to_and_including_the_tag(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("ack-multi"), [b"m1", b"m2", b"m3"])
    tags = [channel.basic_get(queue)[0].delivery_tag for _ in range(3)]

    channel.basic_ack(tags[1], multiple=True)
    channel.close()

    assert_ready_messages(connection.channel(), queue, [(b"m3", True)])


def test_ack_multiple_with_tag_zero_settles_all_outstanding(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("ack-zero"), [b"m1", b"m2"])
    channel.basic_get(queue)
    channel.basic_get(queue)

    channel.basic_ack(0, multiple=True)
    channel.close()

    assert_ready_messages(connection.channel(), queue, [])


def test_consumer_acks_with_delivery_tags_counting_from_one_per_channel(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("tags"), [b"m1", b"m2", b"m3"])
    deliveries = []
    channel.basic_consume(queue, lambda ch, method, props, body: deliveries.append((method.delivery_tag, body)))

    assert poll(lambda: len(deliveries) == 3, WAIT_S, pump=connection.process_data_events)
    assert deliveries == [(1, b"m1"), (2, b"m2"), (3, b"m3")]
    for tag, _ in deliveries:
        channel.basic_ack(tag)
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_basic_recover_redelivers_unacked_messages_to_the_consumer(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("recover"), [b"m1", b"m2"])
    deliveries = []
    channel.basic_consume(queue, lambda ch, method, props, body: deliveries.append((body, method.redelivered, method.delivery_tag)))
    assert poll(lambda: len(deliveries) == 2, WAIT_S, pump=connection.process_data_events)

    channel.basic_recover(requeue=True)

    assert poll(lambda: len(deliveries) == 4, WAIT_S, pump=connection.process_data_events)
    assert [(body, redelivered) for body, redelivered, _ in deliveries] == [
        (b"m1", False), (b"m2", False), (b"m1", True), (b"m2", True),
    ]
    assert [tag for _, _, tag in deliveries] == [1, 2, 3, 4]  # redeliveries get fresh tags


def test_basic_recover_without_requeue_is_not_implemented(connection):
    channel = connection.channel()

    with pytest.raises(ConnectionClosedByBroker) as error:
        channel.basic_recover(requeue=False)

    assert error.value.reply_code == 540
    assert error.value.reply_text == "NOT_IMPLEMENTED - requeue=false"


def test_acking_an_unknown_delivery_tag_closes_the_channel_with_406(connection):
    channel = connection.channel()

    with pytest.raises(ChannelClosedByBroker) as error:
        channel.basic_ack(99)
        channel.queue_declare("", exclusive=True)  # any round trip surfaces the close

    assert error.value.reply_code == 406
    assert error.value.reply_text == "PRECONDITION_FAILED - unknown delivery tag 99"
    assert connection.is_open


def test_acking_the_same_delivery_twice_closes_the_channel_with_406(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("double-ack"), [b"m1"])
    method, _, _ = channel.basic_get(queue)
    channel.basic_ack(method.delivery_tag)

    with pytest.raises(ChannelClosedByBroker) as error:
        channel.basic_ack(method.delivery_tag)
        channel.queue_declare("", exclusive=True)

    assert error.value.reply_code == 406
    assert error.value.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}"


def test_acking_an_auto_acked_delivery_is_an_unknown_tag(connection, unique):
    channel = connection.channel()
    queue = filled_queue(channel, unique("auto-ack"), [b"m1"])
    method, _, _ = channel.basic_get(queue, auto_ack=True)

    with pytest.raises(ChannelClosedByBroker) as error:
        channel.basic_ack(method.delivery_tag)
        channel.queue_declare("", exclusive=True)

    assert error.value.reply_code == 406
    assert error.value.reply_text == "PRECONDITION_FAILED - unknown delivery tag 1"


def test_nack_and_reject_of_unknown_tags_close_the_channel_with_406(connection):
    nacking, rejecting = connection.channel(), connection.channel()

    with pytest.raises(ChannelClosedByBroker) as nack_error:
        nacking.basic_nack(7)
        nacking.queue_declare("", exclusive=True)
    with pytest.raises(ChannelClosedByBroker) as reject_error:
        rejecting.basic_reject(8)
        rejecting.queue_declare("", exclusive=True)

    assert (nack_error.value.reply_code, nack_error.value.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 7")
    assert (reject_error.value.reply_code, reject_error.value.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 8")
