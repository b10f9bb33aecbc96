"""In-process AMQP connections to this broker: what a shovel or federation link whose URI has no
host ("amqp://", "amqp:///vhost") uses, as RabbitMQ's direct connections.

`LocalLinks.open(protocol_factory)` makes a pair of `PipeTransport`s: the link's client protocol
on one end, an `AMQPProtocol` (the same shell every TCP connection has, so the connection is
an ordinary one: heartbeats, flow control, confirms after fsync, /api/connections) on the
other. Bytes written on one end reach the other end's `data_received` in a later event-loop
turn, all the bytes of one turn together, as a socket would deliver them, with no system call.
The link logs in as the broker's LOCAL_LINK_USER with a secret made here (access_control.py),
which never leaves this process.

The pipe keeps a socket's flow control: a reader that paused reading gets nothing until it
resumes, and a writer whose bytes wait past WRITE_HIGH_WATER hears `pause_writing` (and
`resume_writing` below a quarter of it), so neither end can make the other buffer without bound.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from amqp_server.broker.access_control import LOCAL_LINK_USER
from amqp_server.broker.broker import Broker

WRITE_HIGH_WATER = 4 * 1024 * 1024
# What an in-process connection reports as its peer and its own end (no socket has them).
PEER = ("127.0.0.1", 0)
LOCAL_END = ("127.0.0.1", 0)


class PipeTransport(asyncio.Transport):
    """One end of an in-process byte pipe (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._loop = loop
        self._protocol = protocol
        self._peer: PipeTransport | None = None
        self._incoming: list[bytes] = []  # written by the peer, not yet handed to our protocol
        self._incoming_size = 0
        self._delivery_scheduled = False
        self._reading_paused = False
        self._closing = False
        self._lost = False
        self._high = WRITE_HIGH_WATER
        self._writing_paused = False

    def connect(self, peer: "PipeTransport") -> None:
        self._peer = peer

    # -- asyncio.Transport ---------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": PEER, "sockname": LOCAL_END}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = high if high is not None else WRITE_HIGH_WATER

    def get_write_buffer_size(self) -> int:
        peer = self._peer
        return peer._incoming_size if peer is not None else 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        peer = self._peer
        if self._closing or peer is None or peer._lost or not data:
            return
        peer._receive(bytes(data))
        if not self._writing_paused and peer._incoming_size > self._high:
            self._writing_paused = True
            self._protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused = False
            self._schedule_delivery()

    def is_reading(self) -> bool:
        return not self._reading_paused

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Both ends learn it once what was written before has been handed over, as a socket's FIN."""
        if self._closing:
            return
        self._closing = True
        self._loop.call_soon(self._close_both)

    def abort(self) -> None:
        self._closing = True
        self._incoming.clear()
        self._incoming_size = 0
        self._close_both()

    def can_write_eof(self) -> bool:
        return False

    # -- between the two ends --------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        self._incoming.append(data)
        self._incoming_size += len(data)
        self._schedule_delivery()

    def _schedule_delivery(self) -> None:
        if not self._delivery_scheduled and not self._reading_paused and self._incoming:
            self._delivery_scheduled = True
            self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._delivery_scheduled = False
        if self._lost or self._reading_paused or not self._incoming:
            return
        data = self._incoming[0] if len(self._incoming) == 1 else b"".join(self._incoming)
        self._incoming.clear()
        self._incoming_size = 0
        if self._peer is not None:
            self._peer._drained()
        self._protocol.data_received(data)

    def _drained(self) -> None:
        """What this end wrote has been read: it may write again if it was told to pause."""
        if self._writing_paused and not self._lost:
            self._writing_paused = False
            self._protocol.resume_writing()

    def _close_both(self) -> None:
        self._lose()
        if self._peer is not None:
            self._peer._lose()

    def _lose(self) -> None:
        """This end is closed: its protocol reads what was still on its way, then loses it."""
        if self._lost:
            return
        if self._incoming and not self._reading_paused:
            self._deliver()
        self._closing = True
        self._lost = True
        self._protocol.connection_lost(None)


class LocalLinks:
    """Opens in-process connections to `broker` (see the module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        # The server side's shell of each connection, once the AMQP server runs (serve_with).
        self._server_protocol: Callable[[], asyncio.Protocol] | None = None
        self.secret = os.urandom(24).hex()
        broker.access.admit_local_links(self.secret)

    def serve_with(self, server_protocol: Callable[[], asyncio.Protocol]) -> None:
        """`server_protocol()` makes the broker's side of a connection (server.py's AMQPProtocol,
        registered with the AMQP server, whose ticker checks its heartbeats)."""
        self._server_protocol = server_protocol

    @property
    def credentials(self) -> tuple[str, str]:
        """The user and password an in-process link logs in with."""
        return LOCAL_LINK_USER, self.secret

    def open(self, protocol_factory: Callable[[], asyncio.Protocol]) -> asyncio.Transport:
        """Connect a new client protocol to the broker; returns the client's end."""
        if self._server_protocol is None:
            raise ConnectionRefusedError("the broker does not accept connections yet")
        loop = asyncio.get_running_loop()
        client = protocol_factory()
        server = self._server_protocol()
        client_end = PipeTransport(loop, client)
        server_end = PipeTransport(loop, server)
        client_end.connect(server_end)
        server_end.connect(client_end)
        server.connection_made(server_end)
        client.connection_made(client_end)
        return client_end
