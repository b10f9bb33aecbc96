"""Routing through every exchange type, as a pika user sees it.

Publishes go through a confirm-mode channel: once a publish is confirmed the
broker has routed it, so basic.get afterwards shows exactly where it went and
an empty queue really means "not routed" (no waiting needed).
"""

from __future__ import annotations

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

from interop_tests.pika_helpers import connect, drain
from interop_tests.pika_helpers import connection  # noqa: F401  (a fixture)


def private_queue(channel: BlockingChannel) -> str:
    return channel.queue_declare("", exclusive=True).method.queue


@pytest.fixture
def channel(connection):
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def test_direct_exchange_routes_on_exact_routing_key(channel, unique):
    exchange = unique("direct")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    only_a, only_b, both = (private_queue(channel) for _ in range(3))
    channel.queue_bind(only_a, exchange, "a")
    channel.queue_bind(only_b, exchange, "b")
    channel.queue_bind(both, exchange, "a")
    channel.queue_bind(both, exchange, "b")

    for key in ("a", "b", "c", "A"):
        channel.basic_publish(exchange, key, key.encode())

    assert drain(channel, only_a) == [b"a"]
    assert drain(channel, only_b) == [b"b"]
    assert drain(channel, both) == [b"a", b"b"]


def test_direct_exchange_delivers_once_per_queue_even_with_duplicate_bindings(channel, unique):
    exchange = unique("direct")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    queue = private_queue(channel)
    channel.queue_bind(queue, exchange, "k")
    channel.queue_bind(queue, exchange, "k")  # idempotent

    channel.basic_publish(exchange, "k", b"once")

    assert drain(channel, queue) == [b"once"]


def test_fanout_exchange_ignores_routing_key(channel, unique):
    exchange = unique("fanout")
    channel.exchange_declare(exchange, "fanout", auto_delete=True)
    first, second = private_queue(channel), private_queue(channel)
    channel.queue_bind(first, exchange, "ignored")
    channel.queue_bind(second, exchange, "")

    channel.basic_publish(exchange, "whatever", b"m1")
    channel.basic_publish(exchange, "", b"m2")

    assert drain(channel, first) == [b"m1", b"m2"]
    assert drain(channel, second) == [b"m1", b"m2"]


TOPIC_CASES = {
    # binding key -> routing keys (published in this order) that must reach it
    "*.orange.*": ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"],
    "*.*.rabbit": ["quick.orange.rabbit", "lazy.pink.rabbit"],
    "lazy.#": ["lazy.orange.elephant", "lazy.brown.fox", "lazy.pink.rabbit", "lazy", "lazy.orange.male.rabbit"],
    "a.#.z": ["a.z", "a.b.c.z"],
    "#.b": ["b", "x.b", "a.b"],
    "#": None,  # everything, including the empty routing key
    "": [""],
    "quick.brown.fox": ["quick.brown.fox"],
}
TOPIC_ROUTING_KEYS = [
    "quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox", "lazy.brown.fox",
    "lazy.pink.rabbit", "quick.brown.fox", "orange", "quick.orange.male.rabbit",
    "lazy.orange.male.rabbit", "lazy", "a.z", "a.b.c.z", "b", "x.b", "a.b", "",
]


def test_topic_exchange_star_matches_one_word_and_hash_matches_zero_or_more(channel, unique):
    exchange = unique("topic")
    channel.exchange_declare(exchange, "topic", auto_delete=True)
    queues = {}
    for binding_key in TOPIC_CASES:
        queues[binding_key] = private_queue(channel)
        channel.queue_bind(queues[binding_key], exchange, binding_key)

    for routing_key in TOPIC_ROUTING_KEYS:
        channel.basic_publish(exchange, routing_key, routing_key.encode())

    for binding_key, expected in TOPIC_CASES.items():
        wanted = TOPIC_ROUTING_KEYS if expected is None else [k for k in TOPIC_ROUTING_KEYS if k in expected]
        assert drain(channel, queues[binding_key]) == [k.encode() for k in wanted], binding_key


def test_topic_exchange_delivers_once_when_several_bindings_match(channel, unique):
    exchange = unique("topic")
    channel.exchange_declare(exchange, "topic", auto_delete=True)
    queue = private_queue(channel)
    for binding_key in ("a.*", "*.b", "#"):
        channel.queue_bind(queue, exchange, binding_key)

    channel.basic_publish(exchange, "a.b", b"one copy")

    assert drain(channel, queue) == [b"one copy"]


