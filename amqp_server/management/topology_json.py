"""Exchanges and bindings in the management API's JSON shapes.

A binding is identified in URLs by its "properties key": the URL-quoted routing key when it
has no arguments ("~" for an empty key), otherwise the key, "~" and a short hash of the
arguments. RabbitMQ hashes with Erlang's phash2; clients treat the key as opaque and read it
from the listing, so any stable hash will do.
"""

from __future__ import annotations

import base64
import hashlib
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from amqp_server.broker import policy_application
from exchanges.exchange import Exchange
from exchanges.field_equality import canonical_table
from queues.queue import Queue

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost

Binding = tuple[Exchange, "Queue | Exchange", str, dict[str, Any]]


def exchange_json(vhost: "VirtualHost", exchange: Exchange) -> dict[str, Any]:
    """As RabbitMQ 3.10 shows an exchange; the policy fields only when a policy or operator
    policy applies (RabbitMQ shows `policy` alone; the other two are this broker's addition)."""
    in_force = policy_application.for_exchange(vhost, exchange.name)
    policy_fields = in_force.as_json() if in_force.policy or in_force.operator_policy else {}
    if in_force.policy is None:
        policy_fields.pop("policy", None)
    return {
        **policy_fields,
        "arguments": exchange.arguments,
        "auto_delete": exchange.auto_delete,
        "durable": exchange.durable,
        "internal": exchange.internal,
        "name": exchange.name,
        "type": exchange.type_name,
        "user_who_performed_action": "rmq-internal" if exchange.name == "" or exchange.name.startswith("amq.") else "",
        "vhost": vhost.name,
    }


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    quoted = urllib.parse.quote(routing_key, safe="")
    if not arguments:
        return quoted or "~"
    digest = hashlib.sha1(repr(canonical_table(arguments)).encode()).digest()[:4]
    return f"{quoted}~{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"


def binding_json(vhost: "VirtualHost", source: Exchange, destination: Queue | Exchange, routing_key: str,
                 arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": source.name,
        "vhost": vhost.name,
        "destination": destination.name,
        "destination_type": "queue" if isinstance(destination, Queue) else "exchange",
        "routing_key": routing_key,
        "arguments": arguments,
        "properties_key": properties_key(routing_key, arguments),
    }


def all_bindings(vhost: "VirtualHost") -> Iterator[Binding]:
    """Every binding of a vhost as the management API shows them: the default exchange's
    implicit one per queue (keyed by the queue's name) first, as RabbitMQ lists them, then
    the explicit ones."""
    for queue in list(vhost.queues.values()):
        yield vhost.default_exchange, queue, queue.name, {}
    yield from vhost.bindings()


def all_bindings_json(vhost: "VirtualHost") -> list[dict[str, Any]]:
    return [binding_json(vhost, *binding) for binding in all_bindings(vhost)]
