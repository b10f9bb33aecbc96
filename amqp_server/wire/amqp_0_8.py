"""AMQP 0-8 as RabbitMQ 3.10 speaks it, translated at the codec: the broker above sees the
0-9-1 methods pamqp makes (and writes them), this module knows where 0-8's bytes differ.

What RabbitMQ 3.10.8 speaks to a 0-8 client is its rabbit_framing_amqp_0_8, the 0-8 spec plus
RabbitMQ's extensions of it (queue.unbind, basic.recover-async, basic.recover and recover-ok
under their 0-9-1 ids). Encoding each method common to it and rabbit_framing_amqp_0_9_1 with
both modules gives the same bytes except for:

- connection.close and close-ok, 10.60 and 10.61 (0-9-1: 10.50 and 10.51, and 10.60 and 10.61
  are connection.blocked and unblocked);
- channel.open-ok, which has no field (0-9-1: a reserved long string);
- basic.consume, which has no arguments table (0-9-1 appends one).

Frames (types, the frame-end byte 0xCE, heartbeats), content headers and their properties, and
reply codes are the same. Methods only 0-9-1 has (connection.blocked, unblocked and
update-secret, exchange.bind and unbind, basic.nack, the confirm class) are unknown method ids
on a 0-8 connection. Methods only 0-8 has (connection.redirect, channel.alert, the file, stream,
dtx, tunnel and test classes) RabbitMQ decodes and then implements nowhere: here their fields'
sizes are checked and they become `UnimplementedMethod`s, which no handler takes: 503
"unimplemented method" on a channel, 504 "unexpected method in connection state ..." on
channel 0, as RabbitMQ answers them.

A method a 0-8 client sends is decoded by `decode_method`; a channel-0 method the broker sends
is encoded by `connection_frame` (the channel's methods are the same bytes in both versions,
channel.open-ok aside: `channel_open_ok_frame`). A 0-9-1 connection never calls any of this.
"""

from __future__ import annotations

import struct
from typing import ClassVar

from pamqp import commands
from pamqp.base import Frame as Method

from amqp_server.wire import codec
from amqp_server.wire.errors import COMMAND_INVALID, AMQPError

CLOSE = 0x000A003C  # connection.close (10, 60)
CLOSE_OK = 0x000A003D  # connection.close-ok (10, 61)
CONSUME = 0x003C0014  # basic.consume (60, 20)
CHANNEL_OPEN_OK = 0x0014000B  # channel.open-ok (20, 11)
# What 0-8's consume and open-ok lack: an empty table, an empty long string (both 4 zero bytes).
_MISSING_LAST_FIELD = b"\x00\x00\x00\x00"

_u32 = struct.Struct(">I")  # the ids of a method, a long string's or a table's size
_channel_open_ok = struct.Struct(">BHIHHB")


def _ids(*pairs: tuple[int, tuple[int, ...]]) -> frozenset[int]:
    return frozenset((class_id << 16) | method_id for class_id, methods in pairs for method_id in methods)


# Same ids and the same fields in 0-8 and 0-9-1: decoded as 0-9-1.
SAME_AS_0_9_1 = _ids(
    (10, (10, 11, 20, 21, 30, 31, 40, 41)),  # start, secure, tune, open (and their -ok)
    (20, (10, 20, 21, 40, 41)),  # channel.open, flow, close
    (30, (10, 11)),  # access.request
    (40, (10, 11, 20, 21)),  # exchange.declare, delete
    (50, (10, 11, 20, 21, 30, 31, 40, 41, 50, 51)),  # queue.declare, bind, purge, delete, unbind
    (60, (10, 11, 21, 30, 31, 40, 50, 60, 70, 71, 72, 80, 90, 100, 110, 111)),  # basic, consume aside
    (90, (10, 11, 20, 21, 30, 31)),  # tx
)


