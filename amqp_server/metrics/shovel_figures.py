"""Shovel figures for Prometheus (ours: RabbitMQ 3.10's prometheus plugin has no shovel series,
so they are named amqp_server_shovel_*, and never pass for RabbitMQ's).

On /metrics/per-object only (the aggregated endpoint serves RabbitMQ's names alone, as the
other amqp_server_* series): `amqp_server_shovels{state}`, how many shovels this node runs in
each state, and per shovel ({vhost, shovel, type}): messages forwarded to the
destination, acked on the source, refused (nacked) by the destination, reconnects (counters),
messages published and not yet confirmed, and the state as 0 starting / 1 running / 2
terminated (gauges). Read from the workers when Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from amqp_server.shovel.definition import COMPONENT
from amqp_server.shovel.shovels import Shovels
from amqp_server.shovel.worker import ShovelState

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

PREFIX = "amqp_server_shovel"
STATE_VALUES = {ShovelState.STARTING: 0, ShovelState.RUNNING: 1, ShovelState.TERMINATED: 2}


def shovel_families(broker: "Broker", per_object: bool) -> Iterator[Metric]:
    if not per_object:
        return
    component = broker.parameters.component(COMPONENT)
    workers = component.workers if isinstance(component, Shovels) else []
    states = GaugeMetricFamily("amqp_server_shovels", "Shovels this node runs, by state (amqp-server)",
                               labels=["state"])
    for each in ShovelState:
        states.add_metric([each.value], sum(1 for worker in workers if worker.state is each))
    yield states
    labels = ["vhost", "shovel", "type"]
    forwarded = CounterMetricFamily(f"{PREFIX}_messages_forwarded", "Messages a shovel published to its "
                                    "destination (amqp-server)", labels=labels)
    acked = CounterMetricFamily(f"{PREFIX}_messages_acked", "Messages a shovel settled on its source once "
                                "forwarded as its ack-mode says (amqp-server)", labels=labels)
    nacked = CounterMetricFamily(f"{PREFIX}_messages_nacked", "Messages a shovel's destination refused, put "
                                 "back on the source (amqp-server)", labels=labels)
    reconnects = CounterMetricFamily(f"{PREFIX}_reconnects", "Times a shovel reconnected after a failure "
                                     "(amqp-server)", labels=labels)
    unconfirmed = GaugeMetricFamily(f"{PREFIX}_messages_unconfirmed", "Messages a shovel published and its "
                                    "destination has not confirmed yet (amqp-server)", labels=labels)
    state = GaugeMetricFamily(f"{PREFIX}_state", "A shovel's state: 0 starting, 1 running, 2 terminated "
                              "(amqp-server)", labels=labels)
    for worker in workers:
        definition = worker.definition
        key = [definition.vhost, definition.name, definition.kind]
        counters = worker.counters
        forwarded.add_metric(key, counters.forwarded)
        acked.add_metric(key, counters.acked)
        nacked.add_metric(key, counters.nacked)
        reconnects.add_metric(key, worker.reconnects.count)
        unconfirmed.add_metric(key, worker.unconfirmed_count)
        state.add_metric(key, STATE_VALUES[worker.state])
    yield from (forwarded, acked, nacked, reconnects, unconfirmed, state)
