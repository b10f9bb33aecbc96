"""Federation link figures for Prometheus (ours: RabbitMQ 3.10's prometheus plugin has no
federation series, so they are named amqp_server_federation_*, and never pass for RabbitMQ's).

On /metrics/per-object only (the aggregated /metrics serves RabbitMQ's names alone):
`amqp_server_federation_links{state}`, how many links this node runs in each state; and per link ({vhost, type, name, upstream}: the federated exchange or queue and its
upstream) on /metrics/per-object: messages received from the upstream, confirmed here,
acknowledged upstream, dropped (past max-hops, or back where they came from), redelivered by
the upstream (possible duplicates), reconnects (counters), messages published here and not
confirmed yet, and the state as 0 starting / 1 running / 2 error (gauges). Read from the links
when Prometheus scrapes (amqp_server/federation/status.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from amqp_server.federation.federation import federation_of
from amqp_server.federation.status import LinkState

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

PREFIX = "amqp_server_federation"
STATE_VALUES = {LinkState.STARTING: 0, LinkState.RUNNING: 1, LinkState.ERROR: 2}
_COUNTERS = (
    ("messages_received", "received", "Messages a federation link received from its upstream"),
    ("messages_confirmed", "confirmed", "Messages a federation link published here and had confirmed (as its "
                                        "ack-mode says)"),
    ("messages_acked_upstream", "acked_upstream", "Messages a federation link acknowledged on its upstream"),
    ("messages_dropped", "dropped", "Messages a federation link did not forward: past max-hops, or back where they "
                                    "came from"),
    ("messages_redelivered", "redelivered", "Messages the upstream redelivered to a federation link (possible "
                                            "duplicates here)"),
    ("reconnects", "reconnects", "Times a federation link started again after a failure"),
)


def federation_families(broker: "Broker", per_object: bool) -> Iterator[Metric]:
    if not per_object:
        return
    federation = federation_of(broker)
    links = federation.links if federation is not None else []
    states = GaugeMetricFamily(f"{PREFIX}_links", "Federation links this node runs, by state (amqp-server)",
                               labels=["state"])
    for each in LinkState:
        states.add_metric([each.value], sum(1 for link in links if link.status.state is each))
    yield states
    labels = ["vhost", "type", "name", "upstream"]
    counters = [(CounterMetricFamily(f"{PREFIX}_{name}", f"{text} (amqp-server)", labels=labels), attribute)
                for name, attribute, text in _COUNTERS]
    unconfirmed = GaugeMetricFamily(f"{PREFIX}_messages_unconfirmed", "Messages a federation link published here "
                                    "and not confirmed yet (amqp-server)", labels=labels)
    state = GaugeMetricFamily(f"{PREFIX}_state", "A federation link's state: 0 starting, 1 running, 2 error "
                              "(amqp-server)", labels=labels)
    for link in links:
        status = link.status
        key = [status.key.vhost, status.key.kind, status.key.name, status.key.upstream]
        for family, attribute in counters:
            family.add_metric(key, getattr(status, attribute))
        unconfirmed.add_metric(key, link.unconfirmed_count)
        state.add_metric(key, STATE_VALUES[status.state])
    for family, _attribute in counters:
        yield family
    yield unconfirmed
    yield state
