"""One AMQP connection as a sans-I/O state machine: `receive_data(bytes)` in, `take_output()` out.

The connection owns its state (states.py: one transition table, moved only by `advance`) and
its attributes; the modules that do its work call its methods to change them. It runs the
handshake (its steps are handshake.py), multiplexes channels, stops reading while it publishes
too fast or a resource alarm is on (PublisherFlow, publisher_blocking.py), and turns errors
into RabbitMQ's closes: a soft error closes the channel it happened on, a hard error the
connection. It never touches a socket or a clock: the asyncio shell in server.py feeds it
bytes, writes what it produces, and handles heartbeat timing.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import Any

from pamqp import commands

from amqp_server.wire import codec, errors, protocols
from amqp_server.connection import handshake, secret_update
from amqp_server.broker.access_control import AuthenticationFailed, UnsupportedMechanism, User, is_loopback_address
from amqp_server.wire.codec import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, FRAME_PUBLISH
from amqp_server.config.settings import FRAME_MIN_SIZE
from amqp_server.broker.connection_limits import Admission
from amqp_server.channel.channel import Channel
from amqp_server.wire.errors import AMQPError, HandshakeError
from amqp_server.connection.ports import Handover
from amqp_server.connection.publisher_flow import PublisherFlow
from amqp_server.wire.states import (
    CONNECTION_TRANSITIONS,
    UNTRUSTED,
    ChannelEvent,
    ChannelState,
    ConnectionEvent,
    ConnectionState,
    HandoverState,
    IllegalTransition,
    next_state,
)
from amqp_server.config.tls import TlsSession
from amqp_server.broker.vhost import VirtualHost
from queues.queue import Queue

log = logging.getLogger(__name__)

# The states as names of this module too (server.py and tests read them here).
AWAIT_HEADER = ConnectionState.AWAIT_HEADER
AWAIT_START_OK = ConnectionState.AWAIT_START_OK
AWAIT_TUNE_OK = ConnectionState.AWAIT_TUNE_OK
AWAIT_OPEN = ConnectionState.AWAIT_OPEN
OPEN = ConnectionState.OPEN
CLOSING = ConnectionState.CLOSING
CLOSED = ConnectionState.CLOSED
_HANDSHAKE_STATES = (AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN)
# Body bytes of deliveries that may wait for one write: past it, consumers on the connection get
# nothing more until the shell has written them (output_flushed), so one dispatch round cannot
# move a whole queue into memory as frames, nor hold the event loop while doing it.
DELIVERY_BYTES_PER_WRITE = 4 * 1024 * 1024
# Deliveries after which the shell writes what is waiting at once, the first time in an
# event-loop turn (on_early_write), instead of only at the end of the turn: a consumer acking a
# prefetch window (100 by default in the benchmark's clients) then starts on its first
# deliveries while the broker makes the rest, and its ack comes back while the broker is still
# busy, instead of the two taking turns with one of them idle (docs/benchmarks.md, "Hot path,
# issue 14"). At most one early write per turn: a turn that delivers thousands (auto-ack) adds
# one write, not one per this many.
EARLY_WRITE_DELIVERIES = 32
# How long the shell keeps a socket after connection.close was sent, waiting for close-ok.
CLOSE_OK_TIMEOUT_S = 3.0
# Channel methods other than publish and ack (declarations, deletions, bindings ...) cost far
# more per byte than publishes: one connection handles at most this many per event-loop turn,
# so a client pipelining thousands of them (one read can hold 5,000 declarations) holds the
# loop for about a millisecond at a time, not for the whole read.
METHODS_PER_TURN = 16
# Largest frame read from a client whose login was refused: close-ok is 4 payload bytes and a
# connection.close at most 266; anything bigger ends the wait.
_REFUSED_LOGIN_FRAME_MAX = 512
_unpack_method_index = struct.Struct(">I").unpack_from
_CHANNEL_OPEN = 0x0014000A
# The client's methods on channel 0 as events of the connection's state table (states.py):
# each is allowed only in the states whose row names it. By name: a 0-8 connection.close is a
# Connection.Close of its own id (amqp_0_8.Close).
_METHOD_EVENTS = {
    commands.Connection.StartOk.name: ConnectionEvent.START_OK,
    commands.Connection.TuneOk.name: ConnectionEvent.TUNE_OK,
    commands.Connection.Open.name: ConnectionEvent.OPEN,
    commands.Connection.UpdateSecret.name: ConnectionEvent.UPDATE_SECRET,
    commands.Connection.Close.name: ConnectionEvent.CLOSE,
}

class Connection:
    """See the module docstring. `on_output` is called when output becomes available."""

    # Slots, not an instance dict: past 30 attributes CPython 3.11 gives each instance a dict of
    # its own instead of one sharing the class's keys, about 1.5 KiB more per connection
    # (docs/benchmarks.md, idle connections). Every attribute is declared here.
    __slots__ = (
        "broker", "admission", "tls", "peer_host", "peer_port", "peer", "local_address", "peer_is_loopback",
        "on_output", "state", "reader", "frame_max", "max_body_frame", "channel_max", "heartbeat",
        "client_properties", "client_capabilities", "user", "mechanism", "vhost", "channels",
        "exclusive_queues", "write_paused", "deliveries_paused", "_delivery_bytes_unwritten", "content_in_flight",
        "max_content_in_flight", "flow", "on_reading_paused", "close_when_flushed", "close_ok_timeout_s", "_out",
        "_confirm_channels", "_input_broken", "_method_budget", "input_waiting", "input_held", "connected_at_ms",
        "received_bytes", "received_reads", "sent_bytes", "sent_writes", "handover", "on_early_write",
        "_delivery_count_unwritten", "protocol", "decode_method",
    )

    def __init__(
        self,
        broker: Any,
        peer_host: str = "",
        peer_port: int = 0,
        on_output: Callable[[], None] | None = None,
        admission: Admission | None = None,
        tls: TlsSession | None = None,
        local_address: str = "",
        on_reading_paused: Callable[[bool], None] | None = None,
        handover: Handover | None = None,
        on_early_write: Callable[[], None] | None = None,
    ) -> None:
        """`local_address` is "ip:port" of our end; `on_reading_paused` is called with True/False
        when reading from the socket should pause/resume; `on_early_write` when
        EARLY_WRITE_DELIVERIES deliveries wait (take_early_output; all from the shell, server.py).
        `handover`: the connection may move to the worker owning its queue (handover.py)."""
        self.broker = broker
        # Its place under the connection limits; refused at connection.open when over one.
        # Connections made without a shell (unit tests) are under no node limit.
        self.admission = admission if admission is not None else Admission((), "")
        self.tls = tls  # the negotiated TLS session on an AMQPS listener, None on a plain one
        self.peer_host = peer_host
        self.peer_port = peer_port
        self.peer = f"{peer_host}:{peer_port}"
        self.local_address = local_address
        self.peer_is_loopback = is_loopback_address(peer_host)
        self.on_output = on_output or (lambda: None)
        self.state = AWAIT_HEADER  # changed by advance() only
        # The AMQP version spoken (protocols.py), chosen by the protocol header, and its decoder
        # of the client's methods (the channels call it: one attribute, as the codec's was).
        self.protocol = protocols.AMQP_0_9_1
        self.decode_method: Callable[[bytes], Any] = codec.decode_method
        limits = broker.limits
        # Until tune-ok a client gets frames of FRAME_MIN_SIZE, as in RabbitMQ: an anonymous socket
        # can make the broker hold one small frame, not the broker's frame_max.
        self.reader = codec.FrameReader(FRAME_MIN_SIZE)
        self.frame_max = limits.frame_max
        self.max_body_frame = self.frame_max - codec.FRAME_OVERHEAD
        self.channel_max = limits.channel_max
        self.heartbeat = limits.heartbeat
        self.client_properties: dict[str, Any] = {}
        self.client_capabilities: dict[str, Any] = {}
        self.user: User | None = None
        self.mechanism = ""  # the SASL mechanism the user logged in with
        self.vhost: VirtualHost | None = None
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: list[Queue] = []
        self.write_paused = False  # the socket's buffer is over its high-water mark (the shell says)
        # No deliveries now: write_paused, or DELIVERY_BYTES_PER_WRITE wait for the next write.
        self.deliveries_paused = False
        self._delivery_bytes_unwritten = 0
        # Declared body bytes of publishes whose content is still arriving (a first body frame
        # came, not the last), on all channels, and how many may be (Channel.handle_body).
        self.content_in_flight = 0
        self.max_content_in_flight = limits.max_content_in_flight
        # Congested queues (flow control) and resource alarms that hold back reading.
        self.flow = PublisherFlow(self)
        self.on_reading_paused: Callable[[bool], None] = on_reading_paused or (lambda paused: None)
        self.close_when_flushed = False  # the shell closes the socket after the next write
        # In CLOSING, the shell drops the socket after this long without close-ok.
        self.close_ok_timeout_s = CLOSE_OK_TIMEOUT_S
        self._out: list[bytes] = []
        self._delivery_count_unwritten = 0  # deliveries in _out (EARLY_WRITE_DELIVERIES)
        self.on_early_write = on_early_write
        self._confirm_channels: set[Channel] = set()
        self._input_broken = False
        # Channel methods other than publish and ack left to run in this event-loop turn; when
        # none are, the frames still buffered wait for the next turn (input_waiting). Zero too
        # once closed or broken, and while held by flow control (hold_input).
        self._method_budget = METHODS_PER_TURN
        self.input_waiting = False
        # Flow control holds the connection: no frame is handled, read already or not, until
        # its congested queues drain (hold_input, release_input).
        self.input_held = False
        # Traffic, as the management API reports it (recv_oct, send_oct, ...): one addition per
        # read or write, never per message.
        self.connected_at_ms = int(time.time() * 1000)
        self.received_bytes = 0
        self.received_reads = 0
        self.sent_bytes = 0
        self.sent_writes = 0
        # While it may still move to another worker (handover.py); None once it stays here.
        self.handover = handover

    @property
    def name(self) -> str:
        """RabbitMQ's connection name: "client_ip:port -> server_ip:port"."""
        return f"{self.peer} -> {self.local_address}" if self.local_address else self.peer

    @property
    def is_cluster_link(self) -> bool:
        """Logged in as another node of the cluster (with the cluster secret)."""
        return self.user is not None and self.user is self.broker.access.cluster_link_user

    def advance(self, event: ConnectionEvent) -> None:
        """Move to the state `event` leads to (states.py); IllegalTransition if this state does
        not allow it."""
        self.state = next_state(CONNECTION_TRANSITIONS, self.state, event)
        if self.state is CLOSED:
            self._method_budget = 0  # no frame after this one is handled (_handle_input)

    # -- what the handshake (handshake.py) and update-secret learn ----------------------

    def identify(self, client_properties: dict[str, Any]) -> None:
        """The client's properties from start-ok, and the capabilities it announced there."""
        self.client_properties = client_properties
        capabilities = client_properties.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}

    def logged_in(self, user: User, mechanism: str) -> None:
        self.user = user
        self.mechanism = mechanism

    def tuned(self, frame_max: int, channel_max: int, heartbeat: int) -> None:
        """The limits tune-ok settled on (handshake.tune_ok checked them against ours)."""
        self.frame_max = frame_max
        self.max_body_frame = frame_max - codec.FRAME_OVERHEAD
        self.reader.raise_frame_max(frame_max)
        self.channel_max = channel_max
        self.heartbeat = heartbeat

    def entered(self, vhost: VirtualHost) -> None:
        """connection.open was granted for `vhost`."""
        self.vhost = vhost

    def secret_updated(self, user: User) -> None:
        """update-secret renewed the user's credentials: permissions are looked up again from
        each channel's next publish."""
        self.user = user
        for channel in self.channels.values():
            channel.forget_permissions()

    def describe(self) -> str:
        """The connection for log lines: name, vhost, user and client product."""
        vhost = f", vhost: '{self.vhost.name}'" if self.vhost is not None else ""
        user = f", user: '{self.user.name}'" if self.user is not None else ""
        product = self.client_properties.get("product")
        client = f", client: '{product}'" if product else ""
        return f"{self.name}{vhost}{user}{client}"

    # -- bytes in ----------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if self.state is CLOSED or self._input_broken:
            return
        self.received_bytes += len(data)
        self.received_reads += 1
        if self.handover is not None and self.handover.received(data):
            return  # moving: the bytes are for the worker it moves to
        self.reader.feed(data)
        if self.state is AWAIT_HEADER:
            header = self.reader.take_protocol_header()
            if header is None:
                return
            protocol = protocols.negotiate(header)
            if protocol is None:
                # Spec 4.2.2 and RabbitMQ: answer with the protocol we speak, then close.
                log.error("closing AMQP connection %s: %s", self.name, codec.refused_header_reason(header))
                self._write(codec.PROTOCOL_HEADER)
                self.finish()
                return
            self.protocol = protocol
            self.decode_method = protocol.decode_method
            self.advance(ConnectionEvent.HEADER_ACCEPTED)
            handshake.send_start(self)
        self._handle_input()

    @property
    def input_stopped(self) -> bool:
        """No frame may be handled now, not even those waiting: flow control holds the
        connection (hold_input), or a resource alarm blocked it at a publish."""
        return self.input_held or self.flow.blocked_by is not None

    def resume_input(self) -> None:
        """A new event-loop turn: handle the frames left waiting (the shell calls this while
        ``input_waiting`` and not ``input_stopped``)."""
        self._method_budget = METHODS_PER_TURN
        self.input_waiting = False
        if self.state is CLOSED or self._input_broken:
            return
        self._handle_input()

    def hold_input(self) -> None:
        """Flow control (PublisherFlow) holds this publisher back: handle none of its frames
        after the one being handled, and read nothing more. RabbitMQ's reader stops the same
        way, mid-buffer. Handling the rest of a socket read (up to 256 KB, some 1,500 small
        publishes) grew a congested queue by that much each time it was let go, and the broker
        then sat idle while its consumers drained the surplus one prefetch window at a time
        (docs/benchmarks.md, "Hot path, issue 14"). The frames left wait in the reader
        (``input_waiting``) for the next turn after the hold ends."""
        self.input_held = True
        self._method_budget = 0  # the loop in _handle_input stops after this frame
        self.on_reading_paused(True)

    def release_input(self) -> None:
        """The congested queues drained: handle the frames held (the shell resumes input from
        the next turn) and read again, unless an alarm still blocks the connection."""
        self.input_held = False
        if not self.reading_paused:
            self.on_reading_paused(False)

    def _blocked_by_alarm(self) -> None:
        """A publish met a resource alarm (PublisherFlow.publishing): the client is told, reading
        stops, and no frame after this one is handled until the alarm clears, not even the rest
        of this socket read."""
        self.flow.publishing()
        if self.flow.blocked_by is not None:
            self._method_budget = 0  # the loop in _handle_input stops after this frame

    def spend_method_budget(self) -> None:
        """A channel method other than publish and ack is being handled (see METHODS_PER_TURN)."""
        self._method_budget -= 1

    def _handle_input(self) -> None:
        if self.input_held:
            # Held (hold_input): bytes fed meanwhile wait with the frames held.
            self.input_waiting = True
            return
        channels = self.channels
        flow = self.flow
        handover = self.handover  # None unless the connection may still move (handover.py)
        # A publish whose frames all came in one read, its body in one frame, is one step
        # (codec.FRAME_PUBLISH), except while the connection may still move (the hand-over looks
        # at each frame), before it is open, and while a resource alarm waits for the next
        # publish to block the connection (flow.publishing after its header). An alarm changes
        # only between two reads (its monitor runs on a timer; a connection opened in this read
        # is not joined anyway).
        frames = self.reader.frames(handover is None and self.state is OPEN and not flow.block_on_publish)
        try:
            for frame_type, channel_id, payload in frames:
                if handover is not None and handover.before_frame(self, frame_type, channel_id, payload):
                    break  # stopped before a frame naming another worker's queue: the connection moves
                try:
                    # The hot case inline (publishes, acks: one call less per frame): content or
                    # a method on an open channel. Every other frame: _handle_frame.
                    channel = channels.get(channel_id) if channel_id and self.state is OPEN else None
                    if channel is None:
                        self._handle_frame(frame_type, channel_id, payload)
                    else:
                        try:
                            if frame_type == FRAME_PUBLISH:
                                method, header, body = payload
                                channel.handle_publish(method, header, body)
                            elif frame_type == FRAME_BODY:
                                channel.handle_body(payload)
                                if flow.block_on_publish:
                                    # A body of a publish begun before the alarm is publishing too.
                                    self._blocked_by_alarm()
                            elif frame_type == FRAME_HEADER:
                                channel.handle_header(payload)
                                if flow.block_on_publish:
                                    self._blocked_by_alarm()
                            elif frame_type == FRAME_METHOD:
                                try:  # codec.method_index, without the call
                                    index = _unpack_method_index(payload)[0]
                                except struct.error:
                                    index = codec.method_index(payload)  # raises its 501
                                if index >> 16 == 10:
                                    # A connection-class method belongs on channel 0 only (on an
                                    # unopened channel RabbitMQ says 'expected channel.open' first).
                                    raise AMQPError(errors.COMMAND_INVALID, "unimplemented method", 10, index & 0xFFFF)
                                channel.handle_method(payload, index)
                                if flow.block_on_publish and index == codec.PUBLISH_METHOD:
                                    # As RabbitMQ's reader: blocked at the basic.publish, its
                                    # content handled (routed, confirmed) once the alarm clears.
                                    self._blocked_by_alarm()
                            else:
                                self._handle_frame(frame_type, channel_id, payload)
                        except AMQPError as error:
                            if error.is_hard:
                                raise
                            self.fail_channel(channel, error)
                except HandshakeError as error:
                    self._stop_input()
                    self._handshake_error(error)
                    return
                except AMQPError as error:
                    self._connection_error(error)
                if self._method_budget <= 0:
                    # Out of budget for this turn, held by flow control, or no more input at all
                    # (closed, or broken framing: advance and _stop_input zero the budget too, so
                    # the hot loop tests one number per frame).
                    if self.state is not CLOSED and not self._input_broken:
                        self.input_waiting = True
                    return
        except AMQPError as error:  # framing itself is broken: nothing after this can be read
            self._stop_input()
            if self.state in _HANDSHAKE_STATES:
                self._handshake_error(error)
                return
            self._connection_error(error)
            self.finish()
        finally:
            frames.close()  # the frames handled leave the buffer; the others wait
            if self._confirm_channels:
                self._ask_stores()
        if handover is not None and handover.state is not HandoverState.RECORDING:
            if handover.state is HandoverState.MOVING:
                handover.stopped(self.reader.take_unread())
            else:
                self.handover = None  # stays here: nothing more to record or check

    def stay_after_handover(self) -> None:
        """The hand-over failed or was refused: handle the frame it stopped before and what came
        after, here (a queue of another worker is then reached over its link)."""
        handover = self.handover
        assert handover is not None, "only a connection that was moving stays after its hand-over"
        self.handover = None
        self.reader.feed(handover.refused())
        self._handle_input()

    def handed_over(self) -> None:
        """The socket is another worker's now (the owner took it; or, on the owner, the replay
        was refused and the first worker keeps it): forget the connection without a word to the
        client (its channels, its place in the broker's connections)."""
        if self.handover is not None:
            self.handover.taken()
            self.handover = None
        self._release(moved=True)
        self.advance(ConnectionEvent.HANDED_OVER)

    def _ask_stores(self) -> None:
        """The publishes of this input that wait for their queues to store them: ask the queues
        now, after the last of them and in this event-loop iteration (PublisherConfirms.ask_stores)."""
        for channel in self._confirm_channels:
            if channel.confirms is not None:
                channel.confirms.ask_stores()

    def _handle_frame(self, frame_type: int, channel_id: int, payload: bytes | tuple[bytes, bytes, bytes]) -> None:
        """Every frame but content and methods on an open channel (_handle_input handles those);
        `payload` is a frame's, or a FRAME_PUBLISH's three."""
        if isinstance(payload, tuple):  # frame_type is FRAME_PUBLISH
            # A publish read whole (codec.FRAME_PUBLISH) but not for an open channel: its method
            # frame is either refused, which closes the connection, or dropped because the
            # connection is closing already. Either way the closing connection would drop its
            # header and body frames too, so they need no handling.
            self._handle_frame(FRAME_METHOD, channel_id, payload[0])
            return
        if self.state is CLOSING:
            if frame_type == codec.FRAME_METHOD and channel_id == 0:
                index = codec.method_index(payload)
                if index == self.protocol.close_ok_index:
                    self.finish()
                elif index == self.protocol.close_index:
                    # Both sides closing: answer, and keep waiting for the close-ok of ours (RabbitMQ).
                    self.send_connection_method(commands.Connection.CloseOk())
            return
        if frame_type == codec.FRAME_HEARTBEAT:
            if channel_id != 0:
                raise AMQPError(errors.UNEXPECTED_FRAME, f"type {frame_type}, all octets = <<>>")
            return
        if frame_type not in (codec.FRAME_METHOD, codec.FRAME_HEADER, codec.FRAME_BODY):
            raise AMQPError(errors.FRAME_ERROR, f"unknown frame type {frame_type}")
        if channel_id == 0:
            if frame_type != codec.FRAME_METHOD:
                raise self._out_of_turn(
                    errors.UNEXPECTED_FRAME, f"type {frame_type}, all octets = {codec.erlang_binary(payload)}"
                )
            self._handle_connection_method(payload)
            return
        if self.state is not OPEN:
            raise self._out_of_turn(
                errors.UNEXPECTED_FRAME, f"type {frame_type}, all octets = {codec.erlang_binary(payload)}"
            )
        # A channel that is not open.
        if frame_type == codec.FRAME_METHOD:
            index = codec.method_index(payload)
            if index == _CHANNEL_OPEN:
                self._open_channel(channel_id)
                return
            raise AMQPError(errors.CHANNEL_ERROR, "expected 'channel.open'", index >> 16, index & 0xFFFF)
        # RabbitMQ: content with no method before it, whether or not the channel is open.
        raise AMQPError(errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")

    # -- connection class --------------------------------------------------------------

    def _handle_connection_method(self, payload: bytes) -> None:
        method = self.decode_method(payload)
        try:
            # As RabbitMQ: during the handshake only its next step, once open only close and
            # update-secret (not a second start-ok or open, which would log in or count the
            # connection again, nor a close-ok nobody asked for, nor blocked from a client).
            self.advance(_METHOD_EVENTS[method.name])
        except (KeyError, IllegalTransition):
            text = f"unexpected method in connection state {self.state.value}"
            raise self._out_of_turn(errors.CHANNEL_ERROR, text, *_ids(method)) from None
        if isinstance(method, commands.Connection.StartOk):
            handshake.start_ok(self, method)
        elif isinstance(method, commands.Connection.TuneOk):
            handshake.tune_ok(self, method)
        elif isinstance(method, commands.Connection.Open):
            handshake.open_vhost(self, method)
        elif isinstance(method, commands.Connection.Close):
            log.info("closing AMQP connection %s: client requested close", self.describe())
            self._release()
            self.send_connection_method(commands.Connection.CloseOk())
            self.finish()
        elif isinstance(method, commands.Connection.UpdateSecret):  # (the last of _METHOD_EVENTS)
            secret_update.update_secret(self, method)

    # -- channels ----------------------------------------------------------------------

    def _open_channel(self, channel_id: int) -> None:
        # RabbitMQ counts open channels rather than checking the channel number.
        if len(self.channels) >= self.channel_max:
            raise AMQPError(
                errors.NOT_ALLOWED,
                f"number of channels opened ({len(self.channels)}) has reached the negotiated "
                f"channel_max ({self.channel_max})",
            )
        user = self.user
        assert user is not None, "channels open only after connection.open"
        user_limits = self.broker.limits_of(user.name)
        if user_limits.limits_channels:  # counting the user's channels costs a pass over connections
            user_limits.check_new_channel(user.name, self.broker.open_channels_of(user))
        # Another node's link gets the channel the cluster plug-in made for it (it takes forwarded
        # publishes); every client gets a Channel.
        channel_class = self.broker.link_channel_class if self.is_cluster_link else None
        channel = (channel_class or Channel)(self, channel_id)
        self.channels[channel_id] = channel
        self.broker.stats.channels_opened += 1
        self._write(self.protocol.channel_open_ok_frame(channel_id))

    def close_channel(self, channel: Channel) -> None:
        """The client closed the channel (channel.close): release it at once."""
        self.channels.pop(channel.id, None)
        self._confirm_channels.discard(channel)
        channel.advance(ChannelEvent.CLIENT_CLOSE)
        channel.release()
        self.broker.stats.channels_closed += 1

    def channel_finished(self, channel: Channel) -> None:
        """close-ok arrived for a channel we closed: its number may be reused."""
        self.channels.pop(channel.id, None)

    def fail_channel(self, channel: Channel, error: AMQPError) -> None:
        """Close `channel` with a soft error, as RabbitMQ does: requeue its deliveries, send channel.close."""
        if channel.state is ChannelState.CLOSED:
            # An answer that came back for a channel closed meanwhile (a cluster node's counts):
            # there is nothing to close, and its number may belong to a new channel already.
            return
        log.warning("channel error on connection %s, channel %d: %s", self.describe(), channel.id, error.reply_text)
        self._confirm_channels.discard(channel)
        if channel.confirms is not None and channel.confirms.has_pending:
            channel.flush_confirms()
        channel.advance(ChannelEvent.CLOSE_SENT)
        channel.release()
        self.broker.stats.channels_closed += 1
        # After the replies that wait for disk, so a client sees them answered before the close.
        channel.replies.send(commands.Channel.Close(error.code, error.reply_text, error.class_id, error.method_id))

    def own_exclusive(self, queue: Queue) -> None:
        """`queue` was declared exclusive on this connection: it is deleted when the connection closes."""
        self.exclusive_queues.append(queue)

    def check_permission(self, kind: str, resource_kind: str, name: str) -> None:
        """403 unless the user may `kind` (configure/write/read) the named resource."""
        user, vhost = self.user, self.vhost
        # Asked only on an open channel (a publish asks once per exchange, Channel.write_permitted).
        assert user is not None and vhost is not None, "permissions are checked only after connection.open"
        if not self.broker.access.is_permitted(user, vhost.name, kind, name):
            raise errors.access_refused(resource_kind, name, vhost.name, user.name)

    # -- bytes out ---------------------------------------------------------------------

    def method_frame(self, channel_id: int, method: Any) -> bytes:
        return codec.method_frame(channel_id, method)

    def send_method(self, channel_id: int, method: Any) -> None:
        self._write(codec.method_frame(channel_id, method))

    def send_connection_method(self, method: Any) -> None:
        """A method of channel 0 (the connection class), in the ids of the protocol spoken."""
        self._write(self.protocol.connection_frame(method))

    def send_frames(self, frames: list[bytes]) -> None:
        if not self._out:
            self.on_output()
        self._out.extend(frames)

    def send_deliveries(self, frames: list[bytes], body_size: int, count: int) -> None:
        """The frames of `count` deliveries (one basic.deliver, or a stream's batch), `body_size`
        bytes of bodies; consumers pause once DELIVERY_BYTES_PER_WRITE wait, and the output is
        written early once EARLY_WRITE_DELIVERIES deliveries wait."""
        if not self._out:
            self.on_output()
        self._out.extend(frames)
        self._delivery_bytes_unwritten += body_size
        if self._delivery_bytes_unwritten > DELIVERY_BYTES_PER_WRITE:
            self.deliveries_paused = True
        before = self._delivery_count_unwritten
        self._delivery_count_unwritten = after = before + count
        if before < EARLY_WRITE_DELIVERIES <= after and self.on_early_write is not None:
            self.on_early_write()

    def _write(self, data: bytes) -> None:
        if not self._out:
            self.on_output()
        self._out.append(data)

    def confirms_pending(self, channel: Channel) -> None:
        """`channel` has publisher confirms to send; they go out with the next write."""
        if not self._confirm_channels:
            self.on_output()
        self._confirm_channels.add(channel)

    def take_output(self) -> bytes:
        """Everything to write now (confirms collected since the last call included)."""
        if self._confirm_channels:
            for channel in self._confirm_channels:
                channel.flush_confirms()
            self._confirm_channels.clear()
        return self.take_early_output()

    def take_early_output(self) -> bytes:
        """The frames waiting now, for a write before the end of the event-loop turn
        (on_early_write): without the publisher confirms collected, which wait for take_output
        at the end of the turn, once the queues that store their messages were asked
        (_ask_stores)."""
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self._delivery_count_unwritten = 0
        self.sent_bytes += len(data)
        self.sent_writes += 1
        return data

    def content_started(self, body_size: int) -> None:
        """A content header announced `body_size` bytes on one of the channels."""
        self.content_in_flight += body_size

    def content_finished(self, body_size: int) -> None:
        """A publish announced with `body_size` bytes is complete, or dropped with its channel."""
        self.content_in_flight -= body_size

    def throttle(self, queue: Queue) -> None:
        """Stop reading from this publisher until `queue` drains (flow control)."""
        self.flow.throttle(queue)

    @property
    def reading_paused(self) -> bool:
        """No more input wanted: a congested queue (flow control), a resource alarm, output the
        client does not read (write_paused) or broken framing."""
        return self.flow.holds_reading or self.write_paused or self._input_broken

    def alarm_changed(self, reason: str | None) -> None:
        """The broker's resource alarms changed (alarms.py); `reason` is None when none is left.
        An alarm blocks the connection when it next publishes (publisher_blocking.py)."""
        self.flow.alarm_changed(reason)

    def pause_output(self) -> None:
        """The socket's buffer passed its high-water mark: deliver nothing more, and read nothing
        more, since what the client sends makes the broker answer (replies, basic.return,
        confirms). A client that does not read can then hold only a bounded output buffer."""
        self.write_paused = True
        self.deliveries_paused = True
        self.on_reading_paused(True)

    def resume_deliveries(self) -> None:
        """The socket drained: read again, and consumers on this connection may receive again."""
        self.write_paused = False
        if not self.reading_paused:
            self.on_reading_paused(False)
        self._resume_consumers()

    def output_flushed(self) -> None:
        """The shell wrote what take_output returned: deliveries held back for that write go on,
        unless the socket's buffer is now over its high-water mark (then resume_deliveries will)."""
        held_back = self._delivery_bytes_unwritten > DELIVERY_BYTES_PER_WRITE
        self._delivery_bytes_unwritten = 0
        if held_back and not self.write_paused:
            self._resume_consumers()

    def _resume_consumers(self) -> None:
        self.deliveries_paused = False
        for channel in list(self.channels.values()):
            channel.dispatch_all()

    def send_timed_out(self, timeout_s: float, pending: int) -> None:
        """Nothing could be written to the client for `timeout_s`: close it without waiting for a
        close-ok (a connection.close could not reach it behind `pending` unread bytes)."""
        log.warning(
            "closing AMQP connection %s: client is not reading, nothing could be sent to it for %gs "
            "with %d bytes pending (send_timeout)", self.describe(), timeout_s, pending,
        )
        self._release()
        self.finish()

    # -- closing -----------------------------------------------------------------------

    def _connection_error(self, error: AMQPError) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        log.warning("closing AMQP connection %s: %s", self.describe(), error.reply_text)
        self._release()
        self.send_connection_method(
            commands.Connection.Close(error.code, error.reply_text, error.class_id, error.method_id))
        self.advance(ConnectionEvent.CLOSE_SENT)

    def _out_of_turn(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
        """The error for a frame the connection's state does not allow: silent before login and
        tuning are done (HandshakeError), a connection.close after."""
        kind = HandshakeError if self.state in UNTRUSTED else AMQPError
        return kind(code, text, class_id, method_id)

    def _stop_input(self) -> None:
        """Nothing more will be read: drop what is buffered and stop reading the socket."""
        self._input_broken = True
        self._method_budget = 0  # no frame after this one is handled (_handle_input)
        self.reader.clear()
        self.on_reading_paused(True)

    def _handshake_error(self, error: AMQPError) -> None:
        """An error before connection.open-ok that gets no reply (a broken frame, or any
        HandshakeError): the shell drops the socket after its close-ok timeout (3 s). RabbitMQ
        does the same (SILENT_CLOSE_DELAY): a client not yet trusted gets no reply and waits, so
        it cannot retry at full speed."""
        log.warning(
            "closing AMQP connection %s: handshake error in state %s: %s", self.describe(), self.state.value,
            error.reply_text,
        )
        self._release()
        self.advance(ConnectionEvent.CLOSE_SENT)

    def refuse_login(self, failure: AuthenticationFailed) -> None:
        """Close after a refused login as RabbitMQ does. A client that announced
        authentication_failure_close gets connection.close (403), others nothing; the socket then
        stays open until the client's close-ok or `refused_login_close_delay_ms`, whichever comes
        first, so the client reads "access refused" before the socket goes, and cannot retry at
        full speed. An unknown mechanism gets no reply and nothing more is read (RabbitMQ sleeps).
        Meanwhile the connection keeps one small frame buffer and still holds its place under the
        connection limits, like any socket."""
        self.advance(ConnectionEvent.CLOSE_SENT)
        self.close_ok_timeout_s = self.broker.limits.refused_login_close_delay_ms / 1000
        self.reader = codec.FrameReader(_REFUSED_LOGIN_FRAME_MAX)
        self.client_properties = {"product": self.client_properties.get("product")}
        if isinstance(failure, UnsupportedMechanism):
            self._stop_input()
        elif self.client_capabilities.get("authentication_failure_close"):
            self.send_connection_method(commands.Connection.Close(errors.ACCESS_REFUSED, failure.reply_text, 0, 0))
        self.client_capabilities = {}
        if not self.close_ok_timeout_s:
            self.finish()

    def close_by_broker(self, code: int, text: str) -> None:
        """Close from the broker side (shutdown, management request)."""
        self._connection_error(AMQPError(code, text))

    def heartbeat_missed(self) -> None:
        log.warning(
            "closing AMQP connection %s: missed heartbeats from client, timeout: %ds", self.describe(), self.heartbeat
        )
        self._release()
        self.finish()

    def transport_closed(self) -> None:
        """The socket is gone (client vanished or we closed it)."""
        if self.state not in (CLOSED, CLOSING, AWAIT_HEADER):
            log.info("connection %s closed by peer without connection.close", self.describe())
        self._release()
        self.advance(ConnectionEvent.TRANSPORT_CLOSED)

    def finish(self) -> None:
        """Closed: the shell closes the socket once what is written so far is flushed."""
        self.advance(ConnectionEvent.FINISHED)
        self.close_when_flushed = True
        self.on_output()

    def _release(self, moved: bool = False) -> None:
        """Give back everything this connection held: channels, consumers, exclusive queues.
        `moved`: it goes on at another worker (handed_over), its channels and itself not closed."""
        channels = list(self.channels.values())
        self.channels.clear()
        self._confirm_channels.clear()
        for channel in channels:
            released = channel.state is not ChannelState.CLOSING  # a closing one was released then
            channel.advance(ChannelEvent.CONNECTION_GONE)
            if released:
                channel.release()
                if not moved:
                    self.broker.stats.channels_closed += 1
        for queue in self.exclusive_queues:
            queue_vhost = self.broker.vhosts.get(queue.vhost)
            if queue_vhost is not None:
                queue_vhost.delete_queue(queue)
        self.exclusive_queues.clear()
        self.flow.release()
        if self.vhost is not None:
            self.broker.connection_closed(self, moved)
            self.vhost = None


def _ids(method: Any) -> tuple[int, int]:
    return method.index >> 16, method.index & 0xFFFF
