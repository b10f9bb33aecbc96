"""Definitions shared by every node of a cluster, kept in the coordination service.

Vhosts, users (their password hashes), permissions, exchanges, queues and bindings each live
under one key (cluster_definition_keys.py says where). Every node holds all of them locally, as
a single node does, and keeps them equal to the service's:

- **A local change** (a declare, a management API call) is applied locally at once, as on a
  single node, and written to the service in the background; the method's reply waits until
  the write is committed (`when_committed`, through the channel's OrderedReplies). A new queue
  or exchange is written create-if-absent: when two nodes create it at the same moment one
  wins, the other takes the winner's definition and its client gets the 406 (or 405) a
  redeclaration with those properties gets. Writes to one key go out in order; writes to
  different keys overlap (up to MAX_WRITES_IN_FLIGHT), so remote nodes may see a binding
  before its queue: it waits ("parked") until the queue arrives.
- **Remote changes** come from a list-then-watch of each directory and are applied locally
  (cluster_apply.py; cluster_mirror.py keeps what the service holds). A node recognises the echo of its own writes ("by" and "seq" in the value) and
  ignores events for a key older than its own latest write there. A watch that cannot resume
  (etcd compacted, ZooKeeper lost track) lists the directory again and applies the difference;
  so does a node that starts, whatever it missed while down.
- **The service unreachable**: a write fails (CoordinationUnavailable: etcd's and kazoo's own
  retry deadlines), the local change is rolled back to what the service last said, and the
  waiting client gets 541 INTERNAL_ERROR; later writes fail at once until a probe reaches the
  service again. Deletions (a closed connection's exclusive queue) are retried instead.

Queue ownership: a queue's value names its home node (where it was declared); the home node
alone holds its messages and writes an ephemeral `queue-owners/` key in its own session for each
queue it holds. `owner_of` answers "who owns (vhost, queue) and is it live"; listeners added with
`on_owner_change` hear when that changes. Non-durable and exclusive queues are ephemeral keys in
their home node's session too: they vanish when it dies, as RabbitMQ deletes a lost node's
transient queues. A queue whose home is another node is represented locally by the object the
remote-queue factory builds (`set_remote_queue_factory`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqp_server.wire import errors
from cluster.definitions.apply import LocalDefinitions, RemoteQueueFactory
from cluster.definitions.keys import (
    DIRECTORIES,
    KIND_OF_DIRECTORY,
    KINDS,
    OWNERS,
    SEEDED_MARKER,
    SETTINGS,
    SharedValue,
    decode_owner,
    encode_owner,
    entry_key,
    owner_key,
)
from cluster.definitions.mirror import BindingEnd, ServiceMirror
from cluster.replication.replicated_queues import is_replicated
from amqp_server.wire.errors import AMQPError
from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, KeyValue, VersionConflict, WatchEvent,
)
from persistence.definition_table import PUT, DefinitionTable
from queues.arguments import equivalence
from queues.arguments.equivalence import Inequivalent

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from cluster.replication.replicated_queues import ReplicatedQueues

log = logging.getLogger(__name__)

ACCESS_KINDS = ("users", "vhosts", "permissions")
MAX_WRITES_IN_FLIGHT = 32
PROBE_INTERVAL_S = 1.0
FAILURES_KEPT = 1000
OUT_OF_REACH = "the cluster's coordination service is out of reach"

CommitCallback = Callable[[Exception | None], None]
OwnerListener = Callable[[str, str], None]


@dataclass(frozen=True)
class QueueOwner:
    """Who holds a queue's messages, and whether that node is live now."""

    node: str
    live: bool
    local: bool  # the owner is this node


@dataclass
class _Write:
    seq: int
    key: str
    data: bytes | None  # None: delete
    value: SharedValue | None = None  # the definition written (None for deletions and ownership keys)
    ephemeral: bool = False
    create_only: bool = False
    then_own: bool = False  # a queue of this node: take its ownership once this write succeeded
    # Write only over this definition: compare-and-set against the version the service holds
    # it at, so a change made meanwhile (a deletion) is never undone. None: write whatever is there.
    replaces: SharedValue | None = None


