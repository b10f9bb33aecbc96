"""Editing a message's basic properties in their raw form, leaving every other byte as it came.

Decoding a header table and encoding it again loses the publisher's integer types: pamqp
decodes every integer to a Python int and encodes it back with the smallest type that fits,
so a 32-bit `I` comes back as an 8-bit `b`, which Java and .NET consumers then fail to cast.
When the broker changes a message (dead-lettering adds `x-death`, routing strips `BCC`, a
delayed message negates `x-delay`), it edits only the properties and header fields it means to
change, and copies the rest byte for byte, as RabbitMQ does.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import encode

from persistence.properties_format import decode_field_value
from queues.message import (
    FLAG_APP_ID,
    FLAG_CLUSTER_ID,
    FLAG_CONTENT_ENCODING,
    FLAG_CONTENT_TYPE,
    FLAG_CORRELATION_ID,
    FLAG_DELIVERY_MODE,
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_MESSAGE_ID,
    FLAG_PRIORITY,
    FLAG_REPLY_TO,
    FLAG_TIMESTAMP,
    FLAG_TYPE,
    FLAG_USER_ID,
)

# The basic properties in wire order, with how each is encoded: a short string (length octet),
# a field table (length u32), one octet, or a 64-bit timestamp.
_LAYOUT = (
    (FLAG_CONTENT_TYPE, "shortstr"),
    (FLAG_CONTENT_ENCODING, "shortstr"),
    (FLAG_HEADERS, "table"),
    (FLAG_DELIVERY_MODE, "octet"),
    (FLAG_PRIORITY, "octet"),
    (FLAG_CORRELATION_ID, "shortstr"),
    (FLAG_REPLY_TO, "shortstr"),
    (FLAG_EXPIRATION, "shortstr"),
    (FLAG_MESSAGE_ID, "shortstr"),
    (FLAG_TIMESTAMP, "timestamp"),
    (FLAG_TYPE, "shortstr"),
    (FLAG_USER_ID, "shortstr"),
    (FLAG_APP_ID, "shortstr"),
    (FLAG_CLUSTER_ID, "shortstr"),
)
_u32 = struct.Struct(">I")


class RawProperties:
    """The present basic properties of one message, each kept as its encoded bytes."""

    __slots__ = ("_parts",)

    def __init__(self, raw: bytes) -> None:
        """`raw` is the property-flags words followed by the property list. Basic has 14
        properties, so words after the first can only be empty continuations; they are dropped
        (encode() writes one word). Raises ValueError if the list is truncated or a later word
        sets a property bit no basic property has."""
        if len(raw) < 2:
            raise ValueError("no property flags")
        flags = int.from_bytes(raw[:2], "big")
        pos = 2
        word = flags
        while word & 1:  # a continuation: another flags word follows
            if pos + 2 > len(raw):
                raise ValueError("truncated property flags")
            word = int.from_bytes(raw[pos : pos + 2], "big")
            if word & ~1:
                raise ValueError("a property bit beyond the basic properties")
            pos += 2
        parts: dict[int, bytes] = {}
        for flag, kind in _LAYOUT:
            if not flags & flag:
                continue
            if kind == "shortstr":
                end = pos + 1 + raw[pos] if pos < len(raw) else len(raw) + 1
            elif kind == "table":
                end = pos + 4 + _u32.unpack_from(raw, pos)[0] if pos + 4 <= len(raw) else len(raw) + 1
            elif kind == "octet":
                end = pos + 1
            else:
                end = pos + 8
            if end > len(raw):
                raise ValueError("truncated property list")
            parts[flag] = raw[pos:end]
            pos = end
        self._parts = parts

    def encode(self) -> bytes:
        flags = 0
        chunks = []
        for flag, _kind in _LAYOUT:
            part = self._parts.get(flag)
            if part is not None:
                flags |= flag
                chunks.append(part)
        return flags.to_bytes(2, "big") + b"".join(chunks)

    def remove(self, flag: int) -> None:
        self._parts.pop(flag, None)

    def set_short_string(self, flag: int, text: str) -> None:
        encoded = text.encode()
        self._parts[flag] = bytes((len(encoded),)) + encoded

    def header_fields(self) -> list[tuple[str, bytes]]:
        """The headers table as (name, encoded value with its type octet), in their order."""
        table = self._parts.get(FLAG_HEADERS)
        if table is None:
            return []
        end = len(table)
        pos = 4
        fields = []
        while pos < end:
            name_length = table[pos]
            name = table[pos + 1 : pos + 1 + name_length].decode("utf-8", "surrogateescape")
            pos += 1 + name_length
            # Read as the content header check reads it: names and strings that are not UTF-8,
            # timestamps past 9999 (which pamqp refuses) are fields like any other.
            _value, value_end = decode_field_value(table, pos, end)
            fields.append((name, table[pos:value_end]))
            pos = value_end
        return fields

    def set_header_fields(self, fields: list[tuple[str, bytes]]) -> None:
        body = b"".join(
            bytes((len(encoded_name),)) + encoded_name + value
            for encoded_name, value in ((name.encode("utf-8", "surrogateescape"), value) for name, value in fields)
        )
        self._parts[FLAG_HEADERS] = _u32.pack(len(body)) + body


def encode_field(value: Any) -> bytes:
    """A header value the broker writes itself, as RabbitMQ types it: integers as 64-bit `l`
    (x-death's count), strings as long strings, tables and arrays recursively."""
    if isinstance(value, bool):
        return encode.encode_table_value(value)
    if isinstance(value, int):
        return b"l" + encode.long_long_int(value)
    if isinstance(value, dict):
        body = b"".join(bytes((len(key.encode()),)) + key.encode() + encode_field(item) for key, item in value.items())
        return b"F" + _u32.pack(len(body)) + body
    if isinstance(value, list):
        body = b"".join(encode_field(item) for item in value)
        return b"A" + _u32.pack(len(body)) + body
    if isinstance(value, bytes):
        return b"S" + _u32.pack(len(value)) + value
    return encode.encode_table_value(value)
