"""The headers exchange: routes on message header values; routing keys are ignored.

Follows rabbit_exchange_type_headers.erl. A binding's ``x-match`` argument picks
the rule:

- ``all`` (the default): every binding key is in the headers with an equal value;
- ``any``: at least one is;
- ``all-with-x`` / ``any-with-x``: the same, but binding keys starting with
  "x-" take part too (otherwise they are ignored). ``x-match`` itself never does.

A binding value of None (AMQP void) asks only that the header be present. So a
binding with no keys to compare matches every message under ``all`` and none
under ``any``. Values compare as in field_equality.field_values_equal.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from datetime import datetime
from decimal import Decimal
from typing import Any

from .errors import InvalidBindingArguments
from .exchange import Exchange
from .field_equality import canonical_table, field_values_equal

_X_MATCH_MODES = {"all": (True, False), "any": (False, False),
                  "all-with-x": (True, True), "any-with-x": (False, True)}
_PRESENT = object()  # compiled form of a void binding value: "the key exists"
_MISSING = object()
_NO_HEADERS: dict[str, Any] = {}
# Types whose == is already RabbitMQ's comparison when both sides have the type.
_PLAIN_TYPES = frozenset({str, int, bytes, float, bool, Decimal, datetime})

# (destination, match_all, [(header key, expected value or _PRESENT), ...])
_Rule = tuple[Hashable, bool, list[tuple[str, Any]]]


def _compile(destination: Hashable, arguments: dict[str, Any]) -> _Rule:
    match_all, with_x = _X_MATCH_MODES.get(arguments.get("x-match"), (True, False))  # type: ignore[arg-type]
    tests = [(key, _PRESENT if value is None else value)
             for key, value in arguments.items()
             if key != "x-match" and (with_x or not key.startswith("x-"))]
    return destination, match_all, tests


class HeadersExchange(Exchange):
    """Checks each binding's rule against the message headers (a scan, as RabbitMQ does)."""

    type_name = "headers"
    needs_headers = True

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        # (destination, routing_key, canonical arguments) -> compiled rule
        self._rules: dict[tuple[Any, ...], _Rule] = {}

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        """See Exchange.route; here the result is a new set owned by the caller."""
        get = (headers or _NO_HEADERS).get
        found: set[Hashable] = set()
        for destination, match_all, tests in self._rules.values():
            if destination in found:
                continue
            matched = match_all
            for key, expected in tests:
                actual = get(key, _MISSING)
                if actual is _MISSING:
                    hit = False
                elif expected is _PRESENT:
                    hit = True
                elif type(actual) is type(expected) and type(actual) in _PLAIN_TYPES:
                    hit = actual == expected
                else:
                    hit = field_values_equal(expected, actual)
                if hit is not match_all:  # a miss decides "all", a hit decides "any"
                    matched = hit
                    break
            if matched:
                found.add(destination)
        return found

    def _validate_binding_arguments(self, arguments: dict[str, Any]) -> None:
        x_match = arguments.get("x-match", "all")
        if type(x_match) is str and x_match in _X_MATCH_MODES:
            return
        if isinstance(x_match, (str, bytes)):  # bytes: a longstr that is not UTF-8
            raise InvalidBindingArguments(
                f"Invalid x-match field value {_erlang_term(x_match)}; "
                "expected all, any, all-with-x, or any-with-x")
        raise InvalidBindingArguments(
            f"Invalid x-match field type {_amqp_type_name(x_match)} "
            f"(value {_erlang_term(x_match)}); expected longstr")

    def _index_add(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        self._rules[(destination, routing_key, canonical_table(arguments))] = _compile(destination, arguments)

    def _index_remove(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        del self._rules[(destination, routing_key, canonical_table(arguments))]


def _amqp_type_name(value: Any) -> str:
    """The field type RabbitMQ would report for a decoded value (ints as a typical client encodes them)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -2**31 <= value < 2**31 else "long"
    for kind, name in ((float, "double"), (Decimal, "decimal"), (datetime, "timestamp"),
                       (bytearray, "binary"), (dict, "table"), (list, "array")):
        if isinstance(value, kind):
            return name
    return "void" if value is None else type(value).__name__


def _erlang_term(value: Any) -> str:
    """Roughly how Erlang's ~tp prints the value, enough for the error text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "undefined"
    if isinstance(value, (str, bytes, bytearray)):
        raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
        if all(32 <= b < 127 for b in raw):
            return '<<"' + raw.decode("ascii").replace("\\", "\\\\").replace('"', '\\"') + '">>'
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return "<<" + ",".join(str(b) for b in raw) + ">>"
        if text.isprintable():
            return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"/utf8>>'
        return "<<" + ",".join(str(b) for b in raw) + ">>"
    return str(value)
