"""What an idle connection costs the broker in memory: a bound that catches a change that adds per connection.

Idle connections are what a broker holds most of (a fleet of services, each with a connection
and a channel it rarely uses). The figure measured end to end over TCP is in docs/benchmarks.md
(idle connections, RSS per connection); this bounds the sans-I/O part of it, which is what our
code allocates: the Connection, its Channel, and what they create up front.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from amqp_server.broker.broker import Broker
from tests.frame_driver import opened_client

CONNECTIONS = 200
# Bytes allocated by the broker's own modules per open connection with one channel, measured at
# about 2,800 (it was about 5,150 when Connection's instance dict outgrew CPython's key sharing
# and each channel made its deque of held replies up front).
BUDGET_PER_CONNECTION = 3_300

_SOURCE_ROOT = Path(__file__).resolve().parent.parent
_BROKER_PACKAGES = tuple(str(_SOURCE_ROOT / package) for package in ("amqp_server", "queues", "exchanges"))


def _broker_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes of the snapshot allocated on a line of the broker's own modules."""
    return sum(
        stat.size
        for stat in snapshot.statistics("filename")
        if stat.traceback[0].filename.startswith(_BROKER_PACKAGES)
    )


def test_an_idle_connection_with_one_channel_stays_within_its_memory_budget() -> None:
    broker = Broker()
    opened_client(broker)  # first use: caches and lazily built tables are not per connection
    gc.collect()
    tracemalloc.start()
    try:
        before = _broker_bytes(tracemalloc.take_snapshot())
        clients = [opened_client(broker) for _ in range(CONNECTIONS)]
        gc.collect()
        held = _broker_bytes(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    assert len(broker.connections) == CONNECTIONS + 1
    per_connection = (held - before) / len(clients)
    assert per_connection <= BUDGET_PER_CONNECTION, f"{per_connection:.0f} bytes per idle connection"
