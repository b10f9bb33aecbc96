"""Handing a client's connection to the worker of `--workers N` that owns its queue.

The kernel spreads connections on the shared port over the workers without knowing which queue
a client will use; a client on a worker that does not own its queue would have every message
forwarded over a cluster link (three times the CPU of a message on its owner: docs/cluster.md,
"Every core"). Instead, the worker it landed on passes the client's socket to the owner, once,
when the client first names a queue another worker of this host owns, and only while everything
the client did so far can be replayed there with no side effect:

- `HandoverRecorder` (one per plain connection on the shared port, owned by its `Connection`)
  keeps the bytes the client sent (at most MAX_RECORDED) while they are only the handshake,
  heartbeats, channel.open, basic.qos and confirm.select. Anything else makes the connection
  FIXED: it stays, and its recorder is dropped. The first queue.declare, basic.consume or
  basic.get naming a queue a sibling worker owns, or basic.publish whose key routes only to
  queues of one sibling (the default exchange, or a direct, topic or fanout exchange with no
  alternate exchange), with nothing awaiting a reply, stops the connection before that frame
  (MOVING): the bytes before it are the replay, the frame and everything read after it the rest.
- The shell (server.py) then passes the socket's descriptor, the replay and the rest to the
  owner over its Unix socket (`HandoverService.send`, `socket.send_fds`). The owner feeds the
  replay to a connection of its own with the replies discarded (the client had them from the
  first worker) without reading the socket yet; if that reached the same state (open, the same
  channels) it answers yes, wraps the descriptor and goes on live from the rest. On yes the
  first worker forgets the connection: closing its copy of the descriptor sends nothing to the
  client, since the owner's copy keeps the socket open. On anything else (no such worker, it refused or is stopping, the
  replay ended elsewhere) the first worker keeps the connection and handles the rest itself,
  forwarding as before.

Authentication is done again by the replay (every worker has the same users). TLS connections
never move (the session keys live in the process that did the handshake), nor cluster links,
nor a connection that already moved. Each worker listens on an abstract Unix socket named from
its data directory (reachable from the whole network namespace), and takes descriptors only from
its siblings: processes of its own user whose parent is its own (SO_PEERCRED, /proc).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pamqp import commands

from amqp_server.wire import codec
from exchanges.delayed import DelayedMessageExchange
from queues.queue import Queue
from amqp_server.wire.states import (
    HANDOVER_TRANSITIONS,
    ChannelState,
    ConnectionState,
    HandoverEvent,
    HandoverState,
    next_state,
)

if TYPE_CHECKING:
    from amqp_server.connection.connection import Connection

log = logging.getLogger(__name__)

# The client's bytes kept for a replay; a connection that sent more before naming a queue stays.
MAX_RECORDED = 64 * 1024
# The rest: the hand-over frame and what followed it, recorded (so within MAX_RECORDED), plus
# what the transport read before reading paused; an owner takes no larger message.
MAX_REST = MAX_RECORDED + (1 << 20)
MAX_HEADER = 64 * 1024
# How long an owner waits for the whole hand-over message once a sibling connected, and a
# sibling for the owner's answer (then it keeps the connection: _last_word).
RECEIVE_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 5.0
_MAGIC = b"AHO1"
_PREFIX = struct.Struct(">4sIII")  # magic, header length, replay length, rest length
_YES, _NO = b"Y", b"N"

_START_OK, _TUNE_OK, _OPEN = 0x000A000B, 0x000A001F, 0x000A0028
_CHANNEL_OPEN, _BASIC_QOS, _CONFIRM_SELECT = 0x0014000A, 0x003C000A, 0x0055000A
_QUEUE_DECLARE, _BASIC_CONSUME, _BASIC_GET, _BASIC_PUBLISH = 0x0032000A, 0x003C0014, 0x003C0046, 0x003C0028
# Replayed on the owner with the same replies and no effect beyond the connection itself.
_REPLAYABLE_ON_0 = frozenset((_START_OK, _TUNE_OK, _OPEN))
_REPLAYABLE = frozenset((_CHANNEL_OPEN, _BASIC_QOS, _CONFIRM_SELECT))
_NAMING_A_QUEUE = frozenset((_QUEUE_DECLARE, _BASIC_CONSUME, _BASIC_GET, _BASIC_PUBLISH))


def handover_address(data_dir: Path) -> str:
    """The abstract Unix socket a worker takes connections on, named from its data directory."""
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:32]
    return f"\0amqp-server-handover-{digest}"


@dataclass(frozen=True)
class HandoverPlan:
    """This worker's Unix socket and its siblings' (by node name)."""

    node_name: str
    address: str
    peers: Mapping[str, str]


class HandoverRecorder:
    """One connection's record of the client's bytes while it may still move (module docstring).
    Its `Connection` calls `received` with every read and `before_frame` with every frame, and
    drops it once it is FIXED."""

    __slots__ = ("state", "_peers", "_on_move", "_chunks", "_size", "_frame", "_after", "owner", "queue", "replay",
                 "_rest")

    def __init__(self, peers: Mapping[str, str], on_move: Callable[[], None]) -> None:
        """`peers`: the sibling workers by node name; `on_move` is called (from the connection's
        input handling) once the connection stopped before a frame naming a sibling's queue."""
        self.state = HandoverState.RECORDING
        self._peers = peers
        self._on_move = on_move
        self._chunks: list[bytes] = []
        self._size = 0
        self._frame = b""  # the hand-over frame, as the client sent it
        self._after: list[bytes] = []  # read while moving
        self._rest = b""
        self.owner = ""  # the worker the connection moves to
        self.queue = ""  # the queue that decided it
        self.replay = b""

    def _advance(self, event: HandoverEvent) -> None:
        self.state = next_state(HANDOVER_TRANSITIONS, self.state, event)

    def _fix(self) -> None:
        self._advance(HandoverEvent.UNREPLAYABLE)
        self._chunks = []

    def received(self, data: bytes) -> bool:
        """Every read, before the connection handles it; True while moving: the bytes are kept
        for the owner and not handled here."""
        if self.state is HandoverState.RECORDING:
            self._size += len(data)
            if self._size > MAX_RECORDED:
                self._fix()
            else:
                self._chunks.append(bytes(data))
            return False
        if self.state is HandoverState.MOVING:
            self._after.append(bytes(data))
            return True
        return False

    def before_frame(self, connection: "Connection", frame_type: int, channel_id: int, payload: bytes) -> bool:
        """Every frame before the connection handles it; True: stop before it, the connection moves."""
        if self.state is not HandoverState.RECORDING or frame_type == codec.FRAME_HEARTBEAT:
            return False
        if frame_type == codec.FRAME_METHOD and len(payload) >= 4:  # a shorter one is refused as usual
            index = codec.method_index(payload)
            if (index in _REPLAYABLE_ON_0) if channel_id == 0 else (index in _REPLAYABLE):
                return False
            if channel_id and index in _NAMING_A_QUEUE and _quiet(connection):
                owned = self._sibling_owner(connection, payload)
                if owned is not None:
                    self.owner, self.queue = owned
                    self._frame = struct.pack(">BHI", frame_type, channel_id, len(payload)) + payload + b"\xce"
                    self._advance(HandoverEvent.OWNER_FRAME)
                    return True
        self._fix()
        return False

    def _sibling_owner(self, connection: "Connection", payload: bytes) -> tuple[str, str] | None:
        """The sibling owning every queue the frame names or its publish reaches, and one of
        them; None when there is no single such sibling."""
        try:
            method = connection.decode_method(payload)  # in its protocol (AMQP 0-8 too)
        except Exception:  # a broken method: handled (and refused) here
            return None
        vhost = connection.vhost
        if vhost is None:
            return None
        queues: tuple[Queue | None, ...]
        if isinstance(method, (commands.Queue.Declare, commands.Basic.Consume, commands.Basic.Get)):
            queues = (vhost.queues.get(method.queue),) if method.queue else ()
        elif not isinstance(method, commands.Basic.Publish):  # (_NAMING_A_QUEUE has no other)
            return None
        elif not method.exchange:
            queues = (vhost.queues.get(method.routing_key),)
        else:
            # Routed by its key alone, with no other exchange to go through: where the message
            # goes is known from the method frame (a headers exchange needs the content header).
            exchange = vhost.exchanges.get(method.exchange)
            if (exchange is None or exchange.needs_headers or exchange.alternate_exchange is not None
                    or exchange.internal or isinstance(exchange, DelayedMessageExchange)):
                return None
            # Its destinations are queues and exchanges (bound to it): where an exchange's
            # messages go is not looked at, so one makes the connection stay here.
            queues = tuple(
                queue if isinstance(queue, Queue) else None for queue in exchange.route(method.routing_key, None)
            )
        owners = {(queue.home_node or None) if queue is not None else None for queue in queues}
        if len(owners) != 1:
            return None
        owner = owners.pop()
        first = queues[0]
        return (owner, first.name) if owner is not None and owner in self._peers and first is not None else None

    def stopped(self, unread: bytes) -> None:
        """The connection stopped before the hand-over frame; `unread` is what it had read after it."""
        self._rest = self._frame + unread
        recorded = b"".join(self._chunks)
        self._chunks = []
        self.replay = recorded[: len(recorded) - len(self._rest)]
        if not recorded.endswith(self._rest):  # not the stream recorded: keep the connection
            self.replay = b""
        self._on_move()

    @property
    def rest(self) -> bytes:
        """The hand-over frame and everything the client sent after it."""
        return self._rest + b"".join(self._after)

    def refused(self) -> bytes:
        """The connection stays; returns the rest, for it to handle here."""
        rest = self.rest
        self._advance(HandoverEvent.REFUSED)
        self._rest, self._after, self.replay = b"", [], b""
        return rest

    def taken(self) -> None:
        self._advance(HandoverEvent.TAKEN)
        self._rest, self._after, self.replay = b"", [], b""


