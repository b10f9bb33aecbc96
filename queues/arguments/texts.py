"""The words RabbitMQ uses in its refusals of arguments: field type names, and how a value
is shown when a redeclaration differs ("inequivalent arg")."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any


def amqp_type_name(value: Any) -> str:
    """The field-table type RabbitMQ names for a value.

    pamqp decodes every integer type to int, so the width is guessed the way pika encodes an
    int: 'I' (signedint) when it fits 32 bits, else 'l' (long). A longstr that is not UTF-8
    decodes to bytes; an 'x' byte array decodes to bytearray.
    """
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, bytes):
        return "longstr"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


_TYPE_NAMES: dict[type, str] = {
    str: "longstr",
    bytearray: "binary",
    float: "double",
    Decimal: "decimal",
    datetime: "timestamp",
    dict: "table",
    list: "array",
    type(None): "void",
}


def describe_argument(value: object) -> str:
    """A value as RabbitMQ shows it when only one side of an inequivalence has it."""
    if value is None:
        return "none"
    shown = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if isinstance(shown, bool):
        shown = str(shown).lower()
    return f"the value '{shown}' of type '{amqp_type_name(value)}'"


def plain(value: object) -> str:
    """A value as RabbitMQ shows it when both sides of an inequivalence have one."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def resource(kind: str, name: str, vhost: str) -> str:
    """RabbitMQ's way of naming a resource in error texts: "queue 'q' in vhost '/'"."""
    return f"{kind} '{name}' in vhost '{vhost}'"
