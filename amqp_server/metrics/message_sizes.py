"""The published-message size histogram (RabbitMQ's rabbitmq_message_size_bytes).

Plain integers: `observe()` is one bisect over eight bounds and two additions, cheap enough
to call for every published message. The Prometheus collector reads the counts at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left

# RabbitMQ's buckets (rabbit_msg_size_metrics): 100 B up to 100 MB.
BUCKET_BOUNDS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)


class MessageSizeHistogram:
    __slots__ = ("counts", "count", "sum")

    def __init__(self) -> None:
        # counts[i] = messages with size <= BUCKET_BOUNDS[i] and > the bound before; the last
        # slot holds the ones above every bound (+Inf).
        self.counts = [0] * (len(BUCKET_BOUNDS) + 1)
        self.count = 0
        self.sum = 0

    def observe(self, size: int) -> None:
        # Most messages fit the first bucket: no bisect for them.
        self.counts[0 if size <= 100 else bisect_left(BUCKET_BOUNDS, size)] += 1
        self.count += 1
        self.sum += size

    def cumulative_buckets(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs in Prometheus' order, ending with "+Inf"."""
        buckets = []
        running = 0
        for bound, count in zip(BUCKET_BOUNDS, self.counts):
            running += count
            buckets.append((str(bound), running))
        buckets.append(("+Inf", self.count))
        return buckets
