"""The AMQP versions a connection can speak, and the protocol header that asks for each.

RabbitMQ 3.10 (rabbit_reader:handle_input) speaks AMQP 0-9-1 to the header `AMQP 0 0 9 1` and
to AMQP 0-9's `AMQP 1 1 0 9`, and AMQP 0-8 to `AMQP 1 1 8 0` (what 0-8 clients send: Mono's
RabbitMQ.Client by default) and to `AMQP 1 1 9 1` (the 0-8 spec's own text). Any other header is
answered with `AMQP 0 0 9 1` and the socket closed; `negotiate` returns None for it.

A `Protocol` is what a connection needs to know of the version it speaks, all of it outside the
hot path: how to decode a method the client sent (publishes and acks never get there: their
bytes are the same in every version), how to encode the methods of channel 0 and
channel.open-ok, and what connection.start announces. The connection is told once, at its
header; a 0-9-1 connection runs exactly the code it ran before 0-8 was spoken here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pamqp import commands
from pamqp.base import Frame as Method

from amqp_server.wire import amqp_0_8, codec


@dataclass(frozen=True, slots=True, eq=False)
class Protocol:
    """One AMQP version as the connection speaks it."""

    name: str  # as RabbitMQ's management API shows it ("AMQP 0-9-1")
    start_version: tuple[int, int]  # connection.start's version_major, version_minor
    # connection.start announces the server's capabilities (0-8's start has an empty table:
    # none of RabbitMQ's extensions exists in it).
    capabilities: bool
    connection_blocked: bool  # the method exists (sent to clients that announce it)
    decode_method: Callable[[bytes], Method]  # a method frame's payload from the client
    connection_frame: Callable[[Method], bytes]  # a channel-0 method the broker sends, as a frame
    channel_open_ok_frame: Callable[[int], bytes]
    close_index: int  # the client's connection.close, as a method frame's class and method ids
    close_ok_index: int


def _connection_frame_0_9_1(method: Method) -> bytes:
    return codec.method_frame(0, method)


AMQP_0_9_1 = Protocol(
    name="AMQP 0-9-1",
    start_version=(0, 9),  # RabbitMQ's too: 0-9-1 has no field for the revision
    capabilities=True,
    connection_blocked=True,
    decode_method=codec.decode_method,
    connection_frame=_connection_frame_0_9_1,
    channel_open_ok_frame=codec.channel_open_ok_frame,
    close_index=commands.Connection.Close.index,
    close_ok_index=commands.Connection.CloseOk.index,
)

AMQP_0_8 = Protocol(
    name="AMQP 0-8",
    start_version=(8, 0),  # as the 0-8 spec numbers itself, and RabbitMQ sends it
    capabilities=False,
    connection_blocked=False,
    decode_method=amqp_0_8.decode_method,
    connection_frame=amqp_0_8.connection_frame,
    channel_open_ok_frame=amqp_0_8.channel_open_ok_frame,
    close_index=amqp_0_8.CLOSE,
    close_ok_index=amqp_0_8.CLOSE_OK,
)

AMQP_0_8_HEADER = b"AMQP\x01\x01\x08\x00"
# The header the text of the 0-8 spec gives; some 0-8 clients (py-amqplib) send it.
AMQP_0_8_SPEC_HEADER = b"AMQP\x01\x01\x09\x01"
_BY_HEADER = {
    codec.PROTOCOL_HEADER: AMQP_0_9_1,
    codec.LEGACY_0_9_HEADER: AMQP_0_9_1,
    AMQP_0_8_HEADER: AMQP_0_8,
    AMQP_0_8_SPEC_HEADER: AMQP_0_8,
}


def negotiate(header: bytes) -> Protocol | None:
    """The protocol the 8-byte protocol header asks for; None for one RabbitMQ refuses (the
    connection then answers codec.PROTOCOL_HEADER and closes: codec.refused_header_reason)."""
    return _BY_HEADER.get(header)
