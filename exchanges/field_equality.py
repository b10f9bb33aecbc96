"""When two AMQP field tables or values are the same, as the routing layer judges them.

Tables arrive decoded by pamqp: str (longstr/shortstr), bytes (a longstr that is
not UTF-8), bytearray (byte array), bool, int, float, Decimal, datetime, dict
(nested table), list (array) and None (void).

Two operations:
- ``canonical_table`` gives a hashable identity for binding arguments. Like
  RabbitMQ, the top level is order-insensitive (it sorts the table) while nested
  tables keep their order, and a value's type is part of its identity
  (``True`` and ``1`` are different arguments).
- ``field_values_equal`` is the value comparison of RabbitMQ's headers exchange
  (Erlang ``==`` on the decoded values): strings compare by their bytes whatever
  their wire type, ints and floats compare numerically, but a bool never equals
  a number and a Decimal never equals an int.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

_STRINGS = (str, bytes, bytearray)
_NUMBERS = (int, float)


def _as_bytes(value: str | bytes | bytearray) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return bytes(value)


def _canonical_value(value: Any) -> Hashable:
    kind = type(value)
    if kind is str or kind is bytes:
        return ("S", _as_bytes(value))  # the same longstr on the wire
    if kind is bytearray:
        return ("x", bytes(value))
    if kind is dict:
        return ("F", tuple((key, _canonical_value(item)) for key, item in value.items()))
    if kind is list or kind is tuple:
        return ("A", tuple(_canonical_value(item) for item in value))
    # bool, int, float, Decimal, datetime, None: hashable and typed by their class.
    return (kind.__name__, value)


def canonical_table(table: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """A hashable form of ``table``, equal for tables RabbitMQ treats as the same binding arguments."""
    if not table:
        return ()
    return tuple(sorted(((key, _canonical_value(value)) for key, value in table.items()),
                        key=lambda item: str(item[0])))


def field_values_equal(pattern: Any, value: Any) -> bool:
    """True when a binding value and a message header value are equal for routing."""
    kind = type(pattern)
    if kind is type(value):
        if kind is dict:
            # Nested tables are compared in order, as RabbitMQ compares them.
            return len(pattern) == len(value) and all(
                pk == vk and field_values_equal(pv, vv)
                for (pk, pv), (vk, vv) in zip(pattern.items(), value.items()))
        if kind is list:
            return len(pattern) == len(value) and all(
                field_values_equal(p, v) for p, v in zip(pattern, value))
        # Any == Any is Any to mypy; a bool() here would cost a call per header on the routing path.
        return pattern == value  # type: ignore[no-any-return]
    if isinstance(pattern, _STRINGS) and isinstance(value, _STRINGS):
        return _as_bytes(pattern) == _as_bytes(value)
    if kind in _NUMBERS and type(value) in _NUMBERS:  # exact types: bool is excluded
        return pattern == value  # type: ignore[no-any-return]  # int/float ==: a bool, as above
    return False
