"""Hand-built AMQP 0-9-1 frames for the benchmark's hot paths.

pamqp builds frames through generic per-field marshalling, which costs several
microseconds per message; at tens of thousands of messages per second that
would make the client, not the broker, the thing being measured. The frames
here are packed with `struct` directly. Everything that is not on a hot path
(handshake, declarations) still goes through pamqp.

Frame layout: type (1) | channel (2) | payload size (4) | payload | 0xCE.
"""

from __future__ import annotations

import struct

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_OVERHEAD = 8  # 7-byte frame header + frame-end octet

# class_id << 16 | method_id, as one big-endian u32 at the start of a method payload.
BASIC_PUBLISH = (60 << 16) | 40
BASIC_DELIVER = (60 << 16) | 60
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120

FRAME_HEADER_STRUCT = struct.Struct(">BHI")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")

DELIVERY_MODE_FLAG = 0x1000  # basic property flag bit for delivery-mode
HEARTBEAT_FRAME = bytes([FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END])


def _frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return FRAME_HEADER_STRUCT.pack(frame_type, channel, len(payload)) + payload + b"\xce"


def _shortstr(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 bytes: {value[:40]}...")
    return bytes([len(raw)]) + raw


def publish_method(channel: int, exchange: str, routing_key: str, mandatory: bool = False) -> bytes:
    """The Basic.Publish method frame; constant for a given exchange and key, so callers cache it."""
    payload = U32.pack(BASIC_PUBLISH) + b"\x00\x00" + _shortstr(exchange) + _shortstr(routing_key)
    payload += bytes([1 if mandatory else 0])
    return _frame(FRAME_METHOD, channel, payload)


def content_header(channel: int, body_size: int, persistent: bool) -> bytes:
    """A Basic content header carrying only delivery-mode (2 when persistent, else no properties)."""
    if persistent:
        props = struct.pack(">HB", DELIVERY_MODE_FLAG, 2)
    else:
        props = b"\x00\x00"
    payload = struct.pack(">HHQ", 60, 0, body_size) + props
    return _frame(FRAME_HEADER, channel, payload)


def body_frames(channel: int, body: bytes, frame_max: int) -> bytes:
    """The body split into frames no larger than the negotiated frame_max."""
    if not body:
        return b""
    chunk = frame_max - FRAME_OVERHEAD
    if len(body) <= chunk:
        return FRAME_HEADER_STRUCT.pack(FRAME_BODY, channel, len(body)) + body + b"\xce"
    return b"".join(_frame(FRAME_BODY, channel, body[i : i + chunk]) for i in range(0, len(body), chunk))


def publish(channel: int, exchange: str, routing_key: str, body: bytes, persistent: bool, frame_max: int) -> bytes:
    """All frames of one Basic.Publish: method, content header, body."""
    return (
        publish_method(channel, exchange, routing_key)
        + content_header(channel, len(body), persistent)
        + body_frames(channel, body, frame_max)
    )


_ACK = struct.Struct(">BHIIQBB")


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Basic.Ack; with multiple=True it acknowledges every tag up to and including delivery_tag."""
    return _ACK.pack(FRAME_METHOD, channel, 13, BASIC_ACK, delivery_tag, 1 if multiple else 0, FRAME_END)


def basic_deliver(channel: int, consumer_tag: str, delivery_tag: int, exchange: str, routing_key: str) -> bytes:
    """Basic.Deliver method frame (used by the null broker that measures the client's ceiling)."""
    payload = (
        U32.pack(BASIC_DELIVER)
        + _shortstr(consumer_tag)
        + U64.pack(delivery_tag)
        + b"\x00"
        + _shortstr(exchange)
        + _shortstr(routing_key)
    )
    return _frame(FRAME_METHOD, channel, payload)
