"""A virtual host: its exchanges, queues and bindings, and routing across them.

Every declare, delete and bind goes through here, so the RabbitMQ rules (reserved names,
equivalence, exclusivity, auto-delete) live in one place. Permissions are the channel's job:
this module knows nothing about users.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Callable, Collection
from typing import Any

from exchanges import InvalidBindingArguments, UnknownExchangeType, create_exchange
from exchanges.delayed import DelayedMessageExchange, InvalidDelayedType
from exchanges.exchange import Exchange
from queues import dead_letter
from queues.arguments import InvalidArgument, QueueArguments
from queues.delayed_delivery import DelayedMessages, delay_of, store_name
from queues.queue_defaults import QueueDefault, defaults_for
from queues.journal import QueueJournal
from queues.memory_budget import MemoryBudget
from queues.message import Message
from queues.queue import Queue, QueueStats
from queues.queue_entry import QueueEntry
from queues.timers import Timers

from amqp_server import errors
from amqp_server.errors import AMQPError

log = logging.getLogger(__name__)

DEFAULT_EXCHANGE = ""
# Predeclared in every vhost, as RabbitMQ does (rabbit_vhost.erl).
STANDARD_EXCHANGES = (
    ("amq.direct", "direct", False),
    ("amq.fanout", "fanout", False),
    ("amq.topic", "topic", False),
    ("amq.headers", "headers", False),
    ("amq.match", "headers", False),
    ("amq.rabbitmq.trace", "topic", True),
)
# Queue arguments that must match on redeclaration (rabbit_amqqueue:declare_args()).
EQUIVALENT_QUEUE_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-delayed-retry-type",
    "x-delayed-retry-min",
    "x-delayed-retry-max",
    "x-delayed-retry-backoff",
    "x-consumer-timeout",
    "x-message-deduplication",
)
EQUIVALENT_EXCHANGE_ARGUMENTS = ("alternate-exchange", "x-delayed-type")


def flag(value: bool) -> str:
    return "'true'" if value else "'false'"


def generate_queue_name() -> str:
    """A server-named queue: "amq.gen-" and 22 URL-safe characters, as RabbitMQ names them."""
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class VirtualHost:
    """The exchanges, queues and bindings of one vhost.

    `on_durable_change` is called after any change to durable definitions, so the broker can
    save them through its definition store.
    """

    def __init__(
        self,
        name: str,
        on_durable_change: Callable[[], None] | None = None,
        timers: Timers | None = None,
        journal_factory: Callable[[str, str, bool], QueueJournal] | None = None,
        memory_budget: MemoryBudget | None = None,
    ) -> None:
        """`journal_factory(vhost, queue, archive)` gives durable queues their journal (None: no
        persistence); `archive` is the queue's x-archive argument."""
        self.name = name
        self.journal_factory = journal_factory
        self.memory_budget = memory_budget if memory_budget is not None else MemoryBudget()
        self.timers = timers if timers is not None else Timers()
        # The firehose (amq.rabbitmq.trace) when tracing is on for this vhost; see amqp_server/firehose.py.
        self.firehose: Any = None
        # Counters of deleted queues, so vhost-wide totals never go backwards.
        self.retired_queue_stats = QueueStats()
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.on_durable_change = on_durable_change or (lambda: None)
        # [[queue_defaults]] of the configuration: lifecycle x-arguments by queue-name pattern.
        self.queue_defaults: list[QueueDefault] = []
        # Called for every queue removed, whatever removed it (delete, auto-delete, x-expires...).
        self.on_queue_deleted: Callable[[Queue], None] = lambda queue: None
        # destination (queue or exchange) -> {source exchange: number of bindings}, for cleanup on delete.
        self._bound_to: dict[object, dict[Exchange, int]] = {}
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
            self._check_exchange_equivalence(existing, type_name, durable, auto_delete, internal, arguments)
            return existing
        if name.startswith("amq."):
            raise errors.reserved_prefix("exchange", name)
        try:
            exchange = create_exchange(
                type_name, name, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
            )
        except UnknownExchangeType as error:
            raise AMQPError(errors.COMMAND_INVALID, f"unknown exchange type '{error.type_name}'") from None
        except InvalidDelayedType as error:
            raise AMQPError(errors.PRECONDITION_FAILED, str(error)) from None
        if isinstance(exchange, DelayedMessageExchange):
            self._hold_delayed_messages(exchange)
        self.exchanges[name] = exchange
        if durable:
            self.on_durable_change()
        return exchange

    def _check_exchange_equivalence(
        self, existing: Exchange, type_name: str, durable: bool, auto_delete: bool, internal: bool,
        arguments: dict[str, Any],
    ) -> None:
        def refuse(field: str, received: str, current: str) -> AMQPError:
            return errors.inequivalent(field, "exchange", existing.name, self.name, received, current)

        if existing.type_name != type_name:
            raise refuse("type", f"'{type_name}'", f"'{existing.type_name}'")
        if existing.durable != durable:
            raise refuse("durable", flag(durable), flag(existing.durable))
        if existing.auto_delete != auto_delete:
            raise refuse("auto_delete", flag(auto_delete), flag(existing.auto_delete))
        if existing.internal != internal:
            raise refuse("internal", flag(internal), flag(existing.internal))
        self._check_arguments("exchange", existing.name, existing.arguments, arguments, EQUIVALENT_EXCHANGE_ARGUMENTS)

    def _check_arguments(
        self, kind: str, name: str, current: dict[str, Any], received: dict[str, Any], keys: Collection[str]
    ) -> None:
        for key in keys:
            have, want = current.get(key), received.get(key)
            if have != want:
                raise errors.inequivalent_argument(key, kind, name, self.name, want, have)

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

    def _hold_delayed_messages(self, exchange: DelayedMessageExchange) -> None:
        """Give a delayed exchange the store its held messages wait in (journaled if durable)."""
        journal = None
        if exchange.durable and self.journal_factory is not None:
            journal = self.journal_factory(self.name, store_name(exchange.name), False)
        pending = DelayedMessages(exchange.name, self.timers, lambda message: self._route_released(exchange, message), journal)
        recovered = pending.recover()
        if recovered:
            log.info("recovered %d delayed messages of %s", recovered, errors.resource("exchange", exchange.name, self.name))
        exchange.pending = pending

    def _route_released(self, exchange: DelayedMessageExchange, message: Message) -> bool:
        """A delayed message is due: route it through the exchange's bindings as they are now."""
        if self.exchanges.get(exchange.name) is not exchange:
            return False
        targets = list(self.route(exchange, message))
        for target in targets:
            target.publish(message)
        return bool(targets)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        if isinstance(exchange, DelayedMessageExchange):
            exchange.pending.delete()
        for destination, _key, _args in exchange.bindings():
            self._bound_to.get(destination, {}).pop(exchange, None)
        # Bindings where this exchange is the destination go too.
        for source in self._bound_to.pop(exchange, {}):
            source.unbind_destination(exchange)
            self._maybe_auto_delete_exchange(source)
        if exchange.durable:
            self.on_durable_change()

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
        server_named: bool = False,
    ) -> tuple[Queue, bool]:
        """Declare (or check) a queue; returns the queue and whether it was created."""
        if passive:
            return self.queue(name, connection), False
        arguments = arguments or {}
        if name.startswith("amq.") and not server_named:
            raise errors.reserved_prefix("queue", name)
        existing = self.queues.get(name)
        if existing is not None:
            if existing.exclusive_owner not in (None, connection) or existing.exclusive != exclusive:
                raise errors.resource_locked(name, self.name)
            self._check_queue_equivalence(existing, durable, auto_delete, arguments)
            existing.touch()
            return existing, False
        defaults = defaults_for(self.queue_defaults, self.name, name) if self.queue_defaults else None
        try:
            QueueArguments.parse(arguments, defaults)
        except InvalidArgument as error:
            raise AMQPError(
                errors.PRECONDITION_FAILED,
                f"invalid arg '{error.key}' for {errors.resource('queue', name, self.name)}: {error.reason}",
            ) from None
        # Exclusive queues die with their connection, so only shared durable queues keep files.
        journal = None
        if durable and not exclusive and self.journal_factory is not None:
            journal = self.journal_factory(self.name, name, arguments.get("x-archive") is True)
        queue = Queue(
            name,
            self.name,
            durable=durable,
            exclusive_owner=connection if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
            timers=self.timers,
            dead_letterer=self.dead_letter,
            journal=journal,
            memory_budget=self.memory_budget,
            defaults=defaults,
        )
        recovered = queue.recover()
        if recovered:
            log.info("recovered %d messages of %s", recovered, errors.resource("queue", name, self.name))
        queue.on_unused = self.delete_queue
        queue.on_unused_expired = self.delete_queue
        self.queues[name] = queue
        if durable:
            self.on_durable_change()
        return queue, True

    def _check_queue_equivalence(
        self, existing: Queue, durable: bool, auto_delete: bool, arguments: dict[str, Any]
    ) -> None:
        if existing.durable != durable:
            raise errors.inequivalent(
                "durable", "queue", existing.name, self.name, flag(durable), flag(existing.durable)
            )
        if existing.auto_delete != auto_delete:
            raise errors.inequivalent(
                "auto_delete", "queue", existing.name, self.name, flag(auto_delete), flag(existing.auto_delete)
            )
        self._check_arguments("queue", existing.name, existing.arguments, arguments, EQUIVALENT_QUEUE_ARGUMENTS)

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
            source.unbind_destination(queue)
            self._maybe_auto_delete_exchange(source)
        if queue.durable:
            self.on_durable_change()

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
            if source.durable and destination.durable:
                self.on_durable_change()

    def unbind(self, source: Exchange, destination: Queue | Exchange, routing_key: str, arguments: dict[str, Any]) -> None:
        if source is self.default_exchange:
            raise errors.default_exchange_refused()
        if not source.unbind(destination, routing_key, arguments):
            return
        self._forget_binding(destination, source)
        if source.durable and destination.durable:
            self.on_durable_change()
        self._maybe_auto_delete_exchange(source)

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
        return [
            (exchange, destination, key, args)
            for exchange in self.exchanges.values()
            if exchange is not self.default_exchange
            for destination, key, args in exchange.bindings()
        ]

    # -- routing -----------------------------------------------------------------------

    def route(self, exchange: Exchange, message: Message, routing_keys: Collection[str] | None = None) -> Collection[Queue]:
        """The queues a message published to `exchange` reaches.

        Follows exchange-to-exchange bindings and alternate exchanges (each exchange whose own
        bindings match nothing hands the message to its alternate exchange), visiting each
        exchange once. `routing_keys` replaces the message's key (sender-selected CC/BCC).
        A message with a positive x-delay that reaches an x-delayed-message exchange goes to
        that exchange's DelayedMessages instead (it publishes like a queue).
        """
        if routing_keys is None:
            if exchange is self.default_exchange:
                queue = self.queues.get(message.routing_key)
                return (queue,) if queue is not None else ()
            routing_keys = (message.routing_key,)
        found: dict[Queue, None] = {}
        self._route_into(exchange, message, routing_keys, found, set())
        return found.keys()

    def _route_into(
        self, exchange: Exchange, message: Message, keys: Collection[str], found: dict[Queue, None], visited: set[Exchange]
    ) -> None:
        visited.add(exchange)
        if exchange.__class__ is DelayedMessageExchange and delay_of(message.headers) > 0:
            found[exchange.pending] = None  # held until its x-delay passes, then routed
            return
        matched = False
        if exchange is self.default_exchange:
            for key in keys:
                queue = self.queues.get(key)
                if queue is not None:
                    found[queue] = None
                    matched = True
        else:
            headers = message.headers if exchange.needs_headers else None
            for key in keys:
                for destination in exchange.route(key, headers):
                    matched = True
                    if isinstance(destination, Queue):
                        found[destination] = None
                    elif destination not in visited:
                        self._route_into(destination, message, keys, found, visited)
        if not matched and exchange.alternate_exchange is not None:
            alternate = self.exchanges.get(exchange.alternate_exchange)
            if alternate is not None and alternate not in visited:
                self._route_into(alternate, message, keys, found, visited)

    def dead_letter(self, queue: Queue, entries: list[QueueEntry], reason: str) -> None:
        """Republish messages that left `queue` for `reason` to its dead-letter exchange.

        A missing dead-letter exchange drops them, as in RabbitMQ; so does a cycle (see
        queues.dead_letter.is_cycle).
        """
        settings = queue.settings
        exchange = self.exchanges.get(settings.dead_letter_exchange or "")
        if exchange is None:
            return
        now = time.time()
        for entry in entries:
            new_key = settings.dead_letter_routing_key
            message = dead_letter.dead_lettered(entry.message, queue.name, reason, now, new_key)
            keys = (new_key,) if new_key is not None else tuple(dead_letter.routing_keys_of(entry.message))
            for target in self.route(exchange, message, keys):
                if not dead_letter.is_cycle(message, target.name):
                    target.publish(message)

    # -- definitions -------------------------------------------------------------------

    def durable_definitions(self) -> dict[str, list[dict[str, Any]]]:
        """Durable exchanges, queues and bindings in RabbitMQ's definitions-export shape."""
        exchanges = [
            {
                "name": exchange.name,
                "vhost": self.name,
                "type": exchange.type_name,
                "durable": True,
                "auto_delete": exchange.auto_delete,
                "internal": exchange.internal,
                "arguments": exchange.arguments,
            }
            for exchange in self.exchanges.values()
            if exchange.durable and exchange.name and not exchange.name.startswith("amq.")
        ]
        queues = [
            {
                "name": queue.name,
                "vhost": self.name,
                "durable": True,
                "auto_delete": queue.auto_delete,
                "arguments": queue.arguments,
            }
            for queue in self.queues.values()
            if queue.durable and not queue.exclusive
        ]
        bindings = [
            {
                "source": source.name,
                "vhost": self.name,
                "destination": destination.name,
                "destination_type": "queue" if isinstance(destination, Queue) else "exchange",
                "routing_key": key,
                "arguments": args,
            }
            for source, destination, key, args in self.bindings()
            if source.durable and destination.durable
        ]
        return {"exchanges": exchanges, "queues": queues, "bindings": bindings}

    def queue_stats_total(self) -> QueueStats:
        """Counters summed over every queue this vhost has had, deleted ones included."""
        total = QueueStats()
        total.add(self.retired_queue_stats)
        for queue in self.queues.values():
            total.add(queue.stats)
        return total
