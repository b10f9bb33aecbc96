"""The published-message size histogram (RabbitMQ's rabbitmq_message_size_bytes).

The counts are plain integers in BrokerStats (`received_sizes`, `received_bytes`), bumped
where a publish's message is made (amqp_server/channel/channel.py, `Channel._complete_publish`: one
index into a list, no call into this file per message). This file defines the buckets and folds those counts into
Prometheus' cumulative buckets when metrics are scraped.
"""

from __future__ import annotations

from collections.abc import Sequence

# RabbitMQ's buckets (rabbit_msg_size_metrics): 100 B up to 100 MB.
BUCKET_BOUNDS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)
# How many counts the histogram keeps: one per bound, then one for sizes above every bound (+Inf).
BUCKET_COUNT = len(BUCKET_BOUNDS) + 1
# The first bound alone: most messages are at most this, and the publish path tests it before
# any bisect (amqp_server/channel/channel.py).
FIRST_BOUND = BUCKET_BOUNDS[0]


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
