"""Content in flight: the bodies of publishes still arriving, per connection.

A connection may hold at most max_content_in_flight declared body bytes of unfinished publishes
across its channels (a single message of any allowed size always), and an alarm blocks a
connection with publishes in flight at once, not at its next content header.
"""

from __future__ import annotations

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.broker.alarms import MEMORY
from amqp_server.broker.broker import Broker
from amqp_server.config.settings import LimitsConfig, ServerConfig
from tests.frame_driver import methods, opened_client


def started(client, channel: int, body_size: int):
    """basic.publish, a content header announcing `body_size` bytes and its first body byte."""
    return client.send(
        channel,
        commands.Basic.Publish(exchange="", routing_key="q"),
        ContentHeader(body_size=body_size),
        ContentBody(b"x"),
    )


def broker_with(max_content_in_flight: int) -> Broker:
    return Broker(ServerConfig(limits=LimitsConfig(max_content_in_flight=max_content_in_flight)))


def test_in_flight_bytes_are_counted_until_the_content_is_complete():
    client = opened_client(broker_with(1000), channels=(1, 2))
    started(client, 1, 300)
    started(client, 2, 400)
    assert client.connection.content_in_flight == 700
    client.send(1, ContentBody(b"x" * 299))
    assert client.connection.content_in_flight == 400


def test_a_body_in_one_frame_is_never_counted_and_a_header_alone_holds_nothing():
    client = opened_client(broker_with(1000), channels=(1, 2))
    client.publish(1, b"x" * 5000, routing_key="q")
    client.send(2, commands.Basic.Publish(exchange="", routing_key="q"), ContentHeader(body_size=5000))
    assert client.connection.content_in_flight == 0


def test_a_publish_that_would_pass_the_bound_closes_its_channel_and_holds_nothing():
    client = opened_client(broker_with(1000), channels=(1, 2, 3))
    started(client, 1, 600)
    received = started(client, 2, 600)
    close = methods(received)[0]
    assert isinstance(close, commands.Channel.Close) and close.reply_code == 406
    assert close.reply_text == (
        "PRECONDITION_FAILED - content in flight on this connection would reach 1200 bytes, "
        "more than the configured max_content_in_flight 1000"
    )
    assert client.connection.content_in_flight == 600
    # Channel 1's publish continues; one message larger than the bound alone is allowed.
    client.send(1, ContentBody(b"x" * 599))
    assert client.connection.content_in_flight == 0
    assert started(client, 3, 5000) == []


def test_a_channel_released_mid_content_gives_its_bytes_back():
    client = opened_client(broker_with(1000), channels=(1,))
    started(client, 1, 500)
    # A method instead of the body: 505 closes the connection, releasing the channel.
    received = client.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert methods(received)[0].reply_code == 505
    assert client.connection.content_in_flight == 0


def test_an_alarm_blocks_a_connection_with_bodies_in_flight_at_once():
    broker = Broker()
    client = opened_client(broker, channels=(1,))
    client.call(1, commands.Queue.Declare(queue="q"))
    started(client, 1, 1000)
    paused: list[bool] = []
    client.connection.on_reading_paused = paused.append

    broker.alarms.set(MEMORY, True)

    assert client.connection.reading_paused and paused == [True]
    blocked = methods(client.take())
    assert isinstance(blocked[0], commands.Connection.Blocked) and blocked[0].reason == "low on memory"


def test_a_body_frame_during_an_alarm_blocks_as_a_header_does():
    broker = Broker()
    client = opened_client(broker, channels=(1,))
    client.call(1, commands.Queue.Declare(queue="q"))
    client.send(1, commands.Basic.Publish(exchange="", routing_key="q"), ContentHeader(body_size=10))
    broker.alarms.set(MEMORY, True)
    assert not client.connection.reading_paused

    received = client.send(1, ContentBody(b"0123456789"))

    assert client.connection.reading_paused
    assert isinstance(methods(received)[0], commands.Connection.Blocked)


def test_an_alarm_leaves_a_connection_with_nothing_in_flight_reading():
    broker = Broker()
    client = opened_client(broker, channels=(1,))
    broker.alarms.set(MEMORY, True)
    assert not client.connection.reading_paused and client.take() == []
