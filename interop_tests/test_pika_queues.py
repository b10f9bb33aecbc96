"""Queue lifecycle as a pika user sees it: exclusive, auto-delete, server-named,
passive declare, equivalence checks, delete/purge and declare-ok counts.

Reply texts are RabbitMQ 3.10's, character for character: client code greps them.
"""

from __future__ import annotations

import time

import pytest
from pika.exceptions import ChannelClosedByBroker

from interop_tests.pika_helpers import WAIT_S, connect, wait_ready
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import poll


def locked_text(queue: str) -> str:
    return (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' in vhost '/'. "
        "It could be originally declared on another connection or the exclusive property value "
        "does not match that of the original declaration."
    )


def assert_queue_missing(broker, queue: str, timeout: float = 5.0) -> None:
    """From another connection, the queue is (soon) gone: passive declare gives 404.

    Deleting an exclusive or auto-delete queue happens just after the close or
    cancel that triggers it, so poll briefly instead of checking once.
    """
    deadline = time.monotonic() + timeout
    with connect(broker) as probe:
        while True:
            try:
                probe.channel().queue_declare(queue, passive=True)
            except ChannelClosedByBroker as error:
                assert (error.reply_code, error.reply_text) == (404, f"NOT_FOUND - no queue '{queue}' in vhost '/'")
                return
            assert time.monotonic() < deadline, f"queue {queue} still exists"
            probe.process_data_events(time_limit=0.05)


@pytest.fixture
def durable_queue(connection, unique):
    """A named, non-exclusive queue, deleted after the test."""
    name = unique("shared-q")
    connection.channel().queue_declare(name)
    yield name
    if connection.is_open:
        connection.channel().queue_delete(name)


OTHER_CONNECTION_OPERATIONS = {
    "declare": lambda ch, q: ch.queue_declare(q, exclusive=True),
    "declare-non-exclusive": lambda ch, q: ch.queue_declare(q),
    "passive-declare": lambda ch, q: ch.queue_declare(q, passive=True),
    "consume": lambda ch, q: ch.basic_consume(q, lambda *args: None),
    "get": lambda ch, q: ch.basic_get(q),
    "purge": lambda ch, q: ch.queue_purge(q),
    "delete": lambda ch, q: ch.queue_delete(q),
    "bind": lambda ch, q: ch.queue_bind(q, "amq.direct", "k"),
}


@pytest.mark.parametrize("operation", OTHER_CONNECTION_OPERATIONS)
def test_exclusive_queue_is_locked_for_other_connections(broker, connection, unique, operation):
    queue = unique("exclusive")
    connection.channel().queue_declare(queue, exclusive=True)

    with connect(broker) as other:
        with pytest.raises(ChannelClosedByBroker) as error:
            OTHER_CONNECTION_OPERATIONS[operation](other.channel(), queue)

    assert error.value.reply_code == 405
    assert error.value.reply_text == locked_text(queue)
    # the owner is unaffected
    assert connection.channel().queue_declare(queue, exclusive=True).method.queue == queue


def test_server_named_exclusive_queue_redeclared_elsewhere_hits_the_reserved_prefix(broker, connection):
    queue = connection.channel().queue_declare("", exclusive=True).method.queue

    with connect(broker) as other:
        with pytest.raises(ChannelClosedByBroker) as error:
            other.channel().queue_declare(queue)

    assert error.value.reply_code == 403
    assert error.value.reply_text == f"ACCESS_REFUSED - queue name '{queue}' contains reserved prefix 'amq.*'"


def test_exclusive_queue_is_deleted_when_its_connection_closes(broker, unique):
    queue = unique("exclusive-gone")
    with connect(broker) as owner:
        owner.channel().queue_declare(queue, exclusive=True)

    assert_queue_missing(broker, queue)


def test_redeclaring_a_queue_with_a_different_exclusive_flag_is_resource_locked(connection, durable_queue):
    with pytest.raises(ChannelClosedByBroker) as error:
        connection.channel().queue_declare(durable_queue, exclusive=True)

    assert error.value.reply_code == 405
    assert error.value.reply_text == locked_text(durable_queue)


def test_auto_delete_queue_is_deleted_after_its_last_consumer_cancels(broker, connection, unique):
    queue = unique("auto-delete")
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=True)
    first = channel.basic_consume(queue, lambda *args: None)
    second = channel.basic_consume(queue, lambda *args: None)

    channel.basic_cancel(first)
    assert channel.queue_declare(queue, passive=True).method.consumer_count == 1

    channel.basic_cancel(second)
    assert_queue_missing(broker, queue)