def _quiet(connection: "Connection") -> bool:
    """Nothing of the connection is left that its replay would not rebuild: open, no reply
    awaited, no content half-received, no exclusive queue, not held back by flow control; and
    not another node's link (those reach this worker on its own port, never the shared one)."""
    if (connection.state is not ConnectionState.OPEN or connection.exclusive_queues or connection.content_in_flight
            or connection.reading_paused or connection.is_cluster_link):
        return False
    return all(channel.state is ChannelState.OPEN and not channel.replies.waiting and not channel.consumers
               for channel in connection.channels.values())


@dataclass(frozen=True)
class MovedConnection:
    """What the owner gets with a descriptor: the bytes to replay with their replies discarded,
    the rest to handle live, and what the replay must lead to."""

    replay: bytes
    rest: bytes
    channels: tuple[int, ...]
    queue: str
    origin: str


class Adopted(Protocol):
    """The owner's connection, replayed from a moved socket's bytes before anything is read from
    the socket (server.AMQPProtocol)."""

    async def go_live(self, sock: socket.socket) -> None:
        """The sibling forgot the connection: read and write `sock` from now on."""

    def forget(self) -> None:
        """The sibling keeps the connection: drop this one without touching the socket."""


# Replays the connection, or refuses it (None); it must not read from the socket.
Adopt = Callable[[socket.socket, MovedConnection], "Adopted | None"]