def publish_with_headers(channel: BlockingChannel, exchange: str, headers: dict, body: bytes) -> None:
    channel.basic_publish(exchange, "ignored", body, pika.BasicProperties(headers=headers))


def test_headers_exchange_x_match_all_and_any(channel, unique):
    exchange = unique("headers")
    channel.exchange_declare(exchange, "headers", auto_delete=True)
    match_all, match_any, default_all = (private_queue(channel) for _ in range(3))
    channel.queue_bind(match_all, exchange, "", {"x-match": "all", "format": "pdf", "type": "report"})
    channel.queue_bind(match_any, exchange, "", {"x-match": "any", "format": "pdf", "type": "report"})
    channel.queue_bind(default_all, exchange, "", {"format": "pdf", "type": "report"})  # x-match defaults to all

    publish_with_headers(channel, exchange, {"format": "pdf", "type": "report"}, b"both")
    publish_with_headers(channel, exchange, {"format": "pdf", "type": "report", "extra": 1}, b"both+extra")
    publish_with_headers(channel, exchange, {"format": "pdf"}, b"format only")
    publish_with_headers(channel, exchange, {"type": "report", "format": "zip"}, b"type only")
    publish_with_headers(channel, exchange, {"other": "x"}, b"neither")
    publish_with_headers(channel, exchange, {}, b"no headers")

    assert drain(channel, match_all) == [b"both", b"both+extra"]
    assert drain(channel, default_all) == [b"both", b"both+extra"]
    assert drain(channel, match_any) == [b"both", b"both+extra", b"format only", b"type only"]


def test_headers_exchange_compares_values_not_just_keys(channel, unique):
    exchange = unique("headers")
    channel.exchange_declare(exchange, "headers", auto_delete=True)
    queue = private_queue(channel)
    channel.queue_bind(queue, exchange, "", {"x-match": "all", "count": 3})

    publish_with_headers(channel, exchange, {"count": 3}, b"three")
    publish_with_headers(channel, exchange, {"count": 4}, b"four")

    assert drain(channel, queue) == [b"three"]


def test_default_exchange_routes_to_the_queue_named_by_the_routing_key(channel, unique):
    queue = unique("default-x")
    channel.queue_declare(queue, exclusive=True)

    channel.basic_publish("", queue, b"direct to queue")
    channel.basic_publish("", unique("no-such-queue"), b"dropped")

    assert drain(channel, queue) == [b"direct to queue"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
     ("amq.headers", "headers"), ("amq.match", "headers")],
)
def test_predeclared_amq_exchanges_exist_with_their_type(channel, name, kind):
    channel.exchange_declare(name, passive=True)
    # Redeclaring with the same type and durable=True is equivalent, so it succeeds.
    channel.exchange_declare(name, kind, durable=True)
    queue = private_queue(channel)
    if kind == "headers":
        channel.queue_bind(queue, name, "", {"x-match": "all", "route": queue})
        publish_with_headers(channel, name, {"route": queue}, b"via " + name.encode())
    else:
        channel.queue_bind(queue, name, queue if kind != "topic" else f"{queue}.#")
        channel.basic_publish(name, queue, b"via " + name.encode())

    assert drain(channel, queue) == [b"via " + name.encode()]


def test_exchange_to_exchange_binding_forwards_and_unbind_stops_it(channel, unique):
    source, destination = unique("e2e-src"), unique("e2e-dst")
    # Not auto-delete: removing its last binding would delete an auto-delete source.
    channel.exchange_declare(source, "topic")
    channel.exchange_declare(destination, "fanout", auto_delete=True)
    queue = private_queue(channel)
    channel.queue_bind(queue, destination)
    channel.exchange_bind(destination, source, "orders.*")
    try:
        channel.basic_publish(source, "orders.new", b"forwarded")
        channel.basic_publish(source, "invoices.new", b"not matching")
        channel.exchange_unbind(destination, source, "orders.*")
        channel.basic_publish(source, "orders.new", b"after unbind")

        assert drain(channel, queue) == [b"forwarded"]
    finally:
        channel.exchange_delete(source)


