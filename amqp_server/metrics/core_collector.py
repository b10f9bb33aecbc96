"""The collector behind `/metrics` and `/metrics/per-object` (RabbitMQ's core metrics collector).

A prometheus_client custom collector: nothing is recorded as messages flow; `collect()` reads
the broker's plain counters and live objects when Prometheus scrapes. `/metrics` sums queue
and channel figures into one series each ("aggregated"); `/metrics/per-object` gives one
series per queue ({vhost, queue}) and per channel ({channel}), plus this broker's own
per-queue series (QUEUE_MESSAGES_DELAYED), named `amqp_server_*` so they never pass for
RabbitMQ's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from amqp_server.broker.cluster_interface import RaftFigures
from amqp_server.channel.channel import Channel
from amqp_server.connection.views import connection_of, connections_of
from amqp_server.metrics import identity
from amqp_server.metrics.broker_view import (
    BrokerSnapshot,
    channels_of,
    queue_depth,
    queues_of,
    take_snapshot,
    unconfirmed_count,
)
from amqp_server.metrics.global_counters import PROTOCOL, global_counter_families
from amqp_server.metrics.legacy_channel_counters import legacy_channel_counter_families
from amqp_server.metrics.message_sizes import cumulative_buckets
from amqp_server.metrics.process_stats import ProcessStats, uptime_seconds
from amqp_server.metrics.queue_sizes import SIZE_GAUGES, queue_sizes, unacked_bytes_by_queue
from amqp_server.metrics.federation_figures import federation_families
from amqp_server.metrics.shovel_figures import shovel_families
from amqp_server.metrics.stream_figures import consumer_offsets, replica_figures, stream_figures
from queues.arguments.queue_type_rules import STREAM
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.stats import BrokerStats
    from amqp_server.connection.connection import Connection

# A family that takes samples (add_metric): a counter or a gauge.
_Family = CounterMetricFamily | GaugeMetricFamily

AGGREGATED = "aggregated"
PER_OBJECT = "per-object"
DETAILED = "detailed"

# Ours, not RabbitMQ's (3.10 has no stream figures; later releases name stream-protocol series
# rabbitmq_stream_*, so ours keep our prefix): a stream's offsets, segments and bytes on disk.
STREAM_PREFIX = "amqp_server_stream_"

# Ours, not RabbitMQ's (3.10 has no delayed retry): messages waiting for a delayed retry.
QUEUE_MESSAGES_DELAYED = "amqp_server_queue_messages_delayed"
QUEUE_MESSAGES_DELAYED_HELP = "Messages waiting for a delayed retry, neither ready nor unacknowledged (amqp-server)"


def channel_label(connection_name: str, channel_id: int) -> str:
    return f"{connection_name} ({channel_id})"


def identity_families(broker: "Broker", endpoint: str) -> Iterator[Metric]:
    """rabbitmq_identity_info and rabbitmq_build_info: every dashboard panel joins on the first."""
    info = UnknownMetricFamily(
        "rabbitmq_identity_info",
        "RabbitMQ node & cluster identity info",
        labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id", "rabbitmq_endpoint"],
    )
    info.add_metric([broker.node_name, broker.cluster_name, identity.cluster_permanent_id(broker), endpoint], 1)
    yield info
    build = UnknownMetricFamily(
        "rabbitmq_build_info",
        "RabbitMQ & Erlang/OTP version info",
        labels=["rabbitmq_version", "prometheus_plugin_version", "prometheus_client_version", "erlang_version",
                "product_name", "product_version"],
    )
    build.add_metric(
        [identity.RABBITMQ_COMPATIBLE_VERSION, identity.PROMETHEUS_PLUGIN_VERSION,
         identity.prometheus_client_version(), identity.RUNTIME_VERSION,
         identity.PRODUCT_NAME, identity.PRODUCT_VERSION],
        1,
    )
    yield build


class CoreCollector(Collector):
    def __init__(
        self,
        broker: "Broker",
        endpoint: str,
        process_stats: Callable[[], ProcessStats],
    ) -> None:
        self.broker = broker
        self.endpoint = endpoint
        self.process_stats = process_stats

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        stats = broker.stats
        snapshot = take_snapshot(broker)
        yield from identity_families(broker, self.endpoint)
        yield from self._churn(stats)
        yield from self._process(self.process_stats(), snapshot)
        yield from self._object_totals(snapshot)
        yield from self._queues(snapshot)
        yield from self._raft()
        yield from self._channels(snapshot)
        yield from self._connections()
        yield from legacy_channel_counter_families(stats, snapshot)
        yield from global_counter_families(stats, snapshot)
        yield from self._message_sizes()
        yield from shovel_families(broker, self.endpoint == PER_OBJECT)
        yield from federation_families(broker, self.endpoint == PER_OBJECT)

    def _churn(self, stats: BrokerStats) -> Iterator[Metric]:
        for name, documentation, value in (
            ("rabbitmq_connections_opened_total", "Total number of connections opened", stats.connections_opened),
            ("rabbitmq_connections_closed_total", "Total number of connections closed or terminated",
             stats.connections_closed),
            ("rabbitmq_channels_opened_total", "Total number of channels opened", stats.channels_opened),
            ("rabbitmq_channels_closed_total", "Total number of channels closed", stats.channels_closed),
            ("rabbitmq_queues_declared_total", "Total number of queues declared", stats.queues_declared),
            ("rabbitmq_queues_created_total", "Total number of queues created", stats.queues_created),
            ("rabbitmq_queues_deleted_total", "Total number of queues deleted", stats.queues_deleted),
        ):
            yield CounterMetricFamily(name, documentation, value=value)

    def _process(self, process: ProcessStats, snapshot: BrokerSnapshot) -> Iterator[Metric]:
        for name, documentation, value in (
            ("rabbitmq_process_open_fds", "Open file descriptors", process.open_fds),
            ("rabbitmq_process_open_tcp_sockets", "Open TCP sockets", snapshot.connections),
            ("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", process.resident_memory_bytes),
            ("rabbitmq_disk_space_available_bytes", "Disk space available in bytes", process.disk_free_bytes),
            ("rabbitmq_process_max_fds", "Open file descriptors limit", process.max_fds),
            ("rabbitmq_process_max_tcp_sockets", "Open TCP sockets limit", process.max_tcp_sockets),
            ("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes", process.memory_limit_bytes),
            ("rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark in bytes",
             process.disk_free_limit_bytes),
            ("rabbitmq_erlang_uptime_seconds", "Node uptime", round(uptime_seconds(), 3)),
            ("rabbitmq_alarms_memory_used_watermark",
             "is 1 if VM memory watermark threshold has been reached",
             int(process.memory_alarm)),
            ("rabbitmq_alarms_free_disk_space_watermark",
             "is 1 if free disk space watermark threshold has been reached",
             int(process.disk_alarm)),
            ("rabbitmq_alarms_file_descriptor_limit",
             "is 1 if file descriptor limit has been reached", int(process.open_fds >= process.max_fds)),
        ):
            yield GaugeMetricFamily(name, documentation, value=value)

    def _object_totals(self, snapshot: BrokerSnapshot) -> Iterator[Metric]:
        for name, documentation, value in (
            ("rabbitmq_connections", "Connections currently open", snapshot.connections),
            ("rabbitmq_channels", "Channels currently open", snapshot.channels),
            ("rabbitmq_consumers", "Consumers currently connected", snapshot.consumers),
            ("rabbitmq_queues", "Queues available", snapshot.queues),
        ):
            yield GaugeMetricFamily(name, documentation, value=value)

    def _queues(self, snapshot: BrokerSnapshot) -> Iterator[Metric]:
        per_object = self.endpoint == PER_OBJECT
        labels = ["vhost", "queue"] if per_object else None
        ready = GaugeMetricFamily("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers",
                                  labels=labels)
        unacked = GaugeMetricFamily("rabbitmq_queue_messages_unacked",
                                    "Messages delivered to consumers but not yet acknowledged", labels=labels)
        total = GaugeMetricFamily("rabbitmq_queue_messages",
                                  "Sum of ready and unacknowledged messages - total queue depth", labels=labels)
        ready_bytes = GaugeMetricFamily("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages",
                                        labels=labels)
        consumers = GaugeMetricFamily("rabbitmq_queue_consumers", "Consumers on a queue", labels=labels)
        published = CounterMetricFamily("rabbitmq_queue_messages_published_total",
                                        "Total number of messages published to queues", labels=labels)
        if per_object:
            delayed = GaugeMetricFamily(QUEUE_MESSAGES_DELAYED, QUEUE_MESSAGES_DELAYED_HELP, labels=labels)
            sized = [(GaugeMetricFamily("rabbitmq_" + name, documentation, labels=labels), value)
                     for name, documentation, value in SIZE_GAUGES]
            unacked_bytes = unacked_bytes_by_queue(self.broker)
            for vhost, queue in queues_of(self.broker):
                key = [vhost.name, queue.name]
                if not isinstance(queue, StreamQueue):  # RabbitMQ has no byte or paging figures for streams
                    sizes = queue_sizes(queue, unacked_bytes.get(queue, 0))
                    for family, value in sized:
                        family.add_metric(key, value(sizes))
                    ready_bytes.add_metric(key, queue.ready.bytes)
                queue_ready, queue_unacked = queue_depth(queue)
                ready.add_metric(key, queue_ready)
                unacked.add_metric(key, queue_unacked)
                total.add_metric(key, queue_ready + queue_unacked)
                consumers.add_metric(key, queue.consumer_count)
                published.add_metric(key, queue.stats.published)
                delayed.add_metric(key, queue.waiting_count)
            yield delayed
            yield from (family for family, _value in sized)
            yield from self._streams()
        else:
            ready.add_metric([], snapshot.messages_ready)
            unacked.add_metric([], snapshot.messages_unacked)
            total.add_metric([], snapshot.messages)
            ready_bytes.add_metric([], snapshot.messages_ready_bytes)
            consumers.add_metric([], snapshot.consumers)
            published.add_metric([], snapshot.queue_stats.published)
        yield from (ready, unacked, total, ready_bytes, consumers, published)

    def _streams(self) -> Iterator[Metric]:
        """This broker's stream families (metrics/stream_figures.py), per-object only: per stream
        {vhost, queue}, and per consumer of a stream {vhost, queue, channel, consumer_tag} (a tag
        is unique only within its channel). A stream holding no record has no last offset. On a
        cluster every member node of a replicated stream reports its own copy's figures (as each
        reports its replica's rabbitmq_raft_*), `amqp_server_stream_leader` telling the leader's
        from a follower's; the consumers of each node are reported by that node."""
        labels = ["vhost", "queue"]
        first = GaugeMetricFamily(STREAM_PREFIX + "first_offset", "First offset still stored in a stream (amqp-server)",
                                  labels=labels)
        last = GaugeMetricFamily(STREAM_PREFIX + "last_offset", "Offset of the last committed record of a stream "
                                 "(amqp-server)", labels=labels)
        segments = GaugeMetricFamily(STREAM_PREFIX + "segments", "Segment files of a stream (amqp-server)",
                                     labels=labels)
        disk_bytes = GaugeMetricFamily(STREAM_PREFIX + "disk_bytes", "Bytes of a stream's segment files "
                                       "(amqp-server)", labels=labels)
        offsets = GaugeMetricFamily(STREAM_PREFIX + "consumer_offset", "Offset a stream consumer reads next "
                                    "(amqp-server)", labels=[*labels, "channel", "consumer_tag"])
        leader = GaugeMetricFamily(STREAM_PREFIX + "leader", "1 where this node holds the stream, 0 where the "
                                   "figures are this node's replica's of a stream another node leads (amqp-server)",
                                   labels=labels)
        for vhost, queue in queues_of(self.broker):
            if queue.settings.queue_type != STREAM:
                continue
            key = [vhost.name, queue.name]
            held_here = stream_figures(queue)
            # A stream another node leads: its figures as this node's replica holds it (none
            # on a node outside its group); its consumers attached here, each with its offset.
            figures = held_here or replica_figures(self.broker, vhost.name, queue)
            if figures is not None:
                leader.add_metric(key, int(held_here is not None))
                first.add_metric(key, figures.first_offset)
                if figures.last_offset is not None:
                    last.add_metric(key, figures.last_offset)
                segments.add_metric(key, figures.segments)
                disk_bytes.add_metric(key, figures.disk_bytes)
            for consumer, offset in consumer_offsets(queue).items():
                sink = consumer.sink
                if isinstance(sink, Channel):  # a client's channel (every sink the broker makes)
                    channel = channel_label(connection_of(sink).name, sink.id)
                    offsets.add_metric([*key, channel, consumer.tag], offset)
        yield from (first, last, segments, disk_bytes, offsets, leader)

    def _raft(self) -> Iterator[Metric]:
        """RabbitMQ's quorum queue (Raft) families, for this node's replicas of replicated queues
        (a clustered broker only): per queue on the per-object endpoint, summed on the aggregated
        one, as RabbitMQ's plugin serves them (`RaftFigures` says what each index is)."""
        replicated = self.broker.replicated
        if replicated is None:
            return
        per_object = self.endpoint == PER_OBJECT
        labels = ["vhost", "queue"] if per_object else None
        families: tuple[tuple[_Family, Callable[[RaftFigures], int]], ...] = (
            (CounterMetricFamily("rabbitmq_raft_term", "Current Raft term number", labels=labels),
             attrgetter("term")),
            (GaugeMetricFamily("rabbitmq_raft_log_snapshot_index", "Raft log snapshot index", labels=labels),
             attrgetter("snapshot_index")),
            (GaugeMetricFamily("rabbitmq_raft_log_last_applied_index", "Raft log last applied index",
                               labels=labels), attrgetter("applied_index")),
            (GaugeMetricFamily("rabbitmq_raft_log_commit_index", "Raft log commit index", labels=labels),
             attrgetter("commit_index")),
            (GaugeMetricFamily("rabbitmq_raft_log_last_written_index", "Raft log last written index",
                               labels=labels), attrgetter("last_written_index")),
        )
        figures = replicated.raft_figures()
        for family, figure in families:
            if per_object:
                for row in figures:
                    family.add_metric([row.vhost, row.queue], figure(row))
            else:
                family.add_metric([], sum(figure(row) for row in figures))
            yield family

    def _channels(self, snapshot: BrokerSnapshot) -> Iterator[Metric]:
        per_object = self.endpoint == PER_OBJECT
        labels = ["channel"] if per_object else None
        families = {
            "consumers": GaugeMetricFamily("rabbitmq_channel_consumers", "Consumers on a channel", labels=labels),
            "unacked": GaugeMetricFamily("rabbitmq_channel_messages_unacked",
                                         "Delivered but not yet acknowledged messages", labels=labels),
            "unconfirmed": GaugeMetricFamily("rabbitmq_channel_messages_unconfirmed",
                                             "Published but not yet confirmed messages", labels=labels),
            "uncommitted": GaugeMetricFamily("rabbitmq_channel_messages_uncommitted",
                                             "Messages received in a transaction but not yet committed",
                                             labels=labels),
            "acks_uncommitted": GaugeMetricFamily("rabbitmq_channel_acks_uncommitted",
                                                  "Message acknowledgements in a transaction not yet committed",
                                                  labels=labels),
            "consumer_prefetch": GaugeMetricFamily("rabbitmq_consumer_prefetch",
                                                   "Limit of unacknowledged messages for each consumer",
                                                   labels=labels),
            "channel_prefetch": GaugeMetricFamily("rabbitmq_channel_prefetch",
                                                  "Total limit of unacknowledged messages for all consumers on a "
                                                  "channel", labels=labels),
        }
        if per_object:
            for connection, channel in channels_of(self.broker):
                key = [channel_label(connection.name, channel.id)]
                families["consumers"].add_metric(key, len(channel.consumers))
                families["unacked"].add_metric(key, len(channel.unacked))
                families["unconfirmed"].add_metric(key, unconfirmed_count(channel))
                families["uncommitted"].add_metric(key, channel.uncommitted_messages)
                families["acks_uncommitted"].add_metric(key, channel.uncommitted_acks)
                families["consumer_prefetch"].add_metric(key, channel.prefetch_count)
                families["channel_prefetch"].add_metric(key, channel.global_prefetch_count)
        else:
            families["consumers"].add_metric([], snapshot.consumers)
            families["unacked"].add_metric([], snapshot.channel_unacked)
            families["unconfirmed"].add_metric([], snapshot.unconfirmed)
            families["uncommitted"].add_metric([], snapshot.tx_uncommitted_messages)
            families["acks_uncommitted"].add_metric([], snapshot.tx_uncommitted_acks)
            families["consumer_prefetch"].add_metric([], snapshot.consumer_prefetch)
            families["channel_prefetch"].add_metric([], snapshot.channel_prefetch)
        yield from families.values()

    def _connections(self) -> Iterator[Metric]:
        """Traffic and channels of the open connections, as RabbitMQ's connection metrics (on
        /metrics/per-object one series per connection, labelled `channel` with its name, as
        RabbitMQ labels them)."""
        per_object = self.endpoint == PER_OBJECT
        labels = ["channel"] if per_object else None
        families: list[tuple[_Family, Callable[[Connection], int]]] = [
            (CounterMetricFamily("rabbitmq_connection_incoming_bytes", "Total number of bytes received on a connection",
                                 labels=labels), lambda c: c.received_bytes),
            (CounterMetricFamily("rabbitmq_connection_outgoing_bytes", "Total number of bytes sent on a connection",
                                 labels=labels), lambda c: c.sent_bytes),
            (CounterMetricFamily("rabbitmq_connection_incoming_packets",
                                 "Total number of packets received on a connection", labels=labels),
             lambda c: c.received_reads),
            (CounterMetricFamily("rabbitmq_connection_outgoing_packets", "Total number of packets sent on a connection",
                                 labels=labels), lambda c: c.sent_writes),
            (GaugeMetricFamily("rabbitmq_connection_pending_packets",
                               "Number of packets waiting to be sent on a connection", labels=labels), lambda c: 0),
            (GaugeMetricFamily("rabbitmq_connection_channels", "Channels on a connection", labels=labels),
             lambda c: len(c.channels)),
        ]
        connections = connections_of(self.broker)
        for family, value in families:
            if per_object:
                for connection in connections:
                    family.add_metric([connection.name], value(connection))
            else:
                family.add_metric([], sum(value(connection) for connection in connections))
            yield family

    def _message_sizes(self) -> Iterator[Metric]:
        stats = self.broker.stats
        family = HistogramMetricFamily(
            "rabbitmq_message_size_bytes", "Size of messages received from publishers", labels=["protocol"]
        )
        family.add_metric([PROTOCOL], cumulative_buckets(stats.received_sizes), stats.received_bytes)
        yield family

