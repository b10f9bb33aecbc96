"""The broker: vhosts, users and permissions, connections, and the definitions they persist.

This is the object every connection shares. It holds no socket and no event loop, so unit
tests build one and drive connections by feeding bytes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amqp_server.broker.access_control import AccessControl
from amqp_server.broker.alarms import ResourceAlarms
from amqp_server.broker.stats import BrokerStats
from amqp_server.broker.topology_watch import TopologyWatchers
from amqp_server.config.settings import LimitsConfig, ServerConfig
from amqp_server.broker.connection_limits import ConnectionLimit
from amqp_server.wire.errors import AMQPError
from amqp_server.broker.policies import parse_policy
from amqp_server.broker.reply_to import ReplyRegistry
from amqp_server.broker.resource_limits import UserLimits
from amqp_server.broker.runtime_parameters import KIND as PARAMETERS_KIND, RuntimeParameters
from amqp_server.config.limit_definitions import USER_LIMITS, VHOST_LIMITS, LimitError, check_limits
from amqp_server.broker.vhost import OPERATOR_POLICIES, POLICIES, VHOST_LIMITS as VHOST_LIMITS_KIND, VirtualHost
from persistence.definitions import HASHING_ALGORITHM, DefinitionStore, MemoryDefinitionStore
from persistence.group_commit import DirectorySyncs, GroupCommitter
from persistence.queue_store import QueueStore
from persistence.segment_layout import list_queue_directories
from queues.arguments.policy_keys import PolicyError
from persistence.stream_log import StreamLog
from persistence.stream_segment import HEADER_SIZE as STREAM_HEADER_SIZE
from queues.arguments import QueueArguments
from queues.journal import QueueJournal
from queues.stream_queue import StreamQueue
from queues.memory_budget import MemoryBudget
from queues.timers import Timers

if TYPE_CHECKING:
    from amqp_server.broker.cluster_interface import (
        LinkPlacement, Membership, NodeRecord, ReplicatedQueues, SharedDefinitions,
    )
    from amqp_server.broker.ports import BrokerConnection

log = logging.getLogger(__name__)

# The definitions save_definitions compares (the topology, policies and limits are recorded
# change by change).
ACCESS_KINDS = ("users", "vhosts", "permissions")
# Durable settings a cluster shares as they change (the topology is shared by _topology_changed).
SHARED_SETTINGS = ("policies", "operator_policies", "vhost_limits", "user_limits", PARAMETERS_KIND)
USER_LIMITS_KIND = "user_limits"


def _cluster_name(config: ServerConfig) -> str | None:
    if not config.cluster.url:
        return None
    from amqp_server.config.cluster_address import parse_cluster_address

    return parse_cluster_address(config.cluster.url).prefix


class Broker:
    def __init__(
        self,
        config: ServerConfig | None = None,
        store: DefinitionStore | None = None,
        message_dir: Path | None = None,
    ) -> None:
        """`message_dir` enables persistent messages on durable queues (segment files there)."""
        config = config or ServerConfig()
        self.config = config
        self.limits: LimitsConfig = config.limits
        self.max_message_size = config.limits.max_message_size
        self.node_name = config.cluster.node_name or f"amqp-server@{socket.gethostname()}"
        # Every node of a cluster reports the same name: the prefix its keys live under.
        self.cluster_name = _cluster_name(config) or self.node_name
        # What the cluster plug-in registers on joining (cluster_interface.py); None when alone.
        self._membership: "Membership | None" = None
        # The channel class of another node's link connection (it takes forwarded publishes).
        self.link_channel_class: Any = None
        # The cluster's shared definitions (cluster/definitions/shared.py) once joined.
        self._shared: "SharedDefinitions | None" = None
        # Durable quorum queues replicated across the cluster (cluster/replication/) once joined.
        self.replicated: "ReplicatedQueues | None" = None
        # Which node runs each shovel and federation link, once joined (one node, under a lease).
        self._link_placement: "LinkPlacement | None" = None
        self.access = AccessControl.from_config(config)
        self.vhosts: dict[str, VirtualHost] = {}
        # A vhost's description and tags (RabbitMQ's vhost metadata), only for vhosts that have any;
        # kept here, next to the vhost records they are saved in, not in VirtualHost.
        self.vhost_metadata: dict[str, dict[str, Any]] = {}
        self.connections: set[BrokerConnection] = set()
        # Users' max-connections and max-channels (resource_limits.py): made at a user's first
        # connection or limit and kept, so connections are counted before a limit is ever set.
        self._user_limits: dict[str, UserLimits] = {}
        # [limits] max_connections: sockets the whole broker holds (connection_limits.py).
        self.connection_limit = ConnectionLimit("broker", config.limits.max_connections)
        # Memory and disk alarms; ResourceMonitor (alarms.py) measures, connections obey.
        self.alarms = ResourceAlarms(config.limits, lambda: self.connections)
        self.stats = BrokerStats()
        # Components that act on exchanges, queues, bindings and policies (federation).
        self.topology_watchers = TopologyWatchers()
        self.reply_registry = ReplyRegistry()
        self.timers = Timers()
        self.memory_budget = MemoryBudget()
        self.store: DefinitionStore = store or MemoryDefinitionStore()
        self.message_dir = message_dir
        self.committer = GroupCommitter(config.storage.fsync) if message_dir is not None else None
        self.directory_syncs = DirectorySyncs(self.committer) if self.committer is not None else None
        # Every durable queue's store gets these same two callables (see _journal_for): a bound
        # method made per queue is one more object per queue for each full GC pass to scan.
        self._store_dirty = self.committer.request_flush if self.committer is not None else None
        self._store_deleted = self.directory_syncs.sync_later if self.directory_syncs is not None else None
        self.side_files = None
        if message_dir is not None and config.storage.parquet_side_files:
            # Imported only when asked for: it needs pyarrow, which the broker otherwise does not.
            from spark.side_files import SideFileWriter

            self.side_files = SideFileWriter()
        # Runtime parameters (shovels, federation upstreams): stored and shared like policies;
        # the components acting on them register when the runtime starts them.
        self.parameters = RuntimeParameters(on_change=self._definition_changed)
        self._restoring = False
        # Stored durable queues that today's declare rules refuse (made by an older version):
        # kept in the definitions, with their segment files untouched, for an operator to decide.
        self.unrestored_queues: list[dict[str, Any]] = []
        self._restore(config)
        if self.committer is not None:
            # From here on, definition changes are fsynced in the committer's worker thread,
            # in the same rounds as messages (replies wait: when_definitions_durable).
            self.store.sync_with(self.committer)

    # -- vhosts ------------------------------------------------------------------------

    def add_vhost(self, name: str) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            storage = self.config.storage
            vhost = self.vhosts[name] = VirtualHost(
                name,
                on_durable_change=self._definition_changed,
                timers=self.timers,
                journal_factory=self._journal_for if self.committer is not None else None,
                memory_budget=self.memory_budget,
                on_change=self._topology_changed,
                archives_everything=storage.archive or name in storage.archive_vhosts,
                queue_defaults=self.config.queue_defaults,  # [[queue_defaults]] (docs/lifecycle.md)
                on_queue_deleted=self._queue_deleted,
                default_queue_type=self.config.default_queue_type,
                stream_factory=self._stream_for if self.committer is not None else None,
                watchers=self.topology_watchers,
            )
            self.save_definitions()
        return vhost

    def set_vhost_metadata(self, name: str, description: str, tags: list[str]) -> None:
        """Replace the vhost's description and tags (both empty clears them, as RabbitMQ's PUT does)."""
        if description or tags:
            self.vhost_metadata[name] = {"description": description, "tags": list(tags)}
        else:
            self.vhost_metadata.pop(name, None)
        self.save_definitions()

    def delete_vhost(self, name: str) -> None:
        vhost = self.vhosts.pop(name, None)
        if vhost is None:
            return
        self.vhost_metadata.pop(name, None)
        for connection in [c for c in self.connections if c.vhost is vhost]:
            connection.close_by_broker(320, f"vhost '{name}' is deleted")
        vhost.delete_everything()
        self.parameters.forget_vhost(name)
        self.access.forget_vhost(name)
        self.save_definitions()

    # -- users -------------------------------------------------------------------------

    def limits_of(self, user: str) -> UserLimits:
        """The user's limits and what counts against them (none set: no limit)."""
        limits = self._user_limits.get(user)
        if limits is None:
            limits = self._user_limits[user] = UserLimits()
        return limits

    def user_limits(self) -> dict[str, dict[str, int]]:
        """Each user with limits set: their limits (RabbitMQ's "value")."""
        return {user: limits.as_value() for user, limits in self._user_limits.items() if limits.as_value()}

    def set_user_limits(self, user: str, limits: dict[str, int]) -> None:
        """Replace the user's limits (checked by limit_definitions.check_limits); {} lifts them all."""
        current = self.limits_of(user)
        if limits == current.as_value():
            return
        current.replace(limits)
        self._definition_changed(USER_LIMITS_KIND, {"user": user, "value": dict(limits)}, bool(limits))

    def open_channels_of(self, user: object) -> int:
        """Channels open on every connection of `user` (counted only when a channel limit is set)."""
        return sum(len(connection.channels) for connection in self.connections if connection.user is user)

    def delete_user(self, name: str) -> None:
        """Remove a user, their permissions and their limits; KeyError if unknown."""
        self.access.delete_user(name)
        self._user_limits.pop(name, None)
        self.save_definitions()

    def _queue_deleted(self, queue: object) -> None:
        self.stats.queues_deleted += 1

    def _journal_for(self, vhost: str, queue: str, archive: bool,
                     replication: dict[str, Any] | None = None) -> QueueJournal:
        """The journal of a durable queue; `replication`: the arguments of a quorum queue, which
        a clustered broker replicates (cluster_replicated.py)."""
        if replication is not None and self.replicated is not None:
            return self.replicated.journal_for(vhost, queue, lambda: self._store_for(vhost, queue, archive),
                                               replication)
        assert self.committer is not None, "journals are made only with a message directory (journal_factory)"
        return QueueJournal(self._store_for(vhost, queue, archive), self.committer)

    def _stream_for(self, vhost: str, name: str, arguments: dict[str, Any], settings: QueueArguments) -> StreamQueue:
        """A stream of `vhost`, its log opened (and recovered) in the data directory; on a
        clustered broker, a replicated stream over its replica's files (cluster_interface.py)."""
        assert self.message_dir is not None and self.committer is not None
        committer = self.committer
        max_segment_bytes = None
        if settings.stream_max_segment_size_bytes is not None:
            # (0 is a valid argument: every record starts a segment of its own, as near as can be)
            max_segment_bytes = max(settings.stream_max_segment_size_bytes, STREAM_HEADER_SIZE + 1)
        if self.replicated is not None:
            return self.replicated.stream_for(
                vhost, name, arguments, max_segment_bytes,
                lambda log, keeper: StreamQueue(name, vhost, log=log, committer=committer, timers=self.timers,
                                                arguments=arguments, settings=settings, keeper=keeper))
        options: dict[str, Any] = {"committer": committer}
        if max_segment_bytes is not None:
            options["max_segment_bytes"] = max_segment_bytes
        log = StreamLog.open_in(self.message_dir, vhost, name, **options)
        return StreamQueue(name, vhost, log=log, committer=committer, timers=self.timers, arguments=arguments,
                           settings=settings)

    def _store_for(self, vhost: str, queue: str, archive: bool) -> QueueStore:
        assert self.message_dir is not None, "a broker without a message directory has no queue stores"
        storage = self.config.storage
        archive = archive or storage.archive or vhost in storage.archive_vhosts
        return QueueStore.for_queue(
            self.message_dir,
            vhost,
            queue,
            archive=archive,
            on_dirty=self._store_dirty,
            on_deleted=self._store_deleted,
            on_segment_sealed=(
                (lambda path: self.side_files.segment_sealed(path, vhost, queue)) if self.side_files else None
            ),
        )

    def queues_with_files(self) -> list[tuple[str, str]]:
        """(vhost, queue) of every queue directory in the data directory, held here or not."""
        if self.message_dir is None:
            return []
        return [(entry.vhost, entry.queue) for entry in list_queue_directories(self.message_dir)]

    def discard_queue_files(self, vhost: str, queue: str) -> None:
        """Remove the files of a durable queue this node does not hold (in a cluster: deleted
        while this node was down), as its deletion would have: with archiving on, its segments
        move to the archive first. The caller makes sure no queue of this name is held here."""
        store = self._store_for(vhost, queue, archive=False)
        store.recover()
        store.delete()

    def joined_cluster(self, membership: "Membership", link_channel_class: Any) -> None:
        """This node is now a member of a cluster (cluster/node.py); a connection from another
        node gets channels of `link_channel_class`."""
        self._membership = membership
        self.link_channel_class = link_channel_class

    @property
    def clustered(self) -> bool:
        """A member of a cluster (cluster_interface.py), not a node alone."""
        return self._membership is not None

    def replicate_queues(self, replicated: "ReplicatedQueues") -> None:
        """From now on durable quorum queues declared here are replicated."""
        self.replicated = replicated

    def place_links(self, placement: "LinkPlacement") -> None:
        """From now on each shovel and federation link runs on the node `placement` says."""
        self._link_placement = placement

    @property
    def link_placement(self) -> "LinkPlacement | None":
        """Where shovels and federation links run on a cluster (None alone: here)."""
        return self._link_placement

    def share_definitions(self, shared: "SharedDefinitions") -> None:
        """From now on every definition change is shared with the cluster, and a method's reply
        waits until the coordination service committed it."""
        self._shared = shared

    def queue_location(self, vhost: str, queue: str) -> tuple[str, bool]:
        """The node holding the queue's messages, and whether it is up (always this node, up,
        when running alone)."""
        owner = self._shared.owner_of(vhost, queue) if self._shared is not None else None
        if owner is None:
            return self.node_name, True
        return owner.node, owner.live

    def other_live_nodes(self) -> list["NodeRecord"]:
        """The cluster's other live nodes; none when running alone."""
        if self._membership is None:
            return []
        return [node for node in self._membership.live_nodes() if node.name != self.node_name]

    async def close(self) -> None:
        """Write out and fsync every journal, then stop the fsync worker."""
        if self.committer is None:
            return
        journals = [journal for vhost in self.vhosts.values() for journal in vhost.journals()]
        streams = [queue for vhost in self.vhosts.values() for queue in vhost.queues.values()
                   if isinstance(queue, StreamQueue)]
        for journal in journals:
            journal.store.flush()
        for stream in streams:
            stream.log.flush()
        await self.committer.idle()
        self.store.close()
        for stream in streams:
            try:
                stream.close()
            except OSError:
                log.exception("closing the log of stream %s failed", stream.name)
        for journal in journals:
            try:
                journal.close()
            except OSError:
                log.exception("closing the journal of queue %s failed", journal.store.queue)
        self.committer.close()
        if self.side_files is not None:
            self.side_files.close()

    # -- connections -------------------------------------------------------------------

    def connection_opened(self, connection: "BrokerConnection") -> None:
        self.connections.add(connection)
        self.stats.connections_opened += 1

    def connection_closed(self, connection: "BrokerConnection", moved: bool = False) -> None:
        """`moved`: its socket went to another worker of this host (amqp_server/runtime/handover.py),
        where it goes on: it leaves this worker without counting as closed."""
        if connection in self.connections:
            self.connections.discard(connection)
            if not moved:
                self.stats.connections_closed += 1

    def connection_replayed(self, connection: "BrokerConnection") -> None:
        """`connection` was replayed here from a sibling worker's socket (amqp_server/runtime/handover.py),
        which counted it and its channels as opened: one client moving between workers is one
        connection opened and one closed across them, not churn."""
        self.stats.uncount_opening(1 if connection in self.connections else 0, len(connection.channels))

    # -- definitions -------------------------------------------------------------------

    def _restore(self, config: ServerConfig) -> None:
        """Stored definitions first, then the config file's users, vhosts and permissions on top."""
        self._restoring = True
        # A cluster node takes its definitions from the cluster when it joins (its own store
        # only seeds an empty cluster): here it starts from its configuration alone.
        clustered = bool(config.cluster.url)
        try:
            stored = self.store.load() if not clustered else {}
            for user in stored.get("users", []):
                if self.access.user(user["name"]) is None:
                    tags = user.get("tags") or []
                    self.access.add_user(user["name"], user["password_hash"], tags)
            for vhost in stored.get("vhosts", []):
                self.add_vhost(vhost["name"])
                self.set_vhost_metadata(vhost["name"], vhost.get("description", ""), vhost.get("tags", []))
            for name in config.vhosts:
                self.add_vhost(name)
            self._restore_policies(stored)
            configured = {(p.user, p.vhost) for p in config.permissions}
            for permission in stored.get("permissions", []):
                key = (permission["user"], permission["vhost"])
                if key not in configured and self.access.user(permission["user"]) and permission["vhost"] in self.vhosts:
                    self.access.set_permissions(
                        permission["user"], permission["vhost"],
                        permission["configure"], permission["write"], permission["read"],
                    )
            self._restore_topology(stored)
            # After the topology: a queue limit lowered below the queues a vhost has must not
            # keep them from coming back.
            self._restore_limits(stored)
            self._restore_parameters(stored)
        finally:
            self._restoring = False
        # One full comparison at startup: what could not be restored (a binding with a missing
        # end) leaves the store, and the configuration's users and vhosts enter it.
        if not clustered:
            self.store.save(self.definitions())

    def _restore_policies(self, stored: dict[str, Any]) -> None:
        """Before the topology, so restored queues and exchanges start under their policies."""
        for kind, operator in ((POLICIES, False), (OPERATOR_POLICIES, True)):
            for entry in stored.get(kind, []):
                vhost = self.vhosts.get(entry["vhost"])
                if vhost is None:
                    continue
                try:
                    vhost.set_policy(parse_policy(entry["vhost"], entry["name"], entry, operator), operator)
                except PolicyError as error:  # written by a version that took what this one refuses
                    label = "operator policy" if operator else "policy"
                    log.error("stored %s '%s' in vhost '%s' was not restored: %s",
                              label, entry["name"], entry["vhost"], error)

    def _restore_limits(self, stored: dict[str, Any]) -> None:
        for entry in stored.get(VHOST_LIMITS_KIND, []):
            vhost = self.vhosts.get(entry["vhost"])
            try:
                if vhost is not None:
                    vhost.set_limits(check_limits(entry["value"], VHOST_LIMITS, "vhost limits"))
            except LimitError as error:
                log.error("stored limits of vhost '%s' were not restored: %s", entry["vhost"], error)
        for entry in stored.get(USER_LIMITS_KIND, []):
            try:
                if self.access.user(entry["user"]) is not None:
                    self.set_user_limits(entry["user"], check_limits(entry["value"], USER_LIMITS, "user limits"))
            except LimitError as error:
                log.error("stored limits of user '%s' were not restored: %s", entry["user"], error)

    def _restore_parameters(self, stored: dict[str, Any]) -> None:
        """Kept as stored (they were checked when set); each component takes its own when it
        registers."""
        for entry in stored.get(PARAMETERS_KIND, []):
            if entry["vhost"] in self.vhosts:
                self.parameters.set(entry["vhost"], entry["component"], entry["name"], entry["value"], validate=False)

    def _restore_topology(self, stored: dict[str, Any]) -> None:
        for exchange in stored.get("exchanges", []):
            vhost = self.vhosts.get(exchange["vhost"])
            if vhost is None or exchange["name"] in vhost.exchanges:
                continue
            vhost.declare_exchange(
                exchange["name"], exchange["type"], durable=True,
                auto_delete=exchange.get("auto_delete", False), internal=exchange.get("internal", False),
                arguments=exchange.get("arguments") or {},
            )
        for queue in stored.get("queues", []):
            vhost = self.vhosts.get(queue["vhost"])
            if vhost is None or queue["name"] in vhost.queues:
                continue
            try:
                vhost.declare_queue(
                    queue["name"], connection=None, durable=True,
                    auto_delete=queue.get("auto_delete", False), arguments=queue.get("arguments") or {},
                    allow_reserved_name=True,  # a durable server-named queue (amq.gen-…) comes back too
                )
            except AMQPError as error:  # one stored queue must not stop the broker from starting
                log.error(
                    "durable queue '%s' in vhost '%s' was not restored: %s; its definition and messages are kept",
                    queue["name"], queue["vhost"], error.reply_text,
                )
                self.unrestored_queues.append(queue)
        for binding in stored.get("bindings", []):
            vhost = self.vhosts.get(binding["vhost"])
            if vhost is None:
                continue
            source = vhost.exchanges.get(binding["source"])
            pool = vhost.queues if binding["destination_type"] == "queue" else vhost.exchanges
            destination = pool.get(binding["destination"])
            if source is None or destination is None:
                log.warning("dropping stored binding with a missing end: %s", binding)
                continue
            vhost.bind(source, destination, binding["routing_key"], binding.get("arguments") or {})

    def definitions(self) -> dict[str, Any]:
        """Every durable definition in RabbitMQ's export shape."""
        exported = self.access_definitions()
        exported.update(queues=[], exchanges=[], bindings=[])
        exported.update({POLICIES: [], OPERATOR_POLICIES: [], VHOST_LIMITS_KIND: [], USER_LIMITS_KIND: []})
        for vhost in self.vhosts.values():
            for key, entries in vhost.durable_definitions().items():
                exported[key].extend(entries)
            exported[POLICIES].extend(policy.as_json() for policy in vhost.policies)
            exported[OPERATOR_POLICIES].extend(policy.as_json() for policy in vhost.operator_policies)
            if vhost.limits.as_value():
                exported[VHOST_LIMITS_KIND].append({"vhost": vhost.name, "value": vhost.limits.as_value()})
        exported[USER_LIMITS_KIND] = [{"user": user, "value": value} for user, value in self.user_limits().items()]
        exported[PARAMETERS_KIND] = self.parameters.definitions()
        exported["queues"].extend(self.unrestored_queues)
        return exported

    def access_definitions(self) -> dict[str, Any]:
        """Users, vhosts (with their metadata) and permissions in RabbitMQ's export shape."""
        return {
            "users": [
                {"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": HASHING_ALGORITHM, "tags": list(u.tags)}
                for u in self.access.users()
            ],
            "vhosts": [{"name": name, **self.vhost_metadata.get(name, {})} for name in self.vhosts],
            "permissions": [
                {"user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write, "read": p.read}
                for p in self.access.permissions()
            ],
        }

    def save_definitions(self) -> None:
        """Record changes to users, vhosts (with their metadata) and permissions.

        Exchanges, queues and bindings are recorded one change at a time as they happen
        (_definition_changed), so this compares only the small access definitions. Removing
        a vhost removes its topology from the store too."""
        if self._restoring:
            return
        access = self.access_definitions()
        self.store.save(access, ACCESS_KINDS)
        if self._shared is not None:
            self._shared.access_changed(access)

    def _definition_changed(self, kind: str, entry: dict[str, Any], present: bool) -> None:
        if self._restoring:
            return
        if present:
            self.store.put(kind, entry)
        else:
            self.store.remove(kind, entry)
        if self._shared is not None and kind in SHARED_SETTINGS:  # the topology comes by _topology_changed
            self._shared.changed(kind, entry, present)

    def _topology_changed(self, kind: str, entry: dict[str, Any], present: bool) -> None:
        if self._shared is not None and not self._restoring:
            self._shared.changed(kind, entry, present)

    @property
    def definitions_failure(self) -> str:
        """What a refused reply says when definition changes could not be stored."""
        return "could not write definitions to disk" if self._shared is None else "could not commit definitions"

    @property
    def definition_changes(self) -> int:
        """Grows with every change a method makes to definitions (in a cluster: to the shared
        ones); compare before and after a method, and pass the first to wait for its changes."""
        return self.store.changes if self._shared is None else self._shared.changes

    def when_definitions_durable(self, callback: "DefinitionsCallback", since: int | None = None) -> None:
        """Call ``callback(error)`` once every definition change so far is on disk and, in a
        cluster, committed in the coordination service. The error is an OSError, or for the
        changes made after ``since`` (a ``definition_changes`` value) the AMQPError a lost
        declare race gets (cluster_definitions.py)."""
        if self._shared is None:
            self.store.when_durable(callback)
            return
        waiting = _BothDone(callback)
        self.store.when_durable(waiting.one_done)
        self._shared.when_committed(self._shared.changes if since is None else since, waiting.one_done)

    async def definitions_durable(self, since: int | None = None) -> None:
        """Return once every definition change so far is durable (and committed, in a cluster);
        raise its error (see when_definitions_durable)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def durable(error: Exception | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        self.when_definitions_durable(durable, since)
        await done


DefinitionsCallback = Callable[[Exception | None], None]


class _BothDone:
    """Calls back once both the local store and the cluster reported, with the first error."""

    __slots__ = ("_callback", "_left", "_error")

    def __init__(self, callback: DefinitionsCallback) -> None:
        self._callback = callback
        self._left = 2
        self._error: Exception | None = None

    def one_done(self, error: Exception | None) -> None:
        if self._error is None:
            self._error = error
        self._left -= 1
        if not self._left:
            self._callback(self._error)