class HandoverService:
    """A worker's Unix socket: takes sockets from its siblings (`adopt` makes each a connection,
    or None to refuse) and sends its own connections to them (`send`)."""

    def __init__(self, plan: HandoverPlan, adopt: Adopt) -> None:
        self.plan = plan
        self._adopt = adopt
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._receiving: set[asyncio.Task[None]] = set()
        self.stopping = False

    @property
    def peers(self) -> Mapping[str, str]:
        return self.plan.peers

    def listen(self) -> None:
        """Take siblings' offers into the backlog from now on (answered once `start` runs). A
        socket that cannot be bound (an earlier process of this worker still holds it) is
        logged: siblings then keep their connections and forward."""
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.plan.address)
            listener.listen(64)
        except OSError as error:
            listener.close()
            log.warning("not taking connections from the other workers (they forward instead): %s", error)
            return
        listener.setblocking(False)
        self._listener = listener

    async def start(self) -> None:
        """Answer siblings' offers (listening first if `listen` was not called)."""
        self.listen()
        if self._listener is not None and self._accepting is None:
            self._accepting = asyncio.create_task(self._accept_forever(self._listener))

    async def stop(self) -> None:
        """Refuse every socket offered from now on, and stop listening."""
        self.stopping = True
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._receiving):
            task.cancel()
        if self._listener is not None:
            self._listener.close()

    async def _accept_forever(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            peer, _ = await loop.sock_accept(listener)
            task = asyncio.create_task(self._receive(peer))
            self._receiving.add(task)
            task.add_done_callback(self._receiving.discard)

    async def _receive(self, peer: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        client: socket.socket | None = None
        fds: list[int] = []  # received and not yet wrapped: closed whatever happens
        try:
            pid, uid, _gid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                 struct.calcsize("3i")))
            if uid != os.getuid() or not _is_sibling(pid):
                log.warning("hand-over refused: offered by process %d (user id %d), not a sibling worker", pid, uid)
                return
            data = await asyncio.wait_for(_receive_message(loop, peer, fds), RECEIVE_TIMEOUT_S)
            if len(fds) != 1:
                return
            client = socket.socket(fileno=fds.pop())
            moved = _parse(data)
            if (moved is None or self.stopping or client.type != socket.SOCK_STREAM
                    or client.family not in (socket.AF_INET, socket.AF_INET6)):
                await loop.sock_sendall(peer, _NO)
                return
            # Nothing is read from the client's socket before the sibling knows it moved: until
            # then the sibling may keep it, and every byte the client sends is the sibling's.
            adopted = self._adopt(client, moved)
            if adopted is None:
                await loop.sock_sendall(peer, _NO)
                return
            try:
                await loop.sock_sendall(peer, _YES)
            except OSError:  # the sibling cannot learn it moved: it keeps the connection
                adopted.forget()
                return
            sock, client = client, None
            await adopted.go_live(sock)
        except (OSError, asyncio.TimeoutError, ValueError, KeyError) as error:
            log.warning("hand-over from a sibling worker failed: %s", error)
        except Exception:  # a bug: the sibling keeps its connection
            log.exception("hand-over from a sibling worker failed")
        finally:
            for fd in fds:  # a message cut short, too large or late keeps no copy of the client's socket
                os.close(fd)
            peer.close()
            if client is not None:
                client.close()  # our copy only: the sibling's keeps the client's socket open

    async def send(self, owner: str, fd: int, moved: MovedConnection) -> bool:
        """Offer the socket `fd` to the worker `owner`; True once it took it (then this worker
        must forget the connection), False if it stays here."""
        address = self.plan.peers.get(owner)
        if address is None or self.stopping:
            return False
        loop = asyncio.get_running_loop()
        header = json.dumps({"channels": list(moved.channels), "queue": moved.queue, "origin": moved.origin}).encode()
        prefix = _PREFIX.pack(_MAGIC, len(header), len(moved.replay), len(moved.rest)) + header
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sibling:
            sibling.setblocking(False)
            try:
                sibling.connect(address)  # a local listening socket: at once, or refused
                sent = socket.send_fds(sibling, [prefix], [fd])
                await loop.sock_sendall(sibling, prefix[sent:] + moved.replay + moved.rest)
                try:
                    answer = await asyncio.wait_for(loop.sock_recv(sibling, 1), ANSWER_TIMEOUT_S)
                except asyncio.TimeoutError:  # a frozen or stopped sibling: keep the client here
                    answer = _last_word(sibling)
                    log.warning("no answer from %s in %gs: the connection %s", owner, ANSWER_TIMEOUT_S,
                                "moved all the same" if answer == _YES else "stays here")
            except OSError as error:
                log.warning("connection not handed over to %s: %s", owner, error)
                return False
        return answer == _YES


