"""The replicas one node holds, and which nodes a new replicated queue's group gets.

`ReplicaManager` is the node's side of replication, shared by all its queues: one
`ReplicationListener` (holding the cluster secret that every replication stream proves), one
group committer, one directory per queue replica under ``<data_dir>/replicas/``. The broker asks it to ``host`` a queue it serves (with the callbacks
that release its confirms); every group record in the coordination service that names this node
as a member gets a replica here too, so a follower node needs nothing but the record to start
copying a queue. A group whose record is deleted is stopped and its directory removed.

How it learns of the records: with ``watch`` (the broker), the node lists the group records and
the leases once and then watches both directories, one watch each for the whole node; a change
starts or stops a replica and wakes the replica it concerns (`QueueReplica.wake`), whose own
reads then idle at ``idle_poll_interval`` while it is settled. Without ``watch`` it lists the
records every ``poll_interval`` (``sync_groups``) and each replica reads its keys every
``replica_poll_interval``.

**Disk alarm.** While this node's disk alarm is on (``disk_alarm()``, the broker's free-disk
check) the node says so in the coordination service: ``replica-low-disk/<node>``, ephemeral, so
it goes with the node's session. Its leaders (of queues and streams) then hand their leadership
to an in-sync member whose node has no such key (`QueueReplica.avoid_low_disk`): a leader whose
disk is full blocks the queue's publishers (the alarm) and fails its writes, one with room keeps
the queue writable. Checked every ``DISK_CHECK_S``.

`group_members` picks a new group: this node first, then other live nodes, ``size`` in all
(default 3, or every live node when the cluster is smaller), as RabbitMQ places a quorum queue's
members for ``x-quorum-initial-group-size``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from cluster.coordinator import CoordinationUnavailable, Coordinator, EventKind, HistoryLost, leaf_name
from cluster.replication.election import GROUPS, LEASES, GroupRecord
from cluster.replication.log import ReplicaStore
from cluster.replication.queue_log import QueueReplicaLog
from cluster.replication.replica import CHECK_QUORUM_S, QueueReplica, ReplicationListener, Role
from persistence.group_commit import GroupCommitter

log = logging.getLogger(__name__)

DEFAULT_GROUP_SIZE = 3
LOW_DISK = "replica-low-disk"  # replica-low-disk/<node>: present while that node's disk alarm is on
DISK_CHECK_S = 1.0


def group_members(this_node: str, live_nodes: Iterable[str], size: int | None = None) -> list[str]:
    """``size`` members (default 3), this node first, then the other live nodes by name; fewer
    when the cluster is smaller."""
    wanted = DEFAULT_GROUP_SIZE if size is None else size
    if wanted < 1:
        raise ValueError("a group has at least one member")
    others = sorted(set(live_nodes) - {this_node})
    return [this_node] + others[:wanted - 1]


def _ignore_queue_role(queue: str, role: Role) -> None:
    pass


def _no_alarm() -> bool:
    return False


def _queue_log(queue: str, directory: Path) -> ReplicaStore:
    return QueueReplicaLog(directory)


class ReplicaManager:
    """This node's queue replicas; see the module docstring."""

    def __init__(self, *, node: str, coordinator: Coordinator, data_dir: Path, committer: GroupCommitter,
                 secret: bytes, poll_interval: float = 1.0, replica_poll_interval: float = 0.1, watch: bool = False,
                 idle_poll_interval: float = 2.0,
                 on_role: Callable[[str, Role], None] = _ignore_queue_role,
                 open_log: Callable[[str, Path], ReplicaStore] = _queue_log,
                 check_quorum: float = CHECK_QUORUM_S, disk_alarm: Callable[[], bool] = _no_alarm,
                 disk_check_interval: float = DISK_CHECK_S) -> None:
        """``on_role(queue, role)`` hears every role change of every replica here (the broker
        takes a queue over when its replica here becomes leader), after the queue's owner (`host`).
        ``open_log(queue, directory)``: the log of a replica (a queue's `QueueReplicaLog` by
        default; a stream's is its segment files, which the broker tells apart by the group's name).
        ``secret``: the cluster secret every replication stream, to or from this node, proves first.
        ``check_quorum``: how long a leader here may go without hearing from a majority of its
        group before it steps down (QueueReplica). ``disk_alarm()``: whether this node's disk
        alarm is on (module docstring), read every ``disk_check_interval`` seconds."""
        self.node = node
        self._coordinator = coordinator
        self._directory = Path(data_dir) / "replicas"
        self._committer = committer
        self._poll = poll_interval
        self._replica_poll = replica_poll_interval
        self._watch = watch
        self._idle_poll = idle_poll_interval if watch else replica_poll_interval
        self._records: dict[str, GroupRecord] = {}  # watching: group key -> record
        self._by_leaf: dict[str, str] = {}  # a replica's key leaf -> its queue
        self.listener = ReplicationListener(secret)
        self.replicas: dict[str, QueueReplica] = {}
        self.groups: dict[str, GroupRecord] = {}  # every group, as the last listing found them
        # queue -> (on_commit, on_role) of the owner that `host`ed it; replicas nobody hosts
        # (a follower node's) report to nobody but `on_role`.
        self._owners: dict[str, tuple[Callable[[int], None], Callable[[Role], None]]] = {}
        self._on_role = on_role
        self._open_log = open_log
        self._check_quorum = check_quorum
        self._disk_alarm = disk_alarm
        self._disk_check = disk_check_interval
        self._task: asyncio.Task[None] | None = None
        self._disk_task: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int = 0) -> str:
        """Listen for followers and start following the groups that name this node; returns the
        replication address."""
        address = await self.listener.start(host, port)
        self._task = asyncio.get_running_loop().create_task(self._follow_groups())
        self._disk_task = asyncio.get_running_loop().create_task(self._watch_disk())
        return address

    async def close(self) -> None:
        for task in (self._task, self._disk_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for replica in list(self.replicas.values()):
            await replica.stop()
            replica.log.close()
        self.replicas.clear()
        await self.listener.close()

    def host(self, queue: str, members: Iterable[str], on_commit: Callable[[int], None],
             on_role: Callable[[Role], None]) -> QueueReplica:
        """The replica of ``queue`` here, started if needed, reporting to these callbacks."""
        replica = self.replica_of(queue, members)
        self.own(queue, on_commit, on_role)
        return replica

    def replica_of(self, queue: str, members: Iterable[str]) -> QueueReplica:
        """The replica of ``queue`` here; started (creating its group) if there is none."""
        replica = self.replicas.get(queue)
        if replica is not None:
            return replica
        # A new group: whatever a directory of that queue name holds is an earlier group's.
        shutil.rmtree(self._replica_directory(queue), ignore_errors=True)
        return self._start(queue, list(members), create_group=True)

    def own(self, queue: str, on_commit: Callable[[int], None], on_role: Callable[[Role], None]) -> None:
        """The replica of ``queue`` reports its commits and role changes to these callbacks from
        now on (`release` ends it); a replica that leads already says so at once."""
        self._owners[queue] = (on_commit, on_role)
        replica = self.replicas.get(queue)
        if replica is not None and replica.role is Role.LEADER:
            on_role(Role.LEADER)

    def release(self, queue: str) -> None:
        """The owner that hosted ``queue`` hears no more of it (the replica goes on)."""
        self._owners.pop(queue, None)

    def _start(self, queue: str, members: list[str], *, create_group: bool) -> QueueReplica:
        replica = QueueReplica(
            queue=queue, node=self.node, members=members, log=self._open_log(queue, self._replica_directory(queue)),
            coordinator=self._coordinator, listener=self.listener, committer=self._committer,
            on_commit=functools.partial(self._committed, queue), on_role=functools.partial(self._role_changed, queue),
            poll_interval=self._replica_poll, idle_poll_interval=self._idle_poll, create_group=create_group,
            check_quorum=self._check_quorum)
        self.replicas[queue] = replica
        self._by_leaf[leaf_name(queue)] = queue
        replica.start()
        return replica

    def _committed(self, queue: str, index: int) -> None:
        owner = self._owners.get(queue)
        if owner is not None:
            owner[0](index)

    def _role_changed(self, queue: str, role: Role) -> None:
        owner = self._owners.get(queue)
        if owner is not None:
            owner[1](role)
        self._on_role(queue, role)

    def _forget_other_incarnation(self, queue: str, incarnation: str) -> None:
        """A directory left by an earlier group of this queue name (deleted while this node was
        away) is removed before this group's replica starts; the directory then names its group."""
        directory = self._replica_directory(queue)
        marker = directory / "incarnation"
        try:
            held = marker.read_text()
        except OSError:
            held = None
        if held is not None and held != incarnation:
            shutil.rmtree(directory, ignore_errors=True)

    def _mark_incarnation(self, queue: str, incarnation: str) -> None:
        marker = self._replica_directory(queue) / "incarnation"
        if incarnation and not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(incarnation)

    def _replica_directory(self, queue: str) -> Path:
        return self._directory / hashlib.sha1(queue.encode("utf-8")).hexdigest()

    async def sync_groups(self) -> None:
        """Start a replica for each group naming this node; stop those whose group is gone."""
        items, _ = await self._coordinator.list(GROUPS)
        self._records = {}
        for item in items:
            self._remember(item.key, item.value)
        await self._apply_groups()

    def _remember(self, key: str, value: bytes | None) -> str | None:
        """Record what the service holds at group key `key` now; the queue it is of, if known."""
        if value is None:
            gone = self._records.pop(key, None)
            return gone.queue if gone is not None else self._by_leaf.get(key.rsplit("/", 1)[-1])
        try:
            record = GroupRecord.decode(value)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring an unreadable replica group record at %s", key)
            return None
        self._records[key] = record
        return record.queue

    async def _apply_groups(self, only: str | None = None) -> None:
        """Act on the records: a replica for each group naming this node, none for a group gone
        (`only`: of that queue alone)."""
        self.groups = {record.queue: record for record in self._records.values()}
        named = {queue: record for queue, record in self.groups.items()
                 if self.node in record.members and only in (None, queue)}
        for queue, record in named.items():
            replica = self.replicas.get(queue)
            if replica is not None and replica.incarnation not in (None, record.incarnation):
                log.info("%s: replicated queue %s was deleted and made again; its old replica goes", self.node, queue)
                await self._remove(queue)
                replica = None
            if replica is None:
                log.info("%s: following replicated queue %s (members %s)", self.node, queue, ",".join(record.members))
                self._forget_other_incarnation(queue, record.incarnation)
                replica = self._start(queue, list(record.members), create_group=False)
            if replica.incarnation == record.incarnation:
                self._mark_incarnation(queue, record.incarnation)
        for queue in [q for q in self.replicas if only in (None, q) and q not in named
                      and self.replicas[q].record is not None]:
            await self._remove(queue)
            log.info("%s: replicated queue %s was deleted; its replica is removed", self.node, queue)

    async def delete_group(self, queue: str) -> None:
        """The queue was deleted: remove its group (every other member then drops its replica)
        and this node's replica."""
        replica = self.replicas.get(queue)
        if replica is not None:
            await replica.stop()
            await replica.delete_group()
            await self._remove(queue)

    async def _remove(self, queue: str) -> None:
        self._owners.pop(queue, None)
        replica = self.replicas.pop(queue, None)
        if replica is None:
            return  # removed meanwhile (the group deleted here, and its deletion seen by the watch)
        self._by_leaf.pop(leaf_name(queue), None)
        await replica.stop()
        replica.log.close()
        shutil.rmtree(self._replica_directory(queue), ignore_errors=True)

    async def _follow_groups(self) -> None:
        if not self._watch:
            while True:
                try:
                    await self.sync_groups()
                except CoordinationUnavailable as error:
                    log.warning("%s: cannot list replica groups: %s", self.node, error)
                except Exception:
                    log.exception("%s: following replica groups failed a step; retrying", self.node)
                await asyncio.sleep(self._poll)
        leases = asyncio.get_running_loop().create_task(self._watch_leases())
        try:
            await self._watch_groups()
        finally:
            leases.cancel()

    async def _watch_groups(self) -> None:
        while True:
            try:
                items, revision = await self._coordinator.list(GROUPS)
                self._records = {}
                for item in items:
                    self._remember(item.key, item.value)
                await self._apply_groups()
                self._wake_all()
                async for event in self._coordinator.watch(GROUPS, revision, list(self._records)):
                    queue = self._remember(event.key, event.value if event.kind is EventKind.PUT else None)
                    if queue is not None:
                        await self._apply_groups(only=queue)
                        self._wake(queue)
            except HistoryLost:
                continue  # list again
            except CoordinationUnavailable as error:
                log.warning("%s: cannot watch the replica groups: %s", self.node, error)
            except Exception:
                log.exception("%s: watching replica groups failed; listing them again", self.node)
            self._wake_all()  # while the watch is down, the replicas read their keys themselves
            await asyncio.sleep(self._poll)

    async def _watch_leases(self) -> None:
        """Wake the replica whose leader's lease came or went (the lease of a dead leader goes
        when its session expires: its followers elect at once)."""
        while True:
            try:
                items, revision = await self._coordinator.list(LEASES)
                self._wake_all()
                async for event in self._coordinator.watch(LEASES, revision, [item.key for item in items]):
                    queue = self._by_leaf.get(event.key.rsplit("/", 1)[-1])
                    if queue is not None:
                        self._wake(queue)
            except HistoryLost:
                continue
            except CoordinationUnavailable as error:
                log.warning("%s: cannot watch the replica leases: %s", self.node, error)
            except Exception:
                log.exception("%s: watching replica leases failed; listing them again", self.node)
            self._wake_all()
            await asyncio.sleep(self._poll)

    async def _watch_disk(self) -> None:
        """Keep ``replica-low-disk/<node>`` in step with the disk alarm; while it is on, tell the
        replicas leading here which members' nodes have room (module docstring)."""
        key = f"{LOW_DISK}/{leaf_name(self.node)}"
        marked = False
        while True:
            try:
                alarm = self._disk_alarm()
                if alarm != marked:
                    if alarm:
                        log.warning("%s: disk alarm: the queues led here hand their leadership to members with room",
                                    self.node)
                        await self._coordinator.put(key, b"{}", ephemeral=True)
                    else:
                        await self._coordinator.delete(key)
                    marked = alarm
                low: frozenset[str] = frozenset()
                if alarm:
                    items, _ = await self._coordinator.list(LOW_DISK)
                    leaves = {item.key.rsplit("/", 1)[-1] for item in items}
                    low = frozenset(n for n in self._all_members() if leaf_name(n) in leaves) | {self.node}
                for replica in list(self.replicas.values()):
                    replica.avoid_low_disk(low)
            except CoordinationUnavailable as error:
                log.warning("%s: cannot record its disk alarm: %s", self.node, error)
            except Exception:
                log.exception("%s: following the disk alarm failed a step; retrying", self.node)
            await asyncio.sleep(self._disk_check)

    def _all_members(self) -> set[str]:
        return {member for replica in self.replicas.values() for member in replica.members}

    def _wake(self, queue: str) -> None:
        replica = self.replicas.get(queue)
        if replica is not None:
            replica.wake()

    def _wake_all(self) -> None:
        for replica in self.replicas.values():
            replica.wake()
