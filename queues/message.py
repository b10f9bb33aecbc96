"""A published message, kept as the raw bytes that arrived, and its place in each queue.

The content header (class, weight, body size, property flags and property list) and the body
stay exactly as the publisher sent them and go out to consumers unchanged. Properties are
decoded only when a feature needs a field, and then once per message, not once per queue.

A message routed to several queues is one Message; each queue holds it in a QueueEntry of its
own (its sequence number there, deliveries, expiry, state), at the end of this file.
"""

from __future__ import annotations

import datetime
import struct
import time
from typing import Any

from pamqp import commands

from persistence.properties_format import decode_headers_leniently

BasicProperties = commands.Basic.Properties

# Property flag bits of class basic, in the order of the AMQP 0-9-1 spec.
FLAG_CONTENT_TYPE = 1 << 15
FLAG_CONTENT_ENCODING = 1 << 14
FLAG_HEADERS = 1 << 13
FLAG_DELIVERY_MODE = 1 << 12
FLAG_PRIORITY = 1 << 11
FLAG_CORRELATION_ID = 1 << 10
FLAG_REPLY_TO = 1 << 9
FLAG_EXPIRATION = 1 << 8
FLAG_MESSAGE_ID = 1 << 7
FLAG_TIMESTAMP = 1 << 6
FLAG_TYPE = 1 << 5
FLAG_USER_ID = 1 << 4
FLAG_APP_ID = 1 << 3
FLAG_CLUSTER_ID = 1 << 2

_header_prefix = struct.Struct(">HHQ")
_flags = struct.Struct(">H")
CONTENT_HEADER_PREFIX_SIZE = _header_prefix.size  # class, weight, body size


