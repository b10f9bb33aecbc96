"""Frame codec: bytes in, frames out, and the fast writers for the hot path.

pamqp encodes and decodes every method; only the methods that run once per message
(basic.publish, basic.ack and basic.deliver) get a hand-written path here, and the unit
tests prove those produce and accept the same bytes as pamqp. So do the replies that repeat a
name the client chose (queue.declare-ok, basic.get-ok, basic.return): pamqp refuses to encode
names outside the spec's character class, while RabbitMQ accepts any name a short string holds.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from pamqp import commands, frame as pamqp_frame
from pamqp.base import Frame as Method

from amqp_server.errors import COMMAND_INVALID, FRAME_ERROR, AMQPError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# AMQP 0-9's header (class 1, instance 1, version 0-9). RabbitMQ speaks 0-9-1 to it, and clients
# of that era still send it (aioamqp 0.15 does).
LEGACY_0_9_HEADER = b"AMQP\x01\x01\x00\x09"
ACCEPTED_HEADERS = frozenset((PROTOCOL_HEADER, LEGACY_0_9_HEADER))
# AMQP 0-8's headers (the spec's and the one most 0-8 clients send): RabbitMQ 3.10 still speaks
# 0-8, whose connection class differs from 0-9-1's; this broker does not.
AMQP_0_8_HEADERS = frozenset((b"AMQP\x01\x01\x08\x00", b"AMQP\x01\x01\x09\x01"))
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
# Not a type on the wire: FrameReader.frames(whole_publishes=True) yields a basic.publish method
# frame whose content header and one body frame follow it, complete, in the same read, as one
# item of this type whose payload is the three payloads (method, header, body). A message that
# arrives in one read, the usual case, is then one step of the connection's loop, not three.
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

    def frames(self, whole_publishes: bool = False) -> Iterator[tuple[int, int, Any]]:
        """Yield every complete frame buffered so far.

        With `whole_publishes`, a basic.publish whose content header and single body frame are
        buffered too, on the same channel, each within frame_max and with its frame-end byte, is
        yielded as one FRAME_PUBLISH item (payload: the three payloads). Anything else about them
        is left for the frames one by one to show (and refuse).

        Raises AMQPError 501 for a frame larger than the negotiated frame_max or a bad frame-end
        byte, as RabbitMQ does; the caller then closes the connection. Frames not taken (the
        caller stopped early and closed the generator) are yielded again next time.
        """
        data = self._data
        offset = self._offset
        end = len(data)
        unpack = _frame_header.unpack_from
        # Read again before refusing a frame: tune-ok, handled between two frames of this loop,
        # raises max_frame_size (it only ever grows on one reader).
        max_size = self.max_frame_size
        self._wanted = 0
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
                if frame_type == 1 and whole_publishes and end - offset >= 16 and payload.startswith(_PUBLISH_PREFIX):
                    header_type, header_channel, header_size = unpack(data, offset)
                    header_end = offset + 7 + header_size
                    if header_type == 2 and header_channel == channel and header_size <= max_size \
                            and header_end + 8 <= end and data[header_end] == 206:
                        body_type, body_channel, body_size = unpack(data, header_end + 1)
                        body_end = header_end + 8 + body_size
                        if body_type == 3 and body_channel == channel and body_size <= max_size \
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
    if header in AMQP_0_8_HEADERS:
        return "AMQP 0-8 is not supported"
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
    method_class = commands.INDEX_MAPPING.get(index)
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
    return _method_index.unpack_from(payload)[0]


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
        out.append(chunk)
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
