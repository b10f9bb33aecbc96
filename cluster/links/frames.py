"""The frames of the node-to-node link that the broker's codec does not already build or read.

The link is AMQP 0-9-1 (docs/cluster.md says why) plus one method of our own, `forward-to`:
it names the queues, owned by the receiving node, that the publishes following it on the same
channel go into, without routing them again, so a message keeps the exchange and routing key
it was published with and reaches each of the owner's queues it was routed to once. It is
sent only when the set of queues changes, so a stream of messages to one queue costs one
forward-to in all. Only a connection logged in with the cluster secret may send it; to anyone
else it is an unknown method (503), as any method id AMQP does not define.

Deliveries, get-ok and the hot settlement frames are read and built by hand here, as the codec
does for the broker's own hot frames: no pamqp decoding per message.
"""

from __future__ import annotations

import struct

from amqp_server.wire import codec

CLUSTER_CLASS = 3000  # not an AMQP class: ids of 3000 and up are never sent by a client library
FORWARD_TO_METHOD = (CLUSTER_CLASS << 16) | 10
DELIVER_METHOD = 0x003C003C  # basic.deliver (60, 60)
GET_OK_METHOD = codec.GET_OK_METHOD
GET_EMPTY_METHOD = 0x003C0048  # basic.get-empty (60, 72)

_frame_header = struct.Struct(">BHI")
_u16 = struct.Struct(">H")
_method_and_ticket = struct.Struct(">IH")
_tag_and_bits = struct.Struct(">QB")
_settle = struct.Struct(">IQB")
_u32 = struct.Struct(">I")
_BASIC_ACK = 0x003C0050
_BASIC_REJECT = 0x003C005A
_BASIC_NACK = 0x003C0078


def _method(channel: int, payload: bytes) -> bytes:
    return _frame_header.pack(codec.FRAME_METHOD, channel, len(payload)) + payload + codec.FRAME_END_BYTE


def forward_to_frame(channel: int, queue_names: tuple[str, ...]) -> bytes:
    """forward-to: the following publishes on `channel` go into these queues of the receiver."""
    parts = [_u32.pack(FORWARD_TO_METHOD), _u16.pack(len(queue_names))]
    parts.extend(codec.shortstr(name) for name in queue_names)
    return _method(channel, b"".join(parts))


def decode_forward_to(payload: bytes) -> list[str]:
    """The queue names of a forward-to payload (IndexError/UnicodeDecodeError when malformed)."""
    count = _u16.unpack_from(payload, 4)[0]
    names = []
    offset = 6
    for _ in range(count):
        name, offset = codec.read_shortstr(payload, offset)
        names.append(name)
    if offset != len(payload):
        raise IndexError("forward-to is longer than its queue names")
    return names


def publish_frame(channel: int, routing_raw: bytes) -> bytes:
    """basic.publish (not mandatory) with the exchange and routing key as two raw short strings."""
    return _method(channel, _method_and_ticket.pack(codec.PUBLISH_METHOD, 0) + routing_raw + b"\x00")


def ack_frame(channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
    return _method(channel, _settle.pack(_BASIC_ACK, delivery_tag, 1 if multiple else 0))


def reject_frame(channel: int, delivery_tag: int, requeue: bool) -> bytes:
    return _method(channel, _settle.pack(_BASIC_REJECT, delivery_tag, 1 if requeue else 0))


def nack_frame(channel: int, delivery_tag: int, multiple: bool, requeue: bool) -> bytes:
    return _method(channel, _settle.pack(_BASIC_NACK, delivery_tag, (1 if multiple else 0) | (2 if requeue else 0)))


def decode_deliver(payload: bytes) -> tuple[str, int, bool, bytes]:
    """basic.deliver: consumer tag, delivery tag, redelivered, and the exchange and routing key
    as two raw short strings (what our own deliveries repeat byte for byte)."""
    consumer_tag, offset = codec.read_shortstr(payload, 4)
    delivery_tag, bits = _tag_and_bits.unpack_from(payload, offset)
    return consumer_tag, delivery_tag, bool(bits & 1), payload[offset + 9:]


def decode_get_ok(payload: bytes) -> tuple[int, bool, bytes, int]:
    """basic.get-ok: delivery tag, redelivered, raw exchange and routing key, message count."""
    delivery_tag, bits = _tag_and_bits.unpack_from(payload, 4)
    return delivery_tag, bool(bits & 1), payload[13:-4], _u32.unpack_from(payload, len(payload) - 4)[0]


def split_routing_raw(routing_raw: bytes) -> tuple[str, str]:
    """The exchange and routing key out of their two raw short strings."""
    exchange, offset = codec.read_shortstr(routing_raw, 0)
    routing_key, _ = codec.read_shortstr(routing_raw, offset)
    return exchange, routing_key