def _last_word(sibling: socket.socket) -> bytes:
    """The owner's answer once the sibling stops waiting for it: after the shutdown the owner's
    yes fails (EPIPE: it forgets the connection), and a yes it sent before is still read here
    (the connection moved). The kernel orders the two, so they cannot cross."""
    try:
        sibling.shutdown(socket.SHUT_RDWR)
        return sibling.recv(1)
    except OSError:
        return b""


async def _receive_message(loop: asyncio.AbstractEventLoop, peer: socket.socket, fds: list[int]) -> bytes:
    """One hand-over message: its bytes; the descriptor that came with its first bytes goes to
    `fds` as soon as it arrives (the caller closes it if the message never completes)."""
    data = b""
    while not fds and len(data) < _PREFIX.size:
        await _readable(loop, peer)
        try:
            chunk, new_fds, _flags, _address = socket.recv_fds(peer, 65536, 1)
        except BlockingIOError:
            continue
        if not chunk:
            raise ValueError("the sibling closed before its message")
        fds += new_fds
        data += chunk
    buffer = bytearray(data)
    total = 0  # known once the prefix is in
    while True:
        if not total and len(buffer) >= _PREFIX.size:
            magic, header_size, replay_size, rest_size = _PREFIX.unpack_from(buffer)
            if magic != _MAGIC:
                raise ValueError("not a hand-over message")
            if header_size > MAX_HEADER or replay_size > MAX_RECORDED or rest_size > MAX_REST:
                raise ValueError(f"a hand-over message announcing {header_size}+{replay_size}+{rest_size} bytes")
            total = _PREFIX.size + header_size + replay_size + rest_size
        if total and len(buffer) >= total:
            break
        chunk = await loop.sock_recv(peer, min((total or _PREFIX.size) - len(buffer), 1 << 20))
        if not chunk:
            raise ValueError("the sibling closed in the middle of its message")
        buffer += chunk
    return bytes(buffer)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def _is_sibling(pid: int) -> bool:
    """`pid` (the peer of a Unix socket) is this process or another child of its parent: the
    supervisor of `--workers` starts every worker itself (workers.py)."""
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            after_name = stat.read().rsplit(b")", 1)[1].split()  # state, ppid, ...
    except (OSError, IndexError):
        return False
    return int(after_name[1]) == os.getppid()


def _parse(data: bytes) -> MovedConnection | None:
    _magic, header_size, replay_size, rest_size = _PREFIX.unpack_from(data)
    start = _PREFIX.size
    header = json.loads(data[start : start + header_size])
    start += header_size
    replay = data[start : start + replay_size]
    rest = data[start + replay_size : start + replay_size + rest_size]
    if not replay or not rest:
        return None
    return MovedConnection(replay, rest, tuple(int(c) for c in header["channels"]), str(header["queue"]),
                           str(header["origin"]))
