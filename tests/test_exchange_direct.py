"""Direct exchange routing, plus the binding bookkeeping every exchange type shares."""

from datetime import datetime, timezone
from decimal import Decimal

from exchanges import DirectExchange


def test_routes_on_exact_key_only():
    exchange = DirectExchange("d")
    exchange.bind("q1", "red", None)
    exchange.bind("q2", "green", None)
    assert set(exchange.route("red", None)) == {"q1"}
    assert set(exchange.route("Red", None)) == set()
    assert set(exchange.route("red.x", None)) == set()
    assert set(exchange.route("", None)) == set()


def test_empty_key_is_an_ordinary_key():
    exchange = DirectExchange("d")
    exchange.bind("q", "", None)
    assert set(exchange.route("", None)) == {"q"}


def test_several_destinations_on_one_key_each_get_it_once():
    exchange = DirectExchange("d")
    for queue in ("q1", "q2", "q3"):
        exchange.bind(queue, "k", None)
    exchange.bind("q1", "k", {"extra": "arg"})  # second binding, same queue and key
    result = exchange.route("k", None)
    assert sorted(result) == ["q1", "q2", "q3"]
    assert len(result) == 3


def test_binding_the_same_triple_twice_is_one_binding():
    exchange = DirectExchange("d")
    assert exchange.bind("q", "k", {"a": 1, "b": "x"}) is True
    assert exchange.bind("q", "k", {"b": "x", "a": 1}) is False  # table order does not matter
    assert exchange.bind("q", "k", None) is True  # different arguments: a second binding
    assert exchange.bind("q", "k", {}) is False  # None and {} are both the empty table
    assert exchange.binding_count() == 2


def test_argument_identity_follows_field_types():
    exchange = DirectExchange("d")
    assert exchange.bind("q", "k", {"v": 1}) is True
    assert exchange.bind("q", "k", {"v": True}) is True  # bool and int differ on the wire
    assert exchange.bind("q", "k", {"v": "s"}) is True
    assert exchange.bind("q", "k", {"v": b"s"}) is False  # both are longstr <<"s">>
    assert exchange.bind("q", "k", {"v": [1, {"n": None}]}) is True  # unhashable values are fine
    assert exchange.bind("q", "k", {"v": [1, {"n": None}]}) is False
    assert exchange.bind("q", "k", {"v": bytearray(b"z"), "d": Decimal("1.5"),
                                    "t": datetime(2024, 1, 1, tzinfo=timezone.utc)}) is True
    assert exchange.binding_count() == 5


def test_unbind_reports_whether_the_binding_existed():
    exchange = DirectExchange("d")
    exchange.bind("q", "k", {"a": 1})
    assert exchange.unbind("q", "k", None) is False
    assert exchange.unbind("q", "other", {"a": 1}) is False
    assert exchange.unbind("nobody", "k", {"a": 1}) is False
    assert exchange.unbind("q", "k", {"a": 1}) is True
    assert exchange.unbind("q", "k", {"a": 1}) is False
    assert exchange.binding_count() == 0
    assert set(exchange.route("k", None)) == set()


def test_destination_stays_routed_until_its_last_binding_on_the_key_goes():
    exchange = DirectExchange("d")
    exchange.bind("q", "k", None)
    exchange.bind("q", "k", {"x": 1})
    exchange.unbind("q", "k", None)
    assert set(exchange.route("k", None)) == {"q"}
    exchange.unbind("q", "k", {"x": 1})
    assert set(exchange.route("k", None)) == set()


def test_unbind_destination_drops_all_its_bindings_and_no_others():
    exchange = DirectExchange("d")
    exchange.bind("gone", "a", None)
    exchange.bind("gone", "b", None)
    exchange.bind("gone", "b", {"x": 1})
    exchange.bind("kept", "a", None)
    assert exchange.unbind_destination("gone") == 3
    assert exchange.unbind_destination("gone") == 0
    assert set(exchange.route("a", None)) == {"kept"}
    assert set(exchange.route("b", None)) == set()
    assert exchange.bindings() == [("kept", "a", {})]
    assert exchange.binding_count() == 1


def test_has_binding_and_bindings_listing():
    exchange = DirectExchange("d")
    exchange.bind("q1", "a", {"x": "y"})
    exchange.bind("q2", "b", None)
    assert exchange.has_binding("q1", "a", {"x": "y"})
    assert not exchange.has_binding("q1", "a", None)
    assert not exchange.has_binding("q3", "a", {"x": "y"})
    assert sorted(exchange.bindings()) == [("q1", "a", {"x": "y"}), ("q2", "b", {})]


def test_stored_arguments_are_isolated_from_the_callers_dicts():
    exchange = DirectExchange("d")
    args = {"x": "y"}
    exchange.bind("q", "a", args)
    args["x"] = "changed"
    exchange.bindings()[0][2]["x"] = "changed too"
    assert exchange.bindings() == [("q", "a", {"x": "y"})]
    assert exchange.has_binding("q", "a", {"x": "y"})


def test_destinations_can_be_any_hashable_objects():
    class Queue:  # identity-hashed, like the vhost's queue objects
        pass

    q1, q2 = Queue(), Queue()
    exchange = DirectExchange("d")
    exchange.bind(q1, "k", None)
    exchange.bind(q2, "k", None)
    assert set(exchange.route("k", None)) == {q1, q2}


def test_declaration_attributes_and_alternate_exchange():
    exchange = DirectExchange("d", durable=True, auto_delete=True, internal=True,
                              arguments={"alternate-exchange": "ae"})
    assert (exchange.name, exchange.durable, exchange.auto_delete, exchange.internal) == ("d", True, True, True)
    assert exchange.arguments == {"alternate-exchange": "ae"}
    assert exchange.alternate_exchange == "ae"
    assert DirectExchange("d", arguments={"alternate-exchange": b"ae"}).alternate_exchange == "ae"
    assert DirectExchange("d", arguments={"alternate-exchange": 5}).alternate_exchange is None
    plain = DirectExchange("d")
    assert plain.alternate_exchange is None
    assert plain.arguments == {}
    assert (plain.durable, plain.auto_delete, plain.internal) == (False, False, False)
    assert (DirectExchange.type_name, DirectExchange.needs_headers) == ("direct", False)
