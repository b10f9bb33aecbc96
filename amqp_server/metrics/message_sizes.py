"""The published-message size histogram (RabbitMQ's rabbitmq_message_size_bytes).

The counts are plain integers in BrokerStats (`received_sizes`, `received_bytes`), bumped
where a publish's message is made (amqp_server/channel/channel.py, `Channel._complete_publish`: one
index into a list, no call into this file per message). The buckets are defined beside those
counts (amqp_server/broker/stats.py); this file folds the counts into Prometheus' cumulative
buckets when metrics are scraped.
"""

from __future__ import annotations

from collections.abc import Sequence

from amqp_server.broker.stats import BUCKET_BOUNDS


def cumulative_buckets(counts: Sequence[int]) -> list[tuple[str, int]]:
    """(le, cumulative count) pairs in Prometheus' order, ending with "+Inf", from `counts`
    (counts[i]: messages with size <= BUCKET_BOUNDS[i] and > the bound before; the last one,
    those above every bound)."""
    buckets = []
    running = 0
    for bound, count in zip(BUCKET_BOUNDS, counts):
        running += count
        buckets.append((str(bound), running))
    buckets.append(("+Inf", running + counts[-1]))
    return buckets