def test_auto_delete_source_exchange_goes_away_with_its_last_exchange_binding(broker, channel, unique):
    source, destination = unique("e2e-src"), unique("e2e-dst")
    channel.exchange_declare(source, "fanout", auto_delete=True)
    channel.exchange_declare(destination, "fanout")
    try:
        channel.exchange_bind(destination, source)
        channel.exchange_unbind(destination, source)

        with pytest.raises(ChannelClosedByBroker) as error:
            channel.exchange_declare(source, passive=True)
        assert error.value.reply_code == 404
        assert error.value.reply_text == f"NOT_FOUND - no exchange '{source}' in vhost '/'"
    finally:
        with connect(broker) as cleanup:
            cleanup.channel().exchange_delete(destination)


def test_exchange_to_exchange_bindings_deliver_once_through_a_diamond(channel, unique):
    top, left, right = unique("top"), unique("left"), unique("right")
    for name in (top, left, right):
        channel.exchange_declare(name, "fanout", auto_delete=True)
    channel.exchange_bind(left, top)
    channel.exchange_bind(right, top)
    queue = private_queue(channel)
    channel.queue_bind(queue, left)
    channel.queue_bind(queue, right)

    channel.basic_publish(top, "", b"diamond")

    assert drain(channel, queue) == [b"diamond"]


def test_alternate_exchange_receives_messages_the_exchange_cannot_route(channel, unique):
    main, alternate = unique("main"), unique("ae")
    channel.exchange_declare(alternate, "fanout", auto_delete=True)
    channel.exchange_declare(main, "direct", auto_delete=True, arguments={"alternate-exchange": alternate})
    routed, unrouted = private_queue(channel), private_queue(channel)
    channel.queue_bind(routed, main, "known")
    channel.queue_bind(unrouted, alternate)

    channel.basic_publish(main, "known", b"routed")
    channel.basic_publish(main, "unknown", b"to alternate")

    assert drain(channel, routed) == [b"routed"]
    assert drain(channel, unrouted) == [b"to alternate"]


def test_alternate_exchange_that_does_not_exist_just_drops_the_message(channel, unique):
    main = unique("main")
    channel.exchange_declare(main, "direct", auto_delete=True, arguments={"alternate-exchange": unique("missing-ae")})
    queue = private_queue(channel)
    channel.queue_bind(queue, main, "known")

    channel.basic_publish(main, "unknown", b"dropped")  # confirmed, no error
    channel.basic_publish(main, "known", b"kept")

    assert drain(channel, queue) == [b"kept"]


def test_internal_exchange_refuses_direct_publish_but_routes_via_binding(channel, unique):
    internal, front = unique("internal"), unique("front")
    channel.exchange_declare(internal, "fanout", auto_delete=True, internal=True)
    channel.exchange_declare(front, "fanout", auto_delete=True)
    channel.exchange_bind(internal, front)
    queue = private_queue(channel)
    channel.queue_bind(queue, internal)

    channel.basic_publish(front, "", b"through the front")
    assert drain(channel, queue) == [b"through the front"]

    with pytest.raises(ChannelClosedByBroker) as error:
        channel.basic_publish(internal, "", b"straight in")
    assert error.value.reply_code == 403
    assert error.value.reply_text == f"ACCESS_REFUSED - cannot publish to internal exchange '{internal}' in vhost '/'"


def test_amq_rabbitmq_trace_is_internal(channel):
    with pytest.raises(ChannelClosedByBroker) as error:
        channel.basic_publish("amq.rabbitmq.trace", "k", b"x")
    assert error.value.reply_code == 403
    assert error.value.reply_text == "ACCESS_REFUSED - cannot publish to internal exchange 'amq.rabbitmq.trace' in vhost '/'"


def test_auto_delete_exchange_goes_away_when_its_last_binding_is_removed(broker, channel, unique):
    exchange = unique("autodel-x")
    channel.exchange_declare(exchange, "direct", auto_delete=True)
    queue = private_queue(channel)
    channel.queue_bind(queue, exchange, "k")
    channel.queue_unbind(queue, exchange, "k")

    with connect(broker) as other:
        probe = other.channel()
        with pytest.raises(ChannelClosedByBroker) as error:
            probe.exchange_declare(exchange, passive=True)
    assert error.value.reply_code == 404
    assert error.value.reply_text == f"NOT_FOUND - no exchange '{exchange}' in vhost '/'"
