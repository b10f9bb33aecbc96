"""Headers exchange: x-match rules and value comparison, as RabbitMQ 3.10 behaves (probed with pika)."""

from decimal import Decimal

import pytest

from exchanges import HeadersExchange, InvalidBindingArguments


def routes(binding_args, headers, routing_key=""):
    exchange = HeadersExchange("h")
    exchange.bind("q", "", binding_args)
    return set(exchange.route(routing_key, headers)) == {"q"}


@pytest.mark.parametrize("binding,headers,matches", [
    # x-match all (the default): every key present and equal
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 0}, True),
    ({"a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
    ({"a": 1}, None, False),
    # x-match any: one key present and equal is enough
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1}, None, False),
    # no keys to compare: all matches everything, any matches nothing
    ({}, None, True),
    ({}, {"a": 1}, True),
    ({"x-match": "any"}, {"a": 1}, False),
    ({"x-match": "any"}, None, False),
    # x- binding keys are ignored unless x-match ends in -with-x
    ({"x-foo": 1}, None, True),
    ({"x-match": "any", "x-foo": 1}, {"x-foo": 1}, False),
    ({"x-match": "all-with-x", "x-foo": 1}, {"x-foo": 1}, True),
    ({"x-match": "all-with-x", "x-foo": 1}, None, False),
    ({"x-match": "any-with-x", "x-foo": 1, "a": 1}, {"x-foo": 1}, True),
    ({"x-match": "all-with-x"}, None, True),
    ({"x-match": "any-with-x"}, {"a": 1}, False),
    # the binding's own x-match never takes part, and a header named x-match is plain data
    ({"x-match": "all-with-x", "a": 1}, {"a": 1}, True),
    ({"x-match": "all", "a": 1}, {"a": 1, "x-match": "zzz"}, True),
    # a void binding value asks only for presence
    ({"k": None}, {"k": "anything"}, True),
    ({"k": None}, {"k": None}, True),
    ({"k": None}, {"j": 1}, False),
    ({"k": "v"}, {"k": None}, False),
    # values compare by value, not by wire type...
    ({"k": "v"}, {"k": b"v"}, True),
    ({"k": "v"}, {"k": bytearray(b"v")}, True),
    ({"k": 1}, {"k": 1.0}, True),
    ({"k": 2**40}, {"k": 2**40}, True),
    ({"k": Decimal("1.5")}, {"k": Decimal("1.50")}, True),
    ({"k": [1, "a"]}, {"k": [1, "a"]}, True),
    ({"k": {"a": 1, "b": 2}}, {"k": {"a": 1, "b": 2}}, True),
    # ...but a bool is not a number, a decimal is not an int, and nested tables keep their order
    ({"k": 1}, {"k": True}, False),
    ({"k": True}, {"k": True}, True),
    ({"k": [1]}, {"k": [True]}, False),
    ({"k": Decimal("1")}, {"k": 1}, False),
    ({"k": {"a": 1, "b": 2}}, {"k": {"b": 2, "a": 1}}, False),
    ({"k": "1"}, {"k": 1}, False),
])
def test_x_match_rules(binding, headers, matches):
    assert routes(binding, headers) is matches


def test_routing_key_is_ignored():
    assert routes({"a": 1}, {"a": 1}, routing_key="whatever")


def test_destination_matching_several_bindings_gets_one_copy():
    exchange = HeadersExchange("h")
    exchange.bind("q", "", {"a": 1})
    exchange.bind("q", "", {"x-match": "any", "b": 2})
    exchange.bind("other", "", {"a": 2})
    assert list(exchange.route("", {"a": 1, "b": 2})) == ["q"]


def test_unbinding_one_rule_keeps_the_others():
    exchange = HeadersExchange("h")
    exchange.bind("q", "", {"a": 1})
    exchange.bind("q", "", {"b": 2})
    assert exchange.unbind("q", "", {"a": 1}) is True
    assert set(exchange.route("", {"a": 1})) == set()
    assert set(exchange.route("", {"b": 2})) == {"q"}
    assert exchange.unbind_destination("q") == 1
    assert set(exchange.route("", {"b": 2})) == set()


def test_routing_key_is_part_of_binding_identity():
    exchange = HeadersExchange("h")
    assert exchange.bind("q", "k1", {"a": 1}) is True
    assert exchange.bind("q", "k2", {"a": 1}) is True
    assert exchange.unbind("q", "k1", {"a": 1}) is True
    assert set(exchange.route("", {"a": 1})) == {"q"}


@pytest.mark.parametrize("x_match,message", [
    ("foo", 'Invalid x-match field value <<"foo">>; expected all, any, all-with-x, or any-with-x'),
    ("ALL", 'Invalid x-match field value <<"ALL">>; expected all, any, all-with-x, or any-with-x'),
    (1, "Invalid x-match field type signedint (value 1); expected longstr"),
    (True, "Invalid x-match field type bool (value true); expected longstr"),
    (bytearray(b"foo"), 'Invalid x-match field type binary (value <<"foo">>); expected longstr'),
])
def test_invalid_x_match_is_rejected_with_rabbitmq_text(x_match, message):
    exchange = HeadersExchange("h")
    with pytest.raises(InvalidBindingArguments) as caught:
        exchange.bind("q", "", {"x-match": x_match, "a": 1})
    assert str(caught.value) == message  # goes after "PRECONDITION_FAILED - "
    assert isinstance(caught.value, ValueError)
    assert exchange.binding_count() == 0


def test_unbind_with_invalid_x_match_is_just_absent():
    exchange = HeadersExchange("h")
    assert exchange.unbind("q", "", {"x-match": "foo"}) is False


def test_type_attributes():
    assert (HeadersExchange.type_name, HeadersExchange.needs_headers) == ("headers", True)
