"""AMQP field tables and basic properties in their raw bytes: the field types RabbitMQ 3.10
decodes, and how readers of stored messages decode what the broker accepted in the past.

The broker relays the content header a publisher sent byte for byte, so anything it lets in
reaches every consumer. The door is `check_content_header` (amqp_server/wire/codec.py,
where a publish's header arrives): a bounded scan over the raw bytes, with the tables of this
file, that accepts exactly what RabbitMQ 3.10 can decode and tables and arrays nested at most
MAX_NESTING_DEPTH deep (RabbitMQ has no limit; pika and pamqp need two Python frames per level
and fail with RecursionError near 500 levels, less inside a deep application stack).

Messages written by an older version may fail that check. `decode_properties_leniently` decodes
them for readers (the management API's get, the Spark data source) with the same depth limit:
a header field that cannot be decoded is shown as invalid (`invalid_field_text`) and the read
goes on. docs/security.md, "Hostile input".

It lives in persistence/, the lowest layer, because every layer that reads these bytes needs
it: the Spark data source (which reads only files), the queues (message.py, raw_properties.py),
the wire's door (amqp_server/wire/codec.py) and the management API. The field-table values
exchanges compare once decoded are exchanges/field_equality.py.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from typing import Any

# Tables and arrays inside the headers table, counting the headers table itself as level 1.
MAX_NESTING_DEPTH = 64

# Field value types as RabbitMQ 3.10 decodes them (rabbit_binary_parser): the width of a
# fixed-size value, or a marker for values that carry a 32-bit length. 'U' (pika, py-amqp) and
# every other letter make RabbitMQ close the connection with 541, so they do here too.
LONG_STRING, TABLE, ARRAY, UNKNOWN = -1, -2, -3, -4  # FIELD_KINDS of values not of fixed width
FIXED_FIELD_WIDTHS = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "f": 4, "D": 5, "l": 8, "L": 8, "d": 8,
                      "T": 8, "V": 0}
FIELD_KINDS = [UNKNOWN] * 256
for _letter, _size in FIXED_FIELD_WIDTHS.items():
    FIELD_KINDS[ord(_letter)] = _size
FIELD_KINDS[ord("S")] = FIELD_KINDS[ord("x")] = LONG_STRING
FIELD_KINDS[ord("F")] = TABLE
FIELD_KINDS[ord("A")] = ARRAY
FIELD_TYPES = frozenset(chr(code) for code, kind in enumerate(FIELD_KINDS) if kind != UNKNOWN)

# Basic properties in wire order: a short string (-1), the headers table (-2), or a fixed width.
SHORT_STRING, HEADERS_TABLE = -1, -2
PROPERTY_KINDS = (SHORT_STRING, SHORT_STRING, HEADERS_TABLE, 1, 1, SHORT_STRING, SHORT_STRING, SHORT_STRING,
                  SHORT_STRING, 8, SHORT_STRING, SHORT_STRING, SHORT_STRING, SHORT_STRING)
# The flag word's last bit: another flag word follows (class basic, with 14 properties, needs none).
CONTINUATION_BIT = 1
_u32 = struct.Struct(">I")


# -- reading what was stored ---------------------------------------------------------------


class InvalidField(ValueError):
    """A stored field value that cannot be decoded (unknown type, cut short, nested too deep)."""


def invalid_field_text(error: InvalidField) -> str:
    """How readers show a field they could not decode, in place of its value."""
    return f"<invalid field: {error}>"


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_NUMBERS = {"b": struct.Struct(">b"), "B": struct.Struct(">B"), "s": struct.Struct(">h"), "u": struct.Struct(">H"),
            "I": struct.Struct(">i"), "i": struct.Struct(">I"), "l": struct.Struct(">q"), "L": struct.Struct(">Q"),
            "f": struct.Struct(">f"), "d": struct.Struct(">d")}
_i32, _u64 = struct.Struct(">i"), struct.Struct(">Q")


def decode_field_value(raw: bytes, pos: int, end: int, depth: int = 1) -> tuple[Any, int]:
    """(value, position after it) of the field value (type octet first) at `pos`, which must end
    by `end`. Strings stay bytes; timestamps are UTC datetimes (seconds beyond year 9999 stay an
    int). Raises InvalidField; never recurses deeper than MAX_NESTING_DEPTH."""
    if pos >= end:
        raise InvalidField("cut short")
    letter = chr(raw[pos])
    pos += 1
    kind = FIELD_KINDS[raw[pos - 1]]
    if kind == UNKNOWN:
        raise InvalidField(f"unknown field type {letter!r}")
    if kind >= 0:
        if pos + kind > end:
            raise InvalidField("cut short")
        return _fixed_value(raw, pos, letter), pos + kind
    if pos + 4 > end:
        raise InvalidField("cut short")
    value_end = pos + 4 + _u32.unpack_from(raw, pos)[0]
    if value_end > end:
        raise InvalidField("longer than its table")
    if kind == LONG_STRING:
        return raw[pos + 4 : value_end], value_end
    if depth >= MAX_NESTING_DEPTH:
        raise InvalidField(f"nested deeper than {MAX_NESTING_DEPTH}")
    if kind == TABLE:
        return decode_table(raw, pos + 4, value_end, depth + 1), value_end
    items = []
    item_pos = pos + 4
    while item_pos < value_end:
        item, item_pos = decode_field_value(raw, item_pos, value_end, depth + 1)
        items.append(item)
    return items, value_end


def decode_table(raw: bytes, pos: int, end: int, depth: int = 1) -> dict[str, Any]:
    """The table whose body is raw[pos:end], keys as text. Raises InvalidField."""
    table: dict[str, Any] = {}
    while pos < end:
        name_end = pos + 1 + raw[pos]
        if name_end > end:
            raise InvalidField("a field name runs past its table")
        name = raw[pos + 1 : name_end].decode("utf-8", "replace")
        table[name], pos = decode_field_value(raw, name_end, end, depth)
    return table


def _fixed_value(raw: bytes, pos: int, letter: str) -> Any:
    if letter == "t":
        return raw[pos] != 0
    if letter == "V":
        return None
    if letter == "D":
        return decimal.Decimal(_i32.unpack_from(raw, pos + 1)[0]).scaleb(-raw[pos])
    if letter == "T":
        seconds = _u64.unpack_from(raw, pos)[0]
        try:
            return _EPOCH + datetime.timedelta(seconds=seconds)
        except OverflowError:
            return seconds
    return _NUMBERS[letter].unpack_from(raw, pos)[0]


def decode_headers_leniently(raw: bytes, pos: int, end: int) -> dict[str, Any]:
    """The headers table whose body is raw[pos:end] for a reader of stored messages: a field
    that cannot be decoded becomes `invalid_field_text`; after a field whose type is unknown (its
    length is unknown too) the rest of the table cannot be read and is left out."""
    headers: dict[str, Any] = {}
    while pos < end:
        name_end = pos + 1 + raw[pos]
        name = raw[pos + 1 : min(name_end, end)].decode("utf-8", "replace")
        if name_end < end and raw[name_end] == 0x53 and name_end + 5 <= end:  # 'S', the common case
            value_end = name_end + 5 + _u32.unpack_from(raw, name_end + 1)[0]
            if value_end <= end:
                headers[name] = raw[name_end + 5 : value_end]
                pos = value_end
                continue
        try:
            headers[name], pos = decode_field_value(raw, name_end, end)
        except InvalidField as error:
            headers[name] = invalid_field_text(error)
            skipped = _skip_to_next_field(raw, name_end, end)
            if skipped is None:
                break
            pos = skipped
    return headers


def _skip_to_next_field(raw: bytes, pos: int, end: int) -> int | None:
    """Where the field after the invalid value at `pos` starts, if its length says so."""
    if pos >= end:
        return None
    kind = FIELD_KINDS[raw[pos]]
    if kind in (TABLE, ARRAY, LONG_STRING) and pos + 5 <= end:
        value_end = pos + 5 + _u32.unpack_from(raw, pos + 1)[0]
        return value_end if value_end <= end else None
    return None


PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")
_NO_PROPERTIES = (None,) * len(PROPERTY_NAMES)


def decode_properties_leniently(raw: bytes) -> tuple[Any, ...]:
    """The basic properties in `raw` (flag words, then the property list, as stored) in
    PROPERTY_NAMES order, None for an absent one, for readers of stored messages: short strings
    as text (invalid UTF-8 replaced), timestamp as seconds, headers by
    `decode_headers_leniently`. Raises InvalidField only if the property list itself is cut
    short; never recurses deeper than MAX_NESTING_DEPTH."""
    if len(raw) < 2:
        return _NO_PROPERTIES
    flags = (raw[0] << 8) | raw[1]
    if not flags & 0xFFFC:
        return _NO_PROPERTIES
    pos = 2
    word = flags
    end = len(raw)
    values: list[Any] = []
    try:
        while word & CONTINUATION_BIT:  # older versions stored these; class basic uses none
            word = (raw[pos] << 8) | raw[pos + 1]
            pos += 2
        for index, kind in enumerate(PROPERTY_KINDS):
            if not flags & (1 << (15 - index)):
                values.append(None)
            elif kind == SHORT_STRING:
                value_end = pos + 1 + raw[pos]
                values.append(raw[pos + 1 : value_end].decode("utf-8", "replace"))
                pos = value_end
            elif kind == HEADERS_TABLE:
                table_end = pos + 4 + _u32.unpack_from(raw, pos)[0]
                if table_end > end:
                    raise InvalidField("the headers table runs past the properties")
                values.append(decode_headers_leniently(raw, pos + 4, table_end))
                pos = table_end
            elif kind == 1:
                values.append(raw[pos])
                pos += 1
            else:
                values.append(_u64.unpack_from(raw, pos)[0])
                pos += 8
    except (IndexError, struct.error) as error:
        raise InvalidField(f"basic properties cut short: {error}") from error
    if pos > end:
        raise InvalidField("basic properties cut short")
    return tuple(values)
