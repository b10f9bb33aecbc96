"""A vhost's durable definitions in RabbitMQ's definitions-export shape.

This is what the broker's definition store saves after every durable change, and what it
declares again at startup: durable exchanges (the predeclared amq.* ones excluded), durable
queues that are not exclusive, and the bindings between durable ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from queues.queue import Queue

if TYPE_CHECKING:
    from amqp_server.vhost import VirtualHost


def durable_definitions(vhost: "VirtualHost") -> dict[str, list[dict[str, Any]]]:
    """{"exchanges": [...], "queues": [...], "bindings": [...]} of `vhost`'s durable definitions."""
    exchanges = [
        {
            "name": exchange.name,
            "vhost": vhost.name,
            "type": exchange.type_name,
            "durable": True,
            "auto_delete": exchange.auto_delete,
            "internal": exchange.internal,
            "arguments": exchange.arguments,
        }
        for exchange in vhost.exchanges.values()
        if exchange.durable and exchange.name and not exchange.name.startswith("amq.")
    ]
    queues = [
        {
            "name": queue.name,
            "vhost": vhost.name,
            "durable": True,
            "auto_delete": queue.auto_delete,
            "arguments": queue.arguments,
        }
        for queue in vhost.queues.values()
        if queue.durable and not queue.exclusive
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
        if source.durable and destination.durable
    ]
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}