def test_auto_delete_queue_without_any_consumer_ever_stays(connection, unique):
    queue = unique("auto-delete-unused")
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=True)
    try:
        assert channel.queue_declare(queue, passive=True).method.queue == queue
    finally:
        channel.queue_delete(queue)


def test_auto_delete_queue_goes_when_the_consuming_channel_closes(broker, connection, unique):
    queue = unique("auto-delete-close")
    consumer = connection.channel()
    consumer.queue_declare(queue, auto_delete=True)
    consumer.basic_consume(queue, lambda *args: None)

    consumer.close()

    assert_queue_missing(broker, queue)


def test_server_named_queues_start_with_amq_gen_and_are_unique(connection):
    channel = connection.channel()
    first = channel.queue_declare("", exclusive=True).method.queue
    second = channel.queue_declare("", exclusive=True).method.queue

    assert first.startswith("amq.gen-")
    assert second.startswith("amq.gen-")
    assert first != second
    # the name works like any other
    channel.basic_publish("", first, b"hello")
    assert channel.basic_get(first, auto_ack=True)[2] == b"hello"


def test_passive_declare_of_a_missing_queue_is_404(connection, unique):
    queue = unique("missing")

    with pytest.raises(ChannelClosedByBroker) as error:
        connection.channel().queue_declare(queue, passive=True)

    assert error.value.reply_code == 404
    assert error.value.reply_text == f"NOT_FOUND - no queue '{queue}' in vhost '/'"


def test_passive_declare_ignores_flags_and_reports_counts(connection, durable_queue):
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", durable_queue, b"one")

    ok = channel.queue_declare(durable_queue, passive=True, durable=True, exclusive=True).method

    assert (ok.queue, ok.message_count, ok.consumer_count) == (durable_queue, 1, 0)


INEQUIVALENT_REDECLARES = [
    # (first declare kwargs, second declare kwargs, expected text after the queue name)
    ({"auto_delete": True}, {"auto_delete": True, "durable": True},
     "inequivalent arg 'durable' for queue '{q}' in vhost '/': received 'true' but current is 'false'"),
    ({"auto_delete": True}, {},
     "inequivalent arg 'auto_delete' for queue '{q}' in vhost '/': received 'false' but current is 'true'"),
    ({"auto_delete": True, "arguments": {"x-max-length": 5}}, {"auto_delete": True, "arguments": {"x-max-length": 6}},
     "inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': received '6' but current is '5'"),
    ({"auto_delete": True, "arguments": {"x-max-length": 5}}, {"auto_delete": True},
     "inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': received none but current is the value '5' of type 'signedint'"),
    ({"auto_delete": True}, {"auto_delete": True, "arguments": {"x-max-length": 5}},
     "inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': received the value '5' of type 'signedint' but current is none"),
]


@pytest.mark.parametrize(("first", "second", "text"), INEQUIVALENT_REDECLARES)
def test_redeclaring_with_different_flags_or_arguments_is_406(connection, unique, first, second, text):
    queue = unique("inequivalent")
    channel = connection.channel()
    channel.queue_declare(queue, **first)
    try:
        with pytest.raises(ChannelClosedByBroker) as error:
            channel.queue_declare(queue, **second)
        assert error.value.reply_code == 406
        assert error.value.reply_text == "PRECONDITION_FAILED - " + text.format(q=queue)
    finally:
        connection.channel().queue_delete(queue)


def test_redeclaring_with_identical_arguments_succeeds(connection, unique):
    queue = unique("equivalent")
    channel = connection.channel()
    arguments = {"x-max-length": 5, "x-message-ttl": 60000}
    channel.queue_declare(queue, exclusive=True, arguments=arguments)

    assert channel.queue_declare(queue, exclusive=True, arguments=dict(arguments)).method.queue == queue