class Close(commands.Connection.Close):
    """connection.close under its 0-8 id: a 0-9-1 Connection.Close to everything that reads it,
    and the id an error about it names. (No __slots__ of its own: pamqp encodes and decodes the
    fields its class attribute `__slots__` lists, the parent's.)"""

    index: ClassVar[int] = CLOSE


class CloseOk(commands.Connection.CloseOk):
    """connection.close-ok under its 0-8 id (see Close)."""

    index: ClassVar[int] = CLOSE_OK


class UnimplementedMethod(Method):
    """A method of 0-8 that 0-9-1 lacks and RabbitMQ implements nowhere, its fields checked for
    their sizes and not kept. No handler takes it, so it is refused wherever it arrives, naming
    its ids (`index`)."""

    __slots__: ClassVar[list[str]] = []


# rabbit_framing_amqp_0_8's methods that rabbit_framing_amqp_0_9_1 lacks, with their fields, as
# its decoder reads them: o octet, s short, l long, L long long, b an octet of bits, S short
# string, T long string, F table.
_ONLY_0_8_FIELDS = {
    "Connection.Redirect": (10, 50, "SS"),
    "Channel.Alert": (20, 30, "sSF"),
    "File.Qos": (70, 10, "lsb"), "File.QosOk": (70, 11, ""), "File.Consume": (70, 20, "sSSb"),
    "File.ConsumeOk": (70, 21, "S"), "File.Cancel": (70, 30, "Sb"), "File.CancelOk": (70, 31, "S"),
    "File.Open": (70, 40, "SL"), "File.OpenOk": (70, 41, "L"), "File.Stage": (70, 50, ""),
    "File.Publish": (70, 60, "sSSbS"), "File.Return": (70, 70, "sSSS"), "File.Deliver": (70, 80, "SLbSSS"),
    "File.Ack": (70, 90, "Lb"), "File.Reject": (70, 100, "Lb"),
    "Stream.Qos": (80, 10, "lslb"), "Stream.QosOk": (80, 11, ""), "Stream.Consume": (80, 20, "sSSb"),
    "Stream.ConsumeOk": (80, 21, "S"), "Stream.Cancel": (80, 30, "Sb"), "Stream.CancelOk": (80, 31, "S"),
    "Stream.Publish": (80, 40, "sSSb"), "Stream.Return": (80, 50, "sSSS"), "Stream.Deliver": (80, 60, "SLSS"),
    "Dtx.Select": (100, 10, ""), "Dtx.SelectOk": (100, 11, ""), "Dtx.Start": (100, 20, "S"),
    "Dtx.StartOk": (100, 21, ""),
    "Tunnel.Request": (110, 10, "F"),
    "Test.Integer": (120, 10, "oslLo"), "Test.IntegerOk": (120, 11, "L"), "Test.String": (120, 20, "STo"),
    "Test.StringOk": (120, 21, "T"), "Test.Table": (120, 30, "Foo"), "Test.TableOk": (120, 31, "LT"),
    "Test.Content": (120, 40, ""), "Test.ContentOk": (120, 41, "l"),
}
_ONLY_0_8 = {
    (class_id << 16) | method_id: (name, fields) for name, (class_id, method_id, fields) in _ONLY_0_8_FIELDS.items()
}
# Each one's class, made the first time a client sends it: a class per method costs every
# broker a few hundred objects for the garbage collector to walk, for methods nobody sends.
_unimplemented_classes: dict[int, type[UnimplementedMethod]] = {}


def _unimplemented(index: int, name: str) -> UnimplementedMethod:
    method_class = _unimplemented_classes.get(index)
    if method_class is None:
        method_class = type(name, (UnimplementedMethod,), {"__slots__": [], "name": name, "index": index})
        _unimplemented_classes[index] = method_class
    return method_class()


_FIXED_SIZES = {"o": 1, "b": 1, "s": 2, "l": 4, "L": 8}


