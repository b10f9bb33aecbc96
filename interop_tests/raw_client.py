"""A tiny blocking AMQP 0-9-1 client over a plain socket, for protocol-level tests.

It sends whatever frames (or raw bytes) a test asks for, including ones a real
client library would never produce, and reads back the server's frames decoded
by pamqp. Every read has a deadline, so a server that stalls makes the test fail
instead of hang.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from pamqp import commands, constants, exceptions, frame, header, heartbeat
from pamqp.body import ContentBody

DEFAULT_TIMEOUT_S = 5.0

# Capabilities a modern client (pika) announces; the server may honour them.
CLIENT_CAPABILITIES = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
}


class ServerClosedSocket(Exception):
    """The server closed the TCP connection (EOF or reset)."""


def raw_frame(frame_type: int, channel: int, payload: bytes, frame_end: int = constants.FRAME_END) -> bytes:
    """Build a frame by hand, so a test can break any part of it."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([frame_end])


def method_payload(class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    """The payload of a method frame with arbitrary class and method ids."""
    return struct.pack(">HH", class_id, method_id) + arguments


class RawClient:
    """One TCP connection to the broker; frames in, frames out, nothing hidden."""

    def __init__(self, host: str, port: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.timeout = timeout
        self.buffer = b""
        self.tune: commands.Connection.Tune | None = None

    # -- sending ---------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, value: Any, channel: int = 0) -> None:
        """Marshal one pamqp frame object (method, header, body, heartbeat) and send it."""
        self.sock.sendall(frame.marshal(value, channel))

    def send_heartbeat(self, channel: int = 0) -> None:
        self.sock.sendall(raw_frame(constants.FRAME_HEARTBEAT, channel, b""))

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes) -> None:
        """basic.publish followed by its content header and one body frame."""
        self.send(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
        self.send(header.ContentHeader(body_size=len(body)), channel)
        if body:
            self.send(ContentBody(body), channel)

    # -- receiving -------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data from server before the deadline")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(1 << 16)
        except socket.timeout as error:
            raise TimeoutError("no data from server before the deadline") from error
        except (ConnectionResetError, BrokenPipeError) as error:
            raise ServerClosedSocket(str(error)) from error
        if not chunk:
            raise ServerClosedSocket("EOF")
        self.buffer += chunk

    def read_bytes(self, count: int, timeout: float | None = None) -> bytes:
        """Exactly `count` raw bytes (for replies that are not frames)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buffer) < count:
            self._fill(deadline)
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def read_frame(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next frame as (channel, pamqp object); raises on EOF or timeout."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            if len(self.buffer) >= constants.FRAME_HEADER_SIZE:
                try:
                    consumed, channel, value = frame.unmarshal(self.buffer)
                except exceptions.UnmarshalingException as error:
                    if "Not all data received" not in str(error):
                        raise
                else:
                    self.buffer = self.buffer[consumed:]
                    return channel, value
            self._fill(deadline)

    def read_method(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next frame that is not a heartbeat."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            channel, value = self.read_frame(max(deadline - time.monotonic(), 0.001))
            if not isinstance(value, heartbeat.Heartbeat):
                return channel, value

    def expect(self, kind: type, timeout: float | None = None) -> tuple[int, Any]:
        channel, value = self.read_method(timeout)
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r} on channel {channel}"
        return channel, value

    def expect_connection_close(self, timeout: float | None = None) -> commands.Connection.Close:
        """Wait for connection.close, answer close-ok, return the close frame."""
        _, close = self.expect(commands.Connection.Close, timeout)
        try:
            self.send(commands.Connection.CloseOk())
        except OSError:
            pass  # the server may already have dropped the socket
        return close

    def wait_closed(self, timeout: float | None = None) -> float:
        """Block until the server closes the socket; return seconds waited.

        Frames the server sends meanwhile (heartbeats, close) are discarded.
        Raises TimeoutError if the socket is still open at the deadline.
        """
        start = time.monotonic()
        deadline = start + (timeout or self.timeout)
        try:
            while True:
                self.buffer = b""
                self._fill(deadline)
        except ServerClosedSocket:
            return time.monotonic() - start

    # -- conversations -----------------------------------------------------------

    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        channel_max: int | None = None,
        frame_max: int | None = None,
        heartbeat_s: int | None = 0,
    ) -> commands.Connection.Tune:
        """Protocol header through open-ok. None means: accept the server's proposal."""
        self.send(header.ProtocolHeader())
        self.expect(commands.Connection.Start)
        self.send(
            commands.Connection.StartOk(
                client_properties={"product": "raw_client", "capabilities": CLIENT_CAPABILITIES},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
                locale="en_US",
            )
        )
        _, tune = self.expect(commands.Connection.Tune)
        self.tune = tune
        self.send(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=tune.frame_max if frame_max is None else frame_max,
                heartbeat=tune.heartbeat if heartbeat_s is None else heartbeat_s,
            )
        )
        self.send(commands.Connection.Open(virtual_host=vhost))
        self.expect(commands.Connection.OpenOk)
        return tune

    def open_channel(self, channel: int = 1) -> None:
        self.send(commands.Channel.Open(), channel)
        got_channel, _ = self.expect(commands.Channel.OpenOk)
        assert got_channel == channel

    def is_alive(self, channel: int = 1) -> bool:
        """Round-trip a queue.declare of a server-named queue: the connection still works."""
        self.send(commands.Queue.Declare(queue="", exclusive=True, auto_delete=True), channel)
        _, reply = self.read_method()
        return isinstance(reply, commands.Queue.DeclareOk)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
