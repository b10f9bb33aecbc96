"""Replicated queues on a clustered broker: durable `x-queue-type: quorum` queues whose records
a group of nodes replicates (cluster/replication/, docs/replication.md), and durable streams,
whose own files are the replicated log (replicated_streams.py, stream_replica_log.py).

`ReplicatedQueues` is this node's side: it holds the node's `ReplicaManager` (one replica per
group naming this node), gives a replicated queue declared here its `ReplicatedJournal`, and
makes **ownership follow leadership**: the node whose replica leads the group holds the queue
itself (built from its replica log); every other node holds a stand-in reaching it over the
cluster links. When a replica here becomes leader, this node takes the queue (`reconcile`) and
names itself the queue's home in the shared definitions, so the other nodes' stand-ins turn to
it; when it stops leading (a newer term exists, its lease lapsed, it stops), the queue here is
handed over: its pending confirms are failed (basic.nack) and a stand-in takes its place; the
consumers of the queue's old form on every node move to its new one (cluster_apply.py).

Imported only on a clustered broker (cluster_node.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqp_server.broker.cluster_interface import ClusterChangeRefused, RaftFigures
from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError
from cluster.replication.replicated_journal import ReplicatedJournal
from cluster.coordinator import CoordinationUnavailable, Coordinator
from cluster.replication.election import GroupKeys, GroupRecord
from cluster.replication.manager import ReplicaManager, group_members
from cluster.replication.log import ReplicaStore
from cluster.replication.queue_log import QueueReplicaLog
from cluster.replication.replica import QueueReplica, Role
from cluster.replication.replicated_streams import ReplicatedStream, is_stream_id, stream_id
from cluster.replication.stream_replica_log import StreamReplicaLog
from persistence.group_commit import GroupCommitter
from persistence.queue_store import QueueStore
from persistence.stream_log import StreamLog
from queues.arguments.queue_type_rules import QUORUM, STREAM

if TYPE_CHECKING:
    from cluster.definitions.shared import SharedDefinitions
    from queues.stream_queue import StreamKeeper, StreamQueue

log = logging.getLogger(__name__)

GROUP_SIZE_ARGUMENT = "x-quorum-initial-group-size"
STREAM_GROUP_SIZE_ARGUMENT = "x-initial-cluster-size"  # a stream's, as RabbitMQ names it
# How soon a node tries again to list and watch the replica groups and leases when the
# coordination service did not answer (its replicas then read their own keys that often).
GROUPS_POLL_S = 0.25
# How often a settled replica reads its group record and lease although no watch event woke it:
# a safety net only (the node's watches wake a replica whose keys change).
REPLICA_IDLE_POLL_S = 10.0


def queue_id(vhost: str, name: str) -> str:
    """The replica group's name of queue `name` in `vhost`."""
    return json.dumps([vhost, name], separators=(",", ":"))


def _vhost_and_name(replica_id: str) -> tuple[str, str] | None:
    """The (vhost, name) a replica group's name is of: a quorum queue's, or a stream's."""
    try:
        parts = json.loads(replica_id)
    except (ValueError, TypeError):
        return None
    if not isinstance(parts, list) or len(parts) not in (2, 3):
        return None
    return str(parts[0]), str(parts[1])


def is_replicated(entry: dict[str, Any]) -> bool:
    """Is the queue this definition entry describes a replicated one (durable, a quorum queue or
    a stream)?"""
    arguments = entry.get("arguments") or {}
    kind = arguments.get("x-queue-type")
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    return bool(entry.get("durable")) and kind in (QUORUM, STREAM)


class MembershipRefused(ClusterChangeRefused):
    """A membership change that cannot be made; the text says why."""


def _refuse(reason: str) -> GroupRecord:
    raise MembershipRefused(reason)


def _with_members(record: GroupRecord, members: tuple[str, ...]) -> GroupRecord:
    return GroupRecord(record.queue, record.term, record.leader, record.leader_address, members,
                       tuple(m for m in record.in_sync if m in members), record.transfer_to, record.incarnation)


