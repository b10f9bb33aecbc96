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

Decoding the headers table dominates the cost of a full scan, which is why
the reader skips this module entirely when no property column is selected.
"""

from __future__ import annotations

import datetime
import decimal
import json
import struct
from typing import Any

PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")
_SHORTSTR, _TABLE, _OCTET, _U64 = 0, 1, 2, 3
_ENCODING = (_SHORTSTR, _SHORTSTR, _TABLE, _OCTET, _OCTET, _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR, _U64,
             _SHORTSTR, _SHORTSTR, _SHORTSTR, _SHORTSTR)
_BITS = tuple(1 << (15 - i) for i in range(len(PROPERTY_NAMES)))
_NONE = (None,) * len(PROPERTY_NAMES)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I8, _U8 = struct.Struct(">b"), struct.Struct(">B")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64, _Q = struct.Struct(">q"), struct.Struct(">Q")
_F32, _F64 = struct.Struct(">f"), struct.Struct(">d")


class MalformedProperties(ValueError):
    """Property bytes that do not follow AMQP 0-9-1 (the broker stores what clients send)."""


def decode(raw: bytes) -> tuple[Any, ...]:
    """The basic properties in ``raw`` as a tuple in ``PROPERTY_NAMES`` order.

    ``timestamp`` is seconds since the epoch (an int); ``headers`` a dict of text (see the module
    docstring)."""
    if len(raw) < 2:
        return _NONE
    flags = (raw[0] << 8) | raw[1]
    if not flags & 0xFFFE:
        return _NONE
    pos = 2
    word = flags
    try:
        while word & 1:  # continuation: further flag words, unused by class basic
            (word,) = _U16.unpack_from(raw, pos)
            pos += 2
        values: list[Any] = []
        for bit, encoding in zip(_BITS, _ENCODING):
            if not flags & bit:
                values.append(None)
            elif encoding == _SHORTSTR:
                n = raw[pos]
                values.append(raw[pos + 1 : pos + 1 + n].decode("utf-8", "replace"))
                pos += 1 + n
            elif encoding == _OCTET:
                values.append(raw[pos])
                pos += 1
            elif encoding == _TABLE:
                (n,) = _U32.unpack_from(raw, pos)
                values.append(headers_text(raw, pos + 4, pos + 4 + n))
                pos += 4 + n
            else:
                values.append(_Q.unpack_from(raw, pos)[0])
                pos += 8
    except (IndexError, struct.error) as err:
        raise MalformedProperties(f"basic properties cut short: {err}") from err
    if pos > len(raw):
        raise MalformedProperties("basic properties cut short")
    return tuple(values)


def headers_text(raw: bytes, pos: int, end: int) -> dict[str, str | None]:
    """A field table's entries with every value as text (see the module docstring)."""
    out: dict[str, str | None] = {}
    while pos < end:
        n = raw[pos]
        key = raw[pos + 1 : pos + 1 + n].decode("utf-8", "replace")
        pos += 1 + n
        kind = raw[pos]
        pos += 1
        if kind == 0x53:  # 'S' longstr, by far the most common header type
            (n,) = _U32.unpack_from(raw, pos)
            out[key] = raw[pos + 4 : pos + 4 + n].decode("utf-8", "replace")
            pos += 4 + n
            continue
        value, pos = _value(raw, pos, kind)
        out[key] = _text(value)
    if pos != end:
        raise MalformedProperties("a field table entry runs past the end of the table")
    return out


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
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
    if isinstance(value, (decimal.Decimal, datetime.datetime)):
        return _text(value)
    return value


def _timestamp(seconds: int) -> datetime.datetime | int:
    try:
        return _EPOCH + datetime.timedelta(seconds=seconds)
    except OverflowError:
        return seconds  # beyond year 9999: keep the number


def _table(raw: bytes, pos: int, end: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    while pos < end:
        n = raw[pos]
        key = raw[pos + 1 : pos + 1 + n].decode("utf-8", "replace")
        pos += 1 + n
        out[key], pos = _value(raw, pos + 1, raw[pos])
    return out


def _value(raw: bytes, pos: int, kind: int) -> tuple[Any, int]:
    """(decoded value, position after it) of a field value of type ``kind`` at ``pos``."""
    c = chr(kind)
    if c in "Sx":
        (n,) = _U32.unpack_from(raw, pos)
        return raw[pos + 4 : pos + 4 + n].decode("utf-8", "replace"), pos + 4 + n
    if c == "t":
        return raw[pos] != 0, pos + 1
    if c in "IlLbBsuif":
        layout = {"I": _I32, "l": _I64, "L": _I64, "b": _I8, "B": _U8, "s": _I16, "u": _U16, "i": _U32, "f": _F32}[c]
        return layout.unpack_from(raw, pos)[0], pos + layout.size
    if c == "d":
        return _F64.unpack_from(raw, pos)[0], pos + 8
    if c == "D":
        scale = raw[pos]
        (unscaled,) = _I32.unpack_from(raw, pos + 1)
        return decimal.Decimal(unscaled).scaleb(-scale), pos + 5
    if c == "T":
        return _timestamp(_Q.unpack_from(raw, pos)[0]), pos + 8
    if c == "F":
        (n,) = _U32.unpack_from(raw, pos)
        return _table(raw, pos + 4, pos + 4 + n), pos + 4 + n
    if c == "A":
        (n,) = _U32.unpack_from(raw, pos)
        items, p, end = [], pos + 4, pos + 4 + n
        while p < end:
            item, p = _value(raw, p + 1, raw[p])
            items.append(item)
        return items, end
    if c == "V":
        return None, pos
    raise MalformedProperties(f"unknown field value type {c!r}")
