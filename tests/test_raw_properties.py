"""Editing raw basic properties: what is not edited keeps its bytes."""

from __future__ import annotations

import datetime
import struct

import pytest
from pamqp import commands

from queues.message import FLAG_EXPIRATION, FLAG_HEADERS, FLAG_REPLY_TO, decode_properties
from queues.raw_properties import RawProperties, encode_field

EVERY_PROPERTY = commands.Basic.Properties(
    content_type="text/plain", content_encoding="gzip", headers={"a": "b"}, delivery_mode=2, priority=5,
    correlation_id="c", reply_to="r", expiration="60000", message_id="m",
    timestamp=datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc), message_type="t", user_id="guest",
    app_id="app", cluster_id="",
)


def test_every_property_survives_a_round_trip_byte_for_byte():
    raw = EVERY_PROPERTY.marshal()
    assert RawProperties(raw).encode() == raw


def test_an_edit_changes_only_what_it_names():
    properties = RawProperties(EVERY_PROPERTY.marshal())
    properties.remove(FLAG_EXPIRATION)
    properties.set_short_string(FLAG_REPLY_TO, "elsewhere")
    properties.set_header_fields(properties.header_fields() + [("n", encode_field(7))])
    decoded = decode_properties(properties.encode())
    assert (decoded.expiration, decoded.reply_to, decoded.headers) == (None, "elsewhere", {"a": "b", "n": 7})
    assert (decoded.message_id, decoded.app_id, decoded.priority) == ("m", "app", 5)
    assert dict(properties.header_fields())["n"] == b"l" + struct.pack(">q", 7)


def test_an_empty_continuation_flags_word_is_dropped_and_a_stray_bit_refused():
    table = b"\x01aS\x00\x00\x00\x01b"
    with_continuation = struct.pack(">HH", FLAG_HEADERS | 1, 0) + struct.pack(">I", len(table)) + table
    properties = RawProperties(with_continuation)
    assert dict(properties.header_fields()) == {"a": b"S\x00\x00\x00\x01b"}
    assert properties.encode() == struct.pack(">H", FLAG_HEADERS) + struct.pack(">I", len(table)) + table
    with pytest.raises(ValueError):
        RawProperties(struct.pack(">HH", FLAG_HEADERS | 1, 0x8000) + struct.pack(">I", len(table)) + table)
    with pytest.raises(ValueError):
        RawProperties(struct.pack(">H", FLAG_HEADERS) + b"\x00\x00")  # a table length cut short
