"""A vhost's exchanges, queues and bindings in RabbitMQ's definitions-export shape.

Two readers want this shape with different filters:
- the broker's definition store (durable_only=True) saves it after every durable change and
  declares it again at startup: durable exchanges, durable queues that are not exclusive, and
  the bindings between durable ends;
- the management API's export (durable_only=False) has every exchange, and every queue that is
  not exclusive, durable or not, and the bindings to them, as RabbitMQ 3.10 exports them.
Both leave out the default exchange and the predeclared amq.* exchanges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from queues.queue import Queue

if TYPE_CHECKING:
    from amqp_server.vhost import VirtualHost


def topology_definitions(vhost: "VirtualHost", durable_only: bool) -> dict[str, list[dict[str, Any]]]:
    """{"exchanges": [...], "queues": [...], "bindings": [...]} of `vhost`, only its durable
    definitions if `durable_only`."""
    exchanges = [
        {
            "name": exchange.name,
            "vhost": vhost.name,
            "type": exchange.type_name,
            "durable": exchange.durable,
            "auto_delete": exchange.auto_delete,
            "internal": exchange.internal,
            "arguments": exchange.arguments,
        }
        for exchange in vhost.exchanges.values()
        if exchange.name and not exchange.name.startswith("amq.") and (exchange.durable or not durable_only)
    ]
    queues = [
        {
            "name": queue.name,
            "vhost": vhost.name,
            "durable": queue.durable,
            "auto_delete": queue.auto_delete,
            "arguments": queue.arguments,
        }
        for queue in vhost.queues.values()
        if not queue.exclusive and (queue.durable or not durable_only)
    ]
    bindings = [
        {
            "source": source.name,
            "vhost": vhost.name,
            "destination": destination.name,
            "destination_type": "queue" if isinstance(destination, Queue) else "exchange",
            "routing_key": key,
            "arguments": args,
        }
        for source, destination, key, args in vhost.bindings()
        if (source.durable and destination.durable if durable_only else not getattr(destination, "exclusive", False))
    ]
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def durable_definitions(vhost: "VirtualHost") -> dict[str, list[dict[str, Any]]]:
    """What the definition store saves for `vhost` and declares again at startup."""
    return topology_definitions(vhost, durable_only=True)
