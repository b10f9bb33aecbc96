"""Broker-wide counters: plain integers bumped on the hot path, read when metrics are scraped."""

from __future__ import annotations

# The published-message size histogram's buckets, RabbitMQ's (rabbit_msg_size_metrics): 100 B up
# to 100 MB. amqp_server/metrics/message_sizes.py folds the counts into the metric when scraped.
BUCKET_BOUNDS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)
# How many counts the histogram keeps: one per bound, then one for sizes above every bound (+Inf).
BUCKET_COUNT = len(BUCKET_BOUNDS) + 1
# The first bound alone: most messages are at most this, and the publish path tests it before
# any bisect (amqp_server/channel/channel.py).
FIRST_BOUND = BUCKET_BOUNDS[0]


class BrokerStats:
    """What the broker did since it started (RabbitMQ's global counters)."""

    __slots__ = (
        "received",
        "received_confirm",
        "routed",
        "returned",
        "dropped",
        "confirmed",
        "acked",
        "get",
        "get_empty",
        "queues_declared",
        "queues_created",
        "queues_deleted",
        "connections_opened",
        "connections_closed",
        "channels_opened",
        "channels_closed",
        "received_sizes",
        "received_bytes",
    )
    # (The slots' types, for mypy: __init__ sets them in a loop.)
    received: int
    received_confirm: int
    routed: int
    returned: int
    dropped: int
    confirmed: int
    acked: int
    get: int
    get_empty: int
    queues_declared: int
    queues_created: int
    queues_deleted: int
    connections_opened: int
    connections_closed: int
    channels_opened: int
    channels_closed: int
    received_sizes: list[int]
    received_bytes: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)
        # The message size histogram's counts, per bucket of BUCKET_BOUNDS (folded into the
        # metric when it is scraped), and the sum of the sizes.
        self.received_sizes = [0] * BUCKET_COUNT

    def uncount_opening(self, connections: int, channels: int) -> None:
        """Connections and channels just counted as opened that were counted so elsewhere: a
        connection replayed from a sibling worker's socket (amqp_server/runtime/handover.py)."""
        self.connections_opened -= connections
        self.channels_opened -= channels
