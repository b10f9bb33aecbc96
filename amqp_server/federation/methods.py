"""AMQP methods as a link sends them, with RabbitMQ's names that pamqp would refuse to encode.

pamqp checks exchange and queue names against the 0-9-1 grammar (letters, digits, "-_.:")
when it encodes a method; RabbitMQ takes any UTF-8 name, and federation's own names on an
upstream have spaces, ">" and "@" ("federation: orders -> rabbit@host A"). The methods a link
sends are made here without that check; everything else about them is pamqp's.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pamqp import commands
from pamqp.base import Frame

M = TypeVar("M", bound=Frame)
_UNCHECKED: dict[type, type] = {}


def _unchecked_class(cls: type[M]) -> type[M]:
    found = _UNCHECKED.get(cls)
    if found is None:
        found = _UNCHECKED[cls] = type(cls.__name__, (cls,), {"validate": lambda self: None})
    return found


def method(cls: type[M], **fields: Any) -> M:
    """`cls(**fields)`, encodable whatever names it holds."""
    made: M = _unchecked_class(cls)()
    for name, value in fields.items():
        setattr(made, name, value)
    return made


def queue_declare(**fields: Any) -> commands.Queue.Declare:
    return method(commands.Queue.Declare, **fields)


def queue_bind(**fields: Any) -> commands.Queue.Bind:
    return method(commands.Queue.Bind, **fields)


def queue_delete(**fields: Any) -> commands.Queue.Delete:
    return method(commands.Queue.Delete, **fields)


def exchange_declare(**fields: Any) -> commands.Exchange.Declare:
    return method(commands.Exchange.Declare, **fields)


def exchange_delete(**fields: Any) -> commands.Exchange.Delete:
    return method(commands.Exchange.Delete, **fields)


def exchange_bind(**fields: Any) -> commands.Exchange.Bind:
    return method(commands.Exchange.Bind, **fields)


def exchange_unbind(**fields: Any) -> commands.Exchange.Unbind:
    return method(commands.Exchange.Unbind, **fields)


def basic_consume(**fields: Any) -> commands.Basic.Consume:
    return method(commands.Basic.Consume, **fields)


def basic_cancel(**fields: Any) -> commands.Basic.Cancel:
    return method(commands.Basic.Cancel, **fields)
