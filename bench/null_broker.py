"""A null AMQP broker: just enough protocol to measure the benchmark client's own ceiling.

It answers the handshake and setup methods (declare, bind, qos, confirm.select,
consume) like a broker would, then does as little as possible:
- after the first Basic.Publish it discards incoming bytes, only counting
  publish method frames with bytes.count when confirms are on, and acking them
  with one `multiple` ack per read;
- after Basic.Consume it streams pre-built deliveries as fast as the socket takes them.
It never parses the hot path in Python, so it is much faster than any client.
Not a broker: no routing, no queues, prefetch ignored.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands, frame as pamqp_frame

from bench import frames

_PUBLISH_SIGNATURE = frames.U32.pack(frames.BASIC_PUBLISH)
_CLOSE_SIGNATURE = b"\x00\x0a\x00\x32"  # Connection.Close class/method ids
DELIVERIES_PER_WRITE = 1000


class NullBrokerConnection(asyncio.Protocol):
    def __init__(self, body_size: int) -> None:
        self.body_size = body_size
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.header_seen = False
        self.sinking = False
        self.confirm_channel: int | None = None
        self.published = 0
        self.tail = b""
        self.writable = asyncio.Event()
        self.writable.set()
        self.streams: list[asyncio.Task] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self.streams:
            task.cancel()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self.sinking:
            self._sink(data)
            return
        self.buffer += data
        if not self.header_seen:
            if len(self.buffer) < 8:
                return
            self.buffer = self.buffer[8:]
            self.header_seen = True
            self._send(0, commands.Connection.Start(version_major=0, version_minor=9, server_properties={
                "product": "null broker", "capabilities": {"publisher_confirms": True, "basic.nack": True}}))
        while len(self.buffer) >= 8 and not self.sinking:
            size = frames.FRAME_HEADER_STRUCT.unpack_from(self.buffer, 0)[2]
            if len(self.buffer) < size + 8:
                return
            raw, self.buffer = self.buffer[: size + 8], self.buffer[size + 8 :]
            _, channel, method = pamqp_frame.unmarshal(raw)
            self._on_method(channel, method, raw)
        if self.sinking and self.buffer:
            rest, self.buffer = self.buffer, b""
            self._sink(rest)

    def _sink(self, data: bytes) -> None:
        # A 4-byte signature cannot lie wholly inside 3 kept bytes, so nothing is counted twice;
        # the close check needs the 7 frame-header bytes before its signature too.
        scan = self.tail + data
        self.tail = scan[-10:]
        if self.confirm_channel is not None:
            found = scan[-(len(data) + 3):].count(_PUBLISH_SIGNATURE)
            if found:
                self.published += found
                self.transport.write(frames.basic_ack(self.confirm_channel, self.published, True))
        at = scan.find(_CLOSE_SIGNATURE)
        if at >= 7 and scan[at - 7 : at - 4] == b"\x01\x00\x00":
            self._send(0, commands.Connection.CloseOk())
            self.transport.close()

    def _on_method(self, channel: int, method: Any, raw: bytes) -> None:
        C = commands
        replies = {
            C.Connection.StartOk: lambda: C.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=0),
            C.Connection.Open: lambda: C.Connection.OpenOk(),
            C.Channel.Open: lambda: C.Channel.OpenOk(),
            C.Channel.Close: lambda: C.Channel.CloseOk(),
            C.Exchange.Declare: lambda: C.Exchange.DeclareOk(),
            C.Exchange.Delete: lambda: C.Exchange.DeleteOk(),
            C.Queue.Declare: lambda: C.Queue.DeclareOk(queue=method.queue or "null", message_count=0,
                                                       consumer_count=0),
            C.Queue.Bind: lambda: C.Queue.BindOk(),
            C.Queue.Delete: lambda: C.Queue.DeleteOk(message_count=0),
            C.Basic.Qos: lambda: C.Basic.QosOk(),
            C.Confirm.Select: lambda: C.Confirm.SelectOk(),
        }
        kind = type(method)
        if kind in replies:
            self._send(channel, replies[kind]())
            if kind is C.Confirm.Select:
                self.confirm_channel = channel
        elif kind is C.Connection.Close:
            self._send(0, C.Connection.CloseOk())
            self.transport.close()
        elif kind is C.Basic.Consume:
            self._send(channel, C.Basic.ConsumeOk(consumer_tag="null-ctag"))
            self.streams.append(asyncio.ensure_future(self._stream(channel, method.queue)))
            self.sinking = True  # from now on only acks and Connection.Close arrive
        elif kind is C.Basic.Publish:
            self.sinking = True
            self.buffer = raw + self.buffer  # the publish itself is counted by the sink

    def _send(self, channel: int, method: Any) -> None:
        self.transport.write(pamqp_frame.marshal(method, channel))

    async def _stream(self, channel: int, queue: str) -> None:
        body = b"x" * self.body_size
        one = frames.content_header(channel, len(body), False) + frames.body_frames(channel, body, 131072)
        chunk = b"".join(frames.basic_deliver(channel, "null-ctag", tag, "", queue) + one
                         for tag in range(1, DELIVERIES_PER_WRITE + 1))
        while not self.transport.is_closing():
            self.transport.write(chunk)
            await self.writable.wait()
            await asyncio.sleep(0)


def serve(port_queue: Any, body_size: int) -> None:
    """Process entry point: listen on a free port, put the port on `port_queue`, serve until killed."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: NullBrokerConnection(body_size), "127.0.0.1", 0)
        port_queue.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
