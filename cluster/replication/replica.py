"""The asyncio shell of one queue's replica on one node: `QueueReplica`, and the node's
`ReplicationListener` that followers connect to.

One TCP stream per follower and queue carries the leader's APPEND frames one way and the
follower's ACKs the other, once both ends proved they hold the cluster secret (`wire.Handshake`;
the node's `ReplicationListener` holds it and opens and accepts every stream). Nothing is
created per record: appends made in one event-loop iteration are sent to every follower and
handed to the group committer once, at the end of it (`_flush_soon`); a follower fsyncs what one
read of its stream brought in one group-commit round and acknowledges it with one ACK.

Roles and the coordination service (`election`): a background task reads the group record and
the leader's lease, and acts on them. With a live lease of the record's term the replica
follows that leader; without a lease a member votes for the next term and the winner takes the
lease and the term; a leader whose term was superseded, or whose lease vanished, steps down.
It reads them again every ``poll_interval`` while anything is under way (an election, a
follower not yet connected to its leader), and otherwise only when woken (`wake`: the node's
watch of the records and leases saw this group's change, or this leader's in-sync set or a
transfer's target moved) or every ``idle_poll_interval`` (by default the same; the broker's
node watches the keys and lets settled replicas idle, ReplicaManager).

**Check-quorum.** A leader that cannot reach a majority of its group (a network partition that
leaves it the coordination service, so its lease would live on) steps down within
``check_quorum`` seconds: it sends every follower a heartbeat (an empty APPEND, answered by an
ACK) every ``check_quorum / 4`` seconds at most once a second, and when fewer than a majority,
itself included, were heard within ``check_quorum`` it stops leading (what waits for a confirm is
failed) and deletes its lease, so the majority side elects at once. It then abstains from
elections for twice ``check_quorum`` (it would likely win them, having the longest log, and
still reach nobody). A leader that cannot write its log (ENOSPC, EIO) steps down the same way,
so a member whose disk works leads: its confirms waiting are failed (nacks), none leaves
without its record on a majority's disks. A follower stream silent for ``check_quorum`` is closed on both sides, so
the streams start afresh (HELLO) when the network heals, and the old leader catches up as a
follower (log matching truncates what it wrote that no majority had). A tick that runs late (the
event loop was held up: a takeover replaying a long log) judges nothing: the followers' frames
may be waiting unread, so the next tick decides. Connecting to a peer
gives up after ``CONNECT_TIMEOUT_S``: a replica's steps never wait on a black hole. A follower
whose connections to the leader are refused ``REFUSALS_TO_ELECT`` times in a row (nothing
listens: the leader's process died) deletes the leader's lease, so the group elects at once
rather than when the dead leader's session expires.

The owner (the broker's queue, or a test harness) passes ``on_commit(index)``, called with the
new commit index whenever it rises (confirms up to it may leave), and ``on_role(role)``, called
when this replica becomes leader (after the term's no-op is appended, before any commit) or
stops being it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import Callable, Sequence

from cluster.coordinator import CoordinationUnavailable, Coordinator
from cluster.replication.election import GroupKeys, GroupRecord, Lease, Vote, choose_leader
from cluster.replication.follower import FollowerReplication
from cluster.replication.leader import LeaderReplication, LeaderRole, NotLeader
from cluster.replication.log import ReplicaStore
from cluster.replication.wire import (
    Ack, Append, AuthenticationFailed, FrameReader, Handshake, Hello, Mismatch, ProtocolError, Refuse, Reset, State,
    encode_state,
)
from persistence.group_commit import GroupCommitter

log = logging.getLogger(__name__)

# A peer has this long to prove the cluster secret once its stream opened (one round trip is needed).
HANDSHAKE_TIMEOUT_S = 5.0
# A follower whose stream to the leader closed in the handshake connects again after this long.
HANDSHAKE_RETRY_S = 1.0
# A stream to a peer that does not connect within this long is given up (a partition drops
# packets silently: without it the replica's step would wait for the kernel's SYN retries).
CONNECT_TIMEOUT_S = 2.0
# A follower whose connections to its leader's replication port were refused this many times in
# a row (its steps run every 100 ms while it has no stream) deletes the leader's lease: a killed
# leader is replaced at once rather than when its session expires.
REFUSALS_TO_ELECT = 3
# A leader that heard from fewer than a majority of its group for this long steps down (the
# broker passes its session TTL: the time the coordination service takes to notice a dead node).
CHECK_QUORUM_S = 5.0


class Role(enum.Enum):
    FOLLOWER = "follower"
    LEADER = "leader"
    STOPPED = "stopped"


class _Stream(asyncio.Protocol):
    """One replication TCP stream. First the mutual proof of the cluster secret (`Handshake`),
    within ``handshake_timeout`` seconds, or the stream is closed; until it is done nothing is
    read as a frame and nothing but the handshake is sent. Then ``on_open(stream)`` hears it,
    and frames go to ``on_frame(stream, frame)``."""

    def __init__(self, handshake: Handshake, handshake_timeout: float,
                 on_frame: Callable[["_Stream", object], None], on_lost: Callable[["_Stream"], None],
                 peer: str = "", on_open: Callable[["_Stream"], None] | None = None) -> None:
        self._handshake = handshake
        self._handshake_timeout = handshake_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._reader = FrameReader()
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._on_open = on_open
        self.transport: asyncio.Transport | None = None
        self.paused = False
        self.peer = peer  # the node at the other end (on the leader's side: once HELLO named it)
        self.address = ""  # host:port at the other end
        self.on_resume: Callable[["_Stream"], None] | None = None

    @property
    def is_open(self) -> bool:
        """Both sides proved the cluster secret: frames may flow."""
        return self._handshake.is_open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # No isinstance check: uvloop's TCP transports (the broker's loop) are not asyncio.Transport.
        self.transport = transport  # type: ignore[assignment]
        peername = transport.get_extra_info("peername")
        self.address = f"{peername[0]}:{peername[1]}" if peername else "an unknown address"
        self._timer = asyncio.get_running_loop().call_later(self._handshake_timeout, self._handshake_expired)
        opening = self._handshake.opening()
        if opening:
            transport.write(opening)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            if not self._handshake.is_open:
                # The whole of `data`: a peer sends nothing after its handshake message before
                # the other side's answer, so more is a failed handshake (Handshake.feed).
                reply = self._handshake.feed(data)
                if reply and self.transport is not None:
                    self.transport.write(reply)
                if self._handshake.is_open:
                    self._cancel_timer()
                    if self._on_open is not None:
                        self._on_open(self)
                return
            for frame in self._reader.feed(data):
                self._on_frame(self, frame)
        except AuthenticationFailed as error:
            log.warning("replication stream with %s refused: %s", self._describe(), error)
            self.close()
        except ProtocolError as error:
            log.warning("replication stream with %s closed: %s", self._describe(), error)
            self.close()

    def _handshake_expired(self) -> None:
        self._timer = None
        if not self._handshake.is_open and self.transport is not None:
            log.warning("replication stream with %s refused: no handshake within %.1f s", self._describe(),
                        self._handshake_timeout)
            self.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _describe(self) -> str:
        return f"{self.peer} at {self.address}" if self.peer else self.address

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.transport = None
        self._on_lost(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.on_resume is not None:
            self.on_resume(self)

    def attach(self, peer: str, on_frame: Callable[["_Stream", object], None],
               on_lost: Callable[["_Stream"], None], on_resume: Callable[["_Stream"], None]) -> None:
        """Hand the stream's later frames, its loss and its drained buffer to a replica."""
        self.peer = peer
        self._on_frame, self._on_lost, self.on_resume = on_frame, on_lost, on_resume

    def write(self, data: bytes) -> None:
        """Send frames; dropped before the handshake is done (never to an unproven peer)."""
        if self.transport is not None and self._handshake.is_open:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ReplicationListener:
    """This node's replication endpoint, holding the cluster secret: the port followers connect
    to (a stream's first frame, once the handshake is done, is HELLO naming its queue) and the
    streams this node's followers open to other nodes' ports (`connect`). Every stream, either
    way, starts with the mutual proof of the secret (`Handshake`); one that fails it, or does
    not finish it within ``handshake_timeout`` seconds, is closed before any frame."""

    def __init__(self, secret: bytes, handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        if not secret:
            raise ValueError("the replication port needs the cluster secret")
        self._secret = secret
        self._handshake_timeout = handshake_timeout
        self._replicas: dict[str, "QueueReplica"] = {}
        self._server: asyncio.base_events.Server | None = None
        self.address = ""

    def register(self, replica: "QueueReplica") -> None:
        self._replicas[replica.queue] = replica

    def unregister(self, replica: "QueueReplica") -> None:
        self._replicas.pop(replica.queue, None)

    async def start(self, host: str, port: int) -> str:
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Stream(Handshake.listening(self._secret), self._handshake_timeout, self._first_frame,
                            lambda stream: None), host, port)
        sock_host, sock_port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{sock_host}:{sock_port}"
        return self.address

    async def connect(self, host: str, port: int, peer: str, on_frame: Callable[[_Stream, object], None],
                      on_lost: Callable[[_Stream], None], on_open: Callable[[_Stream], None]) -> _Stream:
        """A stream to node ``peer``'s replication port; ``on_open`` hears when both sides proved
        the secret (only then may the stream carry a frame). Raises OSError."""
        # (TimeoutError is an OSError.)
        _, stream = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
            lambda: _Stream(Handshake.connecting(self._secret), self._handshake_timeout, on_frame, on_lost, peer,
                            on_open), host, port), CONNECT_TIMEOUT_S)
        return stream

    def _first_frame(self, stream: _Stream, frame: object) -> None:
        if not isinstance(frame, Hello):
            stream.close()
            return
        replica = self._replicas.get(frame.queue)
        if replica is None or not replica.accept_follower(stream, frame):
            stream.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class QueueReplica:
    """One node's replica of one queue; see the module docstring."""

    def __init__(
        self,
        *,
        queue: str,
        node: str,
        members: Sequence[str],
        log: ReplicaStore,
        coordinator: Coordinator,
        listener: ReplicationListener,
        committer: GroupCommitter,
        on_commit: Callable[[int], None],
        on_role: Callable[[Role], None],
        poll_interval: float = 0.1,
        idle_poll_interval: float | None = None,
        election_timeout: float = 3.0,
        create_group: bool = True,
        check_quorum: float = CHECK_QUORUM_S,
    ) -> None:
        """``create_group``: create the group in the coordination service if it is not there
        (the node that declares the queue); a replica started because a group names this node
        never does, so a deleted group is not brought back. ``check_quorum``: see the module
        docstring."""
        self.queue = queue
        self.node = node
        self.members = tuple(members)
        self.log = log
        self._keys = GroupKeys(coordinator, queue)
        self._listener = listener
        self._committer = committer
        self._on_commit = on_commit
        self._on_role = on_role
        self._poll = poll_interval
        self._idle_poll = poll_interval if idle_poll_interval is None else idle_poll_interval
        self._woken = asyncio.Event()
        self._election_timeout = election_timeout
        self._create_group = create_group
        self._check_quorum = check_quorum
        self._heartbeat_every = min(1.0, check_quorum / 4)
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._heartbeat_due = 0.0  # monotonic: when the scheduled heartbeat tick should run
        self._abstain_until = 0.0  # monotonic: no vote before (after stepping down for want of a quorum)
        self._upstream_heard_at = 0.0  # follower: when the leader's stream last brought a frame
        self._connecting: asyncio.Task[None] | None = None  # follower: a stream to the leader being opened
        self._refused = (0, "", 0)  # follower: (term, leader, connections it refused in a row)
        self.role = Role.FOLLOWER
        self.leader: LeaderReplication | None = None
        self._follower = FollowerReplication(node, queue, log)
        self._followers: dict[str, _Stream] = {}  # leader side: follower name -> stream
        self._upstream: _Stream | None = None  # follower side: the stream to the leader
        self._upstream_term = 0
        self._follow_after = 0.0  # follower: no new stream to the leader before this (monotonic)
        self._sync_requested = False  # follower: a group-commit round will ACK what arrived
        self._caught_up = False  # see _may_vote
        self._flush_scheduled = False
        self._task: asyncio.Task[None] | None = None
        self.record: GroupRecord | None = None
        self.incarnation: str | None = None  # of the group this replica belongs to, once read
        # Leader side: the log's state generation each follower was last sent (STATE frames).
        self._state_sent: dict[str, int] = {}
        # Members whose node's disk alarm is on, this one included, while this node's is on
        # (`avoid_low_disk`); empty otherwise.
        self._low_disk: frozenset[str] = frozenset()
        # A stream's broker appends to its log directly: it says so here, as publish() would.
        log.on_news(self._flush_soon)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._listener.register(self)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop replicating; a leader releases its lease so a follower takes over at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._connecting is not None:
            self._connecting.cancel()
        was_leader = self.role is Role.LEADER
        self._become(Role.STOPPED)
        self._listener.unregister(self)
        await self._committer.idle()
        if was_leader:
            with contextlib.suppress(CoordinationUnavailable):
                await self._keys.release_lease()

    async def delete_group(self) -> None:
        """The queue is gone: remove its group from the coordination service."""
        await self._keys.delete()

    def wake(self) -> None:
        """Read the group record and the lease again now (they, or what this replica compares
        with them, changed)."""
        self._woken.set()

    def avoid_low_disk(self, low_disk: frozenset[str]) -> None:
        """``low_disk``: the members whose node's disk alarm is on, this one's included (empty:
        it is off here). A leader among them hands its leadership to an in-sync member with room,
        at its next step (`_lead`), so the queue stays writable."""
        changed = low_disk != self._low_disk
        self._low_disk = low_disk
        if changed and self.role is Role.LEADER:
            self.wake()

    # ---- facts (metrics) --------------------------------------------------------------------------

    @property
    def term(self) -> int:
        """The group's term as this replica knows it."""
        return max(self.record.term if self.record is not None else 0, self.log.promised_term)

    @property
    def commit_index(self) -> int:
        """The commit index: the leader's own, or the one a follower last heard of (never beyond
        what it has fsynced itself)."""
        if self.leader is not None:
            return self.leader.commit_index
        return min(self._follower.leader_commit_index, self.log.durable_index)

    # ---- the leader's data path ----------------------------------------------------------------

    def publish(self, payload: bytes) -> int:
        """Append ``payload`` as leader; its index is confirmed once ``on_commit`` reaches it."""
        if self.role is not Role.LEADER or self.leader is None:
            raise NotLeader(f"{self.node} is not the leader of {self.queue}")
        index = self.leader.append(payload)
        self._flush_soon()
        return index

    def _flush_soon(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """End of the loop iteration: one group-commit request and one pump per follower."""
        self._flush_scheduled = False
        if self.role is not Role.LEADER:
            return
        self._committer.request_sync(self.log, self._leader_synced)
        for stream in list(self._followers.values()):  # (a disk failure steps down: the streams go)
            self._pump(stream)

    def _leader_synced(self, error: OSError | None) -> None:
        if error is not None:
            self._disk_failed(error)
            return
        if self.leader is None:
            return
        if self.leader.local_synced():
            self._commit_moved(self.leader.commit_index)

    def _commit_moved(self, index: int) -> None:
        """The commit index rose to ``index``: the log (a stream makes its records readable) and
        then the owner (confirms) hear it."""
        self.log.committed(index)
        self._on_commit(index)

    def _pump(self, stream: _Stream) -> None:
        leader = self.leader
        if leader is None:
            return
        generation = self.log.state_generation
        if generation != self._state_sent.get(stream.peer, 0):
            # State beside the log (a stream's tracked offsets), whole, before the entries.
            stream.write(encode_state(leader.term, self.log.state_document()))
            self._state_sent[stream.peer] = generation
        while not stream.paused:
            try:
                frame = leader.outgoing(stream.peer)  # (reading the log writes its buffer out first)
            except OSError as error:
                self._disk_failed(error)
                return
            if frame is None:
                return
            stream.write(frame)

    def _disk_failed(self, error: OSError) -> None:
        """The log could not be written or fsynced: a leader steps down (module docstring)."""
        if self.role is not Role.LEADER or self.leader is None:
            log.warning("%s: the replica log of %s cannot be written: %s", self.node, self.queue, error)
            return
        log.error("%s: leader of %s at term %d cannot write its replica log (%s); stepping down so that a member "
                  "whose disk works leads", self.node, self.queue, self.leader.term, error)
        self._abstain_until = time.monotonic() + 2 * self._check_quorum
        self._become(Role.FOLLOWER)
        self.wake()  # the lease goes at the next step

    def accept_follower(self, stream: _Stream, hello: Hello) -> bool:
        leader = self.leader
        if self.role is not Role.LEADER or leader is None or not leader.follower_connected(hello):
            self._check_stepped_down()
            return False
        old = self._followers.pop(hello.node, None)
        if old is not None and old is not stream:
            old.close()
        log.info("%s: follower %s of %s connected at its index %d (term %d)", self.node, hello.node, self.queue,
                 hello.last_index, hello.term)
        stream.attach(hello.node, self._leader_frame, self._follower_lost, self._pump)
        self._followers[hello.node] = stream
        leader.heard_from(hello.node, time.monotonic())
        self._state_sent.pop(hello.node, None)  # a new stream gets the whole state first
        self._pump(stream)
        return True

    def _leader_frame(self, stream: _Stream, frame: object) -> None:
        leader = self.leader
        if leader is None or self._followers.get(stream.peer) is not stream:
            stream.close()
            return
        leader.heard_from(stream.peer, time.monotonic())
        if isinstance(frame, Ack):
            if leader.on_ack(stream.peer, frame):
                self._commit_moved(leader.commit_index)
            if self._record_lags(stream.peer):
                self.wake()
        elif isinstance(frame, Mismatch):
            leader.on_mismatch(stream.peer, frame)
        elif isinstance(frame, Refuse):
            leader.on_refuse(stream.peer, frame)
        else:
            stream.close()
            return
        if not self._check_stepped_down():
            self._pump(stream)

    def _follower_lost(self, stream: _Stream) -> None:
        if self._followers.get(stream.peer) is stream:
            del self._followers[stream.peer]
            if self.leader is not None:
                self.leader.follower_lost(stream.peer)
                self.wake()  # it leaves the record's in-sync set

    def _record_lags(self, peer: str) -> bool:
        """Does the group record need this leader's attention after `peer`'s ACK: its in-sync
        set says otherwise of `peer`, or `peer` is the target of a leadership transfer?"""
        record, leader = self.record, self.leader
        if record is None or leader is None:
            return False
        return record.transfer_to == peer or (peer in record.in_sync) != (peer in leader.in_sync_members())

    def _heartbeat(self) -> None:
        """Every `_heartbeat_every` while leading: an empty APPEND to each follower, streams
        silent for `check_quorum` closed, and the check-quorum (module docstring)."""
        self._heartbeat_timer = None
        leader = self.leader
        if self.role is not Role.LEADER or leader is None:
            return
        now = time.monotonic()
        if now - self._heartbeat_due > self._heartbeat_every:
            # This tick ran late: the event loop was held up (a long step, such as a takeover
            # replaying a long log). The followers' frames may wait unread in the sockets, so
            # silence proves nothing yet: judge at the next tick, once they are read.
            self._schedule_heartbeat()
            return
        for peer, stream in list(self._followers.items()):
            silent = now - leader.heard_at(peer)
            if silent > self._check_quorum:
                # A partition leaves a stream open and silent: closed, the follower's next
                # stream starts afresh (HELLO) once the network heals.
                log.warning("%s: follower %s of %s silent for %.1f s; closing its stream", self.node, peer,
                            self.queue, silent)
                stream.close()
            elif not stream.paused:
                frame = leader.heartbeat(peer)
                if frame is not None:
                    stream.write(frame)
        if not leader.has_quorum(now, self._check_quorum):
            log.warning("%s: leader of %s at term %d heard from fewer than %d of its %d members within %.1f s; "
                        "stepping down and giving up its lease", self.node, self.queue, leader.term, leader.majority,
                        len(self.members), self._check_quorum)
            self._abstain_until = now + 2 * self._check_quorum
            self._become(Role.FOLLOWER)  # no confirm leaves from here on; the lease goes at the next step
            self.wake()
            return
        self._schedule_heartbeat()

    def _schedule_heartbeat(self) -> None:
        self._heartbeat_due = time.monotonic() + self._heartbeat_every
        self._heartbeat_timer = asyncio.get_running_loop().call_later(self._heartbeat_every, self._heartbeat)

    def _check_stepped_down(self) -> bool:
        if self.leader is not None and self.leader.role is LeaderRole.STEPPED_DOWN:
            log.warning("%s: leader of %s at term %d steps down (term %d exists)",
                        self.node, self.queue, self.leader.term, self.leader.newer_term)
            self._become(Role.FOLLOWER)
            return True
        return False

    # ---- the follower's data path --------------------------------------------------------------

    def _upstream_frame(self, stream: _Stream, frame: object) -> None:
        if stream is not self._upstream:
            stream.close()
            return
        self._upstream_heard_at = time.monotonic()
        if isinstance(frame, State):
            if frame.term >= self.log.promised_term:
                self.log.apply_state(frame.document)
            return
        if isinstance(frame, Append):
            reply = self._follower.on_append(frame)
        elif isinstance(frame, Reset):
            reply = self._follower.on_reset(frame)
        else:
            stream.close()
            return
        if reply is not None:
            log.debug("%s: answering %r to %r", self.node, reply, type(frame).__name__)
            stream.write(reply)
        elif isinstance(frame, Append) and not frame.entries:
            # Nothing new to make durable (a probe, the leader's heartbeat, or a stream's news of
            # the commit index): what it checked is acknowledged at once, within what is fsynced
            # already; a heartbeat is answered even when that repeats the last ACK (check-quorum).
            ack = self._follower.ack() or self._follower.answer_heartbeat()
            if ack is not None:
                stream.write(ack)
        elif not self._sync_requested:
            self._sync_requested = True
            self._committer.request_sync(self.log, self._follower_synced)
        self.log.committed(self._follower.committed_index)

    def _follower_synced(self, error: OSError | None) -> None:
        """One group-commit round ended: one ACK for everything it made durable."""
        self._sync_requested = False
        if error is not None or self._upstream is None:
            return
        frame = self._follower.ack()
        if frame is not None:
            self._upstream.write(frame)
        self.log.committed(self._follower.committed_index)
        if self.log.durable_index < self.log.last_index:  # arrived while the round ran
            self._sync_requested = True
            self._committer.request_sync(self.log, self._follower_synced)

    def _upstream_lost(self, stream: _Stream) -> None:
        if stream is self._upstream:
            self._upstream = None
            if not stream.is_open:
                # Closed in the handshake: most likely the leader holds another cluster secret.
                # Not again at once, or a misconfigured node would fill the leader's log.
                log.warning("%s: the stream to %s, leader of %s, closed in the handshake (another cluster "
                            "secret?); trying again in %.0f s", self.node, stream.peer, self.queue,
                            HANDSHAKE_RETRY_S)
                self._follow_after = time.monotonic() + HANDSHAKE_RETRY_S
            self.wake()  # connect again (or, the leader gone, wait for its lease to go)

    def _upstream_silent(self) -> bool:
        """The stream to the leader brought nothing (not even a heartbeat) for `check_quorum`."""
        return (self._upstream is not None and self._upstream.is_open
                and time.monotonic() - self._upstream_heard_at > self._check_quorum)

    async def _follow(self, record: GroupRecord) -> None:
        if self._upstream is not None and self._upstream_term == record.term and not self._upstream_silent():
            return
        if self._connecting is not None:
            return  # under way: the steps go on meanwhile (an election must not wait on a black hole)
        if time.monotonic() < self._follow_after:
            return  # the last stream failed its handshake: the pause is not over
        self._drop_upstream()
        self._connecting = asyncio.get_running_loop().create_task(self._connect_upstream(record))

    async def _connect_upstream(self, record: GroupRecord) -> None:
        """Open the stream to `record`'s leader (in the background of the replica's steps)."""
        try:
            host, _, port = record.leader_address.rpartition(":")
            try:
                stream = await self._listener.connect(host, int(port), record.leader, self._upstream_frame,
                                                      self._upstream_lost, self._upstream_open)
            except ConnectionRefusedError:
                # Nothing listens at the leader's replication address: its process is gone (or
                # restarted on another port). Counted: see _leader_gone.
                term, leader, count = self._refused
                self._refused = (record.term, record.leader, count + 1 if (term, leader) == (
                    record.term, record.leader) else 1)
                return
            except OSError:
                return  # cut off, or not answering: the next step tries again
            self._refused = (0, "", 0)
            current = self.record
            if (self.role is not Role.FOLLOWER or current is None or current.term != record.term
                    or current.leader != record.leader or self._upstream is not None):
                stream.close()  # things moved on while it connected
                return
            self._upstream, self._upstream_term = stream, record.term
            self._upstream_heard_at = time.monotonic()
            if stream.is_open:  # the handshake finished before this task resumed
                self._upstream_open(stream)
        finally:
            self._connecting = None

    def _leader_gone(self, record: GroupRecord) -> bool:
        """The connection to `record`'s leader was refused REFUSALS_TO_ELECT times in a row (a
        paused or cut-off leader is never refused: its kernel still accepts, or nothing answers)."""
        term, leader, count = self._refused
        return (term, leader) == (record.term, record.leader) and count >= REFUSALS_TO_ELECT

    def _upstream_open(self, stream: _Stream) -> None:
        """Both sides proved the cluster secret: the stream's first frame is HELLO."""
        if stream is self._upstream:
            stream.write(self._follower.hello())

    def _drop_upstream(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None

    # ---- roles and elections -----------------------------------------------------------------

    def _become(self, role: Role) -> None:
        if role is self.role:
            return
        previous, self.role = self.role, role
        if previous is Role.LEADER:
            if self._heartbeat_timer is not None:
                self._heartbeat_timer.cancel()
                self._heartbeat_timer = None
            for stream in list(self._followers.values()):
                stream.close()
            self._followers.clear()
            self.leader = None
        if role is not Role.FOLLOWER:
            self._drop_upstream()
            if self._connecting is not None:
                self._connecting.cancel()
                self._connecting = None
        self._on_role(role)

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
            except CoordinationUnavailable as error:
                log.warning("%s: replication of %s cannot reach the coordination service: %s",
                            self.node, self.queue, error)
            except OSError as error:  # its disk (full, failing): the step is tried again, no traceback
                log.warning("%s: replication of %s cannot write to its disk: %s", self.node, self.queue, error)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: replication of %s failed a step; retrying", self.node, self.queue)
            await self._nap()

    async def _nap(self) -> None:
        """Until the next read: `poll_interval` while anything is under way, else until woken
        or `idle_poll_interval`."""
        delay = self._idle_poll if self._settled() else self._poll
        # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that comes as the
        # event is set, and stop() would wait for ever.
        timer = asyncio.get_running_loop().call_later(delay, self._woken.set)
        try:
            await self._woken.wait()
        finally:
            timer.cancel()
        self._woken.clear()

    def _settled(self) -> bool:
        """Nothing under way: this replica leads, or follows its record's leader over a live
        stream. What changes that comes as a wake (the keys' watch, or this replica's streams)."""
        if self.role is Role.LEADER:
            return True
        record = self.record
        return (self.role is Role.FOLLOWER and record is not None and self._upstream is not None
                and self._upstream_term == record.term and record.leader != self.node
                and not self._upstream_silent())

    async def _tick(self) -> None:
        record, version = await self._keys.read()
        if record is None:
            if self._create_group:
                created = GroupRecord(self.queue, 0, self.node, "", self.members, (), incarnation=os.urandom(8).hex())
                version = await self._keys.create(created)
                if version is not None:
                    # A new group has no entries to lose: its creator takes term 1 at once
                    # (the lease still makes it the only one that can).
                    self.log.promise(1)
                    await self._claim(created, version, 1)
            return
        if self.incarnation is None:
            self.incarnation = record.incarnation
        elif record.incarnation != self.incarnation:
            return  # the group was deleted and made again: the manager replaces this replica
        self.record = record
        if self.role is not Role.LEADER and set(record.members) != set(self.members):
            self.members = tuple(record.members)
        lease, lease_version = await self._keys.lease_and_version()
        if self.role is Role.LEADER:
            await self._lead(record, version, lease)
        elif lease is not None and lease.leader == self.node:
            # Our own lease while we do not lead: left by a step-down for want of a quorum, or
            # by this node's previous process (killed, restarted before its session expired).
            # Nothing of ours leads on it: delete it (at its version), so the others elect now.
            log.warning("%s: releases its stale lease of %s (term %d)", self.node, self.queue, lease.term)
            await self._keys.release_lease(lease_version)
        elif lease is not None and lease.term == record.term and record.leader != self.node:
            if self._leader_gone(record):
                # Its lease would live until its session expires (the TTL): deleted now, at its
                # version, so the group elects at once. Safe even if the leader lived on: an
                # election needs a majority that promised the new term, and then refuses it.
                log.warning("%s: nothing listens at %s, the replication address of %s, leader of %s at term %d; "
                            "deleting its lease", self.node, record.leader_address, record.leader, self.queue,
                            record.term)
                self._refused = (0, "", 0)
                await self._keys.release_lease(lease_version)
                return
            await self._follow(record)
        elif (lease is None and self.node in record.members and self._may_vote(record)
              and time.monotonic() >= self._abstain_until):
            assert version is not None
            await self._elect(record, version)

    def _may_vote(self, record: GroupRecord) -> bool:
        """A replica whose log started empty in a group that already had a leader (a new member,
        or one whose disk was wiped) may lack committed entries it once acknowledged: it votes
        only after it has caught up with a leader's commit index once."""
        if record.term == 0 or not self.log.created_empty or self._caught_up:
            return True
        follower = self._follower
        self._caught_up = follower.leader_term > 0 and self.log.durable_index >= follower.leader_commit_index
        return self._caught_up

    async def _lead(self, record: GroupRecord, version: int | None, lease: Lease | None) -> None:
        leader = self.leader
        assert leader is not None
        if self._check_stepped_down():
            return
        if record.term != leader.term or lease is None or lease != Lease(leader.term, self.node):
            log.warning("%s: lost the lease of %s at term %d; stepping down", self.node, self.queue, leader.term)
            self._become(Role.FOLLOWER)
            return
        if self.node not in record.members or self._transfer_ready(record):
            # Removed from the group, or handing leadership to the member an operator named:
            # the lease goes at once, so the others elect without waiting for it to expire.
            log.warning("%s: hands over the leadership of %s at term %d (%s)", self.node, self.queue, leader.term,
                        "removed from the group" if self.node not in record.members
                        else f"transfer to {record.transfer_to}")
            self._become(Role.FOLLOWER)
            await self._keys.release_lease()
            return
        if set(record.members) != set(self.members):
            self._change_members(record.members)
        if self.node in self._low_disk and not record.transfer_to:
            target = self._member_with_room(record)
            if target is not None:
                log.warning("%s: its disk alarm is on; hands the leadership of %s to %s, whose disk has room",
                            self.node, self.queue, target)
                assert version is not None
                await self._keys.replace(GroupRecord(record.queue, record.term, record.leader, record.leader_address,
                                                     record.members, record.in_sync, target, record.incarnation),
                                         version)
                return  # the transfer goes on as an operator's would (_transfer_ready)
        # Compared with the record at every poll, so a lost compare-and-set is retried by the next.
        if set(record.in_sync) != {m for m in leader.in_sync_members() if m in record.members}:
            updated = GroupRecord(record.queue, record.term, record.leader, record.leader_address, record.members,
                                  tuple(m for m in leader.in_sync_members() if m in record.members),
                                  record.transfer_to, record.incarnation)
            assert version is not None
            await self._keys.replace(updated, version)

    def _transfer_ready(self, record: GroupRecord) -> bool:
        """A transfer to another member is asked for and that member has all of our log."""
        target = record.transfer_to
        if not target or target == self.node or target not in record.members or self.leader is None:
            return False
        connected, acknowledged, _ = self.leader.progress().get(target, (False, 0, 0))
        return connected and acknowledged >= self.log.last_index

    def _member_with_room(self, record: GroupRecord) -> str | None:
        """The in-sync, connected member whose node has no disk alarm and which acknowledged the
        most of our log (None: there is none; the leader stays)."""
        leader = self.leader
        if leader is None:
            return None
        in_sync = set(leader.in_sync_members())
        candidates = [(acknowledged, node) for node, (connected, acknowledged, _) in leader.progress().items()
                      if connected and node in in_sync and node in record.members and node not in self._low_disk]
        return max(candidates)[1] if candidates else None

    def _change_members(self, members: Sequence[str]) -> None:
        log.info("%s: members of %s are now %s", self.node, self.queue, ",".join(members))
        self.members = tuple(members)
        if self.leader is not None:
            self.leader.change_members(members)
            for node in [n for n in self._followers if n not in members]:
                self._followers.pop(node).close()
            if self.leader.commit_index:
                self._commit_moved(self.leader.commit_index)
            self._flush_soon()

    async def _elect(self, record: GroupRecord, version: int) -> None:
        term = record.term + 1
        self._drop_upstream()
        self.log.flush()
        self.log.promise(term)  # from here on no leader of an older term gets an ACK from us
        await self._keys.vote(term, Vote(self.node, self.log.last_term, self.log.last_index))
        deadline = time.monotonic() + self._election_timeout
        while time.monotonic() < deadline:
            votes = await self._keys.votes(term, record.members)
            winner = choose_leader(votes, record)
            if (winner is not None and record.transfer_to in record.members
                    and record.transfer_to not in {vote.node for vote in votes}
                    and time.monotonic() < deadline - self._election_timeout / 2):
                winner = None  # a transfer names a member that has not voted yet: give it a moment
            if winner == self.node:
                await self._claim(record, version, term)
                return
            if winner is not None:
                return  # the winner claims the term; we follow it once its lease is there
            await asyncio.sleep(self._poll)

    async def _claim(self, record: GroupRecord, version: int, term: int) -> None:
        if not await self._keys.take_lease(Lease(term, self.node)):
            return
        # A transfer stands until the member it names leads.
        transfer_to = record.transfer_to if record.transfer_to != self.node else ""
        claimed = GroupRecord(record.queue, term, self.node, self._listener.address, record.members, (self.node,),
                              transfer_to, record.incarnation)
        if await self._keys.replace(claimed, version) is None:
            await self._keys.release_lease()
            return
        self.record = claimed
        self.members = tuple(record.members)
        # A leader holds every committed entry: once it steps down (check-quorum, its disk) it
        # may vote again although its log started empty (see _may_vote).
        self._caught_up = True
        self.leader = LeaderReplication(self.node, term, self.log, record.members, time.monotonic())
        self.leader.start_term()
        log.info("%s: leader of %s at term %d (log ends at %d)", self.node, self.queue, term, self.log.last_index)
        self._become(Role.LEADER)
        self._schedule_heartbeat()
        self._flush_soon()
        with contextlib.suppress(CoordinationUnavailable):
            await self._keys.forget_votes_below(term)
