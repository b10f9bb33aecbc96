"""Queue stores the broker keeps for itself, which are not queues a client declared.

A durable x-delayed-message exchange journals its pending messages in a queue store named
``amq.x-delayed-message.<exchange>`` (queues/delays/delayed_exchange.py, docs/queue-files.md §8). No
client can declare a queue whose name starts with ``amq.``, so the name alone says what a
store is. The data source leaves these stores out unless asked (docs/spark.md).

The prefix is repeated here, not imported, because executors get only the ``spark`` and
``persistence`` packages; tests/test_spark_internal_stores.py checks that it matches.
"""

from __future__ import annotations

DELAYED_EXCHANGE_PREFIX = "amq.x-delayed-message."


def delayed_exchange_of(queue: str) -> str | None:
    """The delayed exchange whose pending messages the store ``queue`` holds; None for a real queue."""
    if queue.startswith(DELAYED_EXCHANGE_PREFIX):
        return queue[len(DELAYED_EXCHANGE_PREFIX) :]
    return None


def is_internal(queue: str) -> bool:
    """True for a store the broker keeps for itself rather than a queue a client declared."""
    return queue.startswith(DELAYED_EXCHANGE_PREFIX)
