"""Content assembly: one basic.publish as its frames arrive (method, content header, bodies).

AMQP sends a message as a basic.publish method frame, one content header frame with the body
size and properties, then body frames until that size is reached (spec 4.2.6). A channel
starts a ContentAssembly at the method (Channel.handle_method) and hands it every frame
after; anything else in between is refused with RabbitMQ's 505 texts, and so is a header of
another class or a body larger than declared. The header is checked before the body is read,
so a message consumers could not decode is refused without holding its body. A publish whose
three frames came in one read, the usual case, needs no assembly: Channel.handle_publish checks
its header with the same `header_body_size` and makes the message at once.

That check is the broker's door for properties (`check_content_header`, below): the content
header is relayed to consumers byte for byte, so it must hold exactly what RabbitMQ 3.10 can
decode (the field types of queues/field_tables.py, no continuation flag word, no byte left
over) and tables and arrays nested at most MAX_NESTING_DEPTH deep. docs/security.md, "Hostile
input".
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from amqp_server import codec, errors
from amqp_server.errors import AMQPError
from queues.field_tables import (
    ARRAY,
    CONTINUATION_BIT,
    FIELD_KINDS,
    HEADERS_TABLE,
    LONG_STRING,
    MAX_NESTING_DEPTH,
    PROPERTY_KINDS,
    SHORT_STRING,
    TABLE,
    UNKNOWN,
)

if TYPE_CHECKING:
    from exchanges import Exchange


class ContentAssembly:
    """A basic.publish whose content header and body are still arriving."""

    __slots__ = (
        "exchange", "routing_key", "mandatory", "routing_raw", "raw_header", "body_size", "parts", "received", "in_flight"
    )

    def __init__(self, exchange: "Exchange", routing_key: str, mandatory: bool, routing_raw: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.routing_raw = routing_raw
        self.raw_header: bytes | None = None
        self.body_size = 0
        # The body frames so far, made only once a body comes in more than one frame: most
        # messages' body is one frame, and this runs for every publish.
        self.parts: list[bytes] | None = None
        self.received = 0
        # Counted in the connection's content_in_flight: a first body frame left it incomplete.
        self.in_flight = False

    def counted_in_flight(self) -> None:
        """Its connection counts it in content_in_flight from now on (Channel._content_in_flight):
        the count goes down when it completes or its channel goes."""
        self.in_flight = True

    def method_refused(self) -> AMQPError:
        """The error for a method frame that arrives before this content is complete."""
        if self.raw_header is None:
            text = "expected content header for class 60, got non content header frame instead"
        else:
            text = "expected content body, got non content body frame instead"
        return AMQPError(errors.UNEXPECTED_FRAME, text, 60, 40)

    def take_header(self, payload: bytes, max_size: int) -> bool:
        """The content header frame; True if the content is complete (an empty body). Raises
        AMQPError for a header out of turn, and what `header_body_size` raises."""
        if self.raw_header is not None:
            raise AMQPError(errors.UNEXPECTED_FRAME, "expected content body, got non content body frame instead")
        body_size = header_body_size(payload, max_size)
        self.raw_header = payload
        self.body_size = body_size
        return body_size == 0

    def take_body(self, payload: bytes) -> bytes | None:
        """One body frame (the header came: the channel checks `raw_header` first); the whole
        body once complete, else None. FRAME_ERROR if the bodies exceed the declared size."""
        received = self.received + len(payload)
        parts = self.parts
        if parts is None:
            if received == self.body_size:
                return payload  # the usual case: the whole body in one frame
            parts = self.parts = []
        parts.append(payload)
        self.received = received
        if received < self.body_size:
            return None
        if received > self.body_size:
            raise AMQPError(errors.FRAME_ERROR, f"content body larger than declared: {received} > {self.body_size}")
        return parts[0] if len(parts) == 1 else b"".join(parts)


# -- the door: content headers consumers can decode ------------------------------------------

_DELIVERY_MODE_BIT = 1 << 12
_PROPERTY_BITS = 0xFFFC  # bit 1 is reserved (ignored, as by RabbitMQ and every client)
_PROPERTIES_START = 14  # class, weight, body size, property flags
_u32 = struct.Struct(">I")
_unpack_header_prefix = struct.Struct(">HHQ").unpack_from  # class, weight, body size


class InvalidContentHeader(ValueError):
    """A content header the broker refuses; `reason` says why, for the log (only the depth
    limit's reason is also the text clients get, as RabbitMQ has no text for it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UndecodableProperties(InvalidContentHeader):
    """RabbitMQ cannot decode these properties either: it closes the connection with 541."""


class NestedTooDeep(InvalidContentHeader):
    """Tables and arrays nested deeper than MAX_NESTING_DEPTH (this broker's own limit)."""


class UnknownDeliveryMode(InvalidContentHeader):
    """delivery_mode other than 1 or 2, which RabbitMQ refuses with 406."""

    def __init__(self, delivery_mode: int) -> None:
        super().__init__(f"delivery_mode {delivery_mode}")
        self.delivery_mode = delivery_mode


# The whole payload's length for each flag word whose properties are all fixed-width (none, or
# any of delivery_mode, priority, timestamp; with or without the reserved bit): one dict lookup
# and one comparison check them, delivery_mode being the first when present.
_FIXED_WIDTH_LENGTHS = {
    flags | reserved: _PROPERTIES_START + sum(width for bit, width in ((1 << 12, 1), (1 << 11, 1), (1 << 6, 8))
                                              if flags & bit)
    for flags in (0, 1 << 12, 1 << 11, 1 << 6, 3 << 11, (1 << 12) | (1 << 6), (1 << 11) | (1 << 6),
                  (3 << 11) | (1 << 6))
    for reserved in (0, 2)
}

# The properties present for each first flag word, computed once per distinct word.
_layouts: dict[int, tuple[int, ...]] = {}


def _layout(flags: int) -> tuple[int, ...]:
    layout = tuple(kind for index, kind in enumerate(PROPERTY_KINDS) if flags & (1 << (15 - index)))
    _layouts[flags] = layout  # at most 2**14 entries, one per combination of properties
    return layout


def header_body_size(payload: bytes, max_size: int) -> int:
    """The body size the basic content header `payload` announces, once the header is found
    acceptable. Raises AMQPError for a header of another class or announcing more than
    `max_size` bytes, and InvalidContentHeader (check_content_header) for properties consumers
    could not decode. (A publish read whole skips the ContentAssembly and asks this directly:
    Channel.handle_publish.)"""
    try:  # codec.content_header_body_size, without the call
        class_id, _weight, body_size = _unpack_header_prefix(payload)
    except struct.error:
        class_id, body_size = codec.content_header_body_size(payload)  # raises its 501
    if class_id != codec.BASIC_CLASS:
        raise AMQPError(
            errors.UNEXPECTED_FRAME,
            f"expected content header for class 60, got one for class {class_id} instead",
            60,
            40,
        )
    if body_size > max_size:
        raise AMQPError(
            errors.PRECONDITION_FAILED,
            f"message size {body_size} is larger than configured max size {max_size}",
            60,
            40,
        )
    check_content_header(payload)  # before the body is read: consumers must decode it
    return body_size


def check_content_header(payload: bytes) -> None:
    """Accept the basic content header `payload` (class, weight and body size, then the flags
    and properties) or raise the InvalidContentHeader subclass that says how to refuse it.

    Costs a few byte reads for properties without headers, and one step per header field."""
    end = len(payload)
    if end < _PROPERTIES_START:
        raise UndecodableProperties("no property flags")
    flags = (payload[12] << 8) | payload[13]
    if _FIXED_WIDTH_LENGTHS.get(flags) == end:  # the common case: nothing of variable length
        if flags & _DELIVERY_MODE_BIT and payload[_PROPERTIES_START] not in (1, 2):
            raise UnknownDeliveryMode(payload[_PROPERTIES_START])
        return
    if flags & CONTINUATION_BIT:
        # RabbitMQ reads one flag word: a second one is left over (541). With none following,
        # RabbitMQ relays the bit and pika and aio-pika consumers fail reading the missing word.
        raise UndecodableProperties("a continuation flag word (class basic has one)")
    pos = _PROPERTIES_START
    delivery_mode_at: int | None = None
    layout = _layouts.get(flags & _PROPERTY_BITS)
    if layout is None:
        layout = _layout(flags & _PROPERTY_BITS)
    for kind in layout:
        if kind == SHORT_STRING:
            if pos >= end:
                raise UndecodableProperties("the property list is cut short")
            pos += 1 + payload[pos]
        elif kind == HEADERS_TABLE:
            if pos + 4 > end:
                raise UndecodableProperties("the property list is cut short")
            table_end = pos + 4 + _u32.unpack_from(payload, pos)[0]
            if table_end > end:
                raise UndecodableProperties("the headers table is longer than the frame")
            _scan_table(payload, pos + 4, table_end, 1)
            pos = table_end
        else:
            if delivery_mode_at is None and flags & _DELIVERY_MODE_BIT:
                delivery_mode_at = pos  # the first fixed-width property present
            pos += kind
    if pos != end:
        raise UndecodableProperties(
            "the property list is cut short" if pos > end else f"{end - pos} bytes after the property list"
        )
    # RabbitMQ checks delivery_mode once the properties decode (rabbit_basic:message).
    if delivery_mode_at is not None and payload[delivery_mode_at] not in (1, 2):
        raise UnknownDeliveryMode(payload[delivery_mode_at])


def _scan_table(raw: bytes, pos: int, end: int, depth: int) -> None:
    """Walk the entries of the table whose body is raw[pos:end]."""
    while pos < end:
        pos += 1 + raw[pos]  # the field name
        if pos >= end:
            raise UndecodableProperties("a field table entry runs past its table")
        pos = _scan_value(raw, pos, end, depth)


def _scan_array(raw: bytes, pos: int, end: int, depth: int) -> None:
    while pos < end:
        pos = _scan_value(raw, pos, end, depth)


def _scan_value(raw: bytes, pos: int, end: int, depth: int) -> int:
    """Position after the field value (type octet first) at `pos`, which must end by `end`."""
    kind = FIELD_KINDS[raw[pos]]
    pos += 1
    if kind >= 0:
        pos += kind
    elif kind == UNKNOWN:
        raise UndecodableProperties(f"unknown field type {raw[pos - 1]:#04x}")
    else:
        if pos + 4 > end:
            raise UndecodableProperties("a field value runs past its table")
        value_end = pos + 4 + _u32.unpack_from(raw, pos)[0]
        if value_end > end:
            raise UndecodableProperties("a field value runs past its table")
        if kind != LONG_STRING:
            if depth >= MAX_NESTING_DEPTH:
                raise NestedTooDeep(f"tables and arrays nested deeper than {MAX_NESTING_DEPTH}")
            if kind == TABLE:
                _scan_table(raw, pos + 4, value_end, depth + 1)
            else:
                _scan_array(raw, pos + 4, value_end, depth + 1)
        pos = value_end
    if pos > end:
        raise UndecodableProperties("a field value runs past its table")
    return pos
