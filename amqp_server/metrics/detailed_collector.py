"""The collector behind `/metrics/detailed?family=...&vhost=...` (RabbitMQ's detailed endpoint).

Only the metric families asked for are returned, optionally only for some vhosts, with the
`rabbitmq_detailed_` prefix (the cluster-wide exchange and vhost families use
`rabbitmq_cluster_`, as RabbitMQ's do), so a Prometheus job can scrape per-queue series for the queues
it cares about without the cost of all of them. With no family, only the identity series are
returned, as RabbitMQ does.

`queue_coarse_metrics` also carries this broker's own `amqp_server_detailed_queue_messages_delayed`
(messages waiting for a delayed retry), beside RabbitMQ's ready/unacked/total.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from amqp_server.metrics.broker_view import channels_of, queue_depth, queues_of, unconfirmed_count
from amqp_server.metrics.queue_sizes import SIZE_GAUGES, queue_sizes, unacked_bytes_by_queue
from amqp_server.metrics.core_collector import (
    DETAILED,
    QUEUE_MESSAGES_DELAYED_HELP,
    channel_label,
    identity_families,
)
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.vhost import VirtualHost
    from queues.queue import Queue

PREFIX = "rabbitmq_detailed_"
CLUSTER_PREFIX = "rabbitmq_cluster_"  # RabbitMQ names its cluster-wide families so, also on this endpoint
OWN_PREFIX = "amqp_server_detailed_"  # this broker's own series: never under RabbitMQ's prefix
QUEUE_LABELS = ["vhost", "queue"]

# family -> (metric name, help, value of a queue)
_QUEUE_FAMILIES: dict[str, list[tuple[str, str, Callable[["Queue"], int]]]] = {
    "queue_coarse_metrics": [
        (PREFIX + "queue_messages_ready", "Messages ready to be delivered to consumers", lambda q: queue_depth(q)[0]),
        (PREFIX + "queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged",
         lambda q: queue_depth(q)[1]),
        (PREFIX + "queue_messages", "Sum of ready and unacknowledged messages - total queue depth",
         lambda q: sum(queue_depth(q))),
        (OWN_PREFIX + "queue_messages_delayed", QUEUE_MESSAGES_DELAYED_HELP, lambda q: q.waiting_count),
    ],
    "queue_consumer_count": [
        (PREFIX + "queue_consumers", "Consumers on a queue", lambda q: q.consumer_count),
    ],
    "queue_metrics": [
        (PREFIX + "queue_messages_ready_bytes", "Size in bytes of ready messages", lambda q: q.ready.bytes),
        (PREFIX + "queue_messages_published_total", "Total number of messages published to queues",
         lambda q: q.stats.published),
    ],
}
FAMILIES = (*_QUEUE_FAMILIES, "exchange_names", "exchange_bindings", "vhost_status", "channel_metrics")
# Byte figures RabbitMQ has none of for streams (their records are on disk, not ready in memory).
_NOT_FOR_STREAMS = {PREFIX + "queue_messages_ready_bytes"}


class DetailedCollector(Collector):
    def __init__(
        self, broker: "Broker", families: Collection[str], vhosts: Collection[str] = ()
    ) -> None:
        """`vhosts` empty means every vhost; unknown family names are ignored."""
        self.broker = broker
        self.families = [family for family in FAMILIES if family in families]
        self.vhosts = set(vhosts)

    def _vhosts(self) -> list["VirtualHost"]:
        return [v for v in self.broker.vhosts.values() if not self.vhosts or v.name in self.vhosts]

    def collect(self) -> Iterator[Metric]:
        yield from identity_families(self.broker, DETAILED)
        for family in self.families:
            if family in _QUEUE_FAMILIES:
                yield from self._queue_family(family)
            elif family == "channel_metrics":
                yield from self._channel_metrics()
            else:
                yield from getattr(self, "_" + family)()

    def _queue_family(self, family: str) -> Iterator[Metric]:
        wanted = {v.name for v in self._vhosts()}
        queues = [(vhost, queue) for vhost, queue in queues_of(self.broker) if vhost.name in wanted]
        for name, documentation, value in _QUEUE_FAMILIES[family]:
            family_class = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            metric = family_class(name, documentation, labels=QUEUE_LABELS)
            for vhost, queue in queues:
                if name not in _NOT_FOR_STREAMS or not isinstance(queue, StreamQueue):
                    metric.add_metric([vhost.name, queue.name], value(queue))
            yield metric
        if family == "queue_metrics":
            unacked_bytes = unacked_bytes_by_queue(self.broker)
            sizes = [(vhost, queue, queue_sizes(queue, unacked_bytes.get(queue, 0))) for vhost, queue in queues
                     if not isinstance(queue, StreamQueue)]
            for name, documentation, size_of in SIZE_GAUGES:
                metric = GaugeMetricFamily(PREFIX + name, documentation, labels=QUEUE_LABELS)
                for vhost, queue, queue_size in sizes:
                    metric.add_metric([vhost.name, queue.name], size_of(queue_size))
                yield metric

    def _exchange_names(self) -> Iterator[Metric]:
        metric = GaugeMetricFamily(CLUSTER_PREFIX + "exchange_name", "Enumerates exchanges without any additional info",
                                   labels=["vhost", "exchange", "type"])
        for vhost in self._vhosts():
            for exchange in vhost.exchanges.values():
                metric.add_metric([vhost.name, exchange.name, exchange.type_name], 1)
        yield metric

    def _exchange_bindings(self) -> Iterator[Metric]:
        metric = GaugeMetricFamily(CLUSTER_PREFIX + "exchange_bindings", "Number of bindings for an exchange",
                                   labels=["vhost", "exchange", "type"])
        for vhost in self._vhosts():
            for exchange in vhost.exchanges.values():
                if exchange is not vhost.default_exchange:
                    metric.add_metric([vhost.name, exchange.name, exchange.type_name], exchange.binding_count())
        yield metric

    def _vhost_status(self) -> Iterator[Metric]:
        metric = GaugeMetricFamily(CLUSTER_PREFIX + "vhost_status", "Whether a given vhost is running", labels=["vhost"])
        for vhost in self._vhosts():
            metric.add_metric([vhost.name], 1)
        yield metric

    def _channel_metrics(self) -> Iterator[Metric]:
        wanted = {v.name for v in self._vhosts()}
        rows = [
            (channel_label(connection.name, channel.id), channel)
            for connection, channel in channels_of(self.broker)
            if channel.vhost is not None and channel.vhost.name in wanted
        ]
        for suffix, documentation, value in (
            ("channel_consumers", "Consumers on a channel", lambda c: len(c.consumers)),
            ("channel_messages_unacked", "Delivered but not yet acknowledged messages", lambda c: len(c.unacked)),
            ("channel_messages_unconfirmed", "Published but not yet confirmed messages", unconfirmed_count),
            ("channel_messages_uncommitted", "Messages received in a transaction but not yet committed",
             lambda c: c.uncommitted_messages),
            ("channel_acks_uncommitted", "Message acknowledgements in a transaction not yet committed",
             lambda c: c.uncommitted_acks),
            ("consumer_prefetch", "Limit of unacknowledged messages for each consumer", lambda c: c.prefetch_count),
            ("channel_prefetch", "Total limit of unacknowledged messages for all consumers on a channel",
             lambda c: c.global_prefetch_count),
        ):
            metric = GaugeMetricFamily(PREFIX + suffix, documentation, labels=["channel"])
            for label, channel in rows:
                metric.add_metric([label], value(channel))
            yield metric
