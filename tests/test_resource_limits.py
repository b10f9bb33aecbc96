"""Vhost and user limits refuse at the moment they are hit, with RabbitMQ's codes and texts."""

from __future__ import annotations

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.wire.errors import AMQPError
from amqp_server.config.limit_definitions import VHOST_LIMITS, LimitError, check_limits
from tests.frame_driver import FakeClient, opened_client


def refused_at_open(broker: Broker) -> commands.Connection.Close:
    client = FakeClient(broker)
    received = client.handshake()
    close = received[-1][1]
    assert isinstance(close, commands.Connection.Close), received
    return close


def test_a_vhosts_connection_limit_refuses_the_next_connection_until_one_closes():
    broker = Broker()
    broker.vhosts["/"].set_limits({"max-connections": 1})
    first = opened_client(broker, channels=())
    close = refused_at_open(broker)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    assert close.reply_text == "NOT_ALLOWED - access to vhost '/' refused for user 'guest': connection limit (1) is reached"
    first.connection.admission.release()  # its socket closed
    opened_client(broker, channels=())


def test_a_limit_of_zero_refuses_every_connection_and_a_negative_one_none():
    broker = Broker()
    broker.vhosts["/"].set_limits({"max-connections": 0})
    assert refused_at_open(broker).reply_code == 530
    broker.vhosts["/"].set_limits({"max-connections": -1})
    opened_client(broker, channels=())


def test_a_users_connection_limit_counts_connections_made_before_it_was_set():
    broker = Broker()
    opened_client(broker, channels=())
    broker.set_user_limits("guest", {"max-connections": 1})
    close = refused_at_open(broker)
    assert close.reply_text == "NOT_ALLOWED - connection refused for user 'guest': user connection limit (1) is reached"


def test_a_users_channel_limit_counts_channels_on_all_their_connections():
    broker = Broker()
    broker.set_user_limits("guest", {"max-channels": 2})
    opened_client(broker, channels=(1,))
    client = opened_client(broker, channels=(1,))
    close = client.send(2, commands.Channel.Open())[-1][1]
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user 'guest' has reached the maximum allowed user limit of (2)")


def test_a_vhosts_queue_limit_refuses_new_queues_but_not_redeclares():
    broker = Broker()
    vhost = broker.vhosts["/"]
    vhost.set_limits({"max-queues": 1})
    vhost.declare_queue("one", connection=None)
    vhost.declare_queue("one", connection=None)
    with pytest.raises(AMQPError) as raised:
        vhost.declare_queue("two", connection=None)
    assert (raised.value.code, raised.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot declare queue 'two': queue limit in vhost '/' (1) is reached")


def test_limits_are_checked_as_rabbitmq_checks_them():
    assert check_limits({"max-queues": 3}, VHOST_LIMITS, "limits") == {"max-queues": 3}
    with pytest.raises(LimitError, match=r'Unrecognised terms \[\{<<"max-widgets">>,1\}\] in limits'):
        check_limits({"max-widgets": 1}, VHOST_LIMITS, "limits")
    with pytest.raises(LimitError, match='max-queues should be a number, actually was <<"x">>'):
        check_limits({"max-queues": "x"}, VHOST_LIMITS, "limits")


def test_a_full_vhost_is_reported_before_the_users_lack_of_access_as_rabbitmq_does():
    broker = Broker()
    broker.add_vhost("full").set_limits({"max-connections": 0})
    client = FakeClient(broker)
    client.start()
    client.start_ok()
    client.send(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0))
    close = client.send(0, commands.Connection.Open(virtual_host="full"))[-1][1]
    assert close.reply_text == "NOT_ALLOWED - access to vhost 'full' refused for user 'guest': connection limit (0) is reached"
