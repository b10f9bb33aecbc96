"""What an exchange link asks of its upstream as the federated exchange's bindings change.

A federated exchange X here, federated from an upstream, has on that upstream (RabbitMQ's
names, rabbit_federation_exchange_link):

- a queue `federation: X -> {cluster name}` (suffixed `:{X}` when the upstream exchange has
  another name, `:{vhost}:{X}` when the vhost differs), durable, that the link consumes;
- an internal exchange `{that queue's name} A` (or `B`: each start of the link declares the
  other one, binds it fully, and deletes the old one, so the upstream's bindings are replaced
  without a moment where messages go nowhere), of type x-federation-upstream, bound to the
  queue;
- for each distinct (routing key, arguments) that X's bindings here have, a binding of the
  upstream exchange to that internal exchange, with x-bound-from in its arguments
  (loops.upstream_binding_arguments).

`BindingMirror` keeps the bindings of X and answers, for each binding that appears or goes
here, the exchange.bind or exchange.unbind the upstream must get (or None): a second binding
with the same key and arguments to another destination changes nothing upstream, and the
unbind waits for the last of them. A binding that itself came from a federation link (it has
x-bound-from) is passed on as it is, hops counted down, never merged.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from amqp_server.federation.loops import BOUND_FROM, binding_hops, upstream_binding_arguments
from exchanges.field_equality import canonical_table

BIND, UNBIND = "bind", "unbind"
SUFFIXES = ("A", "B")


def upstream_queue_name(upstream_exchange: str, upstream_vhost: str, cluster_name: str, vhost: str,
                        exchange: str) -> str:
    """The queue on the upstream that holds what goes to exchange `exchange` of `vhost` here."""
    if vhost != upstream_vhost:
        tail = f":{vhost}:{exchange}"
    elif exchange != upstream_exchange:
        tail = f":{exchange}"
    else:
        tail = ""
    return f"federation: {upstream_exchange} -> {cluster_name}{tail}"


def internal_exchange_name(queue_name: str, suffix: str) -> str:
    return f"{queue_name} {suffix}"


def other_suffix(suffix: str) -> str:
    return SUFFIXES[1] if suffix == SUFFIXES[0] else SUFFIXES[0]


@dataclass(frozen=True)
class UpstreamBinding:
    """One exchange.bind (or exchange.unbind) of the upstream exchange to the internal one."""

    action: str
    routing_key: str
    arguments: dict[str, Any]


class BindingMirror:
    """The federated exchange's bindings, and what each change means upstream (see the module
    docstring). `upstream_cluster`: the upstream's cluster name (None when it gave none)."""

    def __init__(self, *, max_hops: int, cluster_name: str, vhost: str, exchange: str, suffix: str,
                 upstream_cluster: str | None, upstream_vhost: str) -> None:
        self.max_hops = max_hops
        self.cluster_name = cluster_name
        self.vhost = vhost
        self.exchange = exchange
        self.suffix = suffix
        self.upstream_cluster = upstream_cluster
        self.upstream_vhost = upstream_vhost
        # (routing key, canonical arguments) -> the destinations bound with them here
        self._destinations: dict[tuple[str, Any], set[Hashable]] = {}

    @property
    def routing_keys(self) -> list[str]:
        """The routing keys bound upstream (rabbit_federation_exchange_link:list_routing_keys)."""
        return sorted(key for key, _arguments in self._destinations)

    def added(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> UpstreamBinding | None:
        """Binding (destination, routing_key, arguments) appeared on the federated exchange."""
        if BOUND_FROM in arguments:
            return self._command(BIND, routing_key, arguments)
        key = (routing_key, canonical_table(arguments))
        destinations = self._destinations.get(key)
        if destinations is not None:
            destinations.add(destination)
            return None
        self._destinations[key] = {destination}
        return self._command(BIND, routing_key, arguments)

    def removed(self, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> UpstreamBinding | None:
        """Binding (destination, routing_key, arguments) went from the federated exchange."""
        if BOUND_FROM in arguments:
            return self._command(UNBIND, routing_key, arguments)
        key = (routing_key, canonical_table(arguments))
        destinations = self._destinations.get(key)
        if destinations is None or destination not in destinations:
            return None
        destinations.discard(destination)
        if destinations:
            return None
        del self._destinations[key]
        return self._command(UNBIND, routing_key, arguments)

    def _command(self, action: str, routing_key: str, arguments: dict[str, Any]) -> UpstreamBinding | None:
        hops = binding_hops(arguments, self.max_hops, self.upstream_cluster, self.upstream_vhost)
        if hops <= 0:
            return None
        label = f"{self.vhost}:{self.exchange} {self.suffix}"
        upstream_arguments = upstream_binding_arguments(arguments, hops, self.cluster_name, self.vhost, label)
        return UpstreamBinding(action, routing_key, upstream_arguments)
