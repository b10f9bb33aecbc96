"""A virtual host's declare, delete, bind and route rules, with RabbitMQ's codes and texts."""

from __future__ import annotations

import struct

import pytest

from amqp_server.wire.errors import AMQPError
from amqp_server.broker.vhost import VirtualHost
from queues.consumer import Consumer
from queues.message import Message


def message(routing_key: str, body: bytes = b"m") -> Message:
    return Message("", routing_key, struct.pack(">HHQH", 60, 0, len(body), 0), body)


def refused(call, *args, **kwargs) -> AMQPError:
    with pytest.raises(AMQPError) as raised:
        call(*args, **kwargs)
    return raised.value


OWNER, OTHER = object(), object()


@pytest.fixture
def vhost() -> VirtualHost:
    return VirtualHost("/")


def routed_names(vhost: VirtualHost, exchange: str, key: str) -> set[str]:
    return {queue.name for queue in vhost.route(vhost.exchanges[exchange], message(key))}


def test_standard_exchanges_are_predeclared(vhost):
    for name, type_name in (("", "direct"), ("amq.direct", "direct"), ("amq.fanout", "fanout"),
                            ("amq.topic", "topic"), ("amq.headers", "headers"), ("amq.match", "headers")):
        assert vhost.exchanges[name].type_name == type_name
    assert vhost.exchanges["amq.rabbitmq.trace"].internal


def test_default_exchange_routes_to_the_queue_named_by_the_key(vhost):
    vhost.declare_queue("orders", connection=OWNER)
    assert routed_names(vhost, "", "orders") == {"orders"}
    assert routed_names(vhost, "", "missing") == set()


def test_declaring_an_amq_exchange_gives_403(vhost):
    error = refused(vhost.declare_exchange, "amq.custom", "direct")
    assert (error.code, error.reply_text) == (403, "ACCESS_REFUSED - exchange name 'amq.custom' contains reserved prefix 'amq.*'")


def test_declaring_an_amq_queue_gives_403(vhost):
    error = refused(vhost.declare_queue, "amq.mine", connection=OWNER)
    assert error.code == 403


def test_redeclaring_an_exchange_with_another_type_gives_406(vhost):
    vhost.declare_exchange("e", "direct")
    error = refused(vhost.declare_exchange, "e", "fanout")
    assert error.code == 406
    assert error.reply_text == (
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'e' in vhost '/': "
        "received 'fanout' but current is 'direct'"
    )


def test_redeclaring_an_equivalent_exchange_returns_the_same_one(vhost):
    first = vhost.declare_exchange("e", "topic", durable=True)
    assert vhost.declare_exchange("e", "topic", durable=True) is first


def test_redeclaring_a_queue_with_other_durability_gives_406(vhost):
    vhost.declare_queue("q", connection=OWNER, durable=True)
    error = refused(vhost.declare_queue, "q", connection=OWNER, durable=False)
    assert error.reply_text == (
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': "
        "received 'false' but current is 'true'"
    )


def test_classic_queue_type_and_no_queue_type_redeclare_each_other_as_in_rabbitmq(vhost):
    typed = vhost.declare_queue("typed", connection=OWNER, arguments={"x-queue-type": "classic"})[0]
    assert vhost.declare_queue("typed", connection=OWNER)[0] is typed
    untyped = vhost.declare_queue("untyped", connection=OWNER)[0]
    assert vhost.declare_queue("untyped", connection=OWNER, arguments={"x-queue-type": "classic"})[0] is untyped
    error = refused(vhost.declare_queue, "untyped", connection=OWNER, arguments={"x-queue-type": "quorum"})
    assert error.code == 406 and "inequivalent arg 'x-queue-type'" in error.reply_text


def test_redeclaring_a_queue_with_another_x_argument_gives_406(vhost):
    vhost.declare_queue("q", connection=OWNER, arguments={"x-max-length": 10})
    error = refused(vhost.declare_queue, "q", connection=OWNER, arguments={"x-max-length": 20})
    assert error.code == 406
    assert "inequivalent arg 'x-max-length'" in error.reply_text


def test_redeclaring_a_queue_reports_it_was_not_created(vhost):
    queue, created = vhost.declare_queue("q", connection=OWNER)
    assert created
    assert vhost.declare_queue("q", connection=OWNER) == (queue, False)


def test_passive_declare_of_a_missing_queue_gives_404(vhost):
    error = refused(vhost.declare_queue, "nope", connection=OWNER, passive=True)
    assert (error.code, error.reply_text) == (404, "NOT_FOUND - no queue 'nope' in vhost '/'")


def test_an_exclusive_queue_is_locked_to_other_connections(vhost):
    vhost.declare_queue("mine", connection=OWNER, exclusive=True)
    assert refused(vhost.declare_queue, "mine", connection=OTHER, exclusive=True).code == 405
    assert refused(vhost.queue, "mine", OTHER).code == 405
    assert vhost.queue("mine", OWNER).name == "mine"


def test_deleting_a_queue_removes_its_bindings(vhost):
    queue, _ = vhost.declare_queue("q", connection=OWNER)
    vhost.bind(vhost.exchanges["amq.topic"], queue, "#", {})
    vhost.delete_queue(queue)
    assert routed_names(vhost, "amq.topic", "any") == set()
    assert vhost.exchanges["amq.topic"].binding_count() == 0
    assert vhost.bindings() == []