class ReplicatedQueues:
    """See the module docstring."""

    def __init__(self, *, node: str, coordinator: Coordinator, data_dir: Path, committer: GroupCommitter,
                 live_nodes: Callable[[], list[str]], secret: str, session_ttl: float = 5.0,
                 disk_alarm: Callable[[], bool] = lambda: False) -> None:
        """``secret``: the cluster secret (the one the links log in with); the replication
        streams between nodes prove it too. ``session_ttl``: the cluster session's; a leader that
        hears from no majority of its group for that long steps down (check-quorum), as a dead
        one's lease would expire. ``disk_alarm()``: this node's disk alarm (a leader here whose
        alarm is on hands its queues to members with room: ReplicaManager)."""
        self.node = node
        self._coordinator = coordinator
        self._committer = committer
        self._live_nodes = live_nodes
        self.manager = ReplicaManager(node=node, coordinator=coordinator, data_dir=data_dir, committer=committer,
                                      secret=secret.encode("utf-8"), poll_interval=GROUPS_POLL_S, watch=True,
                                      idle_poll_interval=REPLICA_IDLE_POLL_S, on_role=self._role_changed,
                                      open_log=self._open_log, check_quorum=session_ttl, disk_alarm=disk_alarm)
        self._definitions: "SharedDefinitions | None" = None
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._deleting: set[str] = set()  # streams deleted here whose replica here is being removed

    def share(self, definitions: "SharedDefinitions") -> None:
        """Take and hand over queues through these shared definitions."""
        self._definitions = definitions

    async def start(self, host: str) -> str:
        """Listen for followers and follow the groups naming this node; the replication address."""
        return await self.manager.start(host)

    async def close(self) -> None:
        """Stop every replica here (a leader releases its lease: a follower takes over at once)."""
        self._closing = True
        await self.manager.close()
        for task in list(self._tasks):
            task.cancel()

    # -- what the rest of the broker asks ------------------------------------------------------------

    def _replica_id(self, vhost: str, name: str) -> str:
        """The group name of (vhost, name): a stream's if this node knows a stream's group of
        that name, else a quorum queue's (a vhost has one queue of a name)."""
        as_stream = stream_id(vhost, name)
        if as_stream in self.manager.replicas or as_stream in self.manager.groups:
            return as_stream
        return queue_id(vhost, name)

    def leads(self, vhost: str, name: str) -> bool:
        """Does this node's replica of the queue (or stream) lead its group now?"""
        replica = self.manager.replicas.get(self._replica_id(vhost, name))
        return replica is not None and replica.role is Role.LEADER

    def group(self, vhost: str, name: str) -> GroupRecord | None:
        """The queue's group as this node last read it: its replica's view, or the last listing of
        every group for a queue this node holds no replica of (None: not seen yet)."""
        replica_id = self._replica_id(vhost, name)
        replica = self.manager.replicas.get(replica_id)
        if replica is not None and replica.record is not None:
            return replica.record
        return self.manager.groups.get(replica_id)

    def describe(self, vhost: str, name: str) -> dict[str, Any] | None:
        """/api/queues' fields of a replicated queue, as RabbitMQ shows a quorum queue's:
        ``type`` ("quorum", or "stream"), ``leader``, ``members`` and ``online`` (the members
        that are live nodes), and amqp-server's ``in_sync`` (the members holding every committed
        record, which alone may take over with nothing confirmed missing), ``term`` (the group
        record's) and ``replica`` (this node's replica: its ``role``, ``term`` and
        ``commit_index``, when it has one). None: no group here knows the queue."""
        record = self.group(vhost, name)
        if record is None:
            return None
        live = set(self._live_nodes())
        kind = STREAM if is_stream_id(record.queue) else QUORUM
        described: dict[str, Any] = {"type": kind, "leader": record.leader, "members": list(record.members),
                                     "online": [member for member in record.members if member in live],
                                     "in_sync": list(record.in_sync), "term": record.term}
        replica = self.manager.replicas.get(record.queue)
        if replica is not None:
            # This node's own replica, as it sees itself (the fault tests' leader observations).
            described["replica"] = {"role": replica.role.value, "term": replica.term,
                                    "commit_index": replica.commit_index}
        return described

    def replica_stream(self, vhost: str, name: str) -> StreamLog | None:
        """The stream files of this node's replica of stream `name` (None: no replica of it
        here). A follower's hold the records its leader sent, readable up to the commit index
        the leader told it, so its figures are the leader's as of the last replication round."""
        replica = self.manager.replicas.get(stream_id(vhost, name))
        if replica is None or not isinstance(replica.log, StreamReplicaLog):
            return None
        return replica.log.stream

    # -- membership changes (ctl add_member, delete_member, transfer_leadership) -----------------------

    async def add_member(self, vhost: str, name: str, node: str) -> None:
        """Add `node` (a live cluster node) to the queue's group: it starts a replica, gets the
        whole log, and counts for the majority once the leader sees the change. Raises
        MembershipRefused."""
        if node not in self._live_nodes():
            raise MembershipRefused(f"node '{node}' is not a running member of the cluster")
        await self._change(vhost, name, lambda record: _with_members(record, (*record.members, node))
                           if node not in record.members else _refuse(f"node '{node}' is already a member"))

    async def delete_member(self, vhost: str, name: str, node: str) -> None:
        """Remove `node` from the queue's group (a leader that is removed hands over at once).
        Raises MembershipRefused."""
        def without(record: GroupRecord) -> GroupRecord:
            if node not in record.members:
                _refuse(f"node '{node}' is not a member")
            if len(record.members) == 1:
                _refuse("the last member of a queue's group cannot be removed")
            return _with_members(record, tuple(m for m in record.members if m != node))

        await self._change(vhost, name, without)

    async def transfer_leadership(self, vhost: str, name: str, node: str) -> None:
        """Ask the queue's leader to hand over to member `node` once it has every record (the
        queue moves there). Raises MembershipRefused."""
        def to(record: GroupRecord) -> GroupRecord:
            if node not in record.members:
                _refuse(f"node '{node}' is not a member")
            return GroupRecord(record.queue, record.term, record.leader, record.leader_address, record.members,
                               record.in_sync, "" if node == record.leader else node, record.incarnation)

        await self._change(vhost, name, to)

    async def _change(self, vhost: str, name: str, change: Callable[[GroupRecord], GroupRecord]) -> None:
        keys = GroupKeys(self._coordinator, self._replica_id(vhost, name))
        for _attempt in range(10):  # the leader rewrites the record's in-sync set now and then
            record, version = await keys.read()
            if record is None or version is None:
                raise MembershipRefused(f"queue '{name}' in vhost '{vhost}' has no replica group")
            if await keys.replace(change(record), version) is not None:
                return
        raise MembershipRefused("the queue's group kept changing; try again")

    def journal_for(self, vhost: str, name: str, open_store: Callable[[], QueueStore],
                    arguments: dict[str, Any]) -> ReplicatedJournal:
        """The journal of the replicated queue `name` that this node holds (declared here, or
        taken over because its replica here leads)."""
        replica_id = queue_id(vhost, name)
        size = arguments.get(GROUP_SIZE_ARGUMENT)
        members = group_members(self.node, self._live_nodes(), int(size) if size is not None else None)
        replica = self.manager.replica_of(replica_id, members)
        journal = ReplicatedJournal(open_store(), self._committer, replica, open_store, self._lost, self._deleted)
        self.manager.own(replica_id, journal.on_commit, journal.on_role)
        return journal

    def stream_for(self, vhost: str, name: str, arguments: dict[str, Any], max_segment_bytes: int | None,
                   build: "Callable[[StreamLog, StreamKeeper], StreamQueue]") -> "StreamQueue":
        """The replicated stream `name` that this node holds (declared here, or taken over because
        its replica here leads): `build(log, keeper)` makes its queue object over the replica's
        stream files. `max_segment_bytes` (None: the default) is the segment size every copy
        rolls at once this node leads."""
        replica_id = stream_id(vhost, name)
        if replica_id in self._deleting:
            # Deleted a moment ago, and its replica here is still going: a new stream of that name
            # must not start over the old one's files (its group goes first).
            raise AMQPError(errors.RESOURCE_LOCKED,
                            f"cannot declare {errors.resource('queue', name, vhost)}: a stream of that name "
                            "was deleted a moment ago and its replicas are still being removed; try again")
        size = arguments.get(STREAM_GROUP_SIZE_ARGUMENT)
        members = group_members(self.node, self._live_nodes(), int(size) if size is not None else None)
        new_group = replica_id not in self.manager.replicas
        replica = self.manager.replica_of(replica_id, members)
        replica_log = replica.log
        assert isinstance(replica_log, StreamReplicaLog)
        owner = ReplicatedStream(replica, replica_log, max_segment_bytes, self._stream_lost, self._stream_deleted,
                                 new_group=new_group)
        queue = build(replica_log.stream, owner)
        self.manager.own(replica_id, owner.on_commit, owner.on_role)
        return queue

    def _open_log(self, replica_id: str, directory: Path) -> ReplicaStore:
        """A replica's log: a stream's is its own segment files, a quorum queue's a log file."""
        if is_stream_id(replica_id):
            names = _vhost_and_name(replica_id)
            assert names is not None
            return StreamReplicaLog.open(directory, *names, committer=self._committer)
        return QueueReplicaLog(directory)

    def _stream_lost(self, owner: ReplicatedStream) -> None:
        """The replica of a stream held here stopped leading: hand the stream over."""
        log.warning("%s: no longer leads replicated stream %s; handing it over", self.node, owner.replica_id)
        self.manager.release(owner.replica_id)
        asyncio.get_running_loop().call_soon(self._reconcile, owner.replica_id)

    def _stream_deleted(self, owner: ReplicatedStream) -> None:
        """The stream was deleted here: so is its group (every member then drops its copy)."""
        self.manager.release(owner.replica_id)
        if self._closing:
            return
        self._deleting.add(owner.replica_id)
        task = asyncio.get_running_loop().create_task(self._delete_group(owner.replica_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _done: self._deleting.discard(owner.replica_id))

    # -- leadership changes ------------------------------------------------------------------------------

    def _role_changed(self, replica_id: str, role: Role) -> None:
        if role is Role.LEADER:
            asyncio.get_running_loop().call_soon(self._reconcile, replica_id)

    def _lost(self, journal: ReplicatedJournal) -> None:
        """The replica of a queue held here stopped leading: hand the queue over."""
        log.warning("%s: no longer leads replicated queue %s; handing it over", self.node, journal.replica.queue)
        self.manager.release(journal.replica.queue)
        asyncio.get_running_loop().call_soon(self._reconcile, journal.replica.queue)

    def _deleted(self, journal: ReplicatedJournal) -> None:
        """The queue was deleted: so is its group (every member then drops its replica)."""
        replica_id = journal.replica.queue
        self.manager.release(replica_id)
        if self._closing:
            return
        task = asyncio.get_running_loop().create_task(self._delete_group(replica_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drop_group(self, vhost: str, name: str) -> None:
        """The queue is gone from the shared definitions and no node holds it (deleted while no
        replica led): remove its group, and so every member's replica."""
        await self.manager.delete_group(self._replica_id(vhost, name))

    async def _delete_group(self, replica_id: str) -> None:
        try:
            await self.manager.delete_group(replica_id)
        except CoordinationUnavailable as error:
            log.warning("%s: the group of deleted queue %s stays until the coordination service answers: %s",
                        self.node, replica_id, error)

    def _reconcile(self, replica_id: str) -> None:
        if self._closing or self._definitions is None:
            return
        names = _vhost_and_name(replica_id)
        if names is not None:
            self._definitions.reconcile_replicated(*names)

    def raft_figures(self) -> list[RaftFigures]:
        """The figures of every replica on this node, for the metrics' rabbitmq_raft_* families.
        A queue's log folds its committed entries into its state a batch per event-loop turn and
        compacts behind them: its applied index trails the commit index by what is not folded
        yet, its snapshot index is its snapshot's base. A stream's log applies the commit index
        as it is told it (its records become readable) and has no snapshot (retention drops
        segments that nothing stands for)."""
        figures = []
        for replica_id, replica in list(self.manager.replicas.items()):
            names = _vhost_and_name(replica_id)
            if names is None:
                continue
            replica_log, commit = replica.log, replica.commit_index
            if isinstance(replica_log, QueueReplicaLog):
                snapshot, applied = replica_log.snapshot_index, replica_log.applied_index
            else:
                snapshot, applied = 0, commit
            figures.append(RaftFigures(*names, replica.term, snapshot, applied, commit, replica_log.last_index))
        return sorted(figures)

    def replica(self, vhost: str, name: str) -> QueueReplica | None:
        return self.manager.replicas.get(self._replica_id(vhost, name))
