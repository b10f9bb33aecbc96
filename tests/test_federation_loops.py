"""Loop prevention in federation: x-received-from on messages, x-bound-from on bindings, max-hops,
and the x-federation-upstream exchange type a downstream declares here (RabbitMQ 3.10.8's rules,
headers as 3.10.8 wrote them in a federation between two RabbitMQ nodes)."""

from __future__ import annotations

import pytest
from pamqp import commands

from amqp_server.broker.vhost import VirtualHost
from amqp_server.federation.bindings import (
    BIND,
    UNBIND,
    BindingMirror,
    internal_exchange_name,
    other_suffix,
    upstream_queue_name,
)
from amqp_server.federation.message_headers import exchange_forward, queue_forward
from amqp_server.federation.loops import binding_hops, exchange_hop, queue_hop, should_forward
from amqp_server.wire.errors import AMQPError
from exchanges.federation_upstream import FederationUpstreamExchange
from queues.message import content_header, decode_properties

# What a message published on RabbitMQ node fedra reached fedrb with (3.10.8).
RABBITMQ_HOP = {"cluster-name": "fedra@vm", "exchange": "fed.x", "redelivered": False,
                "uri": "amqp://127.0.0.1:5771", "vhost": "/"}


def test_a_hop_is_prepended_as_rabbitmq_writes_it():
    headers = exchange_hop({"h": 1}, "amqp://127.0.0.1:5771", "fed.x", False, "fedra@vm", "/")
    assert headers == {"h": 1, "x-received-from": [RABBITMQ_HOP]}
    again = exchange_hop(headers, "amqp://b", "fed.x", True, None, "/")
    assert again["x-received-from"] == [{"uri": "amqp://b", "exchange": "fed.x", "redelivered": True, "vhost": "/"},
                                        RABBITMQ_HOP]
    assert headers["x-received-from"] == [RABBITMQ_HOP], "the original headers are not changed"


def test_a_header_that_is_not_a_list_moves_aside():
    headers = exchange_hop({"x-received-from": "junk"}, "amqp://a", "x", False, "c", "/")
    assert headers["x-invalid-headers"] == {"x-received-from": "junk"}
    assert len(headers["x-received-from"]) == 1


@pytest.mark.parametrize("headers, max_hops, forward", [
    (None, 1, True),
    ({}, 1, True),
    ({"x-received-from": [RABBITMQ_HOP]}, 1, False),  # one link crossed: max-hops 1 reached
    ({"x-received-from": [RABBITMQ_HOP]}, 2, True),
    ({"x-received-from": [{**RABBITMQ_HOP, "cluster-name": "down"}]}, 5, False),  # it came from there
    ({"x-received-from": [{**RABBITMQ_HOP, "cluster-name": b"down"}]}, 5, False),  # bytes from the codec
    ({"x-received-from": [{**RABBITMQ_HOP, "cluster-name": "down", "vhost": "other"}]}, 5, True),
])
def test_should_forward_counts_hops_and_refuses_to_return(headers, max_hops, forward):
    assert should_forward(headers, max_hops, "down", "/") is forward


def test_the_upstream_exchange_type_routes_like_fanout_but_drops_loops():
    exchange = FederationUpstreamExchange("federation: x -> down B", arguments={
        "x-max-hops": 1, "x-downstream-name": "down", "x-downstream-vhost": "/"})
    exchange.bind("queue", "", {})
    assert list(exchange.route("any", None)) == ["queue"]
    assert list(exchange.route("any", {"x-received-from": [RABBITMQ_HOP]})) == []  # max-hops 1
    two = FederationUpstreamExchange("e", arguments={"x-max-hops": 2, "x-downstream-name": "down",
                                                     "x-downstream-vhost": "/"})
    two.bind("queue", "", {})
    assert list(two.route("k", {"x-received-from": [RABBITMQ_HOP]})) == ["queue"]
    assert list(two.route("k", {"x-received-from": [{**RABBITMQ_HOP, "cluster-name": "down"}]})) == []


def test_declaring_the_upstream_exchange_needs_max_hops():
    vhost = VirtualHost("/")
    with pytest.raises(AMQPError) as refused:
        vhost.declare_exchange("e", "x-federation-upstream")
    assert (refused.value.code, refused.value.explanation) == (406, "Argument x-max-hops missing")
    exchange = vhost.declare_exchange("e", "x-federation-upstream", internal=True, auto_delete=True,
                                      durable=True, arguments={"x-max-hops": 1})
    assert exchange.type_name == "x-federation-upstream"


def test_names_on_the_upstream_are_rabbitmqs():
    assert upstream_queue_name("fed.x", "/", "fedrb@vm", "/", "fed.x") == "federation: fed.x -> fedrb@vm"
    assert upstream_queue_name("up.x", "/", "c", "/", "fed.x") == "federation: up.x -> c:fed.x"
    assert upstream_queue_name("fed.x", "/", "c", "v2", "fed.x") == "federation: fed.x -> c:v2:fed.x"
    assert internal_exchange_name("federation: fed.x -> fedrb@vm", "B") == "federation: fed.x -> fedrb@vm B"
    assert other_suffix("A") == "B" and other_suffix("B") == "A"


def mirror(max_hops=1, upstream_cluster="up"):
    return BindingMirror(max_hops=max_hops, cluster_name="fedrb@vm", vhost="/", exchange="fed.x", suffix="B",
                         upstream_cluster=upstream_cluster, upstream_vhost="/")


