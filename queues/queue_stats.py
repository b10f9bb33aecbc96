"""A queue's message counters: what its management and Prometheus views report."""

from __future__ import annotations


class QueueStats:
    """Plain integer counters, read at scrape time (no library call per message)."""

    __slots__ = (
        "published", "delivered", "delivered_no_ack", "redelivered", "acked", "get", "get_no_ack", "get_empty",
        "dead_lettered_expired", "dead_lettered_rejected", "dead_lettered_maxlen", "dead_lettered_delivery_limit",
    )
    # (The slots' types, for mypy: __init__ sets them in a loop.)
    published: int
    delivered: int
    delivered_no_ack: int
    redelivered: int
    acked: int
    get: int
    get_no_ack: int
    get_empty: int
    dead_lettered_expired: int
    dead_lettered_rejected: int
    dead_lettered_maxlen: int
    dead_lettered_delivery_limit: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def add(self, other: "QueueStats") -> None:
        """Fold another queue's counters into these (a deleted queue's history stays counted)."""
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
