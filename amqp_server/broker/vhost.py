"""A virtual host: its exchanges, queues and bindings.

Every declare, delete and bind goes through here, so the RabbitMQ rules (reserved names,
exclusivity, auto-delete) are applied in one place; the rules for redeclaring and the checks of
x-arguments are queues/arguments/. Routing across the vhost is routing.py, dead-lettering queues/dead_letter.py,
delayed exchanges' held messages queues/delays/, the definitions export definitions_export.py.
Permissions are the channel's job: this module knows nothing about users.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any, cast

from exchanges import InvalidBindingArguments, UnknownExchangeType, create_exchange
from exchanges.delayed import DelayedMessageExchange, InvalidDelayedType
from exchanges.federation_upstream import InvalidFederationUpstream
from exchanges.exchange import Exchange
from queues import dead_letter
from queues.arguments import InvalidArgument, QueueArguments, equivalence, queue_type_rules
from queues.arguments.equivalence import Inequivalent
from queues.arguments.queue_defaults import QueueDefault, defaults_for
from queues.delays.delayed_exchange import hold_delayed_messages
from queues.journal import QueueJournal
from queues.message import Message, QueueEntry
from queues.memory_budget import MemoryBudget
from queues.queue import Queue
from queues.queue_stats import QueueStats
from queues.timers import Timers

from amqp_server.wire import errors
from amqp_server.broker import policy_application
from amqp_server.broker.definitions_export import (
    binding_definition,
    durable_definitions,
    exchange_definition,
    is_stored_binding,
    is_stored_exchange,
    is_stored_queue,
    queue_definition,
)
from amqp_server.wire.errors import AMQPError
from amqp_server.broker.policies import Policy, PolicySet
from amqp_server.broker.resource_limits import VhostLimits
from amqp_server.broker.routing import route_into
from amqp_server.broker.topology_watch import TopologyWatchers

log = logging.getLogger(__name__)

DEFAULT_EXCHANGE = ""
# Predeclared in every vhost, as RabbitMQ does (rabbit_vhost.erl).
# on_durable_change(kind, entry, present): see VirtualHost.
DefinitionChanged = Callable[[str, dict[str, Any], bool], None]
# The definition-store kinds of a vhost's policies, operator policies and limits.
POLICIES = "policies"
OPERATOR_POLICIES = "operator_policies"
VHOST_LIMITS = "vhost_limits"
STANDARD_EXCHANGES = (
    ("amq.direct", "direct", False),
    ("amq.fanout", "fanout", False),
    ("amq.topic", "topic", False),
    ("amq.headers", "headers", False),
    ("amq.match", "headers", False),
    ("amq.rabbitmq.trace", "topic", True),
)
class VirtualHost:
    """The exchanges, queues and bindings of one vhost, its policies and its limits.

    `on_durable_change(kind, entry, present)` is called after each change to a durable
    definition ("queues", "exchanges", "bindings", "policies", "operator_policies" or
    "vhost_limits"; the entry in the definition store's shape; present False when it was
    removed), so the broker can record just that change in its definition store. Removing a
    queue or exchange also removes its bindings there.
    `on_change` is called the same way for every exchange, queue and binding, durable or not
    (not for the default and amq.* exchanges, which every vhost has): a cluster shares them all.
    """

    def __init__(
        self,
        name: str,
        on_durable_change: DefinitionChanged | None = None,
        timers: Timers | None = None,
        journal_factory: Callable[..., QueueJournal] | None = None,
        memory_budget: MemoryBudget | None = None,
        on_change: DefinitionChanged | None = None,
        archives_everything: bool = False,
        queue_defaults: list[QueueDefault] | None = None,
        on_queue_deleted: Callable[[Queue], None] | None = None,
        default_queue_type: str = "classic",
        stream_factory: Callable[..., Queue] | None = None,
        watchers: TopologyWatchers | None = None,
    ) -> None:
        """`journal_factory(vhost, queue, archive)` gives durable queues their journal (None: no
        persistence; a quorum queue's call adds its arguments: a clustered broker replicates it); `archive` is the queue's x-archive (its own or a policy's);
        `archives_everything` says the configuration archives every queue of this vhost;
        `queue_defaults` are the configuration's [[queue_defaults]] (docs/lifecycle.md);
        `on_queue_deleted` is called for every queue removed, whatever removed it;
        `default_queue_type` is the configuration's: what a client's durable shared queue declared
        without x-queue-type becomes (queue_type_rules.with_implied_type);
        `stream_factory(vhost, name, arguments, settings)` makes a stream (queues/stream_queue.py) with
        its log in the data directory (None: no data directory, so no streams);
        `watchers` hear every change of exchanges, queues, bindings and policies (topology_watch.py)."""
        self.name = name
        self.archives_everything = archives_everything
        # Policies and operator policies (policies.py); policy_application.py applies them.
        self.policies = PolicySet()
        self.operator_policies = PolicySet()
        self.limits = VhostLimits()
        self.journal_factory = journal_factory
        self.stream_factory = stream_factory
        self.memory_budget = memory_budget if memory_budget is not None else MemoryBudget()
        self.timers = timers if timers is not None else Timers()
        # The firehose (amq.rabbitmq.trace) when tracing is on for this vhost; see amqp_server/broker/firehose.py.
        self.firehose: Any = None
        # Counters of deleted queues, so vhost-wide totals never go backwards.
        self.retired_queue_stats = QueueStats()
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.on_durable_change: DefinitionChanged = on_durable_change or (lambda kind, entry, present: None)
        self._on_change = on_change
        # [[queue_defaults]] of the configuration: lifecycle x-arguments by queue-name pattern.
        self.queue_defaults: list[QueueDefault] = queue_defaults if queue_defaults is not None else []
        # Called for every queue removed, whatever removed it (delete, auto-delete, x-expires...).
        self.on_queue_deleted: Callable[[Queue], None] = on_queue_deleted or (lambda queue: None)
        self.default_queue_type = default_queue_type
        self._watchers = watchers if watchers is not None else TopologyWatchers()
        # destination (queue or exchange) -> {source exchange: number of bindings}, for cleanup on delete.
        self._bound_to: dict[object, dict[Exchange, int]] = {}
        # The callbacks every queue of this vhost gets, made once: a bound method made per queue
        # is one more object per queue for each full garbage collection to scan.
        self._delete_queue_callback = self.delete_queue
        self._dead_letter_callback = self.dead_letter
        self.default_exchange = create_exchange("direct", DEFAULT_EXCHANGE, durable=True)
        self.exchanges[DEFAULT_EXCHANGE] = self.default_exchange
        for exchange_name, type_name, internal in STANDARD_EXCHANGES:
            self.exchanges[exchange_name] = create_exchange(
                type_name, exchange_name, durable=True, internal=internal
            )

    # -- lookups -----------------------------------------------------------------------

    def exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise errors.not_found("exchange", name, self.name)
        return exchange

    def queue(self, name: str, connection: object | None = None) -> Queue:
        """The queue named `name`; 404 if missing, 405 if another connection owns it exclusively."""
        queue = self.queues.get(name)
        if queue is None:
            raise errors.not_found("queue", name, self.name)
        if connection is not None and queue.exclusive_owner not in (None, connection):
            raise errors.resource_locked(name, self.name)
        return queue

    # -- exchanges ---------------------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type_name: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        if name == DEFAULT_EXCHANGE:
            raise errors.default_exchange_refused()
        if passive:
            return self.exchange(name)
        arguments = arguments or {}
        existing = self.exchanges.get(name)
        if existing is not None:
            try:
                equivalence.check_exchange(self.name, existing, type_name, durable, auto_delete, internal, arguments)
            except Inequivalent as refusal:
                raise errors.inequivalent(refusal) from None
            return existing
        if name.startswith("amq."):
            raise errors.reserved_prefix("exchange", name)
        try:
            exchange = create_exchange(
                type_name, name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
            )
        except UnknownExchangeType as error:
            raise AMQPError(errors.COMMAND_INVALID, f"unknown exchange type '{error.type_name}'") from None
        except (InvalidDelayedType, InvalidFederationUpstream) as error:
            raise AMQPError(errors.PRECONDITION_FAILED, str(error)) from None
        if isinstance(exchange, DelayedMessageExchange):
            hold_delayed_messages(self, exchange)
        policy_application.apply_to_exchange(self, exchange)
        self.exchanges[name] = exchange
        self._changed("exchanges", exchange_definition(self.name, exchange), True, is_stored_exchange(exchange))
        if self._watchers:
            self._watchers.exchange_added(self, exchange)
        return exchange

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        if name == DEFAULT_EXCHANGE:
            raise errors.default_exchange_refused()
        if name.startswith("amq.") and name in self.exchanges:
            raise AMQPError(
                errors.ACCESS_REFUSED, f"deletion of system {errors.resource('exchange', name, self.name)} not allowed"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.binding_count():
            raise AMQPError(errors.PRECONDITION_FAILED, f"{errors.resource('exchange', name, self.name)} in use")
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        if isinstance(exchange, DelayedMessageExchange):
            exchange.pending.delete()
        for destination, _key, _args in exchange.bindings():
            self._bound_to.get(destination, {}).pop(exchange, None)
        # Bindings where this exchange is the destination go too.
        for source in self._bound_to.pop(exchange, {}):
            self._unbind_destination(source, exchange)
            self._maybe_auto_delete_exchange(source)
        self._changed("exchanges", exchange_definition(self.name, exchange), False, is_stored_exchange(exchange))
        if self._watchers:
            self._watchers.exchange_removed(self, exchange)

    def journals(self) -> list[QueueJournal]:
        """Every journal this vhost writes: its durable queues' and its delayed exchanges'."""
        found = [queue.journal for queue in self.queues.values() if queue.journal is not None]
        found.extend(
            exchange.pending.journal
            for exchange in self.exchanges.values()
            if isinstance(exchange, DelayedMessageExchange) and exchange.pending.journal is not None
        )
        return found

    def delete_everything(self) -> None:
        """The vhost is being deleted: remove its queues and delayed exchanges, files included."""
        for queue in list(self.queues.values()):
            self.delete_queue(queue)
        for exchange in list(self.exchanges.values()):
            if isinstance(exchange, DelayedMessageExchange):
                self._remove_exchange(exchange)

    # -- queues ------------------------------------------------------------------------

    def use_firehose(self, firehose: Any) -> None:
        """Trace with `firehose` from now on, or stop tracing (None); see firehose.set_tracing."""
        self.firehose = firehose

    def declare_queue(
        self,
        name: str,
        *,
        connection: object,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        allow_reserved_name: bool = False,
        server_named: bool = False,
        by_client: bool = False,
    ) -> tuple[Queue, bool]:
        """Declare (or check) a queue; returns the queue and whether it was created.

        A new queue's type may refuse its properties or arguments (queues/arguments/queue_type_rules.py);
        `server_named` says the client left the name to the broker, which a quorum queue refuses.
        `by_client`: a client's declaration (AMQP, the HTTP API, a definitions import), whose omitted
        x-queue-type is filled in first (queue_type_rules.with_implied_type); a stored or cluster
        definition already carries the type it was given, so it is taken as it is.
        """
        if passive:
            queue = self.queue(name, connection)
            queue.touch()  # RabbitMQ counts a passive declare as use: it restarts x-expires
            return queue, False
        arguments = arguments or {}
        if name.startswith("amq.") and not allow_reserved_name:
            raise errors.reserved_prefix("queue", name)
        existing = self.queues.get(name)
        if by_client and not (server_named and existing is None):  # a server-named queue stays classic
            arguments = queue_type_rules.with_implied_type(
                arguments, existing.arguments.get("x-queue-type") if existing is not None else None,
                durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                default_queue_type=self.default_queue_type, exists=existing is not None,
            )
        if existing is not None:
            if existing.exclusive_owner not in (None, connection) or existing.exclusive != exclusive:
                raise errors.resource_locked(name, self.name)
            try:
                equivalence.check_queue(self.name, existing, durable, auto_delete, arguments)
            except Inequivalent as refusal:
                raise errors.inequivalent(refusal) from None
            existing.touch()
            return existing, False
        # RabbitMQ checks the vhost's queue limit before the new queue's arguments.
        self.limits.check_new_queue(name, self.name, len(self.queues))
        defaults = defaults_for(self.queue_defaults, self.name, name) if self.queue_defaults else None
        if server_named:
            named_refusal = queue_type_rules.server_named_refusal({**(defaults or {}), **arguments})
            if named_refusal is not None:
                raise AMQPError(errors.PRECONDITION_FAILED, named_refusal)
        resource = errors.resource("queue", name, self.name)
        try:
            settings = QueueArguments.parse(arguments, defaults)
        except InvalidArgument as error:
            raise AMQPError(errors.PRECONDITION_FAILED, error.describe(resource)) from None
        refused = queue_type_rules.refused_property(
            settings.queue_type, durable=durable, exclusive=exclusive, auto_delete=auto_delete
        )
        if refused is not None:
            raise AMQPError(errors.PRECONDITION_FAILED, f"invalid property '{refused}' for {resource}")
        settings, archive = policy_application.queue_settings(self, name, arguments, settings)
        if settings.queue_type == queue_type_rules.STREAM:
            queue = self._new_stream(name, arguments, settings, resource)
        else:
            queue = self._new_queue(name, durable, exclusive, auto_delete, arguments, settings, defaults, archive,
                                    connection)
        recovered = queue.recover()
        if recovered:
            log.info("recovered %d messages of %s", recovered, errors.resource("queue", name, self.name))
        queue.when_unused(self._delete_queue_callback)
        self.queues[name] = queue
        self._changed("queues", queue_definition(self.name, queue), True, is_stored_queue(queue))
        if self._watchers:
            self._watchers.queue_added(self, queue)
        return queue, True

    def _new_queue(self, name: str, durable: bool, exclusive: bool, auto_delete: bool, arguments: dict[str, Any],
                   settings: QueueArguments, defaults: dict[str, Any] | None, archive: bool,
                   connection: Any) -> Queue:
        """A classic or quorum queue; a shared durable one gets its journal."""
        # Exclusive queues die with their connection, so only shared durable queues keep files.
        journal = None
        if durable and not exclusive and self.journal_factory is not None:
            if queue_type_rules.rules_for(settings.queue_type).replicated:  # on a clustered broker
                journal = self.journal_factory(self.name, name, archive, arguments)
            else:
                journal = self.journal_factory(self.name, name, archive)
        return Queue(
            name,
            self.name,
            durable=durable,
            exclusive_owner=connection if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
            timers=self.timers,
            dead_letterer=self._dead_letter_callback,
            journal=journal,
            memory_budget=self.memory_budget,
            defaults=defaults,
            settings=settings,
        )

    def _new_stream(self, name: str, arguments: dict[str, Any], settings: QueueArguments, resource: str) -> Queue:
        """A stream, with its log under the data directory."""
        if self.stream_factory is None:
            raise AMQPError(errors.PRECONDITION_FAILED, f"cannot declare {resource}: streams need a data directory")
        return self.stream_factory(self.name, name, arguments, settings)

    def adopt_remote_queue(self, queue: Queue) -> None:
        """Hold the stand-in of a queue another node of the cluster owns (cluster_definitions.py
        places it, cluster_links.py makes it), in place of any queue of that name here. Its
        definition is the cluster's: nothing is recorded here, now or when it goes
        (delete_queue). A stand-in already there is replaced (with its bindings: the caller
        binds the new one); a queue of this node never is (ValueError): its messages are here."""
        existing = self.queues.get(queue.name)
        if existing is not None:
            if not existing.home_node:
                raise ValueError(f"{queue!r}: this node owns a queue of that name")
            self.delete_queue(existing)
        self.queues[queue.name] = queue
        if self._watchers:
            self._watchers.queue_added(self, queue)

    def delete_queue(self, queue: Queue) -> None:
        """Remove a queue, its bindings and its consumers (who are told by their channels)."""
        if self.queues.get(queue.name) is not queue:
            return
        del self.queues[queue.name]
        self.retired_queue_stats.add(queue.stats)
        self.on_queue_deleted(queue)
        for consumer in queue.delete():
            consumer.sink.consumer_cancelled(consumer)
        for source in self._bound_to.pop(queue, {}):
            self._unbind_destination(source, queue)
            self._maybe_auto_delete_exchange(source)
        stored = is_stored_queue(queue) and not queue.home_node
        self._changed("queues", queue_definition(self.name, queue), False, stored)
        if self._watchers:
            self._watchers.queue_removed(self, queue)

    def _unbind_destination(self, source: Exchange, destination: Queue | Exchange) -> None:
        """Remove every binding of `source` to `destination`, which is being deleted."""
        removed = source.bindings_to(destination) if self._watchers else ()
        source.unbind_destination(destination)
        for routing_key, arguments in removed:
            self._watchers.binding_removed(self, source, destination, routing_key, arguments)

    # -- policies and limits -----------------------------------------------------------

    def set_policy(self, policy: Policy, operator: bool = False) -> None:
        """Add or replace a policy (an operator policy); every queue and exchange takes what
        is in force now, in place."""
        policies = self.operator_policies if operator else self.policies
        if policies.put(policy):
            self.on_durable_change(OPERATOR_POLICIES if operator else POLICIES, policy.as_json(), True)
            policy_application.reapply(self)
            if self._watchers:
                self._watchers.policies_changed(self)

    def clear_policy(self, name: str, operator: bool = False) -> bool:
        """Remove a policy (an operator policy); False when there was none of that name."""
        removed = (self.operator_policies if operator else self.policies).remove(name)
        if removed is None:
            return False
        self.on_durable_change(OPERATOR_POLICIES if operator else POLICIES, removed.as_json(), False)
        policy_application.reapply(self)
        if self._watchers:
            self._watchers.policies_changed(self)
        return True

    def set_limits(self, limits: dict[str, int]) -> None:
        """Replace the vhost's limits (checked by limit_definitions.check_limits); {} lifts them all."""
        if limits == self.limits.as_value():
            return
        self.limits.replace(limits)
        self.on_durable_change(VHOST_LIMITS, {"vhost": self.name, "value": dict(limits)}, bool(limits))

    # -- bindings ----------------------------------------------------------------------

    def bind(self, source: Exchange, destination: Queue | Exchange, routing_key: str, arguments: dict[str, Any]) -> None:
        if source is self.default_exchange:
            raise errors.default_exchange_refused()
        try:
            created = source.bind(destination, routing_key, arguments)
        except InvalidBindingArguments as error:
            raise AMQPError(errors.PRECONDITION_FAILED, str(error)) from None
        if created:
            sources = self._bound_to.setdefault(destination, {})
            sources[source] = sources.get(source, 0) + 1
            self._changed("bindings", binding_definition(self.name, source, destination, routing_key, arguments),
                          True, is_stored_binding(source, destination))
            if self._watchers:
                self._watchers.binding_added(self, source, destination, routing_key, arguments)

    def unbind(self, source: Exchange, destination: Queue | Exchange, routing_key: str, arguments: dict[str, Any]) -> None:
        if source is self.default_exchange:
            raise errors.default_exchange_refused()
        if not source.unbind(destination, routing_key, arguments):
            return
        self._forget_binding(destination, source)
        self._changed("bindings", binding_definition(self.name, source, destination, routing_key, arguments),
                      False, is_stored_binding(source, destination))
        if self._watchers:
            self._watchers.binding_removed(self, source, destination, routing_key, arguments)
        self._maybe_auto_delete_exchange(source)

    def _changed(self, kind: str, entry: dict[str, Any], present: bool, stored: bool) -> None:
        if stored:
            self.on_durable_change(kind, entry, present)
        if self._on_change is not None and (kind != "exchanges" or not entry["name"].startswith("amq.")):
            self._on_change(kind, entry, present)

    def _forget_binding(self, destination: object, source: Exchange) -> None:
        sources = self._bound_to.get(destination)
        if sources is None or source not in sources:
            return
        sources[source] -= 1
        if not sources[source]:
            del sources[source]
            if not sources:
                del self._bound_to[destination]

    def _maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        if exchange.auto_delete and not exchange.binding_count() and self.exchanges.get(exchange.name) is exchange:
            self._remove_exchange(exchange)

    def bindings(self) -> list[tuple[Exchange, Queue | Exchange, str, dict[str, Any]]]:
        """Every explicit binding (the default exchange's implicit ones are not listed)."""
        # (a vhost binds only its queues and exchanges: bind() takes nothing else)
        return [
            (exchange, cast("Queue | Exchange", destination), key, args)
            for exchange in self.exchanges.values()
            if exchange is not self.default_exchange
            for destination, key, args in exchange.bindings()
        ]

    # -- routing -----------------------------------------------------------------------

    def route(self, exchange: Exchange, message: Message, routing_keys: Collection[str] | None = None) -> Collection[Queue]:
        """The queues a message published to `exchange` reaches (routing.py says how).

        `routing_keys` replaces the message's key (sender-selected CC/BCC). A message with a
        positive x-delay that reaches an x-delayed-message exchange gets that exchange's
        DelayedMessages instead (it publishes like a queue).
        """
        if routing_keys is None:
            if exchange is self.default_exchange:
                queue = self.queues.get(message.routing_key)
                return (queue,) if queue is not None else ()
            if exchange.alternate_exchange is None and exchange.__class__ is not DelayedMessageExchange:
                # The common case needs no walk: one exchange whose bindings lead only to queues
                # (exchanges de-duplicate their own destinations). A copy, because exchanges
                # may hand out their live index and enqueueing must not depend on it.
                destinations = tuple(
                    exchange.route(message.routing_key, message.headers if exchange.needs_headers else None)
                )
                for destination in destinations:
                    if destination.__class__ is not Queue:
                        break
                else:
                    # Every one is a Queue, tested just above (a cast would be a call per publish).
                    return destinations  # type: ignore[return-value]
            routing_keys = (message.routing_key,)
        found: dict[Queue, None] = {}
        route_into(self, exchange, message, routing_keys, found, set())
        return found.keys()

    def dead_letter(self, queue: Queue, entries: list[QueueEntry], reason: str) -> None:
        """Republish messages that left `queue` for `reason` through its dead-letter exchange
        (queues/dead_letter.py): a missing exchange or a cycle drops them, as in RabbitMQ."""
        dead_letter.republish(self, queue, entries, reason)

    # -- definitions -------------------------------------------------------------------

    def durable_definitions(self) -> dict[str, list[dict[str, Any]]]:
        """Durable exchanges, queues and bindings in RabbitMQ's definitions-export shape."""
        return durable_definitions(self)

    def queue_stats_total(self) -> QueueStats:
        """Counters summed over every queue this vhost has had, deleted ones included."""
        total = QueueStats()
        total.add(self.retired_queue_stats)
        for queue in self.queues.values():
            total.add(queue.stats)
        return total

