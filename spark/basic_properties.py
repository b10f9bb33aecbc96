"""Decode the raw AMQP basic properties stored in a message record into column values.

The bytes are the content header's property flags and property list exactly
as the client sent them (docs/queue-files.md, section 3.4). ``decode`` returns
one value per property, in ``PROPERTY_NAMES`` order, None for an absent one.

``headers`` becomes a ``dict[str, str | None]`` (Spark ``map<string,string>``),
so every header value is turned into text, the same way for every row:

====================  =================================================
AMQP field type       text
====================  =================================================
longstr, shortstr     the string (invalid UTF-8 replaced by U+FFFD)
byte array (``x``)    decoded like a string
integers              decimal digits, e.g. ``42``
bool                  ``true`` / ``false``
float, double         Python ``repr``, e.g. ``1.5``
decimal               e.g. ``12.50``
timestamp             ISO 8601 UTC, e.g. ``2024-05-01T12:00:00Z``
void                  null
table, array          JSON, e.g. x-death: ``[{"count": 1, ...}]``
====================  =================================================

A field that cannot be decoded (stored by a version that did not check content headers: an
unknown field type, a length past its table, tables nested deeper than 64) reads as
``<invalid field: REASON>``, e.g. ``<invalid field: unknown field type 'Z'>``; the other
fields and properties of the message read as usual. After a field of unknown type the rest
of its table cannot be found and is left out. The decoding itself is
``persistence.properties_format.decode_properties_leniently``.

Decoding the headers table dominates the cost of a full scan, which is why
the reader skips this module entirely when no property column is selected.
"""

from __future__ import annotations

import datetime
import decimal
import json
from typing import Any

from persistence.properties_format import PROPERTY_NAMES, InvalidField, decode_properties_leniently

__all__ = ["PROPERTY_NAMES", "MalformedProperties", "decode"]
_HEADERS = PROPERTY_NAMES.index("headers")


class MalformedProperties(ValueError):
    """A property list cut short (the broker stored what clients sent before it checked)."""


def decode(raw: bytes) -> tuple[Any, ...]:
    """The basic properties in ``raw`` as a tuple in ``PROPERTY_NAMES`` order.

    ``timestamp`` is seconds since the epoch (an int); ``headers`` a dict of text (see the module
    docstring)."""
    try:
        values = decode_properties_leniently(raw)
    except InvalidField as error:
        raise MalformedProperties(str(error)) from error
    headers = values[_HEADERS]
    if not headers:
        return values
    return (*values[:_HEADERS], {key: _text(value) for key, value in headers.items()}, *values[_HEADERS + 1 :])


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, decimal.Decimal)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps(_jsonable(value), ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    if isinstance(value, (bytes, decimal.Decimal, datetime.datetime)):
        return _text(value)
    return value
