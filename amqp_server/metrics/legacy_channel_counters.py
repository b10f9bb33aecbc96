"""The `rabbitmq_channel_*` counters that dashboards up to 2022 query.

RabbitMQ sums them over open channels, so its totals drop when a channel closes; these come
from the broker-wide counters instead and only grow, which is what rate() wants. They have
no per-channel labels: the broker keeps no per-channel message counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, Metric

from amqp_server.metrics.broker_view import BrokerSnapshot

if TYPE_CHECKING:
    from amqp_server.broker.stats import BrokerStats


def legacy_channel_counter_families(stats: "BrokerStats", snapshot: BrokerSnapshot) -> Iterator[Metric]:
    q = snapshot.queue_stats
    counters = (
        ("rabbitmq_channel_messages_published_total",
         "Total number of messages published into an exchange on a channel", stats.received),
        ("rabbitmq_channel_messages_confirmed_total",
         "Total number of messages published into an exchange and confirmed on the channel", stats.confirmed),
        ("rabbitmq_channel_messages_unroutable_returned_total",
         "Total number of messages published as mandatory into an exchange and returned to the publisher as "
         "unroutable", stats.returned),
        ("rabbitmq_channel_messages_unroutable_dropped_total",
         "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
         stats.dropped),
        ("rabbitmq_channel_get_ack_total",
         "Total number of messages fetched with basic.get in manual acknowledgement mode", q.get - q.get_no_ack),
        ("rabbitmq_channel_get_total",
         "Total number of messages fetched with basic.get in automatic acknowledgement mode", q.get_no_ack),
        ("rabbitmq_channel_messages_delivered_ack_total",
         "Total number of messages delivered to consumers in manual acknowledgement mode",
         q.delivered - q.delivered_no_ack),
        ("rabbitmq_channel_messages_delivered_total",
         "Total number of messages delivered to consumers in automatic acknowledgement mode", q.delivered_no_ack),
        ("rabbitmq_channel_messages_redelivered_total",
         "Total number of messages redelivered to consumers", q.redelivered),
        ("rabbitmq_channel_messages_acked_total",
         "Total number of messages acknowledged by consumers", q.acked),
        ("rabbitmq_channel_get_empty_total",
         "Total number of times basic.get operations fetched no message", q.get_empty),
    )
    for name, documentation, value in counters:
        yield CounterMetricFamily(name, documentation, value=value)
