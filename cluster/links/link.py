"""The link from this node to another: one AMQP 0-9-1 connection per (node, vhost).

The node logs in to the other node's own AMQP listener with the cluster secret (PLAIN, the
reserved user `CLUSTER_LINK_USER`) and then subscribes and publishes on its clients' behalf:

- channel 1 is the `ForwardStream`: publisher confirms on, every message this node routed to
  queues of that node goes there once (a `forward-to` names its queues when they change), and
  the owner's confirms release the client's. Writes are gathered and sent once per event-loop
  turn; nothing is allocated per message beyond one entry in the table of unconfirmed ones.
- every other channel is a `MirrorChannel`: one per remote consumer (its prefetch is the
  channel's), and one per queue for basic.get and queue.purge. A mirror channel closes once it
  has no consumer and no delivery left unsettled.

The link connects in the background; what is sent before it is open waits in memory (bounded
by the stream's flow control). When the link fails, every unconfirmed message is nacked and
every mirror channel hears `link_lost`; the next use makes a new link, at most once a second.

A link never waits on a black hole (a partition drops packets silently, the socket stays open):
one that is not open within `LINK_CONNECT_TIMEOUT_S` fails, and an open one uses AMQP heartbeats
(`LINK_HEARTBEAT_S`, negotiated with the owner, which closes its end too): it sends one after
half that of silence and fails after twice that without a byte from the owner, so what it
carried is nacked within seconds.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol, cast

from pamqp import commands

from amqp_server.wire import codec, errors
from amqp_server.broker.access_control import CLUSTER_LINK_USER
from cluster.links.frames import (
    DELIVER_METHOD, GET_EMPTY_METHOD, GET_OK_METHOD, ack_frame, decode_deliver, decode_get_ok, forward_to_frame,
    nack_frame, publish_frame, reject_frame, split_routing_raw,
)
from queues.message import Message

log = logging.getLogger(__name__)

LINK_FRAME_MAX = 131072
# Flow control of a forward stream: past FORWARD_HIGH unconfirmed messages its queues count as
# congested (their publishers stop being read) until it is back under FORWARD_LOW.
FORWARD_HIGH = 20000
FORWARD_LOW = 10000
RETRY_AFTER_S = 1.0  # a link that failed is not tried again sooner
# A link not open this long after it started connecting fails (its messages are nacked).
LINK_CONNECT_TIMEOUT_S = 3.0
# The heartbeat a link asks for: it fails after twice this without a byte from the owner.
LINK_HEARTBEAT_S = 2

SyncCallback = Callable[[OSError | None], None]

_STREAM_CHANNEL = 1
_BASIC_ACK = 0x003C0050
_BASIC_NACK = 0x003C0078
_BASIC_CANCEL = 0x003C001E
_CHANNEL_FLOW = 0x00140014
_CHANNEL_CLOSE = 0x00140028
_CHANNEL_CLOSE_OK = 0x00140029


class LinkState(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    FAILED = "failed"  # connection refused or lost; kept a moment so retries are spaced


class LinkLost(ConnectionError):
    """The link to the owning node failed: what waited for it is answered with this."""


class QueueUnavailable(Exception):
    """The owner node refused a mirror channel's method (its channel.close), or the link is
    gone; `code` and `text` are the owner's reply (text without the "NAME - " prefix)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


class MirrorHandler(Protocol):
    """Who a mirror channel reports to (a remote consumer, or a queue's get channel user)."""

    def delivered(self, mirror: "MirrorChannel", consumer_tag: str, link_tag: int, redelivered: bool,
                  message: Message) -> None: ...

    def cancelled_by_owner(self, mirror: "MirrorChannel", consumer_tag: str) -> None: ...

    def mirror_failed(self, mirror: "MirrorChannel", error: QueueUnavailable) -> None: ...


