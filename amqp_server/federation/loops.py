"""What keeps federation from going round in circles: RabbitMQ's headers and max-hops.

Messages (exchange federation). Each link a message crosses prepends a table to its
`x-received-from` header: the upstream's URI (without credentials), the exchange, whether it
was redelivered, and the upstream's cluster name and vhost. A message crosses no more than
`max-hops` links (`length(x-received-from) < max-hops`), and never reaches a broker (cluster
name and vhost) it already passed through. The upstream checks it in its
`x-federation-upstream` exchange (exchanges/federation_upstream.py) and the downstream checks it
again before publishing (the upstream may have no such exchange type: RabbitMQ then uses a
fanout exchange there).

Bindings. A binding travels upstream, against the messages' flow, with an `x-bound-from`
header in its arguments: each link prepends the downstream's cluster name, vhost and exchange
and the hops a message could still make to come back; it counts down from the most
restrictive max-hops on the way, and a binding that reached 0, or would return to a broker it
came from, goes no further (rabbit_federation_exchange_link:update_binding).

Messages (queue federation) may move between queues any number of times; `x-received-from`
then records each queue once with a `visit-count`, and the first hop keeps the original
exchange, routing key and CC (`x-original-exchange`, `x-original-routing-key`, `x-original-cc`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The exchange type's own check, shared: a downstream checks what its upstream may not have.
from exchanges.federation_upstream import (  # noqa: F401  (names of this module too)
    DOWNSTREAM_NAME_ARGUMENT,
    DOWNSTREAM_VHOST_ARGUMENT,
    MAX_HOPS_ARGUMENT,
    RECEIVED_FROM,
    already_seen,
    should_forward,
)

BOUND_FROM = "x-bound-from"
INVALID_HEADERS = "x-invalid-headers"
INTERNAL_PURPOSE_ARGUMENT = "x-internal-purpose"
FEDERATION_PURPOSE = "federation"


def _text(value: Any) -> Any:
    """Header text as str whether the codec gave str or bytes."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


def prepend_table(headers: Mapping[str, Any] | None, name: str, table: dict[str, Any]) -> dict[str, Any]:
    """A copy of `headers` whose list `name` starts with `table` (rabbit_basic:prepend_table_header:
    a value there that is not a list moves to x-invalid-headers)."""
    updated = dict(headers or {})
    existing = updated.get(name)
    if isinstance(existing, list):
        updated[name] = [table, *existing]
        return updated
    if existing is not None:
        invalid = updated.get(INVALID_HEADERS)
        invalid = dict(invalid) if isinstance(invalid, Mapping) else {}
        invalid[name] = existing
        updated[INVALID_HEADERS] = invalid
    updated[name] = [table]
    return updated


def exchange_hop(headers: Mapping[str, Any] | None, uri: str, exchange: str, redelivered: bool,
                 upstream_cluster: str | None, upstream_vhost: str) -> dict[str, Any]:
    """The headers a message federated from an upstream exchange is published with downstream
    (rabbit_federation_exchange_link:update_routing_headers). `exchange` is the federated
    exchange's name; `upstream_cluster` the upstream's cluster_name (None if it gave none)."""
    table: dict[str, Any] = {"uri": uri, "exchange": exchange, "redelivered": redelivered}
    if upstream_cluster is not None:
        table["cluster-name"] = upstream_cluster
    table["vhost"] = upstream_vhost
    return prepend_table(headers, RECEIVED_FROM, table)


def queue_hop(headers: Mapping[str, Any] | None, uri: str, queue: str, redelivered: bool,
              exchange: str, routing_key: str) -> dict[str, Any]:
    """The headers a message federated from an upstream queue is published with downstream
    (rabbit_federation_queue_link:update_headers): one entry per queue it visited, with a count."""
    updated = dict(headers or {})
    received = updated.get(RECEIVED_FROM)
    count = 0
    if isinstance(received, list):
        kept = []
        for entry in received:
            if isinstance(entry, Mapping) and _text(entry.get("uri")) == uri and _text(entry.get("queue")) == queue:
                visits = entry.get("visit-count")
                if isinstance(visits, int) and not isinstance(visits, bool) and not count:
                    count = visits
                continue
            kept.append(entry)
        updated[RECEIVED_FROM] = kept
    else:
        updated["x-original-exchange"] = exchange
        updated["x-original-routing-key"] = routing_key
    if "CC" in updated:
        updated["x-original-cc"] = updated.pop("CC")
    table = {"uri": uri, "queue": queue, "redelivered": redelivered, "visit-count": count + 1}
    return prepend_table(updated, RECEIVED_FROM, table)


def binding_hops(arguments: Mapping[str, Any], max_hops: int, upstream_cluster: str | None,
                 upstream_vhost: str) -> int:
    """How many more links a binding with `arguments` may travel upstream over this link
    (0: it goes no further)."""
    bound = arguments.get(BOUND_FROM)
    if not isinstance(bound, list) or not bound:
        return max_hops
    if upstream_cluster is not None and already_seen(upstream_cluster, upstream_vhost, bound):
        return 0
    previous = bound[0].get("hops") if isinstance(bound[0], Mapping) else None
    if not isinstance(previous, int) or isinstance(previous, bool) or previous < 0:
        previous = 0
    return max(0, min(previous - 1, max_hops))


def upstream_binding_arguments(arguments: Mapping[str, Any], hops: int, cluster_name: str, vhost: str,
                               exchange_label: str) -> dict[str, Any]:
    """The arguments the upstream binding gets: the downstream's own, with this hop in front of
    x-bound-from. `exchange_label` is RabbitMQ's "vhost:exchange suffix"."""
    table = {"cluster-name": cluster_name, "vhost": vhost, "exchange": exchange_label, "hops": hops}
    return prepend_table(arguments, BOUND_FROM, table)


def is_federation_resource(arguments: Mapping[str, Any]) -> bool:
    """Was this exchange or queue declared by a federation link (x-internal-purpose)? Such are
    never federated themselves (rabbit_federation_queue:active_for)."""
    return INTERNAL_PURPOSE_ARGUMENT in arguments
