"""Frame codec: bytes in, frames out, the fast writers for the hot path, and the door for
content headers.

pamqp encodes and decodes every method; only the methods that run once per message
(basic.publish, basic.ack and basic.deliver) get a hand-written path here, and the unit
tests prove those produce and accept the same bytes as pamqp. So do the replies that repeat a
name the client chose (queue.declare-ok, basic.get-ok, basic.return): pamqp refuses to encode
names outside the spec's character class, while RabbitMQ accepts any name a short string holds.

A content header is relayed to consumers as it arrived, so its wire format is checked here,
where the other wire formats are read: `check_content_header` accepts exactly what RabbitMQ 3.10
can decode, and `header_body_size` adds the class and size checks every publish's header gets
before its body is read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from pamqp import commands, frame as pamqp_frame
from pamqp.base import Frame as Method

from amqp_server.wire.errors import COMMAND_INVALID, FRAME_ERROR, PRECONDITION_FAILED, UNEXPECTED_FRAME, AMQPError
from persistence.properties_format import (
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
    from queues.message import Message

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# AMQP 0-9's header (class 1, instance 1, version 0-9). RabbitMQ speaks 0-9-1 to it, and clients
# of that era still send it (aioamqp 0.15 does). Which header asks for which protocol, AMQP
# 0-8's included: protocols.py.
LEGACY_0_9_HEADER = b"AMQP\x01\x01\x00\x09"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
# Not a type on the wire: FrameReader.frames(whole_publishes=True) yields a basic.publish method
# frame whose content header and its whole body, in one body frame, follow it, complete, in the
# same read, as one item of this type whose payload is the three payloads (method, header, body).
# A message that arrives in one read, the usual case, is then one step of the connection's loop,
# not three.
FRAME_PUBLISH = 0x100
_PUBLISH_PREFIX = b"\x00\x3c\x00\x28"  # basic.publish's class and method ids
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
# Frame header: type (octet), channel (short), payload size (long).
FRAME_HEADER_SIZE = 7
# Header + frame-end byte: what a frame costs beyond its payload.
FRAME_OVERHEAD = FRAME_HEADER_SIZE + 1
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

BASIC_CLASS = 60
PUBLISH_METHOD = 0x003C0028  # basic.publish (60, 40)
ACK_METHOD = 0x003C0050  # basic.ack (60, 80)
ACCESS_REQUEST_METHOD = 0x001E000A  # access.request (30, 10)

_frame_header = struct.Struct(">BHI")
# A content header frame's header, then its body size, past its class and weight (FrameReader.frames).
_content_head = struct.Struct(">BHI4xQ")
_method_index = struct.Struct(">I")
_deliver_tail = struct.Struct(">QB")
_deliver_head = struct.Struct(">BHIHH")  # frame header, then class and method ids
_end_and_header = struct.Struct(">BBHI")  # a frame's end byte, then the next frame's header
_content_header_prefix = struct.Struct(">HHQ")
_ack_fields = struct.Struct(">QB")
_declare_ok_counts = struct.Struct(">II")
_get_ok_head = struct.Struct(">IQB")
_get_ok_tail = struct.Struct(">I")
_return_head = struct.Struct(">IH")
QUEUE_DECLARE_OK_METHOD = 0x0032000B  # queue.declare-ok (50, 11)
GET_OK_METHOD = 0x003C0047  # basic.get-ok (60, 71)
RETURN_METHOD = 0x003C0032  # basic.return (60, 50)


class FrameReader:
    """Splits a byte stream into (type, channel, payload) frames; the one place that buffers input.

    Each payload is copied once, straight out of the read it arrived in (a bytes slice). A read
    that starts on a frame boundary is kept as it is, not copied into a buffer; the reads of a
    frame that arrives in pieces are joined once, when the frame is complete, so a frame that
    trickles in a byte at a time costs one join, not one copy per byte.
    """

    __slots__ = ("_data", "_offset", "_parts", "_parts_size", "_wanted", "max_frame_size")

    def __init__(self, max_frame_size: int) -> None:
        self._data = b""  # the unread input is _data[_offset:] followed by _parts
        self._offset = 0
        # A list only while a frame arrives in pieces: an idle connection's reader holds no
        # object of its own for the garbage collector.
        self._parts: list[bytes] | tuple[()] = ()
        self._parts_size = 0
        # Bytes from _offset on that the next frame (or the protocol header) needs; 0 when
        # unknown, which joins at the next feed.
        self._wanted = 0
        self.max_frame_size = max_frame_size

    def raise_frame_max(self, frame_max: int) -> None:
        """tune-ok settled on `frame_max`: frames up to that size are read from now on (a frame
        the loop in `frames` has not reached yet included)."""
        self.max_frame_size = frame_max

    def feed(self, data: bytes) -> None:
        if data.__class__ is not bytes:
            data = bytes(data)
        if not self._parts and self._offset == len(self._data):
            self._data = data
            self._offset = 0
            return
        if self._parts:
            self._parts.append(data)
        else:
            self._parts = [data]
        self._parts_size += len(data)
        if len(self._data) - self._offset + self._parts_size >= self._wanted:
            self._join()

    def _join(self) -> None:
        self._data = b"".join((memoryview(self._data)[self._offset :], *self._parts))
        self._offset = 0
        self._parts = ()
        self._parts_size = 0

    def frames(self, whole_publishes: bool = False) -> Generator[tuple[int, int, Any], None, None]:
        """Yield every complete frame buffered so far.

        With `whole_publishes`, a basic.publish whose content header and whole body, in one body
        frame of the size the header announces (not empty), are buffered too, on the same channel,
        each within frame_max and with its frame-end byte, is yielded as one FRAME_PUBLISH item
        (payload: the three payloads). Anything else about them is left for the frames one by one
        to show (and refuse): an empty body is complete at its header, where flow control may hold
        the connection before the next frame, and a body in several frames needs its assembly.

        Raises AMQPError 501 for a frame larger than the negotiated frame_max or a bad frame-end
        byte, as RabbitMQ does; the caller then closes the connection. Frames not taken (the
        caller stopped early and closed the generator) are yielded again next time.
        """
        data = self._data
        offset = self._offset
        end = len(data)
        unpack = _frame_header.unpack_from
        unpack_content_head = _content_head.unpack_from
        # Read again before refusing a frame: tune-ok, handled between two frames of this loop,
        # raises max_frame_size (it only ever grows on one reader).
        max_size = self.max_frame_size
        self._wanted = 0
        payload: bytes | tuple[bytes, bytes, bytes]  # a publish read whole: its three payloads
        try:
            while end - offset >= 8:  # FRAME_OVERHEAD
                frame_type, channel, size = unpack(data, offset)
                # RabbitMQ lets a payload reach frame_max (8 bytes of slack over the spec).
                if size > max_size and size > (max_size := self.max_frame_size):
                    raise AMQPError(
                        FRAME_ERROR,
                        f"type {frame_type}, all octets = <<>>: "
                        f"{{frame_too_large,{size},{self.max_frame_size - FRAME_OVERHEAD}}}",
                    )
                frame_end = offset + 7 + size  # FRAME_HEADER_SIZE
                if frame_end >= end:
                    self._wanted = frame_end + 1 - offset
                    break
                if data[frame_end] != 206:  # FRAME_END
                    raise AMQPError(
                        FRAME_ERROR,
                        f"type {frame_type}, all octets = <<>>: "
                        f"{{invalid_frame_end_marker,{data[frame_end]}}}",
                    )
                payload = data[offset + 7 : frame_end]
                offset = frame_end + 1
                # 31: the fewest bytes a content header (14: class, weight, body size, property
                # flags) and a body frame (1 byte) take, with their frame headers and end bytes.
                if frame_type == 1 and whole_publishes and end - offset >= 31 and payload.startswith(_PUBLISH_PREFIX):
                    header_type, header_channel, header_size, declared = unpack_content_head(data, offset)
                    header_end = offset + 7 + header_size
                    # (`declared` is the header's only if it holds one: at least class, weight,
                    # body size and property flags; a shorter one is refused one frame at a time.)
                    if header_type == 2 and header_channel == channel and 14 <= header_size <= max_size \
                            and header_end + 8 <= end and data[header_end] == 206:
                        body_type, body_channel, body_size = unpack(data, header_end + 1)
                        body_end = header_end + 8 + body_size
                        if body_type == 3 and body_channel == channel and 0 < body_size == declared <= max_size \
                                and body_end < end and data[body_end] == 206:
                            frame_type = FRAME_PUBLISH
                            payload = (payload, data[offset + 7 : header_end], data[header_end + 8 : body_end])
                            offset = body_end + 1
                yield frame_type, channel, payload
            else:
                self._wanted = FRAME_OVERHEAD
        finally:
            if self._data is not data:
                pass  # cleared while the frames were handled (the stream broke): nothing to keep
            elif offset == end:
                self._data = b""
                self._offset = 0
            else:
                self._offset = offset

    def take_unread(self) -> bytes:
        """Everything buffered and not yet taken as a frame, which leaves the buffer (a
        connection handed to another worker passes it on: handover.py)."""
        unread = b"".join((self._data[self._offset :], *self._parts))
        self.clear()
        return unread

    def clear(self) -> None:
        """Drop what is buffered: the stream is broken and nothing more will be read from it."""
        self._data = b""
        self._offset = 0
        self._parts = ()
        self._parts_size = 0

    def take_protocol_header(self) -> bytes | None:
        """Return the 8-byte protocol header once it has arrived."""
        if self._parts:
            self._join()
        if len(self._data) - self._offset < 8:
            self._wanted = 8
            return None
        header = self._data[self._offset : self._offset + 8]
        self._offset += 8
        return header


def refused_header_reason(header: bytes) -> str:
    """Why an 8-byte protocol header is refused, as RabbitMQ's log names it (rabbit_reader:
    bad_header, bad_version, or an AMQP 1.0 header without the 1.0 plugin)."""
    if header[:4] != b"AMQP":
        return f"{{bad_header,{erlang_binary(header)}}}"
    protocol_id, major, minor, revision = header[4:8]
    if (major, minor, revision) == (1, 0, 0):
        return "amqp1_0_plugin_not_enabled"
    return f"{{bad_version,{{{protocol_id},{major},{minor},{revision}}}}}"


def method_frame(channel: int, method: Method) -> bytes:
    """Encode a method with pamqp."""
    return pamqp_frame.marshal(method, channel)


def decode_method(payload: bytes) -> Method:
    """Decode a method payload with pamqp.

    Raises AMQPError as RabbitMQ does: 503 for a class/method id that does not exist,
    501 for arguments that cannot be decoded (RabbitMQ's reader crashes on those and drops the
    socket) or that nest tables too deep for pamqp.
    """
    index = method_index(payload)
    method_class: type[Method] | None = commands.INDEX_MAPPING.get(index)  # pamqp types it dict[int, type]
    if method_class is None:
        raise AMQPError(COMMAND_INVALID, "unknown method", index >> 16, index & 0xFFFF)
    method = method_class()
    try:
        method.unmarshal(payload[4:])
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        raise cannot_decode(payload) from None
    except RecursionError:
        # pamqp decodes nested tables recursively: arguments or client properties nested
        # hundreds of levels deep (a frame holds thousands) are refused like undecodable ones.
        raise cannot_decode(payload) from None
    return method


def cannot_decode(payload: bytes) -> AMQPError:
    index = _method_index.unpack_from(payload)[0]
    shown = ",".join(str(byte) for byte in payload[4:36])
    return AMQPError(FRAME_ERROR, f"cannot decode <<{shown}>>", index >> 16, index & 0xFFFF)


def method_index(payload: bytes) -> int:
    """Class and method id of a method frame; 501 when the frame is too short to hold them."""
    if len(payload) < 4:
        raise AMQPError(FRAME_ERROR, f"type 1, all octets = {erlang_binary(payload)}: {{method_frame_too_short}}")
    return _method_index.unpack_from(payload)[0]  # type: ignore[no-any-return]  # struct's fields are Any


def read_shortstr(payload: bytes, offset: int) -> tuple[str, int]:
    length = payload[offset]
    start = offset + 1
    return payload[start : start + length].decode("utf-8"), start + length


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool, bytes]:
    """Fast decode of basic.publish: exchange, routing key, mandatory, immediate.

    Also returns the raw exchange and routing-key short strings, which basic.deliver
    repeats byte for byte. IndexError or UnicodeDecodeError for a payload that cannot hold them.
    """
    # payload: class+method (4), ticket (2), exchange shortstr, routing-key shortstr, bits.
    key_at = 7 + payload[6]
    bits_at = key_at + 1 + payload[key_at]
    routing_raw = payload[6:bits_at]
    bits = payload[bits_at] if bits_at < len(payload) else 0
    return (
        payload[7:key_at].decode() if key_at > 7 else "",
        payload[key_at + 1 : bits_at].decode(),
        bool(bits & 1),
        bool(bits & 2),
        routing_raw,
    )


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """Fast decode of basic.ack: delivery tag and multiple."""
    tag, bits = _ack_fields.unpack_from(payload, 4)
    return tag, bool(bits & 1)


def shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError("short string longer than 255 bytes")
    return bytes((len(raw),)) + raw


def deliver_frames(
    channel: int,
    consumer_tag_raw: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange_and_key_raw: bytes,
    raw_header: bytes,
    body: bytes,
    max_body_frame: int,
) -> list[bytes]:
    """basic.deliver + content header + body frames, built from the raw bytes that arrived.

    The fixed parts of neighbouring frames are packed together (a frame's end byte with the
    next frame's header), so a delivery is a few pieces for the output's one join."""
    size = len(body)
    if size > max_body_frame or not size:
        out = [
            _deliver_head.pack(FRAME_METHOD, channel, 13 + len(consumer_tag_raw) + len(exchange_and_key_raw), 60, 60),
            consumer_tag_raw,
            _deliver_tail.pack(delivery_tag, 1 if redelivered else 0),
            exchange_and_key_raw,
            FRAME_END_BYTE,
        ]
        content_frames(out, channel, raw_header, body, max_body_frame)
        return out
    return [
        _deliver_head.pack(FRAME_METHOD, channel, 13 + len(consumer_tag_raw) + len(exchange_and_key_raw), 60, 60),
        consumer_tag_raw,
        _deliver_tail.pack(delivery_tag, 1 if redelivered else 0),
        exchange_and_key_raw,
        _end_and_header.pack(FRAME_END, FRAME_HEADER, channel, len(raw_header)),
        raw_header,
        _end_and_header.pack(FRAME_END, FRAME_BODY, channel, size),
        body,
        FRAME_END_BYTE,
    ]


def deliveries_frames(
    out: list[bytes],
    channel: int,
    consumer_tag_raw: bytes,
    first_tag: int,
    messages: "list[Message]",
    max_body_frame: int,
) -> int:
    """The frames of first deliveries (not redelivered) of `messages`, with tags from
    `first_tag` on, appended to `out` as deliver_frames makes each; returns their body bytes.
    The fixed bytes before and after the delivery tag are packed once for each run of messages
    with the same `routing_raw` object."""
    routing: bytes | None = None
    head = b""
    after_tag: Callable[..., bytes] = _deliver_tail.pack
    total = 0
    tag = first_tag
    end_and_header = _end_and_header.pack
    extend = out.extend
    for message in messages:
        exchange_and_key_raw = message.routing_raw
        raw_header = message.raw_header
        body = message.body
        size = len(body)
        total += size
        if size > max_body_frame or not size:
            extend(deliver_frames(channel, consumer_tag_raw, tag, False, exchange_and_key_raw, raw_header, body,
                                  max_body_frame))
            tag += 1
            continue
        if exchange_and_key_raw is not routing:
            routing = exchange_and_key_raw
            head = _deliver_head.pack(FRAME_METHOD, channel, 13 + len(consumer_tag_raw) + len(routing), 60, 60) + consumer_tag_raw
            after_tag = struct.Struct(f">QB{len(routing)}sBBHI").pack
        extend((head, after_tag(tag, 0, routing, FRAME_END, FRAME_HEADER, channel, len(raw_header)), raw_header,
                end_and_header(FRAME_END, FRAME_BODY, channel, size), body, FRAME_END_BYTE))
        tag += 1
    return total


def _method_frame_of(channel: int, payload: bytes) -> bytes:
    return _frame_header.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def queue_declare_ok_frame(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    """queue.declare-ok naming the queue byte for byte, whatever characters the client chose."""
    payload = _method_index.pack(QUEUE_DECLARE_OK_METHOD) + shortstr(queue) + _declare_ok_counts.pack(
        message_count, consumer_count
    )
    return _method_frame_of(channel, payload)


def get_ok_frame(channel: int, delivery_tag: int, redelivered: bool, routing_raw: bytes, message_count: int) -> bytes:
    """basic.get-ok; `routing_raw` is the exchange and routing key as two short strings (Message.routing_raw)."""
    payload = b"".join(
        (_get_ok_head.pack(GET_OK_METHOD, delivery_tag, 1 if redelivered else 0), routing_raw,
         _get_ok_tail.pack(message_count))
    )
    return _method_frame_of(channel, payload)


def return_frame(channel: int, reply_code: int, reply_text: str, routing_raw: bytes) -> bytes:
    """basic.return; `routing_raw` is the exchange and routing key as two short strings (Message.routing_raw)."""
    payload = _return_head.pack(RETURN_METHOD, reply_code) + shortstr(reply_text) + routing_raw
    return _method_frame_of(channel, payload)


def content_frames(out: list[bytes], channel: int, raw_header: bytes, body: bytes, max_body_frame: int) -> None:
    """Append the content header frame and the body frames (split at frame_max) to `out`."""
    out.append(_frame_header.pack(FRAME_HEADER, channel, len(raw_header)))
    out.append(raw_header)
    out.append(FRAME_END_BYTE)
    size = len(body)
    if size <= max_body_frame:
        if size:
            out.append(_frame_header.pack(FRAME_BODY, channel, size))
            out.append(body)
            out.append(FRAME_END_BYTE)
        return
    view = memoryview(body)
    for start in range(0, size, max_body_frame):
        chunk = view[start : start + max_body_frame]
        out.append(_frame_header.pack(FRAME_BODY, channel, len(chunk)))
        # A slice of a large body, uncopied: the frames go to the transport's writelines, which
        # takes any bytes-like object. (Typed list[bytes] with every sender's frames for now.)
        out.append(chunk)  # type: ignore[arg-type]
        out.append(FRAME_END_BYTE)


def content_header_body_size(payload: bytes) -> tuple[int, int]:
    """Class id and body size of a content header payload; 501 if it cannot hold them (class,
    weight and body size: 12 bytes). A missing flag word is the property check's to refuse."""
    if len(payload) < _content_header_prefix.size:
        raise AMQPError(FRAME_ERROR, f"type 2, all octets = {erlang_binary(payload)}: {{content_header_too_short}}")
    class_id, _weight, body_size = _content_header_prefix.unpack_from(payload)
    return class_id, body_size


def access_request_ok_frame(channel: int) -> bytes:
    """access.request-ok with ticket 1 (class 30 is gone from pamqp 4 but old clients send it)."""
    payload = struct.pack(">HHH", 30, 11, 1)
    return _frame_header.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def channel_open_ok_frame(channel: int) -> bytes:
    """channel.open-ok with the deprecated channel-id empty, as RabbitMQ sends it (pamqp only
    builds it holding "0")."""
    payload = struct.pack(">HHI", 20, 11, 0)
    return _frame_header.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def erlang_binary(data: bytes, limit: int = 16) -> str:
    """Bytes as Erlang prints a binary, as RabbitMQ's frame-error texts show them."""
    data = data[:limit]
    if data and all(32 <= byte < 127 and byte not in (34, 92) for byte in data):
        return f'<<"{data.decode()}">>'
    return "<<" + ",".join(str(byte) for byte in data) + ">>"


# -- the door: content headers consumers can decode --------------------------------------------
#
# A content header is relayed to consumers byte for byte, so it must hold exactly what RabbitMQ
# 3.10 can decode (the field types of persistence/properties_format.py, no continuation flag
# word, no byte left over) and tables and arrays nested at most MAX_NESTING_DEPTH deep:
# docs/security.md, "Hostile input". Every publish's header is checked here before its body is read.

_DELIVERY_MODE_BIT = 1 << 12
_PROPERTY_BITS = 0xFFFC  # bit 1 is reserved (ignored, as by RabbitMQ and every client)
_PROPERTIES_START = 14  # class, weight, body size, property flags
_u32 = struct.Struct(">I")
_unpack_header_prefix = _content_header_prefix.unpack_from  # class, weight, body size


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
    body_size: int  # (struct's fields are Any to mypy)
    try:  # content_header_body_size, without the call
        class_id, _weight, body_size = _unpack_header_prefix(payload)
    except struct.error:
        class_id, body_size = content_header_body_size(payload)  # raises its 501
    if class_id != BASIC_CLASS:
        raise AMQPError(
            UNEXPECTED_FRAME,
            f"expected content header for class 60, got one for class {class_id} instead",
            60,
            40,
        )
    if body_size > max_size:
        raise AMQPError(
            PRECONDITION_FAILED,
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
