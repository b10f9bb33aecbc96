"""A vhost's exchanges, queues and bindings in RabbitMQ's definitions-export shape.

Two readers want this shape with different filters:
- the broker's definition store (durable_only=True) is given each durable entry as it
  changes (the *_definition functions) and declares them again at startup: durable
  exchanges, durable queues that are not exclusive, and the bindings between durable ends;
- the management API's export (durable_only=False) has every exchange, and every queue that is
  not exclusive, durable or not, and the bindings to them, as RabbitMQ 3.10 exports them.
Both leave out the default exchange and the predeclared amq.* exchanges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from queues.queue import Queue

if TYPE_CHECKING:
    from exchanges.exchange import Exchange


class ExportedVhost(Protocol):
    """What the export reads of a vhost (amqp_server.broker.vhost.VirtualHost)."""

    @property
    def name(self) -> str: ...

    @property
    def exchanges(self) -> Mapping[str, "Exchange"]: ...

    @property
    def queues(self) -> Mapping[str, Queue]: ...

    def bindings(self) -> Iterable[tuple["Exchange", "Queue | Exchange", str, dict[str, Any]]]:
        """(source, destination, routing key, arguments) of every binding."""


def exchange_definition(vhost_name: str, exchange: "Exchange") -> dict[str, Any]:
    return {
        "name": exchange.name,
        "vhost": vhost_name,
        "type": exchange.type_name,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": exchange.arguments,
    }


def queue_definition(vhost_name: str, queue: Queue) -> dict[str, Any]:
    return {
        "name": queue.name,
        "vhost": vhost_name,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "arguments": queue.arguments,
    }


def binding_definition(
    vhost_name: str, source: "Exchange", destination: "Queue | Exchange", routing_key: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    return {
        "source": source.name,
        "vhost": vhost_name,
        "destination": destination.name,
        "destination_type": "queue" if isinstance(destination, Queue) else "exchange",
        "routing_key": routing_key,
        "arguments": arguments,
    }


def is_stored_exchange(exchange: "Exchange") -> bool:
    """A durable exchange the definition store keeps (not the default or a predeclared amq.* one)."""
    return exchange.durable and bool(exchange.name) and not exchange.name.startswith("amq.")


def is_stored_queue(queue: Queue) -> bool:
    """A queue the definition store keeps: durable and not exclusive."""
    return queue.durable and not queue.exclusive


def is_stored_binding(source: "Exchange", destination: "Queue | Exchange") -> bool:
    """A binding the definition store keeps: both of its ends are kept there too."""
    if not source.durable:
        return False
    return is_stored_queue(destination) if isinstance(destination, Queue) else destination.durable


def topology_definitions(vhost: ExportedVhost, durable_only: bool) -> dict[str, list[dict[str, Any]]]:
    """{"exchanges": [...], "queues": [...], "bindings": [...]} of `vhost`, only its durable
    definitions if `durable_only`."""
    exchanges = [
        exchange_definition(vhost.name, exchange)
        for exchange in vhost.exchanges.values()
        if exchange.name and not exchange.name.startswith("amq.") and (exchange.durable or not durable_only)
    ]
    queues = [
        queue_definition(vhost.name, queue)
        for queue in vhost.queues.values()
        if not queue.exclusive and (queue.durable or not durable_only)
    ]
    bindings = [
        binding_definition(vhost.name, source, destination, key, args)
        for source, destination, key, args in vhost.bindings()
        if (is_stored_binding(source, destination) if durable_only else not getattr(destination, "exclusive", False))
    ]
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def durable_definitions(vhost: ExportedVhost) -> dict[str, list[dict[str, Any]]]:
    """What the definition store saves for `vhost` and declares again at startup."""
    return topology_definitions(vhost, durable_only=True)
