"""A fake AMQP client for unit tests: frames in, frames out, no sockets.

`FakeClient` owns a `Connection` (the broker's sans-I/O state machine), builds the frames a
client would send with `pamqp.frame.marshal`, feeds their bytes to `receive_data`, and parses
whatever `take_output()` returns with `pamqp.frame.unmarshal` into `(channel, frame)` pairs.
Tests assert on those pairs the way a real client would see them on the wire.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader, ProtocolHeader

from amqp_server.broker.broker import Broker
from amqp_server.connection.connection import Connection

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# What pika, amqplib and kombu advertise in start-ok (the ones the broker looks at).
CLIENT_CAPABILITIES = {
    "authentication_failure_close": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
    "basic.nack": True,
    "connection.blocked": True,
}

Received = list[tuple[int, Any]]


def marshal(channel: int, *frames: Any) -> bytes:
    """The wire bytes of pamqp frame objects (methods, headers, bodies) on one channel."""
    return b"".join(frame.marshal(value, channel) for value in frames)


def raw_frame(frame_type: int, channel: int, payload: bytes, frame_end: int = 0xCE) -> bytes:
    """A frame built by hand, for frames pamqp refuses to build (bad end byte, unknown ids)."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((frame_end,))


def split_raw(data: bytes) -> list[tuple[int, int, bytes]]:
    """Split wire bytes into (frame type, channel, payload) without decoding the payloads."""
    frames = []
    offset = 0
    while offset < len(data):
        if data[offset : offset + 4] == b"AMQP":
            frames.append((-1, 0, data[offset : offset + 8]))
            offset += 8
            continue
        frame_type, channel, size = struct.unpack_from(">BHI", data, offset)
        payload = data[offset + 7 : offset + 7 + size]
        assert data[offset + 7 + size] == 0xCE, "frame-end byte missing in broker output"
        frames.append((frame_type, channel, payload))
        offset += 8 + size
    return frames


def unmarshal_all(data: bytes) -> Received:
    """Decode every frame in `data` with pamqp."""
    received = []
    offset = 0
    while offset < len(data):
        consumed, channel, value = frame.unmarshal(data[offset:])
        received.append((channel, value))
        offset += consumed
    return received


def publish_frames(
    channel: int,
    body: bytes,
    exchange: str = "",
    routing_key: str = "",
    properties: commands.Basic.Properties | None = None,
    mandatory: bool = False,
    frame_max: int = 131072,
) -> bytes:
    """basic.publish + content header + body frames split at `frame_max`, as a client sends them."""
    frames: list[Any] = [
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        ContentHeader(body_size=len(body), properties=properties or commands.Basic.Properties()),
    ]
    step = frame_max - 8
    frames.extend(ContentBody(body[start : start + step]) for start in range(0, len(body), step))
    return marshal(channel, *frames)


def plain_response(user: str, password: str) -> str:
    # pamqp takes the long-string response as str and encodes it as UTF-8.
    return f"\x00{user}\x00{password}"


def amqplain_response(user: str, password: str) -> str:
    """AMQPLAIN as py-amqp sends it: a field table without its length prefix (ASCII credentials)."""
    table = b""
    for key, value in (("LOGIN", user), ("PASSWORD", password)):
        raw = value.encode()
        table += bytes((len(key),)) + key.encode() + b"S" + struct.pack(">I", len(raw)) + raw
    return table.decode("ascii")


class FakeClient:
    """Drives one broker connection. Every `send*` returns the frames the broker answered with."""

    def __init__(self, broker: Broker | None = None, peer_host: str = "127.0.0.1", **connection: Any) -> None:
        """`connection`: more keyword arguments for the Connection (a handover recorder, say)."""
        self.broker = broker or Broker()
        self.output_signals = 0
        self.connection = Connection(self.broker, peer_host=peer_host, peer_port=50000, on_output=self._signal,
                                     **connection)

    def _signal(self) -> None:
        self.output_signals += 1

    # -- bytes -------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> Received:
        self.connection.receive_data(data)
        return self.take()

    def send_bytes_one_at_a_time(self, data: bytes) -> Received:
        for index in range(len(data)):
            self.connection.receive_data(data[index : index + 1])
        return self.take()

    def take(self) -> Received:
        return unmarshal_all(self._written())

    def take_raw(self) -> list[tuple[int, int, bytes]]:
        return split_raw(self._written())

    def _written(self) -> bytes:
        """What the shell would write, told to the connection as the shell does."""
        data = self.connection.take_output()
        if data:
            self.connection.output_flushed()
        return data

    # -- frames ------------------------------------------------------------------------

    def send(self, channel: int, *frames: Any) -> Received:
        return self.send_bytes(marshal(channel, *frames))

    def publish_bytes(self, channel: int, body: bytes, **options: Any) -> bytes:
        return publish_frames(channel, body, **options)

    def publish(self, channel: int, body: bytes, **options: Any) -> Received:
        return self.send_bytes(self.publish_bytes(channel, body, **options))

    # -- conversations -----------------------------------------------------------------

    def start(self, header: bytes = PROTOCOL_HEADER) -> Received:
        return self.send_bytes(header)

    def start_ok(
        self,
        user: str = "guest",
        password: str = "guest",
        mechanism: str = "PLAIN",
        capabilities: dict[str, Any] | None = None,
    ) -> Received:
        response = plain_response(user, password) if mechanism == "PLAIN" else amqplain_response(user, password)
        properties = {
            "product": "frame-driver",
            "capabilities": CLIENT_CAPABILITIES if capabilities is None else capabilities,
        }
        return self.send(
            0,
            commands.Connection.StartOk(client_properties=properties, mechanism=mechanism, response=response),
        )

    def handshake(self, vhost: str = "/", frame_max: int = 131072, channel_max: int = 2047) -> Received:
        """Header through open-ok; returns what the broker sent after tune-ok."""
        self.start()
        self.start_ok()
        self.send(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0))
        return self.send(0, commands.Connection.Open(virtual_host=vhost))

    def open_channel(self, channel: int = 1) -> Received:
        return self.send(channel, commands.Channel.Open())

    def call(self, channel: int, method: Any) -> Any:
        """Send one method and return the single frame the broker answered with."""
        received = self.send(channel, method)
        assert len(received) == 1, received
        return received[0][1]


def opened_client(broker: Broker | None = None, channels: Iterable[int] = (1,), **handshake: Any) -> FakeClient:
    """A client past connection.open with the given channels open."""
    client = FakeClient(broker)
    received = client.handshake(**handshake)
    assert isinstance(received[-1][1], commands.Connection.OpenOk), received
    for channel in channels:
        assert isinstance(client.open_channel(channel)[0][1], commands.Channel.OpenOk)
    return client


def methods(received: Received) -> list[Any]:
    """Only the method frames, in order (drops content headers and bodies)."""
    return [value for _channel, value in received if not isinstance(value, (ContentHeader, ContentBody, ProtocolHeader))]


def bodies(received: Received) -> list[bytes]:
    """Message bodies in `received`, each reassembled from its body frames."""
    result: list[bytes] = []
    for _channel, value in received:
        if isinstance(value, ContentHeader):
            result.append(b"")
        elif isinstance(value, ContentBody):
            result[-1] += value.value
    return result
