"""Lifecycle features as a client sees them on the wire (frame driver, no sockets, time by hand)."""

from __future__ import annotations

import time

from pamqp import commands
from pamqp.header import ContentHeader

from amqp_server.broker.broker import Broker
from tests.frame_driver import CLIENT_CAPABILITIES, FakeClient, bodies, methods, opened_client


def declare(client, queue: str, arguments: dict | None = None, channel: int = 1):
    return client.call(channel, commands.Queue.Declare(queue=queue, arguments=arguments or {}))


def consume(client, queue: str, tag: str = "ctag", channel: int = 1, no_ack: bool = False, arguments=None):
    return client.send(
        channel, commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack, arguments=arguments or {})
    )


def headers_of(received) -> list[dict | None]:
    return [value.properties.headers for _channel, value in received if isinstance(value, ContentHeader)]


def later(client: FakeClient, seconds: float) -> list:
    """Let `seconds` pass on the broker's timer heap; returns what the broker sent meanwhile."""
    client.broker.timers.run_due(time.time() + seconds)
    return client.take()


# -- x-delivery-count ---------------------------------------------------------------------


def test_redeliveries_from_a_queue_with_a_delivery_limit_carry_x_delivery_count():
    client = opened_client()
    declare(client, "q", {"x-delivery-limit": 5})
    consume(client, "q")
    first = client.publish(1, b"m", routing_key="q", properties=commands.Basic.Properties(headers={"app": "kept"}))
    assert headers_of(first) == [{"app": "kept"}]  # the first delivery is the publisher's bytes
    again = client.send(1, commands.Basic.Nack(delivery_tag=1, requeue=True))
    assert methods(again)[0].redelivered is True
    assert headers_of(again) == [{"app": "kept", "x-delivery-count": 1}]
    again = client.send(1, commands.Basic.Reject(delivery_tag=2, requeue=True))
    assert headers_of(again) == [{"app": "kept", "x-delivery-count": 2}]


def test_plain_queues_redeliver_the_publishers_bytes_unchanged():
    client = opened_client()
    declare(client, "q")
    consume(client, "q")
    client.publish(1, b"m", routing_key="q")
    again = client.send(1, commands.Basic.Nack(delivery_tag=1, requeue=True))
    assert headers_of(again) == [None]


