"""Read-only walks over the broker's live objects, shared by the Prometheus collectors and the
management API, so both report the same numbers from the same definitions.

Everything here runs at scrape or request time on the event loop, so it sees one consistent
moment of the broker; nothing here runs per message.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from amqp_server.connection.views import connections_of
from amqp_server.metrics.process_stats import ProcessStats, sample_process_stats
from queues.queue import Queue
from queues.queue_stats import QueueStats
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.channel.channel import Channel
    from amqp_server.connection.connection import Connection
    from amqp_server.broker.vhost import VirtualHost

DEAD_LETTER_REASONS = ("expired", "rejected", "maxlen", "delivery_limit")
# RabbitMQ labels dead-lettering by what happens to the message: republished to a DLX
# ("at_most_once" for classic queues) or dropped ("disabled").
STRATEGY_DLX = "at_most_once"
STRATEGY_DROP = "disabled"


def queues_of(broker: "Broker") -> Iterator[tuple["VirtualHost", Queue]]:
    for vhost in list(broker.vhosts.values()):
        for queue in list(vhost.queues.values()):
            yield vhost, queue


def channels_of(broker: "Broker") -> Iterator[tuple["Connection", "Channel"]]:
    for connection in connections_of(broker):
        for channel in list(connection.channels.values()):
            yield connection, channel


def is_publisher(channel: "Channel") -> bool:
    """A channel that has published at least once (RabbitMQ's definition of a publisher).

    The channel remembers each exchange it was allowed to publish to; a non-empty set means
    it has published.
    """
    return channel.has_published


def unconfirmed_count(channel: "Channel") -> int:
    """Messages published in confirm mode whose ack or nack has not been sent yet."""
    confirms = channel.confirms
    if confirms is None:
        return 0
    return confirms.unconfirmed


def queue_depth(queue: Queue) -> tuple[int, int]:
    """(ready, unacknowledged) messages as RabbitMQ reports them. A stream's are (its records,
    0): a delivery takes nothing out of a stream, so RabbitMQ counts every record ready and
    none unacknowledged (rabbit_osiris_metrics; 3.10.8 shows `messages` = `messages_ready`
    with deliveries unacked). Channels still count their unacked stream deliveries."""
    if isinstance(queue, StreamQueue):
        return queue.message_count, 0
    return queue.message_count, queue.unacked_count


def dead_letter_strategy(queue: Queue) -> str:
    return STRATEGY_DLX if queue.settings.dead_letter_exchange is not None else STRATEGY_DROP


@dataclass
class BrokerSnapshot:
    """The broker's totals at one moment (see `take_snapshot`)."""

    connections: int = 0
    channels: int = 0
    consumers: int = 0
    publishers: int = 0
    queues: int = 0
    exchanges: int = 0
    messages_ready: int = 0
    messages_unacked: int = 0
    messages_ready_bytes: int = 0
    unconfirmed: int = 0
    channel_unacked: int = 0
    consumer_prefetch: int = 0
    channel_prefetch: int = 0
    tx_uncommitted_messages: int = 0
    tx_uncommitted_acks: int = 0
    received_confirm: int = 0
    # Every queue's counters, deleted queues included (they never go backwards).
    queue_stats: QueueStats = field(default_factory=QueueStats)
    # (reason, strategy) -> messages that left a queue that way.
    dead_lettered: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return self.messages_ready + self.messages_unacked


def take_snapshot(broker: "Broker") -> BrokerSnapshot:
    snapshot = BrokerSnapshot(connections=len(broker.connections))
    dead = {(reason, strategy): 0 for reason in DEAD_LETTER_REASONS for strategy in (STRATEGY_DLX, STRATEGY_DROP)}
    for vhost in broker.vhosts.values():
        snapshot.exchanges += len(vhost.exchanges)
        snapshot.queue_stats.add(vhost.queue_stats_total())
        # Deleted queues' counters cannot be split by strategy any more: counted as dropped.
        for reason in DEAD_LETTER_REASONS:
            dead[(reason, STRATEGY_DROP)] += getattr(vhost.retired_queue_stats, "dead_lettered_" + reason)
    for _vhost, queue in queues_of(broker):
        snapshot.queues += 1
        snapshot.consumers += queue.consumer_count
        ready, unacked = queue_depth(queue)
        snapshot.messages_ready += ready
        snapshot.messages_unacked += unacked
        snapshot.messages_ready_bytes += queue.ready.bytes
        strategy = dead_letter_strategy(queue)
        for reason in DEAD_LETTER_REASONS:
            dead[(reason, strategy)] += getattr(queue.stats, "dead_lettered_" + reason)
    snapshot.dead_lettered = dead
    for _connection, channel in channels_of(broker):
        snapshot.channels += 1
        snapshot.publishers += is_publisher(channel)
        snapshot.unconfirmed += unconfirmed_count(channel)
        snapshot.channel_unacked += len(channel.unacked)
        snapshot.channel_prefetch += channel.global_prefetch_count
        snapshot.consumer_prefetch += channel.prefetch_count
        snapshot.tx_uncommitted_messages += channel.uncommitted_messages
        snapshot.tx_uncommitted_acks += channel.uncommitted_acks
    stats = broker.stats
    snapshot.received_confirm = stats.received_confirm
    return snapshot


def vhost_totals(vhost: "VirtualHost") -> dict[str, Any]:
    """Ready, unacked and total messages of one vhost's queues."""
    ready = unacked = 0
    for queue in vhost.queues.values():
        queue_ready, queue_unacked = queue_depth(queue)
        ready += queue_ready
        unacked += queue_unacked
    return {"messages_ready": ready, "messages_unacknowledged": unacked, "messages": ready + unacked}


def process_stats_of(broker: "Broker") -> ProcessStats:
    """The process figures as the broker's resource alarms see them (broker.alarms): memory used,
    free disk, both limits and whether each alarm is in effect, so that what /metrics and
    /api/nodes report agrees with what blocks publishers. Before the alarms' first measurement
    (or without a resource monitor, in unit tests) memory and disk are sampled here."""
    stats = sample_process_stats(broker.config.data_dir)
    alarms = getattr(broker, "alarms", None)
    if alarms is None:
        return stats
    if alarms.measured:
        stats = replace(stats, resident_memory_bytes=alarms.memory_used, disk_free_bytes=alarms.disk_free)
    return replace(
        stats,
        memory_limit_bytes=alarms.memory_limit,
        disk_free_limit_bytes=alarms.disk_free_limit,
        memory_alarm=alarms.memory_alarm,
        disk_alarm=alarms.disk_alarm,
    )