def test_a_binding_goes_upstream_once_per_key_and_arguments():
    bindings = mirror()
    first = bindings.added("q1", "a.#", {})
    # what RabbitMQ 3.10.8 bound upstream for a binding "a.#" of fed.x on fedrb
    assert first is not None and first.action == BIND and first.routing_key == "a.#"
    assert first.arguments == {"x-bound-from": [{"cluster-name": "fedrb@vm", "vhost": "/", "exchange": "/:fed.x B",
                                                 "hops": 1}]}
    assert bindings.added("q2", "a.#", {}) is None, "a second destination changes nothing upstream"
    assert bindings.added("q2", "a.#", {}) is None
    assert bindings.removed("q1", "a.#", {}) is None, "q2 still needs it"
    last = bindings.removed("q2", "a.#", {})
    assert last is not None and (last.action, last.arguments) == (UNBIND, first.arguments)
    assert bindings.removed("q2", "a.#", {}) is None
    assert bindings.routing_keys == []


def test_bindings_travel_as_far_as_messages_come_back():
    # A --(max_hops 1)--> B --(max_hops 2)--> C: a binding at C reaches B with hops 2, A with 1.
    at_c = {"x-bound-from": [{"cluster-name": "C", "vhost": "/", "exchange": "/:x A", "hops": 2}]}
    assert binding_hops(at_c, 1, "A", "/") == 1
    assert binding_hops(at_c, 5, "A", "/") == 1
    at_b = {"x-bound-from": [{"cluster-name": "B", "vhost": "/", "exchange": "/:x A", "hops": 1}]}
    assert binding_hops(at_b, 5, "A", "/") == 0, "no further"
    assert binding_hops(at_c, 5, "C", "/") == 0, "never back to where it came from"
    chained = mirror(max_hops=3, upstream_cluster="A")
    assert chained.added("internal", "k", at_b) is None
    forwarded = chained.added("internal", "k", at_c)
    assert forwarded is not None and forwarded.arguments["x-bound-from"][0]["hops"] == 1
    assert forwarded.arguments["x-bound-from"][1] == at_c["x-bound-from"][0]


def test_a_queue_hop_counts_visits_and_keeps_the_original_route():
    first = queue_hop({"CC": ["k2"]}, "amqp://up", "q", False, "ex", "key")
    assert first["x-original-exchange"] == "ex" and first["x-original-routing-key"] == "key"
    assert first["x-original-cc"] == ["k2"] and "CC" not in first
    assert first["x-received-from"] == [{"uri": "amqp://up", "queue": "q", "redelivered": False, "visit-count": 1}]
    back = queue_hop(queue_hop(first, "amqp://down", "q", False, "", "q"), "amqp://up", "q", True, "", "q")
    assert back["x-received-from"] == [{"uri": "amqp://up", "queue": "q", "redelivered": True, "visit-count": 2},
                                       {"uri": "amqp://down", "queue": "q", "redelivered": False, "visit-count": 1}]
    assert back["x-original-exchange"] == "ex"


def raw_header(properties: commands.Basic.Properties, size: int = 3) -> bytes:
    return content_header(size, properties.marshal())


def decoded(raw: bytes) -> commands.Basic.Properties:
    return decode_properties(raw[12:])


def test_a_forwarded_message_keeps_its_other_headers_byte_for_byte_and_loses_its_user_id():
    original = raw_header(commands.Basic.Properties(headers={"n": 7, "s": "t"}, user_id="alice", message_id="m1"))
    forwarded = exchange_forward(original, max_hops=1, downstream_name="down", downstream_vhost="/",
                                 uri="amqp://up", exchange="fed.x", redelivered=False, upstream_cluster="up",
                                 upstream_vhost="/", trust_user_id=False)
    assert forwarded is not None
    properties = decoded(forwarded)
    assert properties.user_id is None and properties.message_id == "m1"
    assert properties.headers["n"] == 7 and properties.headers["s"] == "t"
    assert properties.headers["x-received-from"] == [{"uri": "amqp://up", "exchange": "fed.x", "redelivered": False,
                                                      "cluster-name": "up", "vhost": "/"}]
    assert forwarded[:4] == original[:4] and forwarded[4:12] == original[4:12], "class, weight and body size kept"
    # the next link (max-hops 1) drops it; one with max-hops 2 takes it, but not back to "up"
    options = dict(downstream_vhost="/", uri="amqp://b", exchange="fed.x", redelivered=False,
                   upstream_cluster="b", upstream_vhost="/", trust_user_id=True)
    assert exchange_forward(forwarded, max_hops=1, downstream_name="c", **options) is None
    assert exchange_forward(forwarded, max_hops=2, downstream_name="up", **options) is None
    again = exchange_forward(forwarded, max_hops=2, downstream_name="c", **options)
    assert again is not None and len(decoded(again).headers["x-received-from"]) == 2


def test_a_trusted_upstream_keeps_the_user_id_and_a_message_without_headers_gets_one():
    original = raw_header(commands.Basic.Properties(user_id="alice"))
    forwarded = queue_forward(original, uri="amqp://up", queue="q", redelivered=True, exchange="", routing_key="q",
                              trust_user_id=True)
    properties = decoded(forwarded)
    assert properties.user_id == "alice"
    assert properties.headers["x-received-from"][0]["visit-count"] == 1
    assert properties.headers["x-original-routing-key"] == "q"
