"""Direct reply-to: RPC replies without a reply queue.

The client consumes the pseudo-queue amq.rabbitmq.reply-to in no-ack mode and
publishes requests on the same channel with reply_to=amq.rabbitmq.reply-to; the
server rewrites reply_to to amq.rabbitmq.reply-to.<opaque>, and a reply
published to that name through the default exchange reaches the client.
"""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from interop_tests.pika_helpers import WAIT_S, connect, pumping
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)
from interop_tests.waiting import poll

REPLY_TO = "amq.rabbitmq.reply-to"


@pytest.fixture
def rpc_server(connection, unique):
    """A request queue on its own connection; returns (connection, queue, requests seen)."""
    channel = connection.channel()
    queue = unique("rpc-requests")
    channel.queue_declare(queue, exclusive=True)
    requests = []

    def answer(ch, method, properties, body):
        requests.append(properties)
        ch.basic_publish("", properties.reply_to, b"reply to " + body,
                         pika.BasicProperties(correlation_id=properties.correlation_id))
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, answer)
    return connection, queue, requests


def test_reply_arrives_through_direct_reply_to(broker, rpc_server):
    server_connection, queue, requests = rpc_server
    with connect(broker) as client:
        channel = client.channel()
        replies = []
        channel.basic_consume(REPLY_TO, lambda ch, method, props, body: replies.append((props.correlation_id, body)),
                              auto_ack=True)

        channel.basic_publish("", queue, b"ping", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c-1"))

        assert poll(lambda: replies, WAIT_S, pump=pumping(server_connection, client))
        assert replies == [("c-1", b"reply to ping")]
        assert requests[0].reply_to.startswith(REPLY_TO + ".")
        assert requests[0].reply_to != REPLY_TO


def test_several_requests_get_their_own_replies(broker, rpc_server):
    server_connection, queue, _ = rpc_server
    with connect(broker) as client:
        channel = client.channel()
        replies = {}
        channel.basic_consume(REPLY_TO, lambda ch, method, props, body: replies.__setitem__(props.correlation_id, body),
                              auto_ack=True)
        for index in range(5):
            channel.basic_publish("", queue, f"q{index}".encode(),
                                  pika.BasicProperties(reply_to=REPLY_TO, correlation_id=str(index)))

        assert poll(lambda: len(replies) == 5, WAIT_S, pump=pumping(server_connection, client))
        assert replies == {str(index): f"reply to q{index}".encode() for index in range(5)}


def test_reply_consumer_must_be_no_ack(broker):
    with connect(broker) as connection:
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as error:
            channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=False)

    assert (error.value.reply_code, error.value.reply_text) == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_only_one_reply_consumer_per_channel(broker):
    with connect(broker) as connection:
        channel = connection.channel()
        channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
        with pytest.raises(ChannelClosedByBroker) as error:
            channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)

    assert (error.value.reply_code, error.value.reply_text) == (406, "PRECONDITION_FAILED - reply consumer already set")


def test_reply_to_a_vanished_client_is_silently_dropped(broker):
    with connect(broker) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", REPLY_TO + ".no-such-client", b"lost")  # confirmed, no error
        assert channel.is_open


def test_the_reply_pseudo_queue_declares_as_a_queue_with_one_consumer(broker):
    """Client libraries check the reply queue with a (passive) declare before using it."""
    with connect(broker) as connection:
        channel = connection.channel()
        for passive in (True, False):
            declared = channel.queue_declare(REPLY_TO, passive=passive).method
            assert (declared.queue, declared.message_count, declared.consumer_count) == (REPLY_TO, 0, 1)
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare(REPLY_TO + ".no-such-client", passive=True)
        assert refused.value.reply_code == 404


def test_a_live_reply_address_declares_passively(broker, rpc_server):
    """RabbitMQ 3.10 closes the connection with 541 INTERNAL_ERROR here (a crash); we answer as
    for the pseudo-queue, which is what the declare means."""
    if broker.is_external:
        pytest.skip("RabbitMQ 3.10 crashes on this declare (541 INTERNAL_ERROR)")
    server_connection, queue, requests = rpc_server
    with connect(broker) as connection:
        channel = connection.channel()
        channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
        channel.basic_publish("", queue, b"ping", pika.BasicProperties(reply_to=REPLY_TO))
        assert poll(lambda: requests, WAIT_S, pump=pumping(server_connection, connection))
        declared = channel.queue_declare(requests[0].reply_to, passive=True).method
        assert (declared.message_count, declared.consumer_count) == (0, 1)
