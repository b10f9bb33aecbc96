"""The x-federation-upstream exchange type: the exchange a federation link declares on its upstream.

A downstream broker federating exchange X from this one (RabbitMQ's federation plugin, or this
broker's amqp_server/federation/) declares here an internal exchange of this type, bound to X
with the downstream's bindings, and a queue bound to it that the link consumes. It routes like
a fanout exchange, except that a message goes nowhere if it already crossed `x-max-hops` links
or already passed through the downstream (its cluster name and vhost, the exchange's
`x-downstream-name` and `x-downstream-vhost` arguments) according to its `x-received-from`
header: so messages do not go round a cycle of federated brokers
(rabbit_federation_upstream_exchange, RabbitMQ 3.10.8).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from typing import Any

from .fanout import FanoutExchange

TYPE_NAME = "x-federation-upstream"
RECEIVED_FROM = "x-received-from"
MAX_HOPS_ARGUMENT = "x-max-hops"
DOWNSTREAM_NAME_ARGUMENT = "x-downstream-name"
DOWNSTREAM_VHOST_ARGUMENT = "x-downstream-vhost"
_NOWHERE: tuple[Hashable, ...] = ()


class InvalidFederationUpstream(ValueError):
    """`x-max-hops` is missing or not an integer (406 PRECONDITION_FAILED with this text)."""


def _text(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


def already_seen(cluster_name: Any, vhost: Any, entries: Iterable[Any]) -> bool:
    """Does a list of x-received-from (or x-bound-from) tables name that cluster and vhost?"""
    for entry in entries:
        if isinstance(entry, Mapping) and _text(entry.get("cluster-name")) == cluster_name \
                and _text(entry.get("vhost")) == vhost:
            return True
    return False


def should_forward(headers: Mapping[str, Any] | None, max_hops: int, downstream_name: Any,
                   downstream_vhost: Any) -> bool:
    """May a message with `headers` cross one more link, into `downstream_name`'s
    `downstream_vhost`? (rabbit_federation_util:should_forward/4; a name None matches nothing)"""
    if not headers:
        return True
    received = headers.get(RECEIVED_FROM)
    if not isinstance(received, list):
        return True
    return len(received) < max_hops and not already_seen(downstream_name, downstream_vhost, received)


class FederationUpstreamExchange(FanoutExchange):
    """A fanout exchange that drops what should not cross the link (see the module docstring)."""

    type_name = TYPE_NAME
    needs_headers = True

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        max_hops = self.arguments.get(MAX_HOPS_ARGUMENT)
        if max_hops is None:
            raise InvalidFederationUpstream(f"Argument {MAX_HOPS_ARGUMENT} missing")
        if not isinstance(max_hops, int) or isinstance(max_hops, bool):
            raise InvalidFederationUpstream(f"Argument {MAX_HOPS_ARGUMENT} must be of type long")
        self.max_hops = max_hops
        # Missing before RabbitMQ 3.3.0 (the name) and 3.8.9 (the vhost): then nothing matches.
        self.downstream_name = _text(self.arguments.get(DOWNSTREAM_NAME_ARGUMENT))
        self.downstream_vhost = _text(self.arguments.get(DOWNSTREAM_VHOST_ARGUMENT))

    def route(self, routing_key: str, headers: dict[str, Any] | None) -> Collection[Hashable]:
        if headers and not should_forward(headers, self.max_hops, self.downstream_name, self.downstream_vhost):
            return _NOWHERE
        return super().route(routing_key, headers)
