"""Applying the cluster's shared definitions to this node (cluster_definitions.py says when).

`LocalDefinitions.apply(key, value)` makes this node's user, vhost, permission, policy, limit, runtime parameter,
exchange, queue or binding at `key` what the coordination service holds there, through the broker's own methods (so
this node's definitions store records it as any change). A queue whose home is this node is a
real queue (its messages, if any, recovered from this node's disk) and this node takes its
ownership; a queue of another node is a stand-in built by the remote-queue factory. What needs an
object that has not arrived yet (a binding before its queue: the service's directories are
watched separately) is parked and applied when that object arrives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cluster.definitions.keys import KIND_OF_DIRECTORY, SharedValue, entry_key
from cluster.definitions.mirror import ServiceMirror
from cluster.replication.replicated_queues import is_replicated
from amqp_server.broker.definitions_export import exchange_definition, queue_definition
from amqp_server.broker.policies import parse_policy
from amqp_server.config.limit_definitions import USER_LIMITS, VHOST_LIMITS, check_limits
from queues.arguments import equivalence
from queues.arguments.equivalence import Inequivalent
from queues.consumer import Consumer
from queues.queue import Queue
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from cluster.replication.replicated_queues import ReplicatedQueues
    from amqp_server.broker.vhost import VirtualHost

log = logging.getLogger(__name__)

# Builds the local stand-in of a queue whose home is another node: (vhost, value) -> queue object.
RemoteQueueFactory = Callable[["VirtualHost", SharedValue], Queue]
# Takes (True) or gives up (False) this node's ownership of (vhost, queue) in the service.
SetOwnership = Callable[[str, str, bool], None]


class _OtherNode:
    """The exclusive owner of an exclusive queue declared on another node: no local connection
    is it, so every local use gets 405 RESOURCE_LOCKED."""

    def __repr__(self) -> str:
        return "<a connection of another node>"


ANOTHER_NODE = _OtherNode()


def shadow_queue(vhost: "VirtualHost", value: SharedValue) -> Queue:
    """The default stand-in of another node's queue: a queue object with the definition and no
    messages of its own (cluster forwarding replaces it with one that reaches the owner)."""
    entry = value.entry
    return Queue(
        entry["name"], vhost.name, durable=entry["durable"], auto_delete=entry["auto_delete"],
        exclusive_owner=ANOTHER_NODE if value.exclusive else None, arguments=entry["arguments"],
        timers=vhost.timers, memory_budget=vhost.memory_budget,
    )


def _moves_with_the_queue(consumer: Consumer) -> bool:
    """A client's consumer moves to the queue's new form. Another node's consumer (on its link:
    the old leader held the queue for that node's stand-in) does not: it is cancelled with the
    old form, and that node's stand-in, replaced in turn, moves its client's consumer itself."""
    return not consumer.sink.connection.is_cluster_link  # type: ignore[attr-defined]


def _move_consumer(consumer: Consumer, queue: Queue) -> None:
    """A consumer of a replicated queue's previous form consumes from `queue`, its form now:
    re-consumed on the new leader through a stand-in, or added to the queue itself. One whose
    channel closed meanwhile is not moved (its channel removed it already)."""
    channel = consumer.sink
    if not channel.is_open:  # type: ignore[attr-defined]
        return
    if queue.home_node:  # the stand-in of a queue another node leads (remote_queue.py)
        queue.reattach(channel, consumer)  # type: ignore[attr-defined]
    else:
        consumer.move_to(queue)
        queue.add_consumer(consumer)


class LocalDefinitions:
    """This node's side of applying shared definitions; see the module docstring."""

    def __init__(self, broker: "Broker", node_name: str, mirror: ServiceMirror,
                 is_pending: Callable[[str], bool], set_ownership: SetOwnership) -> None:
        """`is_pending(key)`: this node has a write of `key` whose echo has not come (its own
        change decides). `set_ownership` writes this node's ownership keys."""
        self._broker = broker
        self._node = node_name
        self._mirror = mirror
        self._is_pending = is_pending
        self._set_ownership = set_ownership
        self._remote_queue_factory: RemoteQueueFactory = shadow_queue
        self._remote_queues: dict[tuple[str, str], Queue] = {}  # stand-ins placed here
        self._parked: dict[str, SharedValue] = {}  # waiting for an object they need
        self._applying = False
        self._replicated: "ReplicatedQueues | None" = None

    @property
    def applying(self) -> bool:
        """A change being applied now comes from the service: it must not be written back."""
        return self._applying

    def set_remote_queue_factory(self, factory: RemoteQueueFactory) -> None:
        self._remote_queue_factory = factory

    def replicate_with(self, replicated: "ReplicatedQueues") -> None:
        """A replicated queue is held here only while its replica here leads its group."""
        self._replicated = replicated

    def replicated(self, entry: dict[str, Any]) -> bool:
        """Is this queue definition a replicated queue's (on this broker)?"""
        return self._replicated is not None and is_replicated(entry)

    def holds(self, vhost_name: str, queue: str) -> bool:
        """This node has the queue itself (not a stand-in)."""
        vhost = self._broker.vhosts.get(vhost_name)
        return vhost is not None and queue in vhost.queues and (vhost_name, queue) not in self._remote_queues

    def forget_stand_in(self, vhost: str, queue: str) -> bool:
        """A local client deleted the queue: was it a stand-in (another node's queue)?"""
        return self._remote_queues.pop((vhost, queue), None) is not None

    def drop_not_shared(self, kind: str) -> None:
        """Remove the exchanges or queues this node has that the service does not."""
        for vhost in list(self._broker.vhosts.values()):
            # Each definition made when its turn comes (after the removals before it), of a
            # snapshot of the names.
            if kind == "exchanges":
                entries = (exchange_definition(vhost.name, exchange) for name, exchange in list(vhost.exchanges.items())
                           if name and not name.startswith("amq."))
            else:
                entries = (queue_definition(vhost.name, queue) for queue in list(vhost.queues.values()))
            for entry in entries:
                key = entry_key(kind, entry)
                if key not in self._mirror:
                    self.apply(key, None, entry)

    def apply(self, key: str, value: SharedValue | None, gone: dict[str, Any] | None = None) -> None:
        """Make this node's object at `key` what the service holds: `value`, or no object (the
        object `gone` describes is removed)."""
        was_applying, self._applying = self._applying, True
        try:
            if value is None:
                self._parked.pop(key, None)
                if gone is not None:
                    _REMOVERS[KIND_OF_DIRECTORY[key.rsplit("/", 1)[0]]](self, gone)
                applied = False
            else:
                applied = _APPLIERS[value.kind](self, key, value)
        except OSError as err:
            # A full or failing disk (the definitions store, a queue's files): one line per
            # definition, not a traceback each, as a node restarted on a full disk replays them all.
            log.error("applying the shared definition %s failed: %s", key, err)
            applied = False
        except Exception:
            log.exception("applying the shared definition %s failed", key)
            applied = False
        finally:
            self._applying = was_applying
        if applied and value is not None and value.kind != "bindings" and self._parked:
            self._retry_parked()

    def _park(self, key: str, value: SharedValue) -> bool:
        """`value` needs an object this node does not have yet: apply it when one arrives."""
        self._parked[key] = value
        return False

    def _retry_parked(self) -> None:
        parked, self._parked = self._parked, {}
        for key, value in parked.items():
            if self._mirror.get(key) is value and not self._is_pending(key):
                self.apply(key, value)

    # users, vhosts, permissions

    def _apply_user(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        self._broker.access.set_user(entry["name"], entry["password_hash"], entry["tags"])
        self._broker.save_definitions()
        return True

    def _remove_user(self, entry: dict[str, Any]) -> None:
        if self._broker.access.user(entry["name"]) is not None:
            self._broker.access.delete_user(entry["name"])
            self._broker.save_definitions()

    def _apply_vhost(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        self._broker.add_vhost(entry["name"])
        self._broker.set_vhost_metadata(entry["name"], entry.get("description", ""), entry.get("tags", []))
        return True

    def _remove_vhost(self, entry: dict[str, Any]) -> None:
        self._broker.delete_vhost(entry["name"])

    def _apply_permission(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        access = self._broker.access
        if access.user(entry["user"]) is None or entry["vhost"] not in self._broker.vhosts:
            return self._park(key, value)
        access.set_permissions(entry["user"], entry["vhost"], entry["configure"], entry["write"], entry["read"])
        self._broker.save_definitions()
        return True

    def _remove_permission(self, entry: dict[str, Any]) -> None:
        self._broker.access.clear_permissions(entry["user"], entry["vhost"])
        self._broker.save_definitions()

    # policies and limits

    def _apply_policy(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is None:
            return self._park(key, value)
        operator = value.kind == "operator_policies"
        vhost.set_policy(parse_policy(entry["vhost"], entry["name"], entry, operator), operator)
        return True

    def _remove_policy(self, entry: dict[str, Any], operator: bool = False) -> None:
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is not None:
            vhost.clear_policy(entry["name"], operator)

    def _remove_operator_policy(self, entry: dict[str, Any]) -> None:
        self._remove_policy(entry, operator=True)

    def _apply_vhost_limits(self, key: str, value: SharedValue) -> bool:
        vhost = self._broker.vhosts.get(value.entry["vhost"])
        if vhost is None:
            return self._park(key, value)
        vhost.set_limits(check_limits(value.entry["value"], VHOST_LIMITS, "vhost limits"))
        return True

    def _remove_vhost_limits(self, entry: dict[str, Any]) -> None:
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is not None:
            vhost.set_limits({})

    def _apply_parameter(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        if entry["vhost"] not in self._broker.vhosts:
            return self._park(key, value)
        # Checked where it was set; set here unchecked, so a node whose component is not
        # started yet still holds it (runtime_parameters.py).
        self._broker.parameters.set(entry["vhost"], entry["component"], entry["name"], entry["value"], validate=False)
        return True

    def _remove_parameter(self, entry: dict[str, Any]) -> None:
        self._broker.parameters.unset(entry["vhost"], entry["component"], entry["name"])

    def _apply_user_limits(self, key: str, value: SharedValue) -> bool:
        user = value.entry["user"]
        if self._broker.access.user(user) is None:
            return self._park(key, value)
        self._broker.set_user_limits(user, check_limits(value.entry["value"], USER_LIMITS, "user limits"))
        return True

    def _remove_user_limits(self, entry: dict[str, Any]) -> None:
        if self._broker.access.user(entry["user"]) is not None:
            self._broker.set_user_limits(entry["user"], {})

    # exchanges

    def _apply_exchange(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is None:
            return self._park(key, value)
        existing = vhost.exchanges.get(entry["name"])
        if existing is not None:
            try:
                equivalence.check_exchange(vhost.name, existing, entry["type"], entry["durable"],
                                           entry["auto_delete"], entry["internal"], entry["arguments"])
                return True
            except Inequivalent:  # deleted and declared again differently elsewhere
                vhost.delete_exchange(entry["name"])
        exchange = vhost.declare_exchange(entry["name"], entry["type"], durable=entry["durable"],
                                          auto_delete=entry["auto_delete"], internal=entry["internal"],
                                          arguments=entry["arguments"])
        self._rebind(vhost, exchange)
        return True

    def _remove_exchange(self, entry: dict[str, Any]) -> None:
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is not None and entry["name"] in vhost.exchanges:
            vhost.delete_exchange(entry["name"])

    # queues

    def _apply_queue(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is None:
            return self._park(key, value)
        name = entry["name"]
        existing = vhost.queues.get(name)
        if self.replicated(entry):
            return self._apply_replicated_queue(vhost, value, existing)
        if existing is not None:
            if self._is_local_form_of(vhost, existing, value):
                return True
            self._remove_queue(entry)
        if value.home != self._node:
            queue = self._remote_queue_factory(vhost, value)
            vhost.adopt_remote_queue(queue)
            self._remote_queues[(vhost.name, name)] = queue
        elif value.exclusive or not entry["durable"]:
            return True  # ours from before a restart: a transient queue did not survive it
        else:
            queue, _created = vhost.declare_queue(
                name, connection=None, durable=True, auto_delete=entry["auto_delete"],
                arguments=entry["arguments"], allow_reserved_name=True,
            )
            self._set_ownership(vhost.name, name, True)
        self._rebind(vhost, queue)
        return True

    def _apply_replicated_queue(self, vhost: "VirtualHost", value: SharedValue, existing: Queue | None) -> bool:
        """The queue itself while this node's replica leads its group, else a stand-in reaching
        its home (the node that last took it)."""
        entry = value.entry
        name = entry["name"]
        assert self._replicated is not None
        leads = self._replicated.leads(vhost.name, name)
        moving: list[Consumer] = []
        if existing is not None:
            stand_in = self._remote_queues.get((vhost.name, name)) is existing
            if leads and not stand_in:
                return True
            if not leads and stand_in and getattr(existing, "owner", value.home) == value.home:
                return True
            if stand_in:
                del self._remote_queues[(vhost.name, name)]
            elif isinstance(existing, StreamQueue):
                existing.hand_over()  # its files stay with its replica
            elif existing.journal is not None:
                # Another node leads it now: our copy goes, the replica (and the group) stay.
                # (A replicated queue's journal: a ReplicatedJournal.)
                existing.journal.hand_over()  # type: ignore[attr-defined]
            # The leader changed, the queue did not: its consumers here go on with its new form,
            # as RabbitMQ keeps a quorum queue's consumers across a leader change (a stream's at
            # the offset they reached: `continuation`).
            moving = [consumer for consumer in existing.consumers() if _moves_with_the_queue(consumer)]
            for consumer in moving:
                continuation = existing.continuation(consumer)
                if continuation is not None:
                    consumer.go_on_with(continuation)
                existing.remove_consumer(consumer)
            vhost.delete_queue(existing)
            if not stand_in:
                self._set_ownership(vhost.name, name, False)
        if leads:
            queue, _created = vhost.declare_queue(
                name, connection=None, durable=True, auto_delete=entry["auto_delete"],
                arguments=entry["arguments"], allow_reserved_name=True,
            )
            self._set_ownership(vhost.name, name, True)
        else:
            queue = self._remote_queue_factory(vhost, value)
            if queue.home_node:
                queue.keep_consumers_across_leader_changes()  # type: ignore[attr-defined]
            vhost.adopt_remote_queue(queue)
            self._remote_queues[(vhost.name, name)] = queue
        self._rebind(vhost, queue)
        for consumer in moving:
            _move_consumer(consumer, queue)
        return True

    def _is_local_form_of(self, vhost: "VirtualHost", queue: Queue, value: SharedValue) -> bool:
        """Is `queue` what this node should hold for `value`?"""
        remote = self._remote_queues.get((vhost.name, queue.name)) is queue
        if remote != (value.home != self._node) or queue.exclusive != value.exclusive:
            return False
        entry = value.entry
        try:
            equivalence.check_queue(vhost.name, queue, entry["durable"], entry["auto_delete"], entry["arguments"])
        except Inequivalent:
            return False
        return True

    def _remove_queue(self, entry: dict[str, Any]) -> None:
        vhost = self._broker.vhosts.get(entry["vhost"])
        name = entry["name"]
        queue = vhost.queues.get(name) if vhost is not None else None
        if vhost is None or queue is None:
            return
        remote = self._remote_queues.pop((vhost.name, name), None) is queue
        vhost.delete_queue(queue)
        if not remote:
            # Another node deleted our queue: our ownership key goes with it.
            self._set_ownership(vhost.name, name, False)

    # bindings

    def _rebind(self, vhost: "VirtualHost", thing: Any) -> None:
        """Apply the service's bindings of a queue or exchange that (re)appeared here."""
        if isinstance(thing, Queue):
            keys = self._mirror.bindings_of((vhost.name, "queue", thing.name))
        else:
            keys = self._mirror.bindings_of((vhost.name, "exchange", thing.name))
            keys |= self._mirror.bindings_of((vhost.name, "source", thing.name))
        for key in keys:
            value = self._mirror.get(key)
            if value is not None and not self._is_pending(key):
                self._parked.pop(key, None)
                self._apply_binding(key, value)

    def _apply_binding(self, key: str, value: SharedValue) -> bool:
        entry = value.entry
        ends = self._binding_ends_here(entry)
        if ends is None:
            return self._park(key, value)
        vhost, source, destination = ends
        vhost.bind(source, destination, entry["routing_key"], entry["arguments"])
        return True

    def _remove_binding(self, entry: dict[str, Any]) -> None:
        ends = self._binding_ends_here(entry)
        if ends is not None:
            vhost, source, destination = ends
            vhost.unbind(source, destination, entry["routing_key"], entry["arguments"])

    def _binding_ends_here(self, entry: dict[str, Any]) -> tuple["VirtualHost", Any, Any] | None:
        vhost = self._broker.vhosts.get(entry["vhost"])
        if vhost is None:
            return None
        source = vhost.exchanges.get(entry["source"])
        pool = vhost.queues if entry["destination_type"] == "queue" else vhost.exchanges
        destination = pool.get(entry["destination"])
        if source is None or destination is None:
            return None
        return vhost, source, destination



_APPLIERS: dict[str, Callable[[LocalDefinitions, str, SharedValue], bool]] = {
    "users": LocalDefinitions._apply_user,
    "vhosts": LocalDefinitions._apply_vhost,
    "permissions": LocalDefinitions._apply_permission,
    "policies": LocalDefinitions._apply_policy,
    "operator_policies": LocalDefinitions._apply_policy,
    "vhost_limits": LocalDefinitions._apply_vhost_limits,
    "user_limits": LocalDefinitions._apply_user_limits,
    "runtime_parameters": LocalDefinitions._apply_parameter,
    "exchanges": LocalDefinitions._apply_exchange,
    "queues": LocalDefinitions._apply_queue,
    "bindings": LocalDefinitions._apply_binding,
}
_REMOVERS: dict[str, Callable[[LocalDefinitions, dict[str, Any]], None]] = {
    "users": LocalDefinitions._remove_user,
    "vhosts": LocalDefinitions._remove_vhost,
    "permissions": LocalDefinitions._remove_permission,
    "policies": LocalDefinitions._remove_policy,
    "operator_policies": LocalDefinitions._remove_operator_policy,
    "vhost_limits": LocalDefinitions._remove_vhost_limits,
    "user_limits": LocalDefinitions._remove_user_limits,
    "runtime_parameters": LocalDefinitions._remove_parameter,
    "exchanges": LocalDefinitions._remove_exchange,
    "queues": LocalDefinitions._remove_queue,
    "bindings": LocalDefinitions._remove_binding,
}
