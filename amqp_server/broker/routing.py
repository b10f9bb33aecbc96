"""Routing: which queues a message published to an exchange reaches, across the whole vhost.

An exchange's own bindings say where a routing key goes (exchanges/); this follows what they
lead to: exchange-to-exchange bindings, and alternate exchanges (an exchange whose bindings
match nothing hands the message to its alternate exchange), visiting each exchange once.
A message with a positive x-delay that reaches an x-delayed-message exchange stops there: the
exchange's DelayedMessages take it like a queue and route it when it is due.
VirtualHost.route is the entry point; it answers the default exchange itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

from exchanges.delayed import DelayedMessageExchange
from exchanges.exchange import Exchange
from queues.delays.delayed_exchange import delay_of
from queues.message import Message
from queues.queue import Queue


class Topology(Protocol):
    """What routing reads of the vhost (amqp_server.broker.vhost.VirtualHost)."""

    @property
    def default_exchange(self) -> Exchange: ...

    @property
    def exchanges(self) -> Mapping[str, Exchange]: ...

    @property
    def queues(self) -> Mapping[str, Queue]: ...


def route_into(
    vhost: Topology,
    exchange: Exchange,
    message: Message,
    keys: Collection[str],
    found: dict[Queue, None],
    visited: set[Exchange],
) -> None:
    """Add to `found` the queues `message` reaches from `exchange` with routing `keys`."""
    visited.add(exchange)
    if exchange.__class__ is DelayedMessageExchange and delay_of(message.headers) > 0:
        found[exchange.pending] = None  # held until its x-delay passes, then routed
        return
    matched = False
    if exchange is vhost.default_exchange:
        queues = vhost.queues
        for key in keys:
            queue = queues.get(key)
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
                    # Not a queue: an exchange (a vhost binds nothing else). The exchanges package
                    # types destinations Hashable; an isinstance here would cost a call per hop.
                    route_into(vhost, destination, message, keys, found, visited)  # type: ignore[arg-type]
    if not matched and exchange.alternate_exchange is not None:
        alternate = vhost.exchanges.get(exchange.alternate_exchange)
        if alternate is not None and alternate not in visited:
            route_into(vhost, alternate, message, keys, found, visited)
