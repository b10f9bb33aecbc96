"""RabbitMQ's global counters (rabbit_global_counters): `rabbitmq_global_*`, protocol="amqp091".

Counters about queues carry queue_type too; every queue here is a classic queue. Values come
from the broker's counters and the queues' counters (deleted queues' included), so they only
ever grow.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from amqp_server.metrics.broker_view import DEAD_LETTER_REASONS, BrokerSnapshot

if TYPE_CHECKING:
    from amqp_server.broker.stats import BrokerStats

PROTOCOL = "amqp091"
QUEUE_TYPE = "rabbit_classic_queue"


def global_counter_families(stats: "BrokerStats", snapshot: BrokerSnapshot) -> Iterator[Metric]:
    q = snapshot.queue_stats

    def by_protocol(name: str, documentation: str, value: int) -> Metric:
        family = CounterMetricFamily(name, documentation, labels=["protocol"])
        family.add_metric([PROTOCOL], value)
        return family

    def by_queue_type(name: str, documentation: str, value: int) -> Metric:
        family = CounterMetricFamily(name, documentation, labels=["protocol", "queue_type"])
        family.add_metric([PROTOCOL, QUEUE_TYPE], value)
        return family

    yield by_protocol("rabbitmq_global_messages_received_total",
                      "Total number of messages received from publishers", stats.received)
    yield by_protocol("rabbitmq_global_messages_received_confirm_total",
                      "Total number of messages received from publishers expecting confirmations",
                      snapshot.received_confirm)
    yield by_protocol("rabbitmq_global_messages_routed_total",
                      "Total number of messages routed to queues or streams", stats.routed)
    yield by_protocol("rabbitmq_global_messages_unroutable_dropped_total",
                      "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
                      stats.dropped)
    yield by_protocol("rabbitmq_global_messages_unroutable_returned_total",
                      "Total number of messages published as mandatory into an exchange and returned to the publisher "
                      "as unroutable", stats.returned)
    yield by_protocol("rabbitmq_global_messages_confirmed_total",
                      "Total number of messages confirmed to publishers", stats.confirmed)
    yield by_queue_type("rabbitmq_global_messages_delivered_total",
                        "Total number of messages delivered to consumers", q.delivered + q.get)
    yield by_queue_type("rabbitmq_global_messages_delivered_consume_manual_ack_total",
                        "Total number of messages delivered to consumers using basic.consume with manual "
                        "acknowledgment", q.delivered - q.delivered_no_ack)
    yield by_queue_type("rabbitmq_global_messages_delivered_consume_auto_ack_total",
                        "Total number of messages delivered to consumers using basic.consume with automatic "
                        "acknowledgment", q.delivered_no_ack)
    yield by_queue_type("rabbitmq_global_messages_delivered_get_manual_ack_total",
                        "Total number of messages delivered to consumers using basic.get with manual acknowledgment",
                        q.get - q.get_no_ack)
    yield by_queue_type("rabbitmq_global_messages_delivered_get_auto_ack_total",
                        "Total number of messages delivered to consumers using basic.get with automatic "
                        "acknowledgment", q.get_no_ack)
    yield by_queue_type("rabbitmq_global_messages_get_empty_total",
                        "Total number of times basic.get operations fetched no message", q.get_empty)
    yield by_queue_type("rabbitmq_global_messages_redelivered_total",
                        "Total number of messages redelivered to consumers", q.redelivered)
    yield by_queue_type("rabbitmq_global_messages_acknowledged_total",
                        "Total number of messages acknowledged by consumers", q.acked)

    for reason in DEAD_LETTER_REASONS:
        family = CounterMetricFamily(
            f"rabbitmq_global_messages_dead_lettered_{reason}_total",
            f"Total number of messages dead-lettered due to {reason.replace('_', '-')}",
            labels=["queue_type", "dead_letter_strategy"],
        )
        for (counted_reason, strategy), value in snapshot.dead_lettered.items():
            if counted_reason == reason:
                family.add_metric([QUEUE_TYPE, strategy], value)
        yield family
    # Only quorum queues confirm dead-lettered messages (at_least_once); none exist here.
    confirmed = CounterMetricFamily(
        "rabbitmq_global_messages_dead_lettered_confirmed_total",
        "Total number of messages dead-lettered and confirmed by target queues",
        labels=["queue_type", "dead_letter_strategy"],
    )
    confirmed.add_metric([QUEUE_TYPE, "at_least_once"], 0)
    yield confirmed

    for name, documentation, value in (
        ("rabbitmq_global_consumers", "Current number of consumers", snapshot.consumers),
        ("rabbitmq_global_publishers", "Current number of publishers", snapshot.publishers),
    ):
        gauge = GaugeMetricFamily(name, documentation, labels=["protocol"])
        gauge.add_metric([PROTOCOL], value)
        yield gauge
