"""A lean asyncio AMQP 0-9-1 client for load generation.

It promises just what the benchmark needs, as cheaply as Python allows:
handshake (PLAIN), channels, exchange/queue declare/bind/delete, basic.qos,
publishing from pre-built frames with batched writes, consuming with
acknowledgements batched as `multiple` acks, and publisher confirms.

Hot frames (publish, deliver, ack, confirm) are built and parsed by hand
(see bench/frames.py); everything else goes through pamqp. Deliveries whose
three frames arrive in one read are handled in a single step. One consumer per
channel. Not a general-purpose client: no reconnects, no TLS, heartbeats off
by default (incoming heartbeats are answered).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pamqp import commands, frame as pamqp_frame
from pamqp.exceptions import UnmarshalingException

from bench import frames

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
RPC_TIMEOUT_S = 30.0

MessageCallback = Callable[[int, bytes], None]
"""Called with (delivery_tag, body) for each delivery."""
ConfirmCallback = Callable[[int, bool, bool], None]
"""Called with (delivery_tag, multiple, acked) for each broker ack (acked=True) or nack."""

_HDR = frames.FRAME_HEADER_STRUCT.unpack_from
_U32 = frames.U32.unpack_from
_U64 = frames.U64.unpack_from
_monotonic_ns = time.monotonic_ns
_DELIVER = frames.BASIC_DELIVER
_ACK = frames.BASIC_ACK
_NACK = frames.BASIC_NACK


class AMQPError(Exception):
    """The broker closed the channel or connection (reply code and text), or the link failed."""

    def __init__(self, reply_code: int, reply_text: str, scope: str = "connection") -> None:
        super().__init__(f"{scope} closed: {reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text


@dataclass(frozen=True)
class BrokerAddress:
    """Where a broker listens. `amqps://` URLs connect over TLS (default port 5671), checking the
    server's certificate against `?cafile=PATH` (else the system's CAs)."""

    host: str
    port: int
    user: str
    password: str
    vhost: str
    tls: bool = False
    cafile: str | None = None

    @classmethod
    def from_url(cls, url: str) -> BrokerAddress:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("amqp", "amqps"):
            raise ValueError(f"only amqp:// and amqps:// URLs are supported: {url}")
        tls = parsed.scheme == "amqps"
        path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
        query = urllib.parse.parse_qs(parsed.query)
        return cls(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or (5671 if tls else 5672),
            user=urllib.parse.unquote(parsed.username or "guest"),
            password=urllib.parse.unquote(parsed.password or "guest"),
            vhost=urllib.parse.unquote(path) if path else "/",
            tls=tls,
            cafile=query.get("cafile", [None])[0],
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context for an amqps:// address, None for amqp://."""
        return ssl.create_default_context(cafile=self.cafile) if self.tls else None


