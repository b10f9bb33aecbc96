"""The asyncio shell around the sans-I/O connections: sockets, write batching, heartbeats, signals.

Each socket gets an `AMQPProtocol` that feeds bytes to its `Connection` and writes what the
connection produces once per event-loop iteration, so everything produced while handling a
batch of input (deliveries to many consumers, confirms) leaves in one write; the one exception
is a consumer's first EARLY_WRITE_DELIVERIES deliveries of an iteration, written at once so it
starts on them while the rest are made (connection.py). One ticker task checks heartbeats and
close deadlines for all connections.

A publish starts here and crosses the layers downward only (tests/test_import_layers.py lists
them). For a persistent message published with confirms to a durable queue, from the socket read
to its basic.ack being written (tests/test_publish_path_files.py traces one and checks these lines):

 runtime -> connection -> wire
     AMQPProtocol.data_received feeds the bytes read to Connection.receive_data; the wire's
     FrameReader splits them (a publish's three frames as one FRAME_PUBLISH)
 runtime -> connection -> channel -> wire
     Channel.handle_publish: the content header checked at the door (header_body_size), its
     Message made
 runtime -> connection -> channel -> broker -> exchanges
     VirtualHost.route: the queues the exchange's bindings name (to the default exchange the
     channel looks the queue up by name itself: the broker is not entered)
 runtime -> connection -> channel -> queues -> persistence
     Queue.publish: QueueJournal.published appends the record to the queue's segment file
     (QueueStore); after the read's last publish the channel's confirms ask the queue to store
     it (Queue.when_stored), which starts a group commit round (the fsync)

The confirm comes back up only through callbacks the lower layers were handed:

 persistence -> channel
     the group commit's completion calls the channel's StoreWait.one_stored, handed down by
     Queue.when_stored
 channel -> connection
     the channel's connection (channel/ports.py), handed to it at channel.open: confirms_pending,
     then send_method writes the basic.ack
 connection -> runtime
     on_output (AMQPProtocol._schedule_flush), handed to the connection: _flush takes the output
     (take_output, the confirms with it) and writes it

A publish whose frames arrive in separate reads, or whose body takes more than one frame, also
runs amqp_server/wire/content_assembly.py (the ContentAssembly that holds the method and header
until the body is complete). Not on this path unless needed: the message's expiry (only with a
TTL), whether it pages out (only once the queue holds KEEP_PER_QUEUE messages in memory), the size
histogram (its bucket counts are bumped in Channel._complete_publish and folded when metrics are
scraped).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

from amqp_server.broker.alarms import ResourceMonitor
from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from amqp_server.connection.connection import AWAIT_HEADER, CLOSED, CLOSING, OPEN, Connection
from amqp_server.broker.connection_limits import Admission, ConnectionLimit
from amqp_server.wire.errors import CONNECTION_FORCED, INTERNAL_ERROR
from amqp_server.runtime.listening import bound_socket
from amqp_server.runtime.handover import HandoverPlan, HandoverRecorder, HandoverService, MovedConnection
from amqp_server.runtime.http_services import start_http_services, stop_http_services
from amqp_server.config.tls import TlsListenerContext, session_of
from amqp_server.wire import codec
from amqp_server.runtime.boot_definitions import DefinitionsFileRefused, load_definitions_file
from amqp_server.runtime.local_links import LocalLinks
from amqp_server.federation.federation import Federation
from amqp_server.shovel.shovels import Shovels, StaticShovelRefused
from persistence.definitions import FileDefinitionStore
from queues.timers import Timers

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25
# RabbitMQ's handshake_timeout: a client must finish the handshake in 10 s.
HANDSHAKE_TIMEOUT_S = 10.0
EXIT_CLUSTER_JOIN_FAILED = 1
EXIT_DEFINITIONS_REFUSED = 1
# Pause deliveries to a client whose socket buffer holds more than this, and stop reading it
# (what it sends makes the broker answer); both resume below a quarter of it.
WRITE_HIGH_WATER = 4 * 1024 * 1024
# Bytes one connection may feed the broker per event-loop iteration before others get a turn.
READ_BUDGET_PER_ITERATION = 64 * 1024


class AMQPProtocol(asyncio.Protocol):
    def __init__(self, broker: Broker, registry: set["AMQPProtocol"], listener_limit: ConnectionLimit,
                 handover: HandoverService | None = None, moved: MovedConnection | None = None) -> None:
        """`handover`: a plain connection on a worker's shared port, which may move to the worker
        owning its queue; `moved`: a connection a sibling worker handed over (handover.py)."""
        self.broker = broker
        self.registry = registry
        self.listener_limit = listener_limit
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        # Made by connection_made, or by replay for a connection a sibling handed over, before
        # any other method runs: no method tests it for None (data_received and _flush would
        # test it with every read and write).
        self.connection: Connection = None  # type: ignore[assignment]
        self._flush_scheduled = False
        self._wrote_early = False  # an early write went out in this turn (_write_early)
        now = time.monotonic()
        self.started_at = now
        self.last_read = now
        self.last_write = now
        self.closing_since: float | None = None
        # Send timeout: bytes handed to the transport, and when the client last took some.
        self._written = 0
        self._sent_seen = 0
        self.last_sent = now
        self._read_budget = READ_BUDGET_PER_ITERATION
        self._yielding = False
        self._input_waiting = False  # the connection holds frames for a later turn
        self._resume_scheduled = False  # _resume_input is due in the next turn
        self._reading_paused = False
        self.handover = handover
        self.moved = moved
        self._moving = False  # being handed over: no reads, writes or ticks
        self._handing_over: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP (or TLS) connection's transport is a Transport; asyncio's signature is every kind's.
        stream = cast(asyncio.Transport, transport)
        self.transport = stream
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if self.moved is None:  # else a connection handed over, replayed already (replay)
            # On an AMQPS listener asyncio calls connection_made after the TLS handshake.
            tls = session_of(transport.get_extra_info("ssl_object"))
            self._make_connection(transport.get_extra_info("peername") or ("", 0),
                                  transport.get_extra_info("sockname"), tls, self.handover if tls is None else None)
            if self.connection.admission.dropped:
                # Over a connection limit, with too many refusals already waiting (connection_limits.py).
                stream.abort()
                return
        self.registry.add(self)
        log.debug("accepting AMQP connection %s", self.connection.peer)
        if self.moved is not None:  # live from the hand-over frame on
            rest, self.moved = self.moved.rest, None
            self.data_received(rest)

    def _make_connection(self, peer: tuple[Any, ...], local: Any, tls: Any, handover: HandoverService | None) -> None:
        """The connection of this socket; with `handover`, one that may move to a sibling worker."""
        admission = Admission((self.broker.connection_limit, self.listener_limit), f"{peer[0]}:{peer[1]}")
        self.connection = Connection(self.broker, peer[0], peer[1], on_output=self._schedule_flush,
                                     admission=admission, tls=tls,
                                     local_address=f"{local[0]}:{local[1]}" if isinstance(local, tuple) else "",
                                     on_reading_paused=self._update_reading, on_early_write=self._write_early,
                                     handover=HandoverRecorder(handover.peers, self._start_moving) if handover is not None else None)

    # -- handing the connection to the worker owning its queue (handover.py) --

    def _start_moving(self) -> None:
        """The connection stopped before a frame naming a sibling worker's queue."""
        self._moving = True
        self._update_reading()
        self._handing_over = self.loop.create_task(self._hand_over())  # referenced while it runs

    async def _hand_over(self) -> None:
        connection, transport, service = self.connection, self.transport, self.handover
        recorder = connection.handover
        # Only a connection made with the hand-over service moves, and it made this recorder.
        assert isinstance(recorder, HandoverRecorder) and service is not None
        taken = False
        if transport is not None and not transport.is_closing() and recorder.replay:
            data = connection.take_output()
            if data:
                self._send(transport, data)
                connection.output_flushed()
            # Everything the client is owed so far is in the kernel: the owner's writes follow it.
            if not transport.get_write_buffer_size():
                moved = MovedConnection(recorder.replay, recorder.rest, tuple(sorted(connection.channels)),
                                        recorder.queue, service.plan.node_name)
                try:
                    taken = await service.send(recorder.owner, transport.get_extra_info("socket").fileno(), moved)
                except Exception:  # a bug here must leave the connection where it is, working
                    log.exception("handing connection %s over to %s failed", connection.peer, recorder.owner)
        if self.transport is None:  # gone meanwhile
            return
        if taken:
            log.info("connection %s handed over to %s, which owns queue '%s'", connection.describe(),
                     recorder.owner, recorder.queue)
            self.forget()
            return
        self._moving = False
        if self._feed(connection.stay_after_handover):
            if connection.input_waiting:
                self._continue_next_turn()
            self._update_reading()
            self._flush()

    def replay(self, sock: socket.socket) -> bool:
        """A sibling offers this socket (`moved`): replay what the client said there, dropping the
        replies it already had, without reading or writing the socket; True if the connection is
        where it was there (then `go_live`)."""
        self._make_connection(sock.getpeername(), sock.getsockname(), None, None)
        connection, moved = self.connection, self.moved
        assert moved is not None, "replay is for a connection a sibling handed over"
        if connection.admission.dropped:
            return False
        try:
            connection.receive_data(moved.replay)
        except Exception:
            log.exception("replaying connection %s handed over by %s failed", connection.peer, moved.origin)
            return False
        finally:
            self.broker.connection_replayed(connection)  # counted as opened where it was accepted
        connection.take_output()
        return (connection.state is OPEN and not connection.close_when_flushed
                and tuple(sorted(connection.channels)) == moved.channels)

    async def go_live(self, sock: socket.socket) -> None:
        """The sibling forgot the connection: this worker serves the socket from the rest on."""
        try:
            await self.loop.connect_accepted_socket(lambda: self, sock)
        except OSError as error:  # nobody has the client any more: it reconnects
            log.error("connection %s handed over, then lost: %s", self.connection.describe(), error)
            self.forget()
            sock.close()

    def forget(self) -> None:
        """The socket is another worker's now: drop the connection without a word to the client.
        Closing this process's descriptor sends nothing, since the other worker's keeps it open."""
        self.connection.handed_over()
        if self.transport is not None:
            self.transport.close()  # connection_lost gives back its place under the limits
        else:  # replayed here, never served
            self.connection.admission.release()

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        if not self._feed(self.connection.receive_data, data):
            return
        if self.connection.input_waiting:
            self._continue_next_turn()
        # Fairness: the event loop may hand us megabytes from one fast publisher in a single
        # iteration, starving every other socket (consumers' acks wait behind it). Take a
        # bounded slice per iteration, then let the others run.
        self._read_budget -= len(data)
        if self._read_budget <= 0 and not self._yielding:
            self._yielding = True
            self._update_reading()
            self.loop.call_soon(self._end_yield)

    def _feed(self, handle: Callable[..., None], *args: Any) -> bool:
        """Run one input step of the connection; False if a bug in it closed the connection."""
        try:
            handle(*args)
        except Exception:
            # A bug must cost this one connection, never the broker or the other clients.
            log.exception("internal error on connection %s; closing it", self.connection.peer)
            self.connection.close_by_broker(INTERNAL_ERROR, "internal error, see the broker log")
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return False
        return True

    def _continue_next_turn(self) -> None:
        """Frames are left for a later turn (the connection's METHODS_PER_TURN ran out, or flow
        control or an alarm holds it): read nothing more until they are handled, and let the
        other connections run first. While the connection is held, its frames wait for the
        hold to end (_update_reading schedules them then), not for every turn."""
        if not self._input_waiting:
            self._input_waiting = True
            self._update_reading()
        if not self._resume_scheduled and not self.connection.input_held:
            self._resume_scheduled = True
            self.loop.call_soon(self._resume_input)

    def _resume_input(self) -> None:
        self._resume_scheduled = False
        if self.connection.input_stopped:
            return  # held or blocked again meanwhile: _update_reading schedules this when it ends
        if not self._feed(self.connection.resume_input):
            return
        if self.connection.input_waiting:
            self._continue_next_turn()
            return
        self._input_waiting = False
        self._update_reading()

    def _end_yield(self) -> None:
        self._yielding = False
        self._read_budget = READ_BUDGET_PER_ITERATION
        self._update_reading()

    def _update_reading(self, _paused: bool | None = None) -> None:
        """Read from the socket unless yielding to others or paused by flow control; frames
        a hold left waiting are handled from the next turn on once it ends."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._input_waiting and not self._resume_scheduled and not self.connection.input_stopped:
            self._resume_scheduled = True
            self.loop.call_soon(self._resume_input)
        pause = self._yielding or self._input_waiting or self._moving or self.connection.reading_paused
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _write_early(self) -> None:
        """EARLY_WRITE_DELIVERIES deliveries wait (connection.py): write them now, once per turn,
        so the client starts on them while the broker makes the rest. What follows waits for
        `_flush` at the end of the turn, as every write did before."""
        transport = self.transport
        if self._wrote_early or transport is None or transport.is_closing() or self._moving:
            return
        self._wrote_early = True
        data = self.connection.take_early_output()
        if data:
            self._send(transport, data)

    def _send(self, transport: asyncio.Transport, data: bytes, now: float | None = None) -> None:
        """Hand `data` to the transport, counted for the send timeout and stamped for the
        heartbeat (a heartbeat is due only after `heartbeat / 2` of silence)."""
        transport.write(data)
        self._written += len(data)
        self.last_write = time.monotonic() if now is None else now

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._wrote_early = False
        transport = self.transport
        if transport is None or transport.is_closing() or self._moving:
            return
        data = self.connection.take_output()
        if data:
            self._send(transport, data)
            self.connection.output_flushed()
        if self.connection.close_when_flushed:
            transport.close()

    def pause_writing(self) -> None:
        self.connection.pause_output()

    def resume_writing(self) -> None:
        self.connection.resume_deliveries()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.admission.release()
        self.registry.discard(self)
        self.connection.transport_closed()
        self.transport = None

    def tick(self, now: float) -> None:
        """Heartbeats, handshake timeout and close-ok timeout for this connection."""
        connection = self.connection
        transport = self.transport
        if transport is None or transport.is_closing() or self._moving:
            return
        if self._send_timed_out(now, transport):
            return
        state = connection.state
        if state is CLOSING:
            if self.closing_since is None:
                self.closing_since = now
            elif now - self.closing_since > connection.close_ok_timeout_s:
                transport.close()
            return
        if state is CLOSED:
            transport.close()
            return
        if state is not OPEN:
            if now - self.started_at > HANDSHAKE_TIMEOUT_S:
                log.warning("closing connection %s: handshake timeout", connection.peer)
                transport.close()
            return
        heartbeat = connection.heartbeat
        if not heartbeat:
            return
        if connection.reading_paused:
            # We are not reading, so silence proves nothing; RabbitMQ pauses its heartbeat monitor too.
            self.last_read = now
        if now - self.last_read > 2 * heartbeat:
            connection.heartbeat_missed()
            self._flush()
            transport.close()
        elif now - self.last_write >= heartbeat / 2:
            self._send(transport, codec.HEARTBEAT_FRAME, now)

    def _send_timed_out(self, now: float, transport: asyncio.Transport) -> bool:
        """RabbitMQ's send_timeout: close a connection whose client took none of the bytes pending
        for it for `send_timeout_ms`, while its buffer is over the high-water mark (so it is not
        read either). It frees what it holds instead of holding it, or an alarm, forever."""
        pending = transport.get_write_buffer_size()
        sent = self._written - pending
        if sent > self._sent_seen or not self.connection.write_paused:
            self._sent_seen = sent
            self.last_sent = now
            return False
        timeout_s = self.broker.limits.send_timeout_ms / 1000
        if now - self.last_sent < timeout_s:
            return False
        self.connection.send_timed_out(timeout_s, pending)
        transport.abort()
        return True


class AMQPServer:
    """Listens (plain AMQP on `port` unless it is None, AMQPS on `tls_port` when `tls` is given),
    accepts, and runs the ticker; `stop()` closes every connection politely."""

    def __init__(self, broker: Broker, host: str, port: int | None, max_connections: int = 0,
                 tls: TlsListenerContext | None = None, tls_port: int | None = None,
                 shared_ports: bool = False, handover: HandoverPlan | None = None) -> None:
        """`max_connections` bounds each listener's connections (0: no bound) within the
        broker's own bound (connection_limits.py). With `shared_ports` (a worker of
        `--workers N`) the AMQP and AMQPS ports are bound with SO_REUSEPORT, so the kernel spreads
        their connections over every worker, and a plain listener on a port of the system's
        choosing (`node_port`) reaches this process alone: the one other nodes link to. With
        `handover` (a worker's siblings) plain connections on the shared port move to the worker
        owning their queue (handover.py)."""
        self.broker = broker
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.tls = tls
        self.tls_port = tls_port if tls is not None else None
        self.shared_ports = shared_ports
        self._node_port: int | None = None
        self.protocols: set[AMQPProtocol] = set()
        self._servers: list[asyncio.base_events.Server] = []
        self._ticker: asyncio.Task[None] | None = None
        self.handover = HandoverService(handover, self._adopt) if handover is not None and shared_ports else None
        self._shared_limit: ConnectionLimit | None = None  # the plain shared port's, for connections handed over
        self._local_limit: ConnectionLimit | None = None  # in-process links' (local_protocol)

    async def bind(self) -> None:
        """Bind the listening sockets (port 0 gets its number here) without accepting yet."""
        if self._servers:
            return
        if self.tls_port is not None and self.tls is not None:  # (tls_port is None without tls)
            # Bound first: whoever waits for the plain port then finds AMQPS ready too.
            self.tls_port = await self._listen(self.tls_port, self.tls.context, reuse_port=self.shared_ports)
        if self.port is not None:
            self.port = await self._listen(self.port, None, reuse_port=self.shared_ports, handover=self.handover)
        if self.shared_ports:
            # Listening already (accepted once `start` serves): a sibling that sees this worker
            # live in the cluster before it serves waits in the backlog instead of being refused.
            self._node_port = await self._listen(0, None, listen_now=True)
        if self.handover is not None:
            self.handover.listen()  # the same for a sibling's hand-over offer

    @property
    def node_port(self) -> int | None:
        """The AMQP port that reaches this process, for the cluster's links (bound by `bind`)."""
        return self._node_port if self.shared_ports else self.port

    async def start(self) -> None:
        """Accept connections (binding first if `bind` was not called)."""
        await self.bind()
        if self.handover is not None:
            await self.handover.start()
        for server in self._servers:
            await server.start_serving()
        if self.tls_port is not None:
            log.info("AMQPS (TLS) listener started on %s:%d", self.host, self.tls_port)
        if self.port is not None:
            log.info("AMQP listener started on %s:%d%s", self.host, self.port,
                     " (shared with the other workers)" if self.shared_ports else "")
        if self.shared_ports:
            log.info("this worker's own AMQP listener (cluster links) started on %s:%d", self.host, self._node_port)
        self._ticker = asyncio.create_task(self._tick_forever())
        self._timer_driver = asyncio.create_task(drive_timers(self.broker.timers))

    async def _listen(self, port: int, ssl_context: "ssl.SSLContext | None", reuse_port: bool = False,
                      handover: HandoverService | None = None, listen_now: bool = False) -> int:
        """Bind `port` (TLS when `ssl_context` is given; shared with the other workers when
        `reuse_port`; its connections may move with `handover`) without accepting yet; returns
        the port bound. `listen_now`: the kernel takes connections from now on (they wait in
        the backlog until `start`), where otherwise they are refused until then."""
        limit: list[ConnectionLimit] = []  # its own limit, named by the port bound (port 0 asks for any)
        loop = asyncio.get_running_loop()

        def protocol() -> AMQPProtocol:
            return AMQPProtocol(self.broker, self.protocols, limit[0], handover)

        # (asyncio refuses a handshake timeout without TLS)
        handshake_timeout = HANDSHAKE_TIMEOUT_S if ssl_context else None
        sock = bound_socket(self.host, port, reuse_port=reuse_port, listen=listen_now)
        server = await loop.create_server(protocol, sock=sock, backlog=1024, start_serving=False, ssl=ssl_context,
                                          ssl_handshake_timeout=handshake_timeout)
        bound: int = server.sockets[0].getsockname()[1]
        # Before serving starts: every accepted connection finds its limit.
        limit.append(ConnectionLimit(f"listener {self.host}:{bound}", self.max_connections))
        if handover is not None:
            self._shared_limit = limit[0]
        self._servers.append(server)
        return bound

    def local_protocol(self) -> AMQPProtocol:
        """The broker's side of an in-process connection (local_links.py): one of this server's
        connections, under no listener's limit."""
        if self._local_limit is None:
            self._local_limit = ConnectionLimit("in-process links", 0)
        return AMQPProtocol(self.broker, self.protocols, self._local_limit)

    def _adopt(self, sock: socket.socket, moved: MovedConnection) -> AMQPProtocol | None:
        """A sibling worker offers a client's socket: its connection here once the replay reached
        the same state, else None (the sibling keeps it). Reads nothing from the socket."""
        if self._shared_limit is None:
            return None
        protocol = AMQPProtocol(self.broker, self.protocols, self._shared_limit, moved=moved)
        if protocol.replay(sock):
            return protocol
        connection = protocol.connection
        log.warning("connection %s not taken from %s: its replay here ended in state %s with channels %s",
                    connection.describe(), moved.origin, connection.state.value, sorted(connection.channels))
        protocol.forget()
        return None

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            now = time.monotonic()
            for protocol in list(self.protocols):
                try:
                    protocol.tick(now)
                except Exception:  # one broken connection must not stop heartbeats for the rest
                    log.exception("heartbeat check failed for a connection")

    async def stop(self) -> None:
        if self.handover is not None:
            await self.handover.stop()
        for server in self._servers:
            server.close()
        if self._ticker is not None:
            self._ticker.cancel()
            self._timer_driver.cancel()
        for protocol in list(self.protocols):
            connection = protocol.connection
            if connection.state not in (CLOSED, CLOSING, AWAIT_HEADER):
                connection.close_by_broker(CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'")
            protocol._flush()
            if protocol.transport is not None:
                protocol.transport.close()
        for server in self._servers:
            await server.wait_closed()


async def drive_timers(timers: Timers) -> None:
    """The one task that services every delay in the broker (see queues.timers)."""
    wake = asyncio.Event()
    timers.wake_with(lambda when: wake.set())
    while True:
        deadline = timers.next_deadline()
        if deadline is None:
            await wake.wait()
        else:
            delay = deadline - time.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(wake.wait(), delay)
                except TimeoutError:
                    pass
        wake.clear()
        timers.run_due()


async def serve(config: ServerConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None,
                shared_ports: bool = False, handover: HandoverPlan | None = None) -> int:
    """Run the broker until `stop` is set (or SIGINT/SIGTERM arrives); returns the exit code.
    `shared_ports`: this process is one worker of `--workers N`, `handover` its siblings
    (AMQPServer says what changes)."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    broker = Broker(config, FileDefinitionStore(config.data_dir), message_dir=config.data_dir)
    # Registered before any definitions import, which brings shovel parameters; they start
    # once the AMQP server runs (in-process links need its connection registry).
    local_links = LocalLinks(broker)
    shovels = Shovels(broker, local_links.open, local_links.credentials)
    try:
        for entry in config.shovels:
            value = {key: item for key, item in entry.items() if key not in ("name", "vhost")}
            shovels.add_static(entry["vhost"], entry["name"], value)
    except StaticShovelRefused as error:
        log.error("%s", error)
        await broker.close()
        return EXIT_DEFINITIONS_REFUSED
    broker.parameters.register(shovels)
    # Its parameter components too (upstreams, upstream sets); its links start with the server.
    federation = Federation(broker, local_links.open, local_links.credentials)
    federation.register_components()
    # A cluster node imports the file into the cluster's definitions, once it has joined.
    boot_definitions = config.definitions_file if not config.cluster.url else None
    if boot_definitions is not None and not _imported(broker, boot_definitions):
        await broker.close()
        return EXIT_DEFINITIONS_REFUSED
    # Everything recovered at startup lives long: keep it out of the garbage collector's scans,
    # so a full collection does not pause every connection for the size of the recovered state.
    gc.freeze()
    tls = TlsListenerContext(config.tls) if config.tls.enabled else None
    server = AMQPServer(broker, config.host, config.port if config.tcp_listener else None,
                        config.limits.max_connections_per_listener, tls, config.tls.amqp_port or None,
                        shared_ports=shared_ports, handover=handover)
    # Prometheus metrics and the management API (each off when its port is 0), up before the
    # AMQP port opens, so whoever waits for that port finds them ready too.
    http_services = await start_http_services(config, broker, server, tls)
    await server.bind()
    cluster_node = None
    if config.cluster.url:
        # Imported only here: a single node needs no coordination service and loads no client.
        from cluster.node import ClusterJoinFailed, ClusterNode

        # Joined before clients are accepted: they find the cluster's definitions in place.
        try:
            cluster_node = await ClusterNode.join(config, broker, server.node_port or config.port)
        except ClusterJoinFailed as error:
            log.error("cannot join the cluster at %s: %s", config.cluster.url, error)
            await stop_http_services(http_services)
            await server.stop()
            await broker.close()
            return EXIT_CLUSTER_JOIN_FAILED
        if config.definitions_file is not None and not await _imported_into_cluster(broker, config.definitions_file):
            await stop_http_services(http_services)
            await server.stop()
            await cluster_node.leave()
            await broker.close()
            return EXIT_DEFINITIONS_REFUSED
    await server.start()
    local_links.serve_with(server.local_protocol)
    shovels.start()
    federation.start()
    # Memory and disk alarms, checked about once a second.
    monitor = asyncio.create_task(ResourceMonitor(broker).run())
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # not on the main thread
            pass
    try:
        # Always handled: SIGHUP's default action would stop a broker without TLS.
        loop.add_signal_handler(signal.SIGHUP, reload_certificates, tls)
    except (NotImplementedError, RuntimeError):
        pass
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("stopping: closing %d connections", len(server.protocols))
    monitor.cancel()
    await shovels.close()
    await federation.stop()
    await stop_http_services(http_services)
    await server.stop()
    if cluster_node is not None:
        await cluster_node.leave()
    await broker.close()
    return 0


def _imported(broker: Broker, path: Path) -> bool:
    """Import the definitions file given at startup; False (logged) if it was refused."""
    try:
        load_definitions_file(broker, path)
    except DefinitionsFileRefused as error:
        log.error("%s", error)
        return False
    return True


async def _imported_into_cluster(broker: Broker, path: Path) -> bool:
    """The same in a cluster: what the file adds is shared, committed before clients come."""
    if not _imported(broker, path):
        return False
    try:
        await broker.definitions_durable()
    except Exception as error:  # the coordination service refused or could not be reached
        log.error("definitions file %s could not be shared with the cluster: %s", path, error)
        return False
    return True


def reload_certificates(tls: TlsListenerContext | None) -> None:
    """SIGHUP: read the TLS certificate and key again; a bad file is logged and the old one kept."""
    if tls is None:
        log.warning("SIGHUP: TLS is not configured, no certificate to reload")
        return
    try:
        tls.reload()
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        log.error("TLS certificate not reloaded, the previous one stays in use: %s", error)


def event_loop_runner() -> tuple[Callable[[Coroutine[Any, Any, int]], int], str]:
    """How a broker process runs its event loop: uvloop's when it is installed, else asyncio's;
    and the loop's name for the log."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run, "asyncio"
    return uvloop.run, "uvloop"


def run_server(config: ServerConfig) -> int:
    """Run the broker in this process until SIGINT/SIGTERM; returns the exit code."""
    runner, loop_name = event_loop_runner()
    log.info("starting amqp-server (data dir %s, event loop %s)", config.data_dir, loop_name)
    code = runner(serve(config))
    log.info("stopped")
    return code