def test_deleting_a_queue_tells_its_consumers(vhost):
    queue, _ = vhost.declare_queue("q", connection=OWNER)

    class Sink:
        def __init__(self) -> None:
            self.cancelled: list[str] = []

        def can_deliver(self) -> bool:
            return True

        def deliver(self, consumer, entry) -> None:
            pass

        def consumer_cancelled(self, consumer) -> None:
            self.cancelled.append(consumer.tag)

    sink = Sink()
    queue.add_consumer(Consumer("c1", queue, sink, no_ack=True))
    vhost.delete_queue(queue)
    assert sink.cancelled == ["c1"]
    assert "q" not in vhost.queues


def test_binding_to_the_default_exchange_gives_403(vhost):
    queue, _ = vhost.declare_queue("q", connection=OWNER)
    error = refused(vhost.bind, vhost.default_exchange, queue, "q", {})
    assert (error.code, error.reply_text) == (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_exchange_to_exchange_bindings_route_through(vhost):
    upstream = vhost.declare_exchange("up", "fanout")
    downstream = vhost.declare_exchange("down", "direct")
    queue, _ = vhost.declare_queue("q", connection=OWNER)
    vhost.bind(upstream, downstream, "", {})
    vhost.bind(downstream, queue, "k", {})
    assert routed_names(vhost, "up", "k") == {"q"}
    assert routed_names(vhost, "up", "other") == set()


def test_an_exchange_binding_cycle_delivers_once(vhost):
    a = vhost.declare_exchange("a", "fanout")
    b = vhost.declare_exchange("b", "fanout")
    queue, _ = vhost.declare_queue("q", connection=OWNER)
    vhost.bind(a, b, "", {})
    vhost.bind(b, a, "", {})
    vhost.bind(b, queue, "", {})
    assert list(vhost.route(a, message("k"))) == [queue]


def test_unroutable_messages_go_to_the_alternate_exchange(vhost):
    vhost.declare_exchange("ae", "fanout")
    main = vhost.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    caught, _ = vhost.declare_queue("caught", connection=OWNER)
    bound, _ = vhost.declare_queue("bound", connection=OWNER)
    vhost.bind(vhost.exchanges["ae"], caught, "", {})
    vhost.bind(main, bound, "known", {})
    assert routed_names(vhost, "main", "known") == {"bound"}
    assert routed_names(vhost, "main", "unknown") == {"caught"}


def test_an_auto_delete_exchange_goes_with_its_last_binding(vhost):
    exchange = vhost.declare_exchange("temp", "direct", auto_delete=True)
    queue, _ = vhost.declare_queue("q", connection=OWNER)
    vhost.bind(exchange, queue, "a", {})
    vhost.bind(exchange, queue, "b", {})
    vhost.unbind(exchange, queue, "a", {})
    assert "temp" in vhost.exchanges
    vhost.unbind(exchange, queue, "b", {})
    assert "temp" not in vhost.exchanges


def test_deleting_a_system_exchange_gives_403(vhost):
    error = refused(vhost.delete_exchange, "amq.direct")
    assert (error.code, error.reply_text) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"
    )
    assert refused(vhost.delete_exchange, "").code == 403


def test_deleting_a_missing_exchange_is_not_an_error(vhost):
    vhost.delete_exchange("never-declared")


def test_deleting_an_exchange_in_use_with_if_unused_gives_406(vhost):
    exchange = vhost.declare_exchange("busy", "fanout")
    queue, _ = vhost.declare_queue("q", connection=OWNER)
    vhost.bind(exchange, queue, "", {})
    error = refused(vhost.delete_exchange, "busy", if_unused=True)
    assert (error.code, error.reply_text) == (406, "PRECONDITION_FAILED - exchange 'busy' in vhost '/' in use")


def test_only_durable_changes_are_reported_for_saving(vhost):
    changes: list[tuple[str, str, bool]] = []
    vhost.on_durable_change = lambda kind, entry, present: changes.append((kind, entry.get("name", ""), present))
    vhost.declare_queue("transient", connection=OWNER)
    vhost.declare_exchange("transient-ex", "direct")
    exclusive, _ = vhost.declare_queue("mine", connection=OWNER, durable=True, exclusive=True)
    vhost.bind(vhost.exchange("amq.direct"), exclusive, "k", {})
    assert changes == []
    durable_queue, _ = vhost.declare_queue("kept", connection=OWNER, durable=True)
    durable_exchange = vhost.declare_exchange("kept-ex", "direct", durable=True)
    vhost.bind(durable_exchange, durable_queue, "k", {})
    assert changes == [("queues", "kept", True), ("exchanges", "kept-ex", True), ("bindings", "", True)]
    definitions = vhost.durable_definitions()
    assert [q["name"] for q in definitions["queues"]] == ["kept"]
    assert [e["name"] for e in definitions["exchanges"]] == ["kept-ex"]
    assert [(b["source"], b["destination"], b["routing_key"]) for b in definitions["bindings"]] == [("kept-ex", "kept", "k")]
    vhost.unbind(durable_exchange, durable_queue, "k", {})
    vhost.delete_queue(durable_queue)
    assert changes[3:] == [("bindings", "", False), ("queues", "kept", False)]
