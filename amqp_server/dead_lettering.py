"""Dead-letter routing: republishing the messages that left a queue through its dead-letter exchange.

The queue decides that messages leave and why (queues/dead_letter.py hands them over); the
vhost routes them, because the dead-letter exchange and its bindings are the vhost's. As in
RabbitMQ, a missing dead-letter exchange drops them, and so does a cycle (a message that would
return to a queue it already died in without a rejection on the way).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from queues import dead_letter
from queues.queue import Queue
from queues.queue_entry import QueueEntry

if TYPE_CHECKING:
    from amqp_server.vhost import VirtualHost


def republish(vhost: "VirtualHost", queue: Queue, entries: list[QueueEntry], reason: str) -> None:
    """Route copies of `entries` (with x-death updated) from `queue`'s dead-letter exchange.

    With x-dead-letter-routing-key they carry that key; otherwise they keep their routing key
    and CC keys.
    """
    settings = queue.settings
    exchange = vhost.exchanges.get(settings.dead_letter_exchange or "")
    if exchange is None:
        return
    now = time.time()
    for entry in entries:
        new_key = settings.dead_letter_routing_key
        message = dead_letter.dead_lettered(entry.message, queue.name, reason, now, new_key, exchange.name)
        keys = (new_key,) if new_key is not None else tuple(dead_letter.routing_keys_of(entry.message))
        for target in vhost.route(exchange, message, keys):
            if not dead_letter.is_cycle(message, target.name, reason):
                target.publish(message)