class Message:
    """One published message: routing information, raw content header, body.

    One instance is shared by every queue the message is routed to, so it must not hold
    per-queue state (see QueueEntry for that).
    """

    __slots__ = (
        "exchange",
        "routing_key",
        "raw_header",
        "body",
        "published_at",
        "property_flags",
        "routing_raw",
        "_properties",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        raw_header: bytes,
        body: bytes,
        routing_raw: bytes | None = None,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.raw_header = raw_header
        # Read once: publishing, routing, expiry and durability each look at the flags.
        self.property_flags: int = _flags.unpack_from(raw_header, CONTENT_HEADER_PREFIX_SIZE)[0]
        self.body = body
        self.published_at = time.time()
        # Exchange and routing key as two AMQP short strings, as basic.deliver carries them: as
        # they arrived in a client's basic.publish, else encoded here. A plain attribute (not a
        # property that encodes on first use): every delivery reads it.
        self.routing_raw = routing_raw if routing_raw is not None else routing_bytes(exchange, routing_key)
        self._properties: BasicProperties | None = None

    @property
    def properties(self) -> BasicProperties:
        """The decoded basic properties (decoded on first use, then cached)."""
        if self._properties is None:
            self._properties = decode_properties(self.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
        return self._properties

    @property
    def headers(self) -> dict[str, Any] | None:
        if not self.property_flags & FLAG_HEADERS:
            return None
        return self.properties.headers

    @property
    def is_persistent(self) -> bool:
        """delivery_mode == 2, read straight from the raw property list.

        Every message bound for a durable queue asks this, so it skips the (at most three)
        fields before delivery_mode instead of decoding all properties.
        """
        raw = self.raw_header
        flags = self.property_flags
        if not flags & FLAG_DELIVERY_MODE:
            return False
        if self._properties is not None or flags & 1:  # decoded already, or a second flag word
            return self.properties.delivery_mode == 2
        offset = CONTENT_HEADER_PREFIX_SIZE + 2
        try:
            if flags & FLAG_CONTENT_TYPE:
                offset += 1 + raw[offset]
            if flags & FLAG_CONTENT_ENCODING:
                offset += 1 + raw[offset]
            if flags & FLAG_HEADERS:
                offset += 4 + int.from_bytes(raw[offset : offset + 4], "big")
            return raw[offset] == 2
        except IndexError:  # a truncated property list: not a message anyone can keep
            return False

    def forget_decoded_properties(self) -> None:
        """Drop the cached decoded properties (they cost several hundred bytes; the raw header
        stays, so they are decoded again if needed). For messages held a long time."""
        self._properties = None

    def with_raw_properties(
        self, raw_properties: bytes, routing_key: str | None = None, exchange: str | None = None
    ) -> "Message":
        """A copy of this message with `raw_properties` (flags and property list), and
        optionally another routing key or exchange."""
        copy = Message(
            self.exchange if exchange is None else exchange,
            self.routing_key if routing_key is None else routing_key,
            content_header(len(self.body), raw_properties),
            self.body,
        )
        copy.published_at = self.published_at
        return copy


def routing_bytes(exchange: str, routing_key: str) -> bytes:
    """Exchange and routing key as two AMQP short strings (basic.deliver's encoding). A routing
    key longer than a short string can hold cannot come from an AMQP publish, but a dead-letter
    routing key or a trace copy's "deliver.<queue>" can be one: it is cut to its first 255 bytes
    (at a character boundary), so the message is delivered with as much of its key as AMQP 0-9-1
    carries. RabbitMQ 3.10 closes the consumer's connection with 541 there, and the message is
    lost; routing still uses the whole key."""
    return _short_string(exchange) + _short_string(routing_key)


def _short_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raw = raw[:255].decode("utf-8", "ignore").encode()
    return bytes((len(raw),)) + raw


def decode_properties(raw: bytes) -> BasicProperties:
    """Decode a property-flags + property-list block with pamqp."""
    flags = 0
    offset = 0
    word_index = 0
    while True:
        word = _flags.unpack_from(raw, offset)[0]
        offset += 2
        flags |= word << (word_index * 16)
        if not word & 1:
            break
        word_index += 1
    properties = BasicProperties()
    try:
        properties.unmarshal(flags, raw[offset:])
    except (ValueError, OverflowError, OSError):
        # pamqp refuses some property lists the broker accepts, as RabbitMQ does
        # (amqp_server/wire/codec.py, check_content_header): short strings that are not UTF-8, timestamps
        # beyond the year 9999. The broker must still read them (user_id, expiration, headers).
        return _decode_properties_leniently(flags, raw[offset:])
    return properties


# The basic properties in wire order: pamqp's attribute name, flag bit and encoding.
_PROPERTY_LAYOUT = (
    ("content_type", FLAG_CONTENT_TYPE, "shortstr"),
    ("content_encoding", FLAG_CONTENT_ENCODING, "shortstr"),
    ("headers", FLAG_HEADERS, "table"),
    ("delivery_mode", FLAG_DELIVERY_MODE, "octet"),
    ("priority", FLAG_PRIORITY, "octet"),
    ("correlation_id", FLAG_CORRELATION_ID, "shortstr"),
    ("reply_to", FLAG_REPLY_TO, "shortstr"),
    ("expiration", FLAG_EXPIRATION, "shortstr"),
    ("message_id", FLAG_MESSAGE_ID, "shortstr"),
    ("timestamp", FLAG_TIMESTAMP, "timestamp"),
    ("message_type", FLAG_TYPE, "shortstr"),
    ("user_id", FLAG_USER_ID, "shortstr"),
    ("app_id", FLAG_APP_ID, "shortstr"),
    ("cluster_id", FLAG_CLUSTER_ID, "shortstr"),
)
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _decode_properties_leniently(flags: int, data: bytes) -> BasicProperties:
    """The properties pamqp will not decode: text that is not UTF-8 gets U+FFFD in place of the
    bad bytes (so user_id and expiration compare unequal, as RabbitMQ's binaries do), a
    timestamp past year 9999 stays seconds, and headers are read as readers of stored messages
    read them (a field that cannot be decoded shows as invalid). Never raises for a list that
    is cut short: what is missing stays None."""
    properties = BasicProperties()
    pos = 0
    end = len(data)
    for name, flag, kind in _PROPERTY_LAYOUT:
        if not flags & flag:
            continue
        if kind == "shortstr":
            value_end = pos + 1 + data[pos] if pos < end else end + 1
            value: Any = data[pos + 1 : value_end].decode("utf-8", "replace")
        elif kind == "table":
            value_end = pos + 4 + _u32.unpack_from(data, pos)[0] if pos + 4 <= end else end + 1
            value = decode_headers_leniently(data, pos + 4, min(value_end, end))
        elif kind == "octet":
            value_end = pos + 1
            value = data[pos] if pos < end else None
        else:
            value_end = pos + 8
            value = _timestamp(_u64.unpack_from(data, pos)[0]) if value_end <= end else None
        if value_end > end:
            break
        setattr(properties, name, value)
        pos = value_end
    return properties


def _timestamp(seconds: int) -> datetime.datetime | int:
    try:
        return _EPOCH + datetime.timedelta(seconds=seconds)
    except OverflowError:
        return seconds



def content_header(body_size: int, raw_properties: bytes) -> bytes:
    """A basic-class content header payload: class 60, weight 0, body size, then the properties."""
    return _header_prefix.pack(60, 0, body_size) + raw_properties


# -- a message as one queue holds it ------------------------------------------------------

READY = 0
UNACKED = 1
GONE = 2  # acked, dropped, expired or dead-lettered
WAITING = 3  # returned by a consumer and waiting for its delayed retry (neither ready nor unacked)


class QueueEntry:
    """A message as one queue holds it.

    `seq` is the queue's own sequence number (its position: requeued messages go back by it);
    `delivery_count` counts deliveries from this queue, so redelivered is `delivery_count > 0`;
    `expires_at` is the wall-clock time (seconds) the message expires, 0 for never;
    `persisted` says the queue's journal holds it, so what happens to it is journaled too.
    """

    __slots__ = ("message", "seq", "delivery_count", "expires_at", "state", "persisted")

    def __init__(self, message: Message, seq: int, expires_at: float = 0.0, persisted: bool = False,
                 delivery_count: int = 0) -> None:
        self.message = message
        self.seq = seq
        self.delivery_count = delivery_count
        self.expires_at = expires_at
        self.state = READY
        self.persisted = persisted  # written to the queue's journal (a persistent message, durable queue)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 0

    # The queue moves its entries between states with these; nothing else writes them. A new
    # entry is READY, and the ready list leaves it so when it hands it out: whoever takes it
    # says what happens next (delivered, mark_unacked for basic.get, mark_gone).

    def delivered(self, no_ack: bool) -> None:
        """Delivered to a consumer once more: UNACKED until settled, or GONE with `no_ack` (that
        delivery was its last). Called after the delivery is made, which says redelivered by
        the count before this one. One call for what every delivery changes (per message)."""
        self.delivery_count += 1
        self.state = GONE if no_ack else UNACKED

    def mark_unacked(self) -> None:
        """Fetched with basic.get, to be acked."""
        self.state = UNACKED

    def mark_ready(self) -> None:
        """Back in the ready list (requeued, or its delayed retry is due)."""
        self.state = READY

    def mark_gone(self) -> None:
        """Settled for good: acked, dropped, expired or dead-lettered."""
        self.state = GONE

    def mark_waiting(self) -> None:
        """Returned by a consumer, waiting for its delayed retry."""
        self.state = WAITING

    def count_delivery(self) -> None:
        """Delivered once more (redelivered from now on)."""
        self.delivery_count += 1

    def expire_at(self, when: float) -> None:
        """Expires at wall-clock time `when` (seconds; 0 for never)."""
        self.expires_at = when