class LeanChannel:
    """One AMQP channel. RPCs run one at a time; hot operations write frames directly."""

    def __init__(self, connection: LeanConnection, number: int) -> None:
        self.connection = connection
        self.number = number
        self.on_message: MessageCallback | None = None
        self.on_confirm: ConfirmCallback | None = None
        self.ack_batch = False
        self.last_tag = 0
        self.acked_tag = 0
        self.error: AMQPError | None = None
        self._rpc: asyncio.Future | None = None
        self._rpc_expect: tuple[type, ...] = ()
        self._rpc_lock = asyncio.Lock()
        # Content assembly when a delivery's frames straddle reads.
        self._content_tag: int | None = None  # None: a Basic.Return being skipped
        self._content_expected = False
        self._content_size = 0
        self._content_parts: list[bytes] = []
        self._content_have = 0

    # ---- RPCs -------------------------------------------------------------

    async def _call(self, method: Any, *expect: type) -> Any:
        async with self._rpc_lock:
            if self.error:
                raise self.error
            self._rpc = self.connection._loop.create_future()
            self._rpc_expect = expect
            self.connection.write(pamqp_frame.marshal(method, self.number))
            try:
                return await asyncio.wait_for(self._rpc, RPC_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise TimeoutError(f"no reply to {method.name} within {RPC_TIMEOUT_S}s") from None
            finally:
                self._rpc = None

    async def exchange_declare(self, exchange: str, exchange_type: str = "direct", durable: bool = False,
                               auto_delete: bool = False) -> None:
        await self._call(commands.Exchange.Declare(exchange=exchange, exchange_type=exchange_type,
                                                   durable=durable, auto_delete=auto_delete),
                         commands.Exchange.DeclareOk)

    async def exchange_delete(self, exchange: str) -> None:
        await self._call(commands.Exchange.Delete(exchange=exchange), commands.Exchange.DeleteOk)

    async def queue_declare(self, queue: str = "", durable: bool = False, exclusive: bool = False,
                            auto_delete: bool = False, arguments: dict | None = None, passive: bool = False) -> str:
        """Declare a queue (or check it exists: `passive`); returns its name (the broker's
        choice when `queue` is empty)."""
        ok = await self._call(commands.Queue.Declare(queue=queue, durable=durable, exclusive=exclusive,
                                                     auto_delete=auto_delete, arguments=arguments,
                                                     passive=passive),
                              commands.Queue.DeclareOk)
        return ok.queue

    async def queue_depth(self, queue: str) -> int:
        """The ready messages of an existing queue (a passive declare)."""
        ok = await self._call(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        return int(ok.message_count)

    async def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        await self._call(commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key),
                         commands.Queue.BindOk)

    async def queue_delete(self, queue: str) -> int:
        ok = await self._call(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        return ok.message_count

    async def basic_qos(self, prefetch_count: int) -> None:
        await self._call(commands.Basic.Qos(prefetch_count=prefetch_count), commands.Basic.QosOk)

    async def round_trip(self) -> None:
        """A harmless RPC (basic.qos prefetch 0): when it returns, the broker has read everything sent before."""
        await self.basic_qos(0)

    async def confirm_select(self, on_confirm: ConfirmCallback) -> None:
        self.on_confirm = on_confirm
        await self._call(commands.Confirm.Select(), commands.Confirm.SelectOk)

    async def basic_consume(self, queue: str, on_message: MessageCallback, no_ack: bool = False,
                            ack_batch: bool = True, arguments: dict | None = None) -> str:
        """Start the channel's one consumer (`arguments`: basic.consume's, e.g. a stream's
        `x-stream-offset`).

        With no_ack=False and ack_batch=True the client acknowledges, after every
        socket read, all deliveries of that read with one `multiple` ack.
        """
        self.on_message = on_message
        self.ack_batch = ack_batch and not no_ack
        if self.ack_batch:
            self.connection._ack_channels.append(self)
        ok = await self._call(commands.Basic.Consume(queue=queue, no_ack=no_ack, arguments=arguments),
                              commands.Basic.ConsumeOk)
        return ok.consumer_tag

    async def close(self) -> None:
        if self.error is None:
            close = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
            await self._call(close, commands.Channel.CloseOk)
        self.connection._channels.pop(self.number, None)

    # ---- hot paths ----------------------------------------------------------

    def publish_frames(self, exchange: str, routing_key: str, body: bytes, persistent: bool = False) -> bytes:
        """The bytes of one publish, for callers that batch many into one write."""
        return frames.publish(self.number, exchange, routing_key, body, persistent, self.connection.frame_max)

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.connection.write(frames.basic_ack(self.number, delivery_tag, multiple))

    # ---- incoming (called by the connection) ----------------------------------

    def _on_method(self, method: Any) -> None:
        if isinstance(method, commands.Channel.Close):
            self.error = AMQPError(method.reply_code, method.reply_text, "channel")
            self.connection.write(pamqp_frame.marshal(commands.Channel.CloseOk(), self.number))
            if self._rpc and not self._rpc.done():
                self._rpc.set_exception(self.error)
            return
        if isinstance(method, commands.Basic.Deliver):
            self._begin_content(method.delivery_tag)
            return
        if isinstance(method, commands.Basic.Return):
            self._begin_content(None)
            return
        if isinstance(method, (commands.Basic.Ack, commands.Basic.Nack)):
            if self.on_confirm:
                self.on_confirm(method.delivery_tag, method.multiple, isinstance(method, commands.Basic.Ack))
            return
        if self._rpc and not self._rpc.done() and isinstance(method, self._rpc_expect):
            self._rpc.set_result(method)

    def _begin_content(self, delivery_tag: int | None) -> None:
        self._content_tag = delivery_tag
        self._content_expected = True
        self._content_size = -1
        self._content_parts = []
        self._content_have = 0

    def _on_header(self, body_size: int) -> None:
        self._content_size = body_size
        if body_size == 0:
            self._finish_content(b"")

    def _on_body(self, chunk: bytes) -> None:
        self._content_parts.append(chunk)
        self._content_have += len(chunk)
        if self._content_have >= self._content_size:
            self._finish_content(b"".join(self._content_parts))

    def _finish_content(self, body: bytes) -> None:
        self._content_expected = False
        self._content_parts = []
        tag = self._content_tag
        if tag is None:
            return  # a returned message: not counted
        self.last_tag = tag
        if self.on_message:
            self.on_message(tag, body)

    def _fail(self, error: AMQPError) -> None:
        if self.error is None:
            self.error = error
        if self._rpc and not self._rpc.done():
            self._rpc.set_exception(self.error)


class LeanConnection(asyncio.Protocol):
    """One AMQP connection. Use `await LeanConnection.open(url)`."""

    def __init__(self, address: BrokerAddress, heartbeat: int, frame_max: int, name: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.address = address
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.name = name
        self.read_ns = 0
        """monotonic_ns() when the socket read being processed arrived; callbacks use it as arrival time."""
        self.blocked = False
        self.error: AMQPError | None = None
        self._transport: asyncio.Transport | None = None
        self._channels: dict[int, LeanChannel] = {}
        self._ack_channels: list[LeanChannel] = []
        self._next_channel = 1
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._need = 0
        self._paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        self._opened: asyncio.Future = self._loop.create_future()
        self._closed: asyncio.Future = self._loop.create_future()
        self._close_ok: asyncio.Future | None = None
        self._heartbeat_task: asyncio.Task | None = None

    @classmethod
    async def open(cls, url: str, heartbeat: int = 0, frame_max: int = 131072, name: str = "bench",
                   timeout: float = RPC_TIMEOUT_S) -> LeanConnection:
        address = BrokerAddress.from_url(url)
        loop = asyncio.get_running_loop()
        conn = cls(address, heartbeat, frame_max, name)
        context = address.ssl_context()
        tls_options = {"ssl": context, "server_hostname": address.host} if context else {}
        await asyncio.wait_for(loop.create_connection(lambda: conn, address.host, address.port, **tls_options),
                               timeout)
        try:
            await asyncio.wait_for(asyncio.shield(conn._opened), timeout)
        except asyncio.TimeoutError:
            conn.abort()
            raise TimeoutError(f"AMQP handshake with {address.host}:{address.port} timed out") from None
        return conn

    async def channel(self, prefetch: int | None = None) -> LeanChannel:
        if self.error:
            raise self.error
        number = self._next_channel
        self._next_channel += 1
        chan = LeanChannel(self, number)
        self._channels[number] = chan
        await chan._call(commands.Channel.Open(), commands.Channel.OpenOk)
        if prefetch:
            await chan.basic_qos(prefetch)
        return chan

    async def close(self, timeout: float = 5.0) -> None:
        """Close politely (Connection.Close / CloseOk), then drop the socket."""
        if self._transport is None or self._closed.done():
            return
        if self.error is None:
            self._close_ok = self._loop.create_future()
            self._send0(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            try:
                await asyncio.wait_for(asyncio.shield(self._close_ok), timeout)
            except (asyncio.TimeoutError, AMQPError):
                pass
        self.abort()
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), timeout)
        except asyncio.TimeoutError:
            pass

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # ---- writing ---------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.error:
            raise self.error
        self._transport.write(data)

    async def drain(self) -> None:
        """Wait while the socket's write buffer is over its high-water mark or the broker blocked us."""
        if self._paused:
            await self._writable.wait()
        if self.blocked:
            await self._unblocked.wait()
        if self.error:
            raise self.error

    @property
    def is_paused(self) -> bool:
        return self._paused or self.blocked

    # ---- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._transport.set_write_buffer_limits(high=256 * 1024)
        transport.write(PROTOCOL_HEADER)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None:
            self.error = AMQPError(320, f"connection lost: {exc or 'closed by peer'}")
        self._fail_all(self.error)
        if self._heartbeat_task:
            self._heartbeat_task.cancel()
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self._paused = False
        self._writable.set()

    def data_received(self, data: bytes) -> None:  # noqa: C901 - one loop on purpose: it is the hot path
        self.read_ns = _monotonic_ns()
        if self._pending:
            self._pending.append(data)
            self._pending_len += len(data)
            if self._pending_len < self._need:
                return
            data = b"".join(self._pending)
            self._pending = []
        n = len(data)
        pos = 0
        channels = self._channels
        while True:
            if n - pos < 8:
                need = 8
                break
            ftype, chnum, size = _HDR(data, pos)
            end = pos + 7 + size
            if end >= n:
                need = size + 8
                break
            if data[end] != 0xCE:
                self._protocol_error(f"bad frame end at frame type {ftype}")
                return
            if ftype == 1:
                method_id = _U32(data, pos + 7)[0]
                if method_id == _DELIVER:
                    chan = channels[chnum]
                    p = pos + 11
                    p += 1 + data[p]  # consumer tag
                    tag = _U64(data, p)[0]
                    # Fast path: header and a single body frame already in this read.
                    hp = end + 1
                    if n - hp >= 22:
                        htype, _, hsize = _HDR(data, hp)
                        hend = hp + 7 + hsize
                        if htype == 2 and hend < n:
                            body_size = _U64(data, hp + 11)[0]
                            bp = hend + 1
                            if body_size == 0:
                                chan.last_tag = tag
                                if chan.on_message:
                                    chan.on_message(tag, b"")
                                pos = bp
                                continue
                            if n - bp >= 8:
                                btype, _, bsize = _HDR(data, bp)
                                bend = bp + 7 + bsize
                                if btype == 3 and bsize == body_size and bend < n and data[bend] == 0xCE:
                                    chan.last_tag = tag
                                    if chan.on_message:
                                        chan.on_message(tag, data[bp + 7 : bend])
                                    pos = bend + 1
                                    continue
                    chan._begin_content(tag)
                elif method_id == _ACK or method_id == _NACK:
                    chan = channels.get(chnum)
                    if chan is not None and chan.on_confirm is not None:
                        chan.on_confirm(_U64(data, pos + 11)[0], bool(data[pos + 19] & 1),
                                        method_id == _ACK)
                else:
                    self._on_slow_method(chnum, data[pos : end + 1])
                    if self.error is not None:
                        return
            elif ftype == 2:
                chan = channels.get(chnum)
                if chan is not None and chan._content_expected:
                    chan._on_header(_U64(data, pos + 11)[0])
            elif ftype == 3:
                chan = channels.get(chnum)
                if chan is not None and chan._content_expected:
                    chan._on_body(data[pos + 7 : end])
            elif ftype == 8:
                self._transport.write(frames.HEARTBEAT_FRAME)
            pos = end + 1
        if pos < n:
            self._pending = [data[pos:]]
            self._pending_len = n - pos
            self._need = need
        for chan in self._ack_channels:
            if chan.last_tag > chan.acked_tag and chan.error is None:
                chan.acked_tag = chan.last_tag
                self._transport.write(frames.basic_ack(chan.number, chan.last_tag, True))

    # ---- control frames ----------------------------------------------------------

    def _on_slow_method(self, chnum: int, raw: bytes) -> None:
        try:
            _, _, method = pamqp_frame.unmarshal(raw)
        except UnmarshalingException as exc:
            self._protocol_error(f"cannot decode frame: {exc}")
            return
        if chnum == 0:
            self._on_connection_method(method)
            return
        chan = self._channels.get(chnum)
        if chan is not None:
            chan._on_method(method)

    def _on_connection_method(self, method: Any) -> None:
        addr = self.address
        if isinstance(method, commands.Connection.Start):
            props = {
                "product": "bench lean client",
                "connection_name": self.name,
                "capabilities": {"publisher_confirms": True, "basic.nack": True,
                                 "consumer_cancel_notify": True, "connection.blocked": True},
            }
            response = f"\0{addr.user}\0{addr.password}"
            self._send0(commands.Connection.StartOk(client_properties=props, mechanism="PLAIN",
                                                    response=response, locale="en_US"))
        elif isinstance(method, commands.Connection.Tune):
            if method.frame_max:
                self.frame_max = min(self.frame_max, method.frame_max)
            channel_max = method.channel_max or 2047
            self._send0(commands.Connection.TuneOk(channel_max=channel_max, frame_max=self.frame_max,
                                                   heartbeat=self.heartbeat))
            self._send0(commands.Connection.Open(virtual_host=addr.vhost))
            if self.heartbeat:
                self._heartbeat_task = self._loop.create_task(self._send_heartbeats())
        elif isinstance(method, commands.Connection.OpenOk):
            if not self._opened.done():
                self._opened.set_result(None)
        elif isinstance(method, commands.Connection.Close):
            self._send0(commands.Connection.CloseOk())
            self.error = AMQPError(method.reply_code, method.reply_text)
            self._fail_all(self.error)
            self._transport.close()
        elif isinstance(method, commands.Connection.CloseOk):
            if self._close_ok and not self._close_ok.done():
                self._close_ok.set_result(None)
        elif isinstance(method, commands.Connection.Blocked):
            self.blocked = True
            self._unblocked.clear()
        elif isinstance(method, commands.Connection.Unblocked):
            self.blocked = False
            self._unblocked.set()

    def _send0(self, method: Any) -> None:
        self._transport.write(pamqp_frame.marshal(method, 0))

    async def _send_heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat / 2)
            if self._transport is None or self._transport.is_closing():
                return
            self._transport.write(frames.HEARTBEAT_FRAME)

    def _protocol_error(self, text: str) -> None:
        self.error = AMQPError(501, text)
        self._fail_all(self.error)
        self._transport.abort()

    def _fail_all(self, error: AMQPError) -> None:
        if not self._opened.done():
            self._opened.set_exception(error)
            self._opened.exception()  # mark retrieved; open() re-raises through shield
        if self._close_ok and not self._close_ok.done():
            self._close_ok.set_result(None)
        for chan in list(self._channels.values()):
            chan._fail(error)
        self._writable.set()
        self._unblocked.set()