class SharedDefinitions:
    """This node's side of the shared definitions; see the module docstring."""

    def __init__(self, coordinator: Coordinator, broker: "Broker", node_name: str,
                 live_nodes: Callable[[], list[str]]) -> None:
        self._coordinator = coordinator
        self._broker = broker
        self._node = node_name
        # Names this process's writes: a restarted node must not take its previous life's for echoes.
        self._writer = f"{node_name}/{os.urandom(6).hex()}"
        self._live_nodes = live_nodes
        # -- writes --
        self._seq = 0  # writes issued
        self._done_through = 0  # every write up to this one has finished
        self._finished: set[int] = set()  # finished writes above _done_through
        self._failures: dict[int, Exception] = {}  # recent failed writes by seq
        self._waiters: deque[tuple[int, int, CommitCallback]] = deque()  # (through seq, since seq, callback)
        self._key_tails: dict[str, asyncio.Task[None]] = {}  # the last write issued per key
        self._pending: dict[str, _Write] = {}  # per key: our latest write whose echo has not come
        self._deletes_to_retry: dict[str, _Write] = {}
        self._landed_after_refusal: dict[str, bytes] = {}  # key -> data of a refused creation that may land
        self._undoing: set[asyncio.Task[None]] = set()
        self._in_flight = asyncio.Semaphore(MAX_WRITES_IN_FLIGHT)
        self._unreachable: CoordinationUnavailable | None = None
        self._probe: asyncio.Task[None] | None = None
        # -- what the service holds, as last listed or watched --
        self._service = ServiceMirror()
        self._owners: dict[str, str] = {}  # queue-owners key -> node
        self._claimed: set[tuple[str, str]] = set()  # (vhost, queue) whose ownership key we wrote
        self._lapsed: set[str] = set()  # ownership keys seen going (their owner let go, or died)
        self._local = LocalDefinitions(broker, node_name, self._service, lambda key: key in self._pending,
                                       self._set_ownership)
        self._access = DefinitionTable()  # users, vhosts, permissions as last shared
        self._followers: list[asyncio.Task[None]] = []
        self._owner_listeners: list[OwnerListener] = []
        self._replicated: "ReplicatedQueues | None" = None

    # -- the interface for other cluster parts -----------------------------------------------

    def set_remote_queue_factory(self, factory: RemoteQueueFactory) -> None:
        """Queues whose home is another node are represented by what `factory` builds (from
        now on; call it before `start`)."""
        self._local.set_remote_queue_factory(factory)

    def replicate_with(self, replicated: "ReplicatedQueues") -> None:
        """Replicated queues are held where their replica leads (cluster_replicated.py); call
        it before `start`."""
        self._replicated = replicated
        self._local.replicate_with(replicated)

    def reconcile_replicated(self, vhost: str, queue: str) -> None:
        """The leadership of replicated queue (vhost, queue) changed here: hold the queue
        itself or a stand-in as it says, and when this node took it, name it the queue's home.
        A replica that leads the group of a queue deleted meanwhile drops the group."""
        key = entry_key("queues", {"vhost": vhost, "name": queue})
        value = self._service.get(key)
        if value is None:
            if not self._local.holds(vhost, queue) and key not in self._pending:
                task = asyncio.create_task(self._drop_group_if_deleted(key, vhost, queue))
                self._undoing.add(task)
                task.add_done_callback(self._undoing.discard)
            return
        self._local.apply(key, value)
        self._name_home_if_held(key, value)

    async def _drop_group_if_deleted(self, key: str, vhost: str, queue: str) -> None:
        """The queue was deleted while no replica led its group (no node held the queue to
        delete the group with it): the replica that leads now removes the group, once the
        service confirms the definition is gone (this node's view may lag)."""
        replicated = self._replicated
        try:
            if await self._coordinator.get(key) is not None:
                return
            if replicated is not None and replicated.leads(vhost, queue) and not self._local.holds(vhost, queue):
                log.info("replicated queue '%s' in vhost '%s' was deleted during its leader change: "
                         "removing its group", queue, vhost)
                await replicated.drop_group(vhost, queue)
        except CoordinationUnavailable as error:
            log.warning("the group of deleted queue '%s' in vhost '%s' stays until the coordination service "
                        "answers: %s", queue, vhost, error)

    def _name_home_if_held(self, key: str, value: SharedValue) -> None:
        """A replicated queue this node holds (its replica leads) but whose definition names
        another home: name this node, so the other nodes' stand-ins turn here. The write is a
        compare-and-set over `value`: a deletion committed meanwhile on another node stands
        (the queue and its group then go here too: `_superseded`)."""
        entry = value.entry
        if value.home == self._node or not self._local.holds(entry["vhost"], entry["name"]):
            return
        moved = SharedValue(value.kind, entry, self._writer, self._seq + 1, self._node, value.exclusive)
        self._issue(key, moved.encode(), moved, replaces=value)
        self._remember(key, moved)
        self._set_ownership(entry["vhost"], entry["name"], True)
        self._tell_owner_listeners(entry["vhost"], entry["name"])

    def owner_of(self, vhost: str, queue: str) -> QueueOwner | None:
        """The queue's owner node and whether it holds the queue now (None: no such queue)."""
        value = self._service.get(entry_key("queues", {"vhost": vhost, "name": queue}))
        if value is None:
            return None
        if value.home == self._node:
            return QueueOwner(self._node, self._local.holds(vhost, queue), True)
        key = owner_key(vhost, queue)
        holder = self._owners.get(key)
        if holder is None and key not in self._lapsed:
            # Not seen yet (its owner writes it just after the queue, and it comes through
            # another watch): a queue of a live node is that node's until its key goes.
            return QueueOwner(value.home, value.home in self._live_nodes(), False)
        return QueueOwner(value.home, holder == value.home, False)

    def on_owner_change(self, listener: OwnerListener) -> None:
        """Call `listener(vhost, queue)` whenever `owner_of` may answer differently for it (a
        queue declared or deleted here or elsewhere, its owner gone or back). It is called from
        within those changes: it must not change definitions itself."""
        self._owner_listeners.append(listener)

    # -- starting and stopping ----------------------------------------------------------------

    async def start(self) -> None:
        """Make this node's definitions the cluster's (seeding an empty cluster with its own),
        take the queues whose home is this node, and follow changes from now on."""
        if await self._coordinator.get(SEEDED_MARKER) is None:
            try:
                await self._coordinator.compare_and_set(SEEDED_MARKER, self._node.encode(), None)
                await self._seed()
            except VersionConflict:
                pass  # another node seeds it
        revisions = {}
        for directory in (*DIRECTORIES.values(), OWNERS):
            revisions[directory] = await self._relist(directory, startup=True)
        self._discard_files_of_queues_gone_meanwhile()
        await self._push_missing_access()
        self._remove_local_access_not_shared()
        self._access.replace(self._broker.access_definitions(), ACCESS_KINDS)
        await self.committed()
        for directory, revision in revisions.items():
            self._followers.append(asyncio.create_task(self._follow(directory, revision)))

    def _discard_files_of_queues_gone_meanwhile(self) -> None:
        """The files of durable queues this node held that the cluster deleted (or gave to
        another node) while this node was down go, as RabbitMQ drops the data of queues its
        metadata store no longer has when it recovers a vhost. Queues this node holds now
        (taken back from the cluster's definitions just before) keep theirs."""
        for vhost, queue in self._broker.queues_with_files():
            value = self._service.get(entry_key("queues", {"vhost": vhost, "name": queue}))
            if self._local.holds(vhost, queue) or (value is not None and value.home == self._node):
                continue
            if value is not None and is_replicated(value.entry):
                continue  # held where its replica leads, which may be here again (cluster_replicated.py)
            log.info("queue '%s' in vhost '%s' was deleted while this node was down: removing its files",
                     queue, vhost)
            try:
                self._broker.discard_queue_files(vhost, queue)
            except OSError as error:  # left for the next start; the queue is gone either way
                log.error("could not remove the files of queue '%s' in vhost '%s': %s", queue, vhost, error)

    async def stop(self) -> None:
        for task in [*self._followers, *([self._probe] if self._probe else []), *self._undoing]:
            task.cancel()
        tails = list(self._key_tails.values())
        if tails:
            await asyncio.wait(tails, timeout=5)

    async def _seed(self) -> None:
        """This node fills an empty cluster: its users, vhosts and permissions, and the durable
        topology of its own definitions store (a single node becoming a cluster keeps it)."""
        stored = self._broker.store.load()
        documents = self._broker.access_definitions()
        for kind in ("exchanges", "queues", "bindings", *SETTINGS):
            documents[kind] = stored.get(kind, [])
        for kind in KINDS:
            for entry in documents.get(kind, []):
                value = SharedValue(kind, entry, self._writer, 0, self._node if kind == "queues" else "")
                try:
                    await self._coordinator.compare_and_set(entry_key(kind, entry), value.encode(), None)
                except VersionConflict:
                    pass
        log.info("seeded the cluster's shared definitions from this node's")

    async def _push_missing_access(self) -> None:
        """The configuration's users, vhosts and permissions that the cluster lacks are added,
        as a single node adds them at every start; those it has win."""
        for kind, entries in self._broker.access_definitions().items():
            for entry in entries:
                key = entry_key(kind, entry)
                if key in self._service:
                    continue
                value = SharedValue(kind, entry, self._writer, 0)
                try:
                    await self._coordinator.compare_and_set(key, value.encode(), None)
                except VersionConflict as conflict:
                    current = self._decoded(kind, conflict.current) if conflict.current else None
                    if current is None:
                        continue
                    value = current
                self._remember(key, value)
                self._local.apply(key, value)

    def _remove_local_access_not_shared(self) -> None:
        """Users, permissions and vhosts this node had that the cluster does not (deleted while
        this node was down) go."""
        shared = self._broker.access_definitions()
        for kind in ("permissions", "users", "vhosts"):
            for entry in shared[kind]:
                key = entry_key(kind, entry)
                if key not in self._service:
                    self._local.apply(key, None, entry)

    @property
    def size(self) -> int:
        """How many shared definitions the service holds, as last seen."""
        return len(self._service)

    # -- local changes (the broker calls these) -----------------------------------------------

    @property
    def changes(self) -> int:
        """Writes issued so far; compare before and after a method."""
        return self._seq

    def changed(self, kind: str, entry: dict[str, Any], present: bool) -> None:
        """A local exchange, queue, binding, policy or limit was set (`present`) or removed."""
        if self._local.applying:
            return
        key = entry_key(kind, entry)
        if not present:
            self._issue(key, None)
            if kind == "queues":
                self._forget_bindings_of((entry["vhost"], "queue", entry["name"]))
                if not self._local.forget_stand_in(entry["vhost"], entry["name"]):
                    self._set_ownership(entry["vhost"], entry["name"], False)  # only the owner's
                self._tell_owner_listeners(entry["vhost"], entry["name"])
            elif kind == "exchanges":
                self._forget_bindings_of((entry["vhost"], "exchange", entry["name"]))
                self._forget_bindings_of((entry["vhost"], "source", entry["name"]))
            return
        if kind == "queues":
            exclusive = self._broker.vhosts[entry["vhost"]].queues[entry["name"]].exclusive
            # A transient or exclusive queue dies with its home node, as in RabbitMQ.
            # Its ownership key is written once the queue's key is: a node that lost the race
            # for the name must not touch the winner's.
            self._issue_definition(kind, entry, home=self._node, exclusive=exclusive,
                                   ephemeral=not entry["durable"] or exclusive, create_only=True,
                                   then_own=True)
            self._tell_owner_listeners(entry["vhost"], entry["name"])
        else:
            self._issue_definition(kind, entry, create_only=kind == "exchanges")

    def access_changed(self, document: dict[str, list[dict[str, Any]]]) -> None:
        """The broker's users, vhosts and permissions are now `document`'s: share what differs."""
        records = self._access.replace(document, ACCESS_KINDS)
        if self._local.applying:
            return
        for text in records:
            record = json.loads(text)
            kind, entry = record["kind"], record["entry"]
            key = entry_key(kind, entry)
            if record["op"] == PUT:
                self._issue_definition(kind, entry)
                continue
            self._issue(key, None)
            if kind == "vhosts":  # what lived in it goes with it
                for other, value in self._service.items():
                    if value.entry.get("vhost") == entry["name"] and other != key:
                        self._issue(other, None)
            elif kind == "users":  # and a user's limits with the user
                limits = entry_key("user_limits", {"user": entry["name"]})
                if limits in self._service:
                    self._issue(limits, None)

    def _forget_bindings_of(self, end: BindingEnd) -> None:
        for key in self._service.bindings_of(end):
            self._issue(key, None)

    def _set_ownership(self, vhost: str, queue: str, held: bool) -> None:
        """Write (or delete) this node's ephemeral ownership key of a queue it holds. Only a key
        this node wrote is deleted: another node may hold a queue of that name."""
        if held:
            self._claimed.add((vhost, queue))
        elif (vhost, queue) in self._claimed:
            self._claimed.discard((vhost, queue))
        else:
            return
        self._issue(owner_key(vhost, queue), encode_owner(self._node) if held else None, ephemeral=held)

    # -- waiting for commits ------------------------------------------------------------------

    def when_committed(self, since: int, callback: CommitCallback) -> None:
        """Call `callback(error)` once every write issued so far has finished: None, or the
        first failure among the writes after `since` (an AMQPError for a lost declare race,
        CoordinationUnavailable when the service could not be reached)."""
        through = self._seq
        if self._done_through >= through:
            callback(self._first_failure(since, through))
            return
        self._waiters.append((through, since, callback))

    async def committed(self, since: int | None = None) -> None:
        """Return once every write so far has finished; raise the first failure after `since`."""
        done: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

        def finish(error: Exception | None) -> None:
            if not done.done():
                done.set_result(error)

        self.when_committed(self._seq if since is None else since, finish)
        error = await done
        if error is not None:
            raise error

    def _first_failure(self, since: int, through: int) -> Exception | None:
        if not self._failures:
            return None
        for seq in range(since + 1, through + 1):
            failure = self._failures.get(seq)
            if failure is not None:
                return failure
        return None

    def _finish(self, seq: int, failure: Exception | None) -> None:
        if failure is not None:
            self._failures[seq] = failure
            if len(self._failures) > FAILURES_KEPT:
                del self._failures[min(self._failures)]
        self._finished.add(seq)
        while self._done_through + 1 in self._finished:
            self._done_through += 1
            self._finished.discard(self._done_through)
        while self._waiters and self._waiters[0][0] <= self._done_through:
            through, since, callback = self._waiters.popleft()
            callback(self._first_failure(since, through))

    # -- writing --------------------------------------------------------------------------------

    def _issue_definition(self, kind: str, entry: dict[str, Any], *, home: str = "", exclusive: bool = False,
                          ephemeral: bool = False, create_only: bool = False, then_own: bool = False) -> None:
        value = SharedValue(kind, entry, self._writer, self._seq + 1, home, exclusive)
        self._issue(entry_key(kind, entry), value.encode(), value, ephemeral=ephemeral, create_only=create_only,
                    then_own=then_own)

    def _issue(self, key: str, data: bytes | None, value: SharedValue | None = None, *, ephemeral: bool = False,
               create_only: bool = False, then_own: bool = False, replaces: SharedValue | None = None) -> None:
        """Write `data` at `key` (None: delete it) after the writes to `key` issued before."""
        self._seq += 1
        write = _Write(self._seq, key, data, value, ephemeral, create_only, then_own, replaces)
        if not key.startswith(OWNERS + "/"):
            self._pending[key] = write
            self._deletes_to_retry.pop(key, None)
            self._landed_after_refusal.pop(key, None)  # this newer change decides the key now
        previous = self._key_tails.get(key)
        task = asyncio.create_task(self._perform(write, previous))
        self._key_tails[key] = task
        task.add_done_callback(lambda done: self._key_tails.get(key) is done and self._key_tails.pop(key))

    async def _perform(self, write: _Write, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:  # one key's writes go out in the order they were made
            await asyncio.wait([previous])
        failure: Exception | None = None
        async with self._in_flight:
            try:
                if self._unreachable is not None:
                    raise self._unreachable
                try:
                    failure = await self._send(write)
                except CoordinationUnavailable:
                    self._outcome_unknown(write)
                    raise
            except CoordinationUnavailable as error:
                failure = self._lost_the_service(error)
                self._not_committed(write)
            except Exception as error:  # a write must always finish, or its waiters wait forever
                log.exception("writing %s to the coordination service failed", write.key)
                failure = error
                self._not_committed(write)
        self._finish(write.seq, failure)

    async def _send(self, write: _Write) -> Exception | None:
        """Write it; the refusal to answer the client with when a create lost a race."""
        coordinator = self._coordinator
        if write.data is None:
            if not await coordinator.delete(write.key):
                self._no_echo(write)  # nothing was there: no event will come
            return None
        if write.replaces is not None:
            await self._replace(write)
            return None
        if not write.create_only:
            await coordinator.put(write.key, write.data, ephemeral=write.ephemeral)
            return None
        try:
            await coordinator.compare_and_set(write.key, write.data, None, ephemeral=write.ephemeral)
        except VersionConflict as conflict:
            return self._lost_race(write, conflict.current)
        if write.then_own and write.value is not None:
            entry = write.value.entry
            if self._local.holds(entry["vhost"], entry["name"]):  # not deleted meanwhile
                self._set_ownership(entry["vhost"], entry["name"], True)
        return None

    async def _replace(self, write: _Write) -> None:
        """Write `write.data` only if the service still holds `write.replaces` at the key:
        compare-and-set against the version it is held at."""
        assert write.replaces is not None and write.data is not None
        current = await self._coordinator.get(write.key)
        held = self._decoded(write.replaces.kind, current) if current is not None else None
        if current is None or held != write.replaces:
            self._superseded(write)
            return
        try:
            await self._coordinator.compare_and_set(write.key, write.data, current.version, ephemeral=write.ephemeral)
        except VersionConflict:
            self._superseded(write)

    def _superseded(self, write: _Write) -> None:
        """A conditional write found the key changed (deleted, or written by another node): it
        is not made, and this node takes what the service holds, as last seen (a change not
        seen yet arrives through the watch and is applied then). A replicated queue deleted
        meanwhile is so removed here too, and its group with it (cluster_replicated.py)."""
        log.info("%s changed before this node's write over it: not written", write.key)
        if self._pending.get(write.key) is not write:
            return  # a later local change of the key decides
        del self._pending[write.key]
        assert write.value is not None
        self._local.apply(write.key, self._service.get(write.key), write.value.entry)

    def _outcome_unknown(self, write: _Write) -> None:
        """A write sent but not answered may still have been committed (the answer lost, or the
        backend's request still under way). Its client is told it failed, so a new object it
        created must not appear: remember it, to delete it if its echo comes (`_undo_if_landed`).
        A change of an existing object is left as it lands (docs/cluster.md: unknown outcome)."""
        if write.data is not None and write.key not in self._service and not write.key.startswith(OWNERS + "/"):
            self._landed_after_refusal[write.key] = write.data

    def _undo_if_landed(self, event: WatchEvent) -> bool:
        """Is `event` a creation this node refused to its client that landed after all? Then it
        is deleted again (if nobody changed it since) and not applied here."""
        data = self._landed_after_refusal.pop(event.key, None)
        if data is None or event.kind is not EventKind.PUT or event.value != data:
            return False
        log.warning("%s was committed after its client was told it failed: deleting it", event.key)
        task = asyncio.create_task(self._delete_landed(event.key, data))
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)
        return True

    async def _delete_landed(self, key: str, data: bytes) -> None:
        while True:
            try:
                current = await self._coordinator.get(key)
                if current is not None and current.value == data and key not in self._pending:
                    await self._coordinator.delete(key, current.version)
                return
            except VersionConflict:
                return  # changed meanwhile: somebody else's now
            except CoordinationUnavailable:
                await asyncio.sleep(PROBE_INTERVAL_S)

    def _no_echo(self, write: _Write) -> None:
        if self._pending.get(write.key) is write:
            del self._pending[write.key]

    def _not_committed(self, write: _Write) -> None:
        """The service may not have the write: undo it locally (back to what the service last
        said), or for a deletion, try it again once the service answers."""
        if self._pending.get(write.key) is not write:
            return  # a later local change of the key decides
        if write.data is None and not write.key.startswith(OWNERS + "/"):
            self._deletes_to_retry[write.key] = write
            return
        del self._pending[write.key]
        if write.value is not None:
            self._local.apply(write.key, self._service.get(write.key), write.value.entry)

    def _lost_race(self, write: _Write, current: KeyValue | None) -> Exception | None:
        """Another node created the object first: take its definition; the refusal a declare
        with ours would get now (None when they are equivalent)."""
        self._no_echo(write)
        mine = write.value
        assert mine is not None
        winner = self._decoded(mine.kind, current) if current is not None else None
        if winner is None:  # gone again meanwhile: write ours again
            self._issue_definition(mine.kind, mine.entry, home=mine.home, exclusive=mine.exclusive,
                                   ephemeral=write.ephemeral, create_only=True)
            return None
        self._remember(write.key, winner)
        self._local.apply(write.key, winner, mine.entry)
        return self._refusal(mine, winner)

    def _refusal(self, mine: SharedValue, winner: SharedValue) -> AMQPError | None:
        entry = mine.entry
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is None:
            return None
        try:
            if mine.kind == "queues":
                existing = vhost.queues.get(entry["name"])
                if existing is None:
                    return None
                if existing.exclusive != mine.exclusive or winner.exclusive:
                    raise errors.resource_locked(entry["name"], vhost.name)
                equivalence.check_queue(vhost.name, existing, entry["durable"], entry["auto_delete"],
                                        entry["arguments"])
            else:
                exchange = vhost.exchanges.get(entry["name"])
                if exchange is None:
                    return None
                equivalence.check_exchange(vhost.name, exchange, entry["type"], entry["durable"],
                                           entry["auto_delete"], entry["internal"], entry["arguments"])
        except Inequivalent as inequivalent:
            refusal = errors.inequivalent(inequivalent)
        except AMQPError as locked:
            refusal = locked
        else:
            return None
        return refusal.caused_by(*((50, 10) if mine.kind == "queues" else (40, 10)))

    # -- the service out of reach ---------------------------------------------------------------

    def _lost_the_service(self, error: CoordinationUnavailable) -> CoordinationUnavailable:
        """Later writes fail at once, until a probe reaches the service; the error to report."""
        if self._unreachable is None:
            log.error("the coordination service is out of reach (%s): new definitions are refused "
                      "until it answers", error)
            # The client's 541 says what happened, not which endpoint refused which HTTP call
            # (that is in the log line above; a reply text is cut at 255 bytes anyway).
            self._unreachable = CoordinationUnavailable(OUT_OF_REACH)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._wait_for_the_service())
        return self._unreachable

    async def _wait_for_the_service(self) -> None:
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            try:
                await self._coordinator.get(SEEDED_MARKER)
            except CoordinationUnavailable:
                continue
            break
        log.info("the coordination service answers again")
        self._unreachable = None
        retries, self._deletes_to_retry = self._deletes_to_retry, {}
        for key, write in retries.items():
            if self._pending.get(key) is write:
                self._issue(key, None)
        # An ownership key taken again while the service was still out of reach (our session
        # expired meanwhile) was refused with the rest: write it now, or the queue stays "down"
        # on every other node although this node holds it.
        for vhost, queue in list(self._claimed):
            key = owner_key(vhost, queue)
            if self._owners.get(key) != self._node and self._local.holds(vhost, queue):
                self._issue(key, encode_owner(self._node), ephemeral=True)

    # -- following the service ------------------------------------------------------------------

    async def _follow(self, directory: str, revision: int) -> None:
        while True:
            try:
                if not revision:
                    revision = await self._relist(directory)
                known = [key for key in self._known_keys(directory)]
                async for event in self._coordinator.watch(directory, revision, known):
                    revision = event.revision
                    self._on_event(directory, event)
            except HistoryLost:
                revision = 0  # list again and apply the difference
            except CoordinationUnavailable as error:
                log.warning("watch of %s interrupted: %s", directory, error)
                await asyncio.sleep(PROBE_INTERVAL_S)
            except asyncio.CancelledError:
                raise
            except Exception:  # the definitions must never silently stop following
                log.exception("watch of %s failed; listing it again", directory)
                revision = 0
                await asyncio.sleep(PROBE_INTERVAL_S)

    def _known_keys(self, directory: str) -> list[str]:
        if directory == OWNERS:
            return list(self._owners)
        return self._service.keys_in(directory)

    async def _relist(self, directory: str, startup: bool = False) -> int:
        """List `directory` and apply what differs from what we had; its revision."""
        items, revision = await self._coordinator.list(directory)
        listed = {item.key: item for item in items}
        events = [WatchEvent(EventKind.PUT, item.key, item.value, item.revision) for item in items]
        events += [WatchEvent(EventKind.DELETE, key, b"", revision)
                   for key in self._known_keys(directory) if key not in listed]
        for event in events:
            self._on_event(directory, event)
        if startup and directory != OWNERS:
            # What this node holds but the cluster does not (it was down when it went) goes.
            kind = KIND_OF_DIRECTORY[directory]
            if kind in ("exchanges", "queues"):
                self._local.drop_not_shared(kind)
        return revision

    def _on_event(self, directory: str, event: WatchEvent) -> None:
        if directory == OWNERS:
            self._owner_event(event)
            return
        if self._landed_after_refusal and event.key in self._landed_after_refusal and self._undo_if_landed(event):
            return
        kind = KIND_OF_DIRECTORY[directory]
        value = None
        if event.kind is EventKind.PUT:
            value = self._decoded(kind, KeyValue(event.key, event.value, 0, event.revision))
            if value is None:
                return
            if self._service.get(event.key) == value and event.key not in self._pending:
                return  # nothing new (a relist of what we had)
        elif event.key not in self._service and event.key not in self._pending:
            return
        previous = self._service.get(event.key)
        self._remember(event.key, value)
        pending = self._pending.get(event.key)
        if pending is not None:
            if value is None and pending.data is None:
                del self._pending[event.key]  # our deletion (or one just like it) is done
            elif value is not None and value.by == self._writer and value.seq == pending.seq:
                del self._pending[event.key]  # the echo of our own write
            return  # older than our latest change of the key, which decides
        self._local.apply(event.key, value, previous.entry if previous is not None else None)
        if kind != "queues":
            return
        if value is not None and self._local.replicated(value.entry):
            self._name_home_if_held(event.key, value)  # another node's write named it home meanwhile
        entry = (value or previous).entry  # type: ignore[union-attr]
        if previous is None or value is None:  # a new queue, or none: no lapse to remember
            self._lapsed.discard(owner_key(entry["vhost"], entry["name"]))
        if value is None and self._tidies_up(previous.home):  # type: ignore[union-attr]
            # Its bindings' keys go too. The node that deleted a queue deletes them, but a
            # transient queue vanishes with its dead home node's session: one live node does it.
            self._forget_bindings_of((entry["vhost"], "queue", entry["name"]))
        self._tell_owner_listeners(entry["vhost"], entry["name"])

    def _tell_owner_listeners(self, vhost: str, queue: str) -> None:
        for listener in self._owner_listeners:
            try:
                listener(vhost, queue)
            except Exception:
                log.exception("a queue owner listener failed for queue '%s' in vhost '%s'", queue, vhost)

    def _tidies_up(self, dead: str) -> bool:
        """Is this node the one that removes what node `dead` left behind: the first live node
        but that one (its membership may outlive its queues' keys by a moment)?"""
        return min((node for node in self._live_nodes() if node != dead), default=self._node) == self._node

    def _decoded(self, kind: str, item: KeyValue) -> SharedValue | None:
        try:
            return SharedValue.decode(kind, item.value)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring an unreadable shared definition at %s: %s", item.key, error)
            return None

    def _remember(self, key: str, value: SharedValue | None) -> None:
        """Record what the service holds at `key` now."""
        self._service.remember(key, value)

    def _owner_event(self, event: WatchEvent) -> None:
        node = decode_owner(event.value) if event.kind is EventKind.PUT else None
        if self._owners.get(event.key) == node:
            return
        if node is None:
            self._owners.pop(event.key, None)
            self._lapsed.add(event.key)
        else:
            self._owners[event.key] = node
            self._lapsed.discard(event.key)
        vhost_and_queue = self._queue_of_owner_key(event.key)
        if vhost_and_queue is None:
            return
        vhost, queue = vhost_and_queue
        owner = self.owner_of(vhost, queue)
        if node is None and owner is not None and owner.local and self._local.holds(vhost, queue):
            # Our session expired while the service was out of reach: take it again.
            log.warning("ownership of queue '%s' in vhost '%s' lapsed; taking it again", queue, vhost)
            self._set_ownership(vhost, queue, True)
        self._tell_owner_listeners(vhost, queue)

    def _queue_of_owner_key(self, key: str) -> tuple[str, str] | None:
        value = self._service.get(DIRECTORIES["queues"] + key[len(OWNERS):])
        if value is None:
            return None
        return value.entry["vhost"], value.entry["name"]
