"""The `message_stats` counters of the management API, from the broker's plain counters.

RabbitMQ's names: `deliver` and `get` count deliveries that need an ack, `deliver_no_ack` and
`get_no_ack` the automatic-ack ones, `deliver_get` all four. Queue counters include messages
the queue received (`publish`); broker-wide ones add what happened at exchanges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queues.queue_stats import QueueStats

if TYPE_CHECKING:
    from amqp_server.broker.stats import BrokerStats


def queue_message_counts(stats: QueueStats, include_publish: bool = True) -> dict[str, int]:
    counts = {
        "ack": stats.acked,
        "deliver": stats.delivered - stats.delivered_no_ack,
        "deliver_get": stats.delivered + stats.get,
        "deliver_no_ack": stats.delivered_no_ack,
        "get": stats.get - stats.get_no_ack,
        "get_empty": stats.get_empty,
        "get_no_ack": stats.get_no_ack,
        "redeliver": stats.redelivered,
    }
    if include_publish:
        counts["publish"] = stats.published
    return counts


def broker_message_counts(broker_stats: "BrokerStats", queue_stats: QueueStats) -> dict[str, int]:
    counts = queue_message_counts(queue_stats, include_publish=False)
    counts.update(
        {
            "confirm": broker_stats.confirmed,
            "drop_unroutable": broker_stats.dropped,
            "publish": broker_stats.received,
            "return_unroutable": broker_stats.returned,
        }
    )
    return dict(sorted(counts.items()))


def queue_depth_counts(ready: int, unacked: int) -> dict[str, int]:
    return {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}