def test_the_message_past_its_delivery_limit_is_dead_lettered_with_reason_delivery_limit():
    client = opened_client()
    declare(client, "dead")
    declare(client, "q", {"x-delivery-limit": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    client.publish(1, b"poison", routing_key="q")
    for tag in (1, 2):
        client.send(1, commands.Basic.Get(queue="q"))
        client.send(1, commands.Basic.Reject(delivery_tag=tag, requeue=True))
    received = client.send(1, commands.Basic.Get(queue="dead", no_ack=True))
    headers = headers_of(received)[0]
    assert bodies(received) == [b"poison"]
    death = headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", "q", 1)
    assert headers["x-first-death-reason"] == "delivery_limit"


# -- delayed retry ------------------------------------------------------------------------


def test_a_nacked_message_comes_back_after_its_delay_while_the_next_one_is_delivered():
    client = opened_client()
    declare(client, "q", {"x-delayed-retry-type": "failed", "x-delayed-retry-min": 2000})
    consume(client, "q")
    client.publish(1, b"slow", routing_key="q")
    assert client.send(1, commands.Basic.Nack(delivery_tag=1, requeue=True)) == []
    assert bodies(client.publish(1, b"next", routing_key="q")) == [b"next"]
    assert later(client, 1.5) == []
    received = later(client, 2.1)
    assert bodies(received) == [b"slow"]
    assert headers_of(received) == [{"x-delivery-count": 1}]


def test_messages_a_closed_channel_left_unacked_wait_with_retry_type_returned():
    broker = Broker()
    client = opened_client(broker, channels=(1, 2))
    declare(client, "q", {"x-delayed-retry-type": "returned", "x-delayed-retry-min": 1000})
    consume(client, "q", channel=1)
    client.publish(2, b"m", routing_key="q")
    client.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    queue = broker.vhosts["/"].queues["q"]
    assert (queue.message_count, queue.waiting_count) == (0, 1)
    later(client, 1.1)
    assert (queue.message_count, queue.waiting_count) == (1, 0)


# -- single active consumer ----------------------------------------------------------------


def test_basic_get_on_a_single_active_consumer_queue_is_refused_with_405():
    client = opened_client()
    declare(client, "sac", {"x-single-active-consumer": True})
    close = client.call(1, commands.Basic.Get(queue="sac"))
    assert isinstance(close, commands.Channel.Close)
    assert close.reply_code == 405
    assert close.reply_text == (
        "RESOURCE_LOCKED - cannot obtain access to locked queue 'sac' in vhost '/'. "
        "basic.get operations are not supported by quorum queues with single active consumer"
    )


def test_only_the_first_consumer_receives_and_the_next_takes_over_with_its_unacked():
    client = opened_client(channels=(1, 2, 3))
    declare(client, "sac", {"x-single-active-consumer": True})
    consume(client, "sac", tag="first", channel=1)
    consume(client, "sac", tag="second", channel=2)
    for n in range(3):
        delivered = client.publish(3, b"%d" % n, routing_key="sac")
        assert [m.consumer_tag for m in methods(delivered)] == ["first"]
    taken_over = client.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    deliveries = [m for m in methods(taken_over) if isinstance(m, commands.Basic.Deliver)]
    assert [m.consumer_tag for m in deliveries] == ["second"] * 3
    assert bodies(taken_over) == [b"0", b"1", b"2"]


# -- consumer timeout ---------------------------------------------------------------------


def test_a_timed_out_delivery_is_requeued_and_only_its_consumer_is_cancelled():
    client = opened_client()
    declare(client, "q", {"x-consumer-timeout": 1000})
    consume(client, "q", tag="slow")
    client.publish(1, b"job", routing_key="q")
    assert later(client, 0.5) == []
    received = later(client, 1.1)
    assert [type(m) for m in methods(received)] == [commands.Basic.Cancel]
    assert methods(received)[0].consumer_tag == "slow"
    # The channel lives on: a new consumer gets the message, redelivered.
    again = consume(client, "q", tag="fresh")
    deliver = [m for m in methods(again) if isinstance(m, commands.Basic.Deliver)][0]
    assert (deliver.consumer_tag, deliver.redelivered) == ("fresh", True)
    # The slow worker's late ack of its old tag is ignored, not a 406.
    assert client.send(1, commands.Basic.Ack(delivery_tag=1)) == []
    assert client.send(1, commands.Basic.Ack(delivery_tag=deliver.delivery_tag)) == []


def test_a_consumer_argument_sets_its_own_timeout():
    client = opened_client()
    declare(client, "q")
    consume(client, "q", tag="c", arguments={"x-consumer-timeout": 500})
    client.publish(1, b"job", routing_key="q")
    assert [type(m) for m in methods(later(client, 0.6))] == [commands.Basic.Cancel]


def test_acked_deliveries_never_time_out():
    client = opened_client()
    declare(client, "q", {"x-consumer-timeout": 1000})
    consume(client, "q")
    client.publish(1, b"job", routing_key="q")
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    assert later(client, 5) == []


def test_a_client_without_consumer_cancel_notify_gets_rabbitmqs_channel_close():
    client = FakeClient()
    client.start()
    client.start_ok(capabilities={k: v for k, v in CLIENT_CAPABILITIES.items() if k != "consumer_cancel_notify"})
    client.send(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0))
    client.send(0, commands.Connection.Open(virtual_host="/"))
    client.open_channel(1)
    declare(client, "q", {"x-consumer-timeout": 1000})
    consume(client, "q")
    client.publish(1, b"job", routing_key="q")
    close = methods(later(client, 1.5))[0]
    assert isinstance(close, commands.Channel.Close)
    assert close.reply_code == 406
    assert close.reply_text.startswith("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out.")
    assert client.broker.vhosts["/"].queues["q"].message_count == 1


# -- deduplication -------------------------------------------------------------------------


def test_a_duplicate_is_confirmed_but_not_enqueued():
    client = opened_client()
    declare(client, "q", {"x-message-deduplication": True})
    client.send(1, commands.Confirm.Select())
    confirms = []
    for body, message_id in ((b"one", "order-1"), (b"copy", "order-1"), (b"two", "order-2")):
        properties = commands.Basic.Properties(message_id=message_id)
        confirms += methods(client.publish(1, body, routing_key="q", properties=properties))
    assert [(type(m), m.delivery_tag) for m in confirms] == [(commands.Basic.Ack, tag) for tag in (1, 2, 3)]
    queue = client.broker.vhosts["/"].queues["q"]
    assert queue.message_count == 2
    assert [e.message.body for e in queue.ready.peek(5)] == [b"one", b"two"]


# -- x-delayed-message ----------------------------------------------------------------------


def test_a_delayed_exchange_needs_x_delayed_type():
    client = opened_client()
    close = client.call(1, commands.Exchange.Declare(exchange="d", exchange_type="x-delayed-message"))
    assert (close.reply_code, close.reply_text) == (
        406, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"
    )


def test_a_delayed_exchange_of_an_unknown_type_is_a_command_invalid():
    client = opened_client()
    close = client.call(
        1, commands.Exchange.Declare(exchange="d", exchange_type="x-delayed-message", arguments={"x-delayed-type": "nope"})
    )
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (503, "COMMAND_INVALID - unknown exchange type 'nope'")


def delayed_setup(client, delayed_type: str = "direct") -> None:
    client.call(
        1,
        commands.Exchange.Declare(
            exchange="d", exchange_type="x-delayed-message", arguments={"x-delayed-type": delayed_type}
        ),
    )
    declare(client, "q")
    client.call(1, commands.Queue.Bind(queue="q", exchange="d", routing_key="k"))


def test_a_message_with_x_delay_is_routed_when_its_delay_has_passed_with_x_delay_negated():
    client = opened_client()
    delayed_setup(client)
    queue = client.broker.vhosts["/"].queues["q"]
    client.publish(1, b"later", exchange="d", routing_key="k", properties=commands.Basic.Properties(headers={"x-delay": 3000}))
    client.publish(1, b"now", exchange="d", routing_key="k")
    assert [e.message.body for e in queue.ready.peek(5)] == [b"now"]
    later(client, 2.5)
    assert queue.message_count == 1
    later(client, 3.1)
    entries = queue.ready.peek(5)
    assert [e.message.body for e in entries] == [b"now", b"later"]
    assert entries[1].message.headers == {"x-delay": -3000}


def test_delays_beyond_49_days_are_held_not_overflowed():
    client = opened_client()
    delayed_setup(client, "topic")
    sixty_days = 60 * 24 * 3600 * 1000
    client.publish(1, b"far", exchange="d", routing_key="k", properties=commands.Basic.Properties(headers={"x-delay": sixty_days}))
    exchange = client.broker.vhosts["/"].exchanges["d"]
    queue = client.broker.vhosts["/"].queues["q"]
    assert len(exchange.pending) == 1
    later(client, 50 * 24 * 3600)
    assert queue.message_count == 0
    later(client, 60 * 24 * 3600 + 1)
    assert queue.message_count == 1


def test_deleting_a_delayed_exchange_drops_its_pending_messages():
    client = opened_client()
    delayed_setup(client)
    client.publish(1, b"later", exchange="d", routing_key="k", properties=commands.Basic.Properties(headers={"x-delay": 100}))
    assert len(client.broker.vhosts["/"].exchanges["d"].pending) == 1  # it was held, so the delete has something to drop
    client.call(1, commands.Exchange.Delete(exchange="d"))
    later(client, 1)
    assert client.broker.vhosts["/"].queues["q"].message_count == 0


def test_a_message_reaching_a_delayed_exchange_over_an_exchange_binding_is_delayed_too():
    client = opened_client()
    delayed_setup(client)
    client.call(1, commands.Exchange.Declare(exchange="front", exchange_type="fanout"))
    client.call(1, commands.Exchange.Bind(destination="d", source="front", routing_key=""))
    queue = client.broker.vhosts["/"].queues["q"]
    client.publish(1, b"via-front", exchange="front", routing_key="k",
                   properties=commands.Basic.Properties(headers={"x-delay": 1000}))
    assert queue.message_count == 0
    later(client, 1.1)
    assert queue.message_count == 1


def test_dead_lettering_into_a_delayed_exchange_delays_every_message():
    # The plugin delays only the first of several nacked messages (its issue #52).
    client = opened_client()
    delayed_setup(client)
    declare(client, "work", {"x-dead-letter-exchange": "d", "x-dead-letter-routing-key": "k"})
    for n in range(3):
        client.publish(1, b"%d" % n, routing_key="work", properties=commands.Basic.Properties(headers={"x-delay": 1000}))
    for _ in range(3):
        client.send(1, commands.Basic.Get(queue="work"))
    client.send(1, commands.Basic.Nack(delivery_tag=3, multiple=True, requeue=False))
    queue = client.broker.vhosts["/"].queues["q"]
    assert queue.message_count == 0
    later(client, 1.1)
    assert [e.message.body for e in queue.ready.peek(5)] == [b"0", b"1", b"2"]