class NodeLink(asyncio.Protocol):
    """One AMQP connection to another node, in one vhost (see the module docstring)."""

    def __init__(self, node: str, vhost: str, host: str, port: int, secret: str,
                 on_failed: Callable[["NodeLink"], None]) -> None:
        self.node = node
        self.vhost = vhost
        self._host = host
        self._port = port
        self._secret = secret
        self._on_failed = on_failed
        self.state = LinkState.CONNECTING
        self.failed_at = 0.0
        self.max_body_frame = LINK_FRAME_MAX - codec.FRAME_OVERHEAD
        self._reader = codec.FrameReader(LINK_FRAME_MAX)
        self._transport: asyncio.Transport | None = None
        self._handshake_done = False
        # Frames to write, gathered during one event-loop turn and written at its end (or, before
        # connection.open-ok, once the connection is open).
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._acking: list["MirrorChannel"] = []  # mirror channels with acks gathered
        self._channels: dict[int, "MirrorChannel"] = {}
        self._next_channel = _STREAM_CHANNEL + 1
        self.write_paused = False
        self.stream = ForwardStream(self)
        self.stream.open()  # first of what waits for connection.open-ok
        loop = asyncio.get_running_loop()
        self._started_at = self._last_read = self._last_write = time.monotonic()
        self._heartbeat = 0  # negotiated with the owner (connection.tune-ok); 0 until then
        self._ticker: asyncio.TimerHandle | None = loop.call_later(LINK_HEARTBEAT_S / 2, self._tick)
        self._task = loop.create_task(self._connect())

    def __repr__(self) -> str:
        return f"<NodeLink {self.node} vhost={self.vhost!r} {self.state.value}>"

    # -- connecting --------------------------------------------------------------------

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: self, self._host, self._port)
        except OSError as error:
            self._fail(f"cannot connect to {self._host}:{self._port}: {error}")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP connection's transport is a Transport; asyncio's signature is every kind's.
        stream = cast(asyncio.Transport, transport)
        self._transport = stream
        stream.write(codec.PROTOCOL_HEADER)

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        self._reader.feed(data)
        try:
            for frame_type, channel_id, payload in self._reader.frames():
                if channel_id == 0:
                    if frame_type == codec.FRAME_METHOD:
                        self._connection_method(payload)
                    continue
                if channel_id == _STREAM_CHANNEL:
                    self.stream.frame(frame_type, payload)
                    continue
                mirror = self._channels.get(channel_id)
                if mirror is not None:
                    mirror.frame(frame_type, payload)
                if self.state is LinkState.FAILED:
                    return
        except (errors.AMQPError, IndexError, ValueError) as error:
            self._fail(f"unreadable frame from node {self.node}: {error}")

    def _connection_method(self, payload: bytes) -> None:
        transport = self._transport
        assert transport is not None, "frames come only once connected"
        method = codec.decode_method(payload)
        if isinstance(method, commands.Connection.Start):
            response = f"\0{CLUSTER_LINK_USER}\0{self._secret}"
            properties: dict[str, Any] = {
                "product": "amqp-server cluster link",
                "capabilities": {"consumer_cancel_notify": True, "publisher_confirms": True, "basic.nack": True},
            }
            transport.write(codec.method_frame(0, commands.Connection.StartOk(
                client_properties=properties, mechanism="PLAIN", response=response, locale="en_US")))
        elif isinstance(method, commands.Connection.Tune):
            frame_max = min(method.frame_max or LINK_FRAME_MAX, LINK_FRAME_MAX)
            self.max_body_frame = frame_max - codec.FRAME_OVERHEAD
            # The owner proposes its heartbeat; the link asks for its own (the lower wins, as in
            # RabbitMQ, unless the owner has none): it must notice a silent owner within seconds.
            self._heartbeat = min(method.heartbeat, LINK_HEARTBEAT_S) if method.heartbeat else LINK_HEARTBEAT_S
            transport.write(codec.method_frame(0, commands.Connection.TuneOk(
                channel_max=method.channel_max, frame_max=frame_max, heartbeat=self._heartbeat)))
            transport.write(codec.method_frame(0, commands.Connection.Open(virtual_host=self.vhost)))
        elif isinstance(method, commands.Connection.OpenOk):
            self.state = LinkState.OPEN
            self._handshake_done = True
            self.schedule_flush()
            log.info("cluster link to node %s (vhost '%s') is open", self.node, self.vhost)
        elif isinstance(method, commands.Connection.Close):
            transport.write(codec.method_frame(0, commands.Connection.CloseOk()))
            self._fail(f"node {self.node} closed the link: {method.reply_code} {method.reply_text}")
        elif isinstance(method, commands.Connection.Blocked):
            log.warning("node %s blocks publishes from this node: %s", self.node, method.reason)

    # -- writing -----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Send at the end of this event-loop turn, with everything else written in it (channel
        frames wait for connection.open-ok)."""
        if self.state is LinkState.FAILED:
            return
        self._out.append(data)
        self.schedule_flush()

    def write_frames(self, frames: list[bytes]) -> None:
        """Like write, for frames in parts (a message's method, header and body frames)."""
        if self.state is LinkState.FAILED:
            return
        self._out.extend(frames)
        self.schedule_flush()

    def acks_waiting(self, mirror: "MirrorChannel") -> None:
        """`mirror` gathered acks: they go with the next write."""
        self._acking.append(mirror)
        self.schedule_flush()

    def schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.state is LinkState.FAILED:
            return
        self.stream.emit_pending()
        if self._acking:
            acking, self._acking = self._acking, []
            for mirror in acking:
                mirror.flush_acks()
        if self._handshake_done and self._out:
            transport = self._transport
            assert transport is not None, "the handshake is done over the transport"
            data = b"".join(self._out)
            self._out.clear()
            transport.write(data)
            self._last_write = time.monotonic()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.stream.room_changed()

    # -- channels ----------------------------------------------------------------------

    def open_mirror(self, handler: MirrorHandler) -> "MirrorChannel":
        """A new channel to subscribe or fetch on; see MirrorChannel."""
        channel_id = self._next_channel
        while channel_id in self._channels or channel_id == _STREAM_CHANNEL:
            channel_id = channel_id + 1 if channel_id < 2047 else _STREAM_CHANNEL + 1
        self._next_channel = channel_id + 1 if channel_id < 2047 else _STREAM_CHANNEL + 1
        mirror = MirrorChannel(self, channel_id, handler)
        self._channels[channel_id] = mirror
        return mirror

    def mirror_closed(self, mirror: "MirrorChannel") -> None:
        if self._channels.get(mirror.id) is mirror:
            del self._channels[mirror.id]

    # -- liveness ----------------------------------------------------------------------

    def _tick(self) -> None:
        """Every half heartbeat: fail a link that did not open in time or whose owner went
        silent; send a heartbeat after half a heartbeat without writing."""
        self._ticker = None
        if self.state is LinkState.FAILED:
            return
        now = time.monotonic()
        if not self._handshake_done:
            if now - self._started_at > LINK_CONNECT_TIMEOUT_S:
                self._fail(f"node {self.node} at {self._host}:{self._port} did not open the link within "
                           f"{LINK_CONNECT_TIMEOUT_S:.0f} s")
                return
        elif self._heartbeat:
            if now - self._last_read > 2 * self._heartbeat:
                self._fail(f"no heartbeat from node {self.node} for {now - self._last_read:.1f} s")
                return
            if now - self._last_write >= self._heartbeat / 2 and self._transport is not None:
                self._transport.write(codec.HEARTBEAT_FRAME)
                self._last_write = now
        self._ticker = asyncio.get_running_loop().call_later(LINK_HEARTBEAT_S / 2, self._tick)

    # -- failing -----------------------------------------------------------------------

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection to node {self.node} lost" + (f": {exc}" if exc else ""))

    def close(self) -> None:
        """Stop using this link (shutdown, or the node left the cluster)."""
        self._fail(f"link to node {self.node} closed")

    def _fail(self, reason: str) -> None:
        if self.state is LinkState.FAILED:
            return
        if self.state is LinkState.OPEN:
            log.warning("cluster link: %s", reason)
        else:
            log.warning("cluster link to node %s (vhost '%s') failed: %s", self.node, self.vhost, reason)
        self.state = LinkState.FAILED
        self.failed_at = time.monotonic()
        self._out.clear()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._task.cancel()  # a connect still under way (a black hole's SYN retries)
        if self._transport is not None:
            self._transport.abort()
        self.stream.link_lost(reason)
        for mirror in list(self._channels.values()):
            mirror.link_lost()
        self._channels.clear()
        self._on_failed(self)


class ForwardStream:
    """Channel 1 of a link: this node's publishes to the other node's queues, in confirm mode.

    `forward` takes the message and the queue it was routed to; every queue one message reaches
    on this node is gathered, so the message goes once with one `forward-to`. `when_confirmed`
    calls back once the owner confirmed that message (error None) or nacked it or the link
    failed (an OSError): the caller's publisher confirm waits for it.
    """

    def __init__(self, link: NodeLink) -> None:
        self._link = link
        self._next_seq = 1
        self._message: Message | None = None  # the message whose queues are still being gathered
        self._message_seq = 0
        self._targets: list[str] = []
        self._sent_targets: tuple[str, ...] = ()
        # Every forwarded message not yet confirmed, oldest first: seq -> callbacks (or None).
        self._unconfirmed: OrderedDict[int, list[SyncCallback] | None] = OrderedDict()
        self._congested_queues: list[Any] = []  # queues whose publishers wait for room here
        self._lost: str | None = None
        # The owner's channel.flow(active=false): one of its queues is congested by what this
        # stream forwards, so this node stops reading the publishers into its queues until
        # channel.flow(active=true). (No flow-ok: the owner does not wait for one.)
        self._held_by_owner = False

    def open(self) -> None:
        """Open the channel and turn confirms on, ahead of any publish."""
        self._link.write(codec.method_frame(_STREAM_CHANNEL, commands.Channel.Open())
                         + codec.method_frame(_STREAM_CHANNEL, commands.Confirm.Select()))

    @property
    def backlog(self) -> int:
        """Messages forwarded and not yet confirmed."""
        return len(self._unconfirmed)

    def is_congested(self, queue: Any) -> bool:
        """Past FORWARD_HIGH (or while the socket is full, or the owner asked to pause):
        `queue` is told (release_flow) when room comes back."""
        if len(self._unconfirmed) <= FORWARD_HIGH and not self._link.write_paused and not self._held_by_owner:
            return False
        if queue not in self._congested_queues:
            self._congested_queues.append(queue)
        return True

    def forward(self, queue_name: str, message: Message) -> int:
        """Send `message` to the owner's queue `queue_name`; returns its sequence number."""
        if message is self._message:
            if queue_name not in self._targets:
                self._targets.append(queue_name)
            return self._message_seq
        if self._message is not None:
            self._emit(self._message)
        seq = self._next_seq
        self._next_seq = seq + 1
        self._message = message
        self._message_seq = seq
        self._targets = [queue_name]
        self._unconfirmed[seq] = None
        self._link.schedule_flush()
        return seq

    def when_confirmed(self, seq: int, callback: SyncCallback) -> None:
        """Call `callback(None)` once the owner confirms message `seq`, or with an OSError."""
        if self._lost is not None:
            callback(LinkLost(self._lost))
            return
        if seq not in self._unconfirmed:  # cannot happen: confirms come a turn later at the soonest
            callback(LinkLost(f"message {seq} to node {self._link.node} is no longer tracked"))
            return
        callbacks = self._unconfirmed[seq]
        if callbacks is None:
            self._unconfirmed[seq] = [callback]
        else:
            callbacks.append(callback)

    def _emit(self, message: Message) -> None:
        """`message` (the one being gathered) goes out to its queues."""
        self._message = None
        targets = tuple(self._targets)
        out: list[bytes] = []
        if targets != self._sent_targets:
            out.append(forward_to_frame(_STREAM_CHANNEL, targets))
            self._sent_targets = targets
        out.append(publish_frame(_STREAM_CHANNEL, message.routing_raw))
        codec.content_frames(out, _STREAM_CHANNEL, message.raw_header, message.body, self._link.max_body_frame)
        self._link.write_frames(out)

    def emit_pending(self) -> None:
        """The message whose queues were being gathered goes out (the link is about to write)."""
        if self._message is not None:
            self._emit(self._message)

    def frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type != codec.FRAME_METHOD:
            return
        index = codec.method_index(payload)
        if index == _BASIC_ACK or index == _BASIC_NACK:
            tag, multiple = codec.decode_ack(payload)
            self._confirmed(tag, multiple, None if index == _BASIC_ACK else OSError(
                f"node {self._link.node} did not accept the message"))
        elif index == _CHANNEL_FLOW:
            flow = codec.decode_method(payload)
            assert isinstance(flow, commands.Channel.Flow)  # (its index says so)
            self._held_by_owner = not flow.active
            if not self._held_by_owner:
                self.room_changed()
        elif index == _CHANNEL_CLOSE:
            method = codec.decode_method(payload)
            assert isinstance(method, commands.Channel.Close)  # (its index says so)
            self._link.write(codec.method_frame(_STREAM_CHANNEL, commands.Channel.CloseOk()))
            # The stream cannot go on without its confirms' order: start a new link.
            self._link._fail(f"node {self._link.node} closed the forward stream: "
                             f"{method.reply_code} {method.reply_text}")

    def _confirmed(self, tag: int, multiple: bool, error: OSError | None) -> None:
        unconfirmed = self._unconfirmed
        if multiple:
            while unconfirmed:
                seq = next(iter(unconfirmed))
                if seq > tag:
                    break
                callbacks = unconfirmed.popitem(last=False)[1]
                if callbacks is not None:
                    for callback in callbacks:
                        callback(error)
        else:
            callbacks = unconfirmed.pop(tag, None)
            if callbacks is not None:
                for callback in callbacks:
                    callback(error)
        if self._congested_queues and len(unconfirmed) < FORWARD_LOW:
            self.room_changed()

    def room_changed(self) -> None:
        """Room in the stream (confirms came, the socket drained, the owner resumed): resume
        paused publishers."""
        if self._link.write_paused or len(self._unconfirmed) >= FORWARD_LOW or self._held_by_owner:
            return
        queues, self._congested_queues = self._congested_queues, []
        for queue in queues:
            queue.release_flow()

    def link_lost(self, reason: str) -> None:
        """Nack everything unconfirmed (the owner may or may not have it: a client that
        republishes a nacked message may make a duplicate, never a loss)."""
        self._lost = reason
        self._message = None
        unconfirmed, self._unconfirmed = self._unconfirmed, OrderedDict()
        for callbacks in unconfirmed.values():
            if callbacks is not None:
                for callback in callbacks:
                    callback(LinkLost(reason))
        queues, self._congested_queues = self._congested_queues, []
        for queue in queues:
            queue.release_flow()


class _Incoming:
    """A delivery or get-ok whose content header and body are still arriving."""

    __slots__ = ("consumer_tag", "link_tag", "redelivered", "routing_raw", "message_count", "raw_header",
                 "body_size", "parts", "received")

    def __init__(self, consumer_tag: str | None, link_tag: int, redelivered: bool, routing_raw: bytes,
                 message_count: int = 0) -> None:
        self.consumer_tag = consumer_tag  # None for a get-ok
        self.link_tag = link_tag
        self.redelivered = redelivered
        self.routing_raw = routing_raw
        self.message_count = message_count
        self.raw_header = b""
        self.body_size = 0
        self.parts: list[bytes] = []
        self.received = 0


class MirrorState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # channel.close sent, waiting for close-ok
    CLOSED = "closed"


# What a mirror channel's pending request waits for, with its callback.
_Reply = tuple[type | tuple[type, ...], Callable[[Any], None] | None]


class MirrorChannel:
    """A channel of a link on which this node consumes or fetches on its clients' behalf.

    Methods are pipelined (the channel.open goes first, replies come in order); each request's
    callback gets the owner's reply, or a QueueUnavailable if the owner closed the channel or
    the link went. Deliveries and get-oks go to the handler with the owner's delivery tag,
    which `ack`, `reject` and `nack` take back.
    """

    def __init__(self, link: NodeLink, channel_id: int, handler: MirrorHandler) -> None:
        self.link = link
        self.id = channel_id
        self.handler = handler
        self.state = MirrorState.OPEN
        self.unsettled = 0  # deliveries handed out and not yet settled
        # Acks are gathered for the link's next write and sent as one `multiple` ack where they
        # settle the oldest deliveries: the owner's tags in delivery order, and those settled
        # while an older one is not (they are skipped when they reach the front).
        self._delivered: deque[int] = deque()
        self._settled_early: set[int] = set()
        self._acks: list[int] = []
        self._replies: deque[_Reply] = deque()
        self._incoming: _Incoming | None = None
        self._get_callbacks: deque[Callable[[Any], None]] = deque()
        self._send(commands.Channel.Open(), commands.Channel.OpenOk, None)

    @property
    def idle(self) -> bool:
        return not self.unsettled and not self._replies and not self._get_callbacks

    def _send(self, method: Any, reply: type | tuple[type, ...] | None, callback: Callable[[Any], None] | None) -> None:
        self.link.write(codec.method_frame(self.id, method))
        if reply is not None:
            self._replies.append((reply, callback))

    # -- requests ----------------------------------------------------------------------

    def consume(self, queue: str, tag: str, *, no_ack: bool, exclusive: bool, prefetch_count: int,
                arguments: dict[str, Any], on_reply: Callable[[Any], None]) -> None:
        """basic.qos then basic.consume; `on_reply` gets ConsumeOk or a QueueUnavailable."""
        if prefetch_count:
            self._send(commands.Basic.Qos(prefetch_count=prefetch_count), commands.Basic.QosOk, None)
        self._send(commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack, exclusive=exclusive,
                                          arguments=arguments), commands.Basic.ConsumeOk, on_reply)

    def qos(self, prefetch_count: int) -> None:
        """A new prefetch for the channel's consumer (the owner applies it to running ones)."""
        if self.state is MirrorState.OPEN:
            self._send(commands.Basic.Qos(prefetch_count=prefetch_count), commands.Basic.QosOk, None)

    def cancel(self, tag: str, on_reply: Callable[[Any], None]) -> None:
        self._send(commands.Basic.Cancel(consumer_tag=tag), commands.Basic.CancelOk, on_reply)

    def get(self, queue: str, on_reply: Callable[[Any], None]) -> None:
        """basic.get (always acknowledged on the link: a client's no_ack get is acked here once
        it has it); `on_reply` gets (link tag, redelivered, message, message count) for a
        message, None for get-empty, or a QueueUnavailable."""
        self._get_callbacks.append(on_reply)
        self._send(commands.Basic.Get(queue=queue, no_ack=False), None, None)

    def declare_passive(self, queue: str, on_reply: Callable[[Any], None]) -> None:
        """queue.declare passive; `on_reply` gets DeclareOk (the owner's counts) or a QueueUnavailable."""
        self._send(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk, on_reply)

    def purge(self, queue: str, on_reply: Callable[[Any], None]) -> None:
        """queue.purge; `on_reply` gets PurgeOk or a QueueUnavailable."""
        self._send(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk, on_reply)

    def ack(self, link_tag: int) -> None:
        """Ack at the link's next write (gathered: see flush_acks)."""
        if self.state is MirrorState.OPEN:
            self.unsettled -= 1
            if not self._acks:
                self.link.acks_waiting(self)
            self._acks.append(link_tag)

    def reject(self, link_tag: int, requeue: bool) -> None:
        """Reject without requeue (the owner dead-letters it), or nack with requeue (the
        owner's basic.nack: requeued as a failed delivery, delayed retry included)."""
        if self.state is MirrorState.OPEN:
            self.flush_acks()  # a multiple ack after this must not be sent before it
            self.unsettled -= 1
            self._settled_early.add(link_tag)
            self.link.write(nack_frame(self.id, link_tag, False, True) if requeue else
                            reject_frame(self.id, link_tag, False))

    def flush_acks(self) -> None:
        """Send the gathered acks: one `multiple` ack for those that settle the oldest
        deliveries, single acks for the others."""
        if not self._acks or self.state is not MirrorState.OPEN:
            self._acks.clear()
            return
        acked = set(self._acks)
        self._acks.clear()
        delivered = self._delivered
        settled_early = self._settled_early
        up_to = 0
        while delivered:
            oldest = delivered[0]
            if oldest in acked:
                acked.discard(oldest)
                up_to = oldest
            elif oldest in settled_early:
                settled_early.discard(oldest)  # its reject or single ack went before
            else:
                break
            delivered.popleft()
        frames = [ack_frame(self.id, up_to, multiple=True)] if up_to else []
        for tag in acked:
            frames.append(ack_frame(self.id, tag))
            settled_early.add(tag)
        self.link.write_frames(frames)

    def close(self) -> None:
        """Close the channel: the owner requeues whatever is still unsettled on it."""
        if self.state is not MirrorState.OPEN:
            return
        self.flush_acks()
        self.state = MirrorState.CLOSING
        self.link.write(codec.method_frame(self.id, commands.Channel.Close(200, "", 0, 0)))

    # -- frames in ---------------------------------------------------------------------

    def frame(self, frame_type: int, payload: bytes) -> None:
        if frame_type == codec.FRAME_METHOD:
            self._method(payload)
        elif frame_type == codec.FRAME_HEADER:
            incoming = self._incoming
            if incoming is not None:
                incoming.raw_header = payload
                incoming.body_size = codec.content_header_body_size(payload)[1]
                if not incoming.body_size:
                    self._complete(incoming)
        elif frame_type == codec.FRAME_BODY:
            incoming = self._incoming
            if incoming is not None:
                incoming.parts.append(payload)
                incoming.received += len(payload)
                if incoming.received >= incoming.body_size:
                    self._complete(incoming)

    def _method(self, payload: bytes) -> None:
        index = codec.method_index(payload)
        if index == DELIVER_METHOD:
            tag, link_tag, redelivered, routing_raw = decode_deliver(payload)
            self._incoming = _Incoming(tag, link_tag, redelivered, routing_raw)
            return
        if index == GET_OK_METHOD:
            link_tag, redelivered, routing_raw, count = decode_get_ok(payload)
            self._incoming = _Incoming(None, link_tag, redelivered, routing_raw, count)
            return
        if index == GET_EMPTY_METHOD:
            if self._get_callbacks:
                self._get_callbacks.popleft()(None)
            return
        if index == _CHANNEL_CLOSE_OK:
            self._closed()
            return
        method = codec.decode_method(payload)
        if isinstance(method, commands.Channel.Close):
            self.link.write(codec.method_frame(self.id, commands.Channel.CloseOk()))
            code = method.reply_code or 0  # (pamqp's type; a decoded channel.close has one)
            self._refused(QueueUnavailable(code, _explanation(code, method.reply_text)))
            return
        if isinstance(method, commands.Basic.Cancel):  # the owner cancelled it: its queue is gone
            self.handler.cancelled_by_owner(self, method.consumer_tag or "")
            return
        if self._replies:
            expected, callback = self._replies.popleft()
            if callback is not None:
                callback(method)

    def _complete(self, incoming: "_Incoming") -> None:
        """`incoming` (the delivery or get-ok arriving) is complete."""
        self._incoming = None
        if self.state is not MirrorState.OPEN:
            return  # sent before the owner saw our channel.close: it requeues it
        parts = incoming.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        exchange, routing_key = split_routing_raw(incoming.routing_raw)
        message = Message(exchange, routing_key, incoming.raw_header, body, incoming.routing_raw)
        self.unsettled += 1
        self._delivered.append(incoming.link_tag)
        if incoming.consumer_tag is None:
            if self._get_callbacks:
                self._get_callbacks.popleft()((incoming.link_tag, incoming.redelivered, message,
                                               incoming.message_count))
            return
        self.handler.delivered(self, incoming.consumer_tag, incoming.link_tag, incoming.redelivered, message)

    def _refused(self, error: QueueUnavailable) -> None:
        """The owner closed this channel, or the link went: every waiting request hears why."""
        self.state = MirrorState.CLOSED
        self.link.mirror_closed(self)
        replies, self._replies = self._replies, deque()
        gets, self._get_callbacks = self._get_callbacks, deque()
        for _expected, callback in replies:
            if callback is not None:
                callback(error)
        for callback in gets:
            callback(error)
        self.handler.mirror_failed(self, error)

    def _closed(self) -> None:
        self.state = MirrorState.CLOSED
        self.link.mirror_closed(self)

    def link_lost(self) -> None:
        if self.state is MirrorState.CLOSED:
            return
        self._refused(QueueUnavailable(errors.NOT_FOUND, "link lost"))


def _explanation(code: int, reply_text: str) -> str:
    """A reply text without its "NAME - " prefix (AMQPError adds it back)."""
    prefix = errors.REPLY_NAMES.get(code, "") + " - "
    return reply_text[len(prefix):] if reply_text.startswith(prefix) else reply_text