def _fields_fit(payload: bytes, fields: str) -> bool:
    """The fields after the ids take up the whole payload (their values are not read)."""
    at, end = 4, len(payload)
    for kind in fields:
        if kind in _FIXED_SIZES:
            at += _FIXED_SIZES[kind]
        elif kind == "S":
            if at >= end:
                return False
            at += 1 + payload[at]
        else:  # T, F: a long string, a table
            if at + 4 > end:
                return False
            at += 4 + _u32.unpack_from(payload, at)[0]
    return at == end


def decode_method(payload: bytes) -> Method:
    """Decode the payload of a method frame a 0-8 client sent, as the 0-9-1 method it is.

    Raises AMQPError as codec.decode_method does, and as RabbitMQ answers a 0-8 client: 503
    "unknown method" for an id 0-8 does not define (basic.nack, confirm.select ... included),
    501 "cannot decode" for fields that do not fit the 0-8 method."""
    index = codec.method_index(payload)
    if index in SAME_AS_0_9_1:
        return codec.decode_method(payload)
    if index == CONSUME:
        # ticket, queue, consumer tag, bits: exactly these (RabbitMQ refuses anything after).
        try:
            tag_at = 7 + payload[6]
            end = tag_at + 1 + payload[tag_at] + 1
        except IndexError:
            raise codec.cannot_decode(payload) from None
        return _decode_extended(payload, end)
    if index == CLOSE:
        return _decode_as(Close(), payload)
    if index == CLOSE_OK:
        return _decode_as(CloseOk(), payload)
    if index == CHANNEL_OPEN_OK:  # no field in 0-8
        return _decode_extended(payload, 4)
    only_0_8 = _ONLY_0_8.get(index)
    if only_0_8 is not None:
        # RabbitMQ decodes it first: fields that do not fit are its 501, as for any method.
        # (One that has content, tunnel.request say, RabbitMQ refuses after its content; here
        # at once, as a channel refuses any other method it has no handler for.)
        name, fields = only_0_8
        if not _fields_fit(payload, fields):
            raise codec.cannot_decode(payload)
        return _unimplemented(index, name)
    raise AMQPError(COMMAND_INVALID, "unknown method", index >> 16, index & 0xFFFF)


def _decode_extended(payload: bytes, size: int) -> Method:
    """A method whose 0-9-1 form adds a last field, empty: decoded with it if `payload` is the
    `size` bytes 0-8 gives it."""
    if len(payload) != size:
        raise codec.cannot_decode(payload)
    try:
        return codec.decode_method(payload + _MISSING_LAST_FIELD)
    except AMQPError:
        raise codec.cannot_decode(payload) from None


def _decode_as(method: Method, payload: bytes) -> Method:
    try:
        method.unmarshal(payload[4:])
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        raise codec.cannot_decode(payload) from None
    return method


# The broker's channel-0 methods whose 0-8 ids differ; it never sends one 0-8 lacks
# (connection.blocked and unblocked: publisher_flow.py asks Protocol.connection_blocked first).
_OUTGOING_IDS = {commands.Connection.Close.index: CLOSE, commands.Connection.CloseOk.index: CLOSE_OK}
_ONLY_0_9_1_ON_CHANNEL_0 = frozenset((
    commands.Connection.Blocked.index, commands.Connection.Unblocked.index,
    commands.Connection.UpdateSecret.index, commands.Connection.UpdateSecretOk.index,
))


def connection_frame(method: Method) -> bytes:
    """The frame of a channel-0 method the broker sends to a 0-8 client."""
    assert method.index not in _ONLY_0_9_1_ON_CHANNEL_0, f"{method.name} does not exist in AMQP 0-8"
    frame = codec.method_frame(0, method)
    index = _OUTGOING_IDS.get(method.index)
    if index is None:
        return frame
    return b"".join((frame[:7], _u32.pack(index), frame[11:]))  # header, ids, fields and frame end


def channel_open_ok_frame(channel: int) -> bytes:
    """channel.open-ok as 0-8 has it, with no field (as RabbitMQ sends it to a 0-8 client)."""
    return _channel_open_ok.pack(codec.FRAME_METHOD, channel, 4, 20, 11, codec.FRAME_END)
