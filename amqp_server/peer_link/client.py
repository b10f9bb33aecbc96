"""A small AMQP 0-9-1 client for links to other brokers (shovels, federation), on the broker's codec.

Why not a client library: the link pumps messages, and a library in confirm mode makes a future
per publish (aiormq, aio-pika) or a callback object per delivery; this one hands each delivery
and each confirm to its handler's methods, and gathers everything it writes in one event-loop
turn into one write, as the broker itself does (docs/shovel-federation.md has the measurement).
Setting a channel up (declare, bind, qos, consume, confirm.select) is awaited, one future per
method: that happens once per connection.

The handler (`LinkHandler`) hears:

- `delivered(channel, delivery_tag, redelivered, exchange, routing_key, raw_header, body)`: a
  basic.deliver and its content. `raw_header` is the content header payload as it came (class,
  weight, body size, property flags and properties), so the message can be published again
  without decoding its properties;
- `confirmed(channel, delivery_tag, multiple, ack)`: a basic.ack (ack True) or basic.nack;
- `cancelled(channel, consumer_tag)`: the server cancelled a consumer (its queue was deleted);
- `write_paused(paused)`: the transport's buffer passed its high-water mark (True) or drained
  (False): the handler should stop making output meanwhile;
- `link_failed(error)`: the connection is gone (refused, lost, closed by the server, heartbeats
  missed): `LinkError` with the server's reply code when it sent one. Called once.

Frames are read by the wire's FrameReader; basic.deliver, basic.ack and basic.nack are decoded
by hand, every other method with pamqp. Heartbeats are sent and checked: two intervals of
silence from the server count as a lost link (a cut network shows up so).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from pamqp import commands
from pamqp.base import Frame as PamqpMethod

from amqp_server.peer_link.uri import DEFAULT_FRAME_MAX, PeerAddress
from amqp_server.wire import codec, errors

log = logging.getLogger(__name__)

# The transport's buffer above which the handler is told to pause its output.
WRITE_HIGH_WATER = 4 * 1024 * 1024
PRODUCT = "amqp-server link"
# A setup method answered by neither its reply nor a close this long after fails the link.
CALL_TIMEOUT_S = 30.0

_DELIVER_METHOD = 0x003C003C
_ACK_METHOD = 0x003C0050
_NACK_METHOD = 0x003C0078
_frame_header = struct.Struct(">BHI")
_tag_and_bits = struct.Struct(">QB")
_settle = struct.Struct(">IQB")
_method_index = struct.Struct(">I")
_publish_head = struct.Struct(">IH")
_body_size = struct.Struct(">Q")

# Opens a transport to this broker in-process for a local URI: (protocol factory) -> transport.
LocalOpener = Callable[[Callable[[], asyncio.Protocol]], asyncio.Transport]


class LinkError(ConnectionError):
    """The link failed. `code` is the AMQP reply code when the server closed it with one (403
    refused login, 530 no such vhost, 404, 406 ...), None for network errors."""

    def __init__(self, text: str, code: int | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


class ChannelClosed(LinkError):
    """The server closed the channel of an awaited setup method (a passive declare of a missing
    queue: 404); the connection stays open."""


class LinkHandler(Protocol):
    def delivered(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
                  raw_header: bytes, body: bytes) -> None: ...

    def confirmed(self, channel: int, delivery_tag: int, multiple: bool, ack: bool) -> None: ...

    def cancelled(self, channel: int, consumer_tag: str) -> None: ...

    def write_paused(self, paused: bool) -> None: ...

    def link_failed(self, error: LinkError) -> None: ...


class LinkOwner(Protocol):
    """What owns a source connection and a destination connection (a shovel, a federation
    link), as `EndHandler` tells it what each end heard."""

    def delivered(self, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str, raw_header: bytes,
                  body: bytes) -> None: ...

    def confirmed(self, delivery_tag: int, multiple: bool, ack: bool) -> None: ...

    def cancelled(self, source: bool, consumer_tag: str) -> None: ...

    def destination_paused(self, paused: bool) -> None: ...

    def link_failed(self, error: LinkError) -> None: ...


class EndHandler:
    """The handler of one of a `LinkOwner`'s two connections: deliveries come from the source,
    confirms and write pauses from the destination, and either end can fail or cancel."""

    __slots__ = ("_owner", "_source")

    def __init__(self, owner: LinkOwner, source: bool) -> None:
        self._owner = owner
        self._source = source

    def delivered(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
                  raw_header: bytes, body: bytes) -> None:
        if self._source:
            self._owner.delivered(delivery_tag, redelivered, exchange, routing_key, raw_header, body)

    def confirmed(self, channel: int, delivery_tag: int, multiple: bool, ack: bool) -> None:
        if not self._source:
            self._owner.confirmed(delivery_tag, multiple, ack)

    def cancelled(self, channel: int, consumer_tag: str) -> None:
        self._owner.cancelled(self._source, consumer_tag)

    def write_paused(self, paused: bool) -> None:
        if not self._source:
            self._owner.destination_paused(paused)

    def link_failed(self, error: LinkError) -> None:
        self._owner.link_failed(error)


class _Content:
    """A delivery whose content is arriving on one channel."""

    __slots__ = ("tag", "redelivered", "exchange", "routing_key", "header", "size", "parts", "received")

    def __init__(self, tag: int, redelivered: bool, exchange: str, routing_key: str) -> None:
        self.tag = tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = b""
        self.size = -1  # body size; -1 until the header came
        self.parts: list[bytes] = []
        self.received = 0

    def header_arrived(self, payload: bytes) -> None:
        self.header = payload
        self.size = _body_size.unpack_from(payload, 4)[0]

    def body_arrived(self, payload: bytes) -> bytes | None:
        """The whole body once `payload` completes it, else None (the part is kept)."""
        self.received += len(payload)
        if self.received < self.size:
            self.parts.append(payload)
            return None
        return b"".join((*self.parts, payload)) if self.parts else payload


class PeerConnection(asyncio.Protocol):
    """One AMQP connection to a peer broker (see the module docstring)."""

    def __init__(self, address: PeerAddress, handler: LinkHandler, connection_name: str = "",
                 local_opener: LocalOpener | None = None, local_credentials: tuple[str, str] | None = None) -> None:
        """`local_opener` reaches this broker in-process for a URI without a host, logging in with
        `local_credentials` (the URI's own user and password otherwise)."""
        self.address = address
        self._local_credentials = local_credentials
        self._handler = handler
        self._connection_name = connection_name
        self._local_opener = local_opener
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        # Until tune, frames up to what we would accept after it (a server's connection.start is small).
        self._reader = codec.FrameReader(address.frame_max or DEFAULT_FRAME_MAX)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.frame_max = address.frame_max
        self.max_body_frame = address.frame_max - codec.FRAME_OVERHEAD
        self.channel_max = 0
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        self._opened: asyncio.Future[None] = self._loop.create_future()
        self._calls: dict[int, tuple[tuple[type, ...], asyncio.Future[Any]]] = {}  # channel -> awaited reply
        self._contents: dict[int, _Content] = {}
        self._failed: LinkError | None = None
        self._closing = False
        self._next_channel = 1
        self._last_read = time.monotonic()
        self._last_write = self._last_read
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self.blocked: str | None = None  # connection.blocked's reason while the server blocks us

    # -- opening ------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, log in, tune and open the URI's vhost; LinkError if any of it fails (within
        the URI's connection_timeout)."""
        address = self.address
        timeout = address.connection_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout):
                if address.local:
                    if self._local_opener is None:
                        raise LinkError("a URI without a host names this broker, which is not reachable in-process here")
                    self._local_opener(lambda: self)
                else:
                    context = address.ssl_context()
                    await self._loop.create_connection(
                        lambda: self, address.host, address.port, ssl=context,
                        server_hostname=address.tls_server_name() if context is not None else None)
                await asyncio.shield(self._opened)
        except TimeoutError:
            error = LinkError(f"{address.where}: no open connection within {timeout:g} s (connection_timeout)")
            self._fail(error)
            raise error from None
        except LinkError:
            raise
        except OSError as error:  # refused, unreachable, TLS handshake failed, certificate unreadable
            failure = LinkError(f"{address.where}: {_describe(error)}")
            self._fail(failure)
            raise failure from None
        except asyncio.CancelledError:  # the link's owner stopped meanwhile: no socket stays open
            self.close("cancelled while connecting")
            raise

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)
        self._transport = stream
        stream.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        stream.write(codec.PROTOCOL_HEADER)

    def _connection_method(self, method: PamqpMethod) -> None:
        address = self.address
        if isinstance(method, commands.Connection.Start):
            self.server_properties = method.server_properties or {}
            offered = (method.mechanisms or "").split()
            if address.mechanism not in offered:
                self._fail(LinkError(f"{address.where}: the server does not offer {address.mechanism} "
                                     f"(it offers {' '.join(offered) or 'nothing'})"))
                return
            self._send_now(0, commands.Connection.StartOk(
                client_properties=self._client_properties(), mechanism=address.mechanism,
                response=self._sasl_response(), locale="en_US"))
        elif isinstance(method, commands.Connection.Tune):
            self.frame_max = _negotiated(address.frame_max, method.frame_max) or DEFAULT_FRAME_MAX
            self.max_body_frame = self.frame_max - codec.FRAME_OVERHEAD
            self._reader.raise_frame_max(self.frame_max)
            self.channel_max = _negotiated(address.channel_max, method.channel_max) or 65535
            self.heartbeat = _negotiated(address.heartbeat, method.heartbeat)
            self._send_now(0, commands.Connection.TuneOk(channel_max=self.channel_max, frame_max=self.frame_max,
                                                         heartbeat=self.heartbeat))
            self._send_now(0, commands.Connection.Open(virtual_host=address.vhost))
        elif isinstance(method, commands.Connection.OpenOk):
            if self.heartbeat:
                self._heartbeat_timer = self._loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
            if not self._opened.done():
                self._opened.set_result(None)
        elif isinstance(method, commands.Connection.Close):
            self._send_now(0, commands.Connection.CloseOk())
            self._fail(LinkError(f"{address.where} closed the connection: {method.reply_code} {method.reply_text}",
                                 method.reply_code))
        elif isinstance(method, commands.Connection.CloseOk):
            self._fail(LinkError("connection closed", 200))
        elif isinstance(method, commands.Connection.Blocked):
            self.blocked = method.reason or "blocked"
        elif isinstance(method, commands.Connection.Unblocked):
            self.blocked = None

    def _sasl_response(self) -> str:
        address = self.address
        if address.mechanism == "EXTERNAL":
            return ""  # the TLS client certificate names the user
        user, password = address.username, address.password
        if address.local and self._local_credentials is not None:
            user, password = self._local_credentials
        return f"\0{user}\0{password}"

    def _client_properties(self) -> dict[str, Any]:
        properties: dict[str, Any] = {
            "product": PRODUCT,
            "platform": f"Python {sys.version.split()[0]}",
            "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
                             "authentication_failure_close": True, "connection.blocked": True},
        }
        if self._connection_name:
            properties["connection_name"] = self._connection_name
        return properties

    # -- channels and their setup methods (awaited: once per connection) -------------------------

    async def open_channel(self) -> int:
        channel = self._next_channel
        self._next_channel += 1
        await self.call(channel, commands.Channel.Open(), commands.Channel.OpenOk)
        return channel

    async def call(self, channel: int, method: PamqpMethod, *replies: type) -> Any:
        """Send a synchronous method and return the server's reply (one of `replies`);
        LinkError if the server closes the channel or the connection instead, or answers
        neither within CALL_TIMEOUT_S (a peer that hangs must not keep a link starting)."""
        if self._failed is not None:
            raise self._failed
        future: asyncio.Future[Any] = self._loop.create_future()
        self._calls[channel] = (replies, future)
        self._send_now(channel, method)
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                return await future
        except TimeoutError:
            raise LinkError(f"{self.address.where}: no answer to {method.name} within {CALL_TIMEOUT_S:g} s") from None

    def send(self, channel: int, method: PamqpMethod) -> None:
        """A method sent without waiting for its reply (a nowait one, basic.cancel)."""
        if self._failed is None:
            self._send_now(channel, method)

    # -- the pumping side: nothing here allocates more than the frames it writes -----------------

    def publish(self, channel: int, exchange: str, routing_key: str, raw_header: bytes, body: bytes,
                mandatory: bool = False) -> None:
        """basic.publish with `raw_header` (a content header payload) and `body`, written at the
        end of this event-loop turn with everything else."""
        if self._failed is not None:
            return
        out = self._out
        routing = codec.shortstr(exchange) + codec.shortstr(routing_key)
        head = _publish_head.pack(codec.PUBLISH_METHOD, 0)
        size = 6 + len(routing) + 1
        out.append(_frame_header.pack(codec.FRAME_METHOD, channel, size))
        out.append(head)
        out.append(routing)
        out.append(b"\x01\xce" if mandatory else b"\x00\xce")
        codec.content_frames(out, channel, raw_header, body, self.max_body_frame)
        if not self._flush_scheduled:
            self._schedule_flush()

    def ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        self._settle(_ACK_METHOD, channel, delivery_tag, 1 if multiple else 0)

    def nack(self, channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self._settle(_NACK_METHOD, channel, delivery_tag, (1 if multiple else 0) | (2 if requeue else 0))

    def _settle(self, method: int, channel: int, delivery_tag: int, bits: int) -> None:
        if self._failed is not None:
            return
        self._out.append(_frame_header.pack(codec.FRAME_METHOD, channel, 13)
                         + _settle.pack(method, delivery_tag, bits) + codec.FRAME_END_BYTE)
        if not self._flush_scheduled:
            self._schedule_flush()

    def pause_reading(self) -> None:
        """Stop reading from the server (the other end of a shovel cannot take more now)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    @property
    def is_open(self) -> bool:
        return self._failed is None and self._opened.done() and not self._closing

    # -- reading -----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        reader = self._reader
        reader.feed(data)
        try:
            for frame_type, channel, payload in reader.frames():
                if frame_type == 1:  # FRAME_METHOD
                    index = _method_index.unpack_from(payload)[0]
                    if index == _DELIVER_METHOD:
                        consumer_tag_size = payload[4]
                        offset = 5 + consumer_tag_size
                        tag, bits = _tag_and_bits.unpack_from(payload, offset)
                        exchange, offset = codec.read_shortstr(payload, offset + 9)
                        routing_key, _ = codec.read_shortstr(payload, offset)
                        self._contents[channel] = _Content(tag, bool(bits & 1), exchange, routing_key)
                    elif index == _ACK_METHOD or index == _NACK_METHOD:
                        _index, tag, bits = _settle.unpack_from(payload)
                        self._handler.confirmed(channel, tag, bool(bits & 1), index == _ACK_METHOD)
                    else:
                        self._method(channel, codec.decode_method(payload))
                elif frame_type == 2:  # FRAME_HEADER
                    content = self._contents.get(channel)
                    if content is None:
                        raise LinkError(f"{self.address.where} sent a content header without a delivery", 505)
                    content.header_arrived(payload)
                    if content.size == 0:
                        del self._contents[channel]
                        self._handler.delivered(channel, content.tag, content.redelivered, content.exchange,
                                                content.routing_key, payload, b"")
                elif frame_type == 3:  # FRAME_BODY
                    content = self._contents.get(channel)
                    if content is None or content.size < 0:
                        raise LinkError(f"{self.address.where} sent a body frame without a delivery", 505)
                    body = content.body_arrived(payload)
                    if body is None:
                        continue
                    del self._contents[channel]
                    self._handler.delivered(channel, content.tag, content.redelivered, content.exchange,
                                            content.routing_key, content.header, body)
                # heartbeats only count as input (_last_read)
                if self._failed is not None:
                    return
        except LinkError as error:
            self._fail(error)
        except (errors.AMQPError, IndexError, ValueError, struct.error) as error:
            self._fail(LinkError(f"unreadable frame from {self.address.where}: {error}", 501))

    def _method(self, channel: int, method: PamqpMethod) -> None:
        if channel == 0:
            self._connection_method(method)
            return
        if isinstance(method, commands.Channel.Close):
            self._send_now(channel, commands.Channel.CloseOk())
            text = f"{self.address.where} closed channel {channel}: {method.reply_code} {method.reply_text}"
            call = self._calls.pop(channel, None)
            if call is not None and not call[1].done():
                call[1].set_exception(ChannelClosed(text, method.reply_code))
                return
            self._fail(LinkError(text, method.reply_code))
            return
        if isinstance(method, commands.Basic.Cancel):
            self._handler.cancelled(channel, method.consumer_tag or "")
            return
        call = self._calls.get(channel)
        if call is not None and isinstance(method, call[0]):
            del self._calls[channel]
            if not call[1].done():
                call[1].set_result(method)
        # anything else (basic.return, channel.flow, consume-ok of a nowait consume) needs no answer

    # -- writing -------------------------------------------------------------------------------------

    def _send_now(self, channel: int, method: PamqpMethod) -> None:
        """A method written at once, behind what is gathered (setup and handshake methods)."""
        self._out.append(codec.method_frame(channel, method))
        self._flush()

    def _schedule_flush(self) -> None:
        self._flush_scheduled = True
        self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            out.clear()
            return
        transport.write(b"".join(out))
        out.clear()
        self._last_write = time.monotonic()

    def pause_writing(self) -> None:
        self._handler.write_paused(True)

    def resume_writing(self) -> None:
        self._handler.write_paused(False)

    # -- heartbeats, closing, failing --------------------------------------------------------------

    def _heartbeat_tick(self) -> None:
        self._heartbeat_timer = None
        if self._failed is not None:
            return
        now = time.monotonic()
        if now - self._last_read > 2 * self.heartbeat:
            self._fail(LinkError(f"missed heartbeats from {self.address.where}: nothing for "
                                 f"{now - self._last_read:.0f} s (heartbeat {self.heartbeat} s)"))
            return
        if now - self._last_write >= self.heartbeat / 2 and self._transport is not None:
            self._out.append(codec.HEARTBEAT_FRAME)
            self._flush()
        self._heartbeat_timer = self._loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def close(self, reason: str = "closed by the link") -> None:
        """Close the connection politely (connection.close, then the socket); the handler hears
        nothing more."""
        if self._failed is not None or self._closing:
            return
        self._closing = True
        self._handler = SilentHandler()
        if self._transport is not None and self._opened.done():
            self._out.append(codec.method_frame(0, commands.Connection.Close(
                reply_code=200, reply_text=reason[:255], class_id=0, method_id=0)))
            self._flush()
            # The server's close-ok ends it; a server that does not answer loses the socket soon.
            self._loop.call_later(1.0, self._abort)
        else:
            self._abort()

    def _abort(self) -> None:
        self._fail(LinkError("connection closed", 200))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if exc is not None:
            self._fail(LinkError(f"connection to {self.address.where} lost: {_describe(exc)}"))
        elif not self._opened.done():
            # A server refusing a login without authentication_failure_close drops the socket.
            self._fail(LinkError(f"{self.address.where} closed the connection during the handshake "
                                 "(login refused, or not an AMQP 0-9-1 server)"))
        else:
            self._fail(LinkError(f"connection to {self.address.where} lost: closed by the server"))

    def _fail(self, error: LinkError) -> None:
        if self._failed is not None:
            return
        self._failed = error
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        transport = self._transport
        if transport is not None:
            self._flush()
            transport.close()
        if not self._opened.done():
            self._opened.set_exception(error)
            self._opened.exception()  # retrieved: open() raises it, or nobody waits any more
        for _replies, future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        self._contents.clear()
        handler, self._handler = self._handler, SilentHandler()
        handler.link_failed(error)


class SilentHandler:
    """A handler that hears nothing: the connection's after it failed or was closed, and that of
    a one-off connection (a probe) whose owner only awaits its calls."""

    def delivered(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
                  raw_header: bytes, body: bytes) -> None:
        pass

    def confirmed(self, channel: int, delivery_tag: int, multiple: bool, ack: bool) -> None:
        pass

    def cancelled(self, channel: int, consumer_tag: str) -> None:
        pass

    def write_paused(self, paused: bool) -> None:
        pass

    def link_failed(self, error: LinkError) -> None:
        pass


def _negotiated(ours: int, theirs: int) -> int:
    """AMQP's rule for frame_max, channel_max and heartbeat: 0 is "no limit", else the lower."""
    if not ours or not theirs:
        return ours or theirs
    return min(ours, theirs)


def _describe(error: BaseException) -> str:
    text = str(error) or error.__class__.__name__
    if isinstance(error, OSError) and error.strerror and error.errno is not None and str(error.errno) not in text:
        return f"{error.strerror} (errno {error.errno})"
    return text
