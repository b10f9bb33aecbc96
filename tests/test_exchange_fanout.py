"""Fanout exchange: every bound destination gets every message."""

from exchanges import FanoutExchange


def test_routes_to_every_destination_whatever_the_key():
    exchange = FanoutExchange("f")
    exchange.bind("q1", "", None)
    exchange.bind("q2", "some.key", None)
    for key in ("", "x", "some.key"):
        assert set(exchange.route(key, {"h": 1})) == {"q1", "q2"}


def test_no_bindings_routes_nowhere():
    assert set(FanoutExchange("f").route("k", None)) == set()


def test_destination_with_several_bindings_gets_one_copy_until_all_are_gone():
    exchange = FanoutExchange("f")
    exchange.bind("q", "a", None)
    exchange.bind("q", "b", None)
    assert list(exchange.route("", None)) == ["q"]
    exchange.unbind("q", "a", None)
    assert list(exchange.route("", None)) == ["q"]
    exchange.unbind("q", "b", None)
    assert list(exchange.route("", None)) == []


def test_unbind_destination():
    exchange = FanoutExchange("f")
    exchange.bind("q1", "a", None)
    exchange.bind("q1", "b", None)
    exchange.bind("q2", "", None)
    assert exchange.unbind_destination("q1") == 2
    assert set(exchange.route("", None)) == {"q2"}
    assert exchange.binding_count() == 1


def test_type_attributes():
    assert (FanoutExchange.type_name, FanoutExchange.needs_headers) == ("fanout", False)
