"""Consumer demand: when a federated queue fetches messages from its upstream.

RabbitMQ's rule (rabbit_federation_queue:consumer_state_changed): a queue link consumes from
the upstream queue while the queue here is empty and has a consumer of priority 0 or more that
can take a message; otherwise it cancels that consumer. Its consumer on the upstream has
priority -1, so the upstream's own consumers go first. Messages therefore move to where they
are consumed, and stay where nobody wants them.

`wants_messages` is the rule; `DemandWatch` remembers the last answer so that a link acts only
on a change. A link asks again after each message it brought in, and the federation's one
demand timer asks every queue link every DEMAND_CHECK_S; nothing is added to the queue's own
publish or deliver path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

# How often a queue link looks at its queue's consumers between messages. A consumer that
# appears downstream waits at most this long for the first message from upstream.
DEMAND_CHECK_S = 0.05


class DemandConsumer(Protocol):
    @property
    def priority(self) -> int: ...

    def has_capacity(self) -> bool: ...


class DemandQueue(Protocol):
    """What the rule reads of a queue (a queues.queue.Queue)."""

    @property
    def message_count(self) -> int: ...

    @property
    def consumer_count(self) -> int: ...

    def consumers(self) -> Iterable[DemandConsumer]: ...


def wants_messages(queue: DemandQueue) -> bool:
    """Is `queue` empty with a consumer of priority >= 0 that has room?"""
    if queue.message_count or not queue.consumer_count:
        return False
    return any(consumer.priority >= 0 and consumer.has_capacity() for consumer in queue.consumers())


class DemandWatch:
    """The last demand a link acted on; `changed` says when it must act again."""

    def __init__(self) -> None:
        self._wanted = False

    @property
    def wanted(self) -> bool:
        return self._wanted

    def changed(self, queue: DemandQueue) -> bool:
        """Look at `queue` again: True when its demand differs from the last answer."""
        wanted = wants_messages(queue)
        if wanted == self._wanted:
            return False
        self._wanted = wanted
        return True

    def reset(self) -> None:
        """The link reconnected: nothing is consumed upstream until demand is seen again."""
        self._wanted = False