@pytest.mark.parametrize(
    ("arguments", "prefix"),
    [
        # Full RabbitMQ text: ... for queue 'q' in vhost '/': "expected integer, got longstr"
        ({"x-max-length": "abc"}, "PRECONDITION_FAILED - invalid arg 'x-max-length' for queue '{q}' in vhost '/': "),
        # Full RabbitMQ text: ... for queue 'q' in vhost '/': {value_negative,-1}
        ({"x-message-ttl": -1}, "PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': "),
    ],
)
def test_invalid_queue_argument_values_are_406(connection, unique, arguments, prefix):
    queue = unique("bad-arg")

    with pytest.raises(ChannelClosedByBroker) as error:
        connection.channel().queue_declare(queue, exclusive=True, arguments=arguments)

    assert error.value.reply_code == 406
    assert error.value.reply_text.startswith(prefix.format(q=queue))


def test_queue_name_with_amq_prefix_is_403(connection):
    with pytest.raises(ChannelClosedByBroker) as error:
        connection.channel().queue_declare("amq.mine")

    assert error.value.reply_code == 403
    assert error.value.reply_text == "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'"


def test_delete_if_unused_refuses_while_a_consumer_exists(connection, durable_queue):
    channel = connection.channel()
    channel.basic_consume(durable_queue, lambda *args: None)

    with pytest.raises(ChannelClosedByBroker) as error:
        connection.channel().queue_delete(durable_queue, if_unused=True)

    assert error.value.reply_code == 406
    assert error.value.reply_text == f"PRECONDITION_FAILED - queue '{durable_queue}' in vhost '/' in use"


def test_delete_if_empty_refuses_while_messages_are_ready(connection, durable_queue):
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", durable_queue, b"still here")

    with pytest.raises(ChannelClosedByBroker) as error:
        connection.channel().queue_delete(durable_queue, if_empty=True)

    assert error.value.reply_code == 406
    assert error.value.reply_text == f"PRECONDITION_FAILED - queue '{durable_queue}' in vhost '/' not empty"


def test_delete_reports_the_ready_messages_it_discarded(broker, connection, unique):
    queue = unique("delete-count")
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.confirm_delivery()
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", queue, body)

    assert channel.queue_delete(queue, if_unused=True).method.message_count == 3
    assert_queue_missing(broker, queue)


def test_delete_of_a_missing_queue_is_ok_with_zero_messages(connection, unique):
    assert connection.channel().queue_delete(unique("never-existed")).method.message_count == 0


def test_purge_reports_how_many_ready_messages_it_removed(connection, unique):
    queue = unique("purge")
    channel = connection.channel()
    channel.queue_declare(queue, exclusive=True)
    channel.confirm_delivery()
    for index in range(4):
        channel.basic_publish("", queue, b"m%d" % index)
    unacked, _, _ = channel.basic_get(queue)

    assert channel.queue_purge(queue).method.message_count == 3  # the unacked one is not ready
    channel.basic_reject(unacked.delivery_tag, requeue=True)
    assert wait_ready(channel, queue, 1) == 1


def test_declare_ok_counts_ready_messages_and_every_consumer(connection, unique):
    queue = unique("counts")
    channel = connection.channel()
    channel.queue_declare(queue, exclusive=True)
    channel.confirm_delivery()
    for index in range(5):
        channel.basic_publish("", queue, b"m%d" % index)
    received = []
    for _ in range(2):
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=1)
        consumer.basic_consume(queue, lambda ch, method, props, body: received.append(body))
    assert poll(lambda: len(received) == 2, WAIT_S, pump=connection.process_data_events)

    ok = channel.queue_declare(queue, exclusive=True).method
    # two consumers; unacked deliveries are not counted as ready
    assert (ok.message_count, ok.consumer_count) == (3, 2)


def test_deleting_a_consumed_queue_sends_basic_cancel_to_the_consumer(connection, unique):
    queue = unique("cancel-notify")
    consumer = connection.channel()
    consumer.queue_declare(queue)
    cancelled = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
    tag = consumer.basic_consume(queue, lambda *args: None)

    connection.channel().queue_delete(queue)

    assert poll(lambda: cancelled, WAIT_S, pump=connection.process_data_events)
    assert cancelled[0].consumer_tag == tag
    # the consumer's channel stays open and usable
    assert consumer.is_open
    assert consumer.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")


def test_queue_unbind_of_a_missing_binding_is_ok(connection, unique):
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue

    channel.queue_unbind(queue, "amq.direct", unique("never-bound"))
    channel.queue_bind(queue, "amq.direct", "k")
    channel.queue_unbind(queue, "amq.direct", "k")
    channel.queue_unbind(queue, "amq.direct", "k")
