"""Broker-wide counters: plain integers bumped on the hot path, read when metrics are scraped."""

from __future__ import annotations


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
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)
