"""AMQP methods as a link (a shovel's, a federation link's) sends them: RabbitMQ's names, and
RabbitMQ's integer types in tables.

- pamqp checks exchange and queue names against the 0-9-1 grammar (letters, digits, "-_.:")
  when it makes a method; RabbitMQ takes any UTF-8 name: a shovel's queue may be called
  "orders in", and federation's own names on an upstream have spaces, ">" and "@"
  ("federation: orders -> rabbit@host A"). The methods here are made and encoded without
  that check; a link sends every method that carries a name through them.
- pamqp encodes an integer in a table with the smallest type that fits (1 is a signed byte);
  RabbitMQ's federation plugin sends its integers as `long` (64-bit, "l") and refuses an
  x-federation-upstream exchange whose x-max-hops is anything else ("Argument x-max-hops must
  be of type long"). The tables here encode integers as "l", as RabbitMQ's plugin does
  (queues/raw_properties.encode_field).

Everything else about them is pamqp's.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from pamqp import commands, encode
from pamqp.base import Frame

from queues.raw_properties import encode_field

M = TypeVar("M", bound=Frame)
_UNCHECKED: dict[type, type] = {}


def _table(value: dict[str, Any] | None) -> bytes:
    body = b"".join(encode.short_string(key) + encode_field(item) for key, item in (value or {}).items())
    return encode.long_int(len(body)) + body


def _marshal(self: Frame) -> bytes:
    """pamqp's Frame.marshal, with no name check and tables as _table writes them."""
    byte, offset, output, in_bits = -1, 0, [], False
    for argument in self.__slots__:
        data_type = self.amqp_type(argument)
        value = getattr(self, argument, 0)
        if data_type == "bit":
            if not in_bits:
                byte, offset, in_bits = 0, 0, True
            byte = encode.bit(value, byte, offset)
            offset += 1
            if offset == 8:
                output.append(encode.octet(byte))
                in_bits = False
            continue
        if in_bits:
            output.append(encode.octet(byte))
            in_bits = False
        output.append(_table(cast("dict[str, Any] | None", value)) if data_type == "table"
                      else encode.by_type(value, data_type))
    if in_bits:
        output.append(encode.octet(byte))
    return b"".join(output)


def _unchecked_class(cls: type[M]) -> type[M]:
    found = _UNCHECKED.get(cls)
    if found is None:
        found = _UNCHECKED[cls] = type(cls.__name__, (cls,), {"validate": lambda self: None, "marshal": _marshal})
    return found


def method(cls: type[M], **fields: Any) -> M:
    """`cls(**fields)`, encodable whatever names it holds."""
    made: M = _unchecked_class(cls)(**fields)  # (pamqp's __init__ checks by calling validate)
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
