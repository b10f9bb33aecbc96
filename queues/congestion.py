"""Flow control on the publisher's side: the congested queues that hold one publisher back.

A queue with consumers that holds more than FLOW_HIGH ready messages is congested
(queues/queue.py, Queue.congested); each publisher into it keeps a CongestedQueues, which the
queue resumes through its `flow_waiters` once it drains below FLOW_LOW.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class CongestedQueue(Protocol):
    """What flow control uses of a congested queue (a queues.queue.Queue): the callables that
    resume its held publishers, one per publisher, called once it drained."""

    @property
    def flow_waiters(self) -> dict[object, Callable[[], None]]: ...


class CongestedQueues:
    """The congested queues that hold one publisher back (flow control: FLOW_HIGH in
    queues/queue.py): each
    is asked to say when it drained (`flow_waiters`); `held` is called when the first one holds
    the publisher, `drained` when the last one let it go. A client connection stops reading
    (amqp_server/connection/publisher_flow.py), a cluster link's channel sends channel.flow
    (cluster/links/forwarded.py)."""

    __slots__ = ("queues", "_held", "_drained")

    def __init__(self, held: Callable[[], None], drained: Callable[[], None]) -> None:
        self.queues: set[CongestedQueue] = set()
        self._held = held
        self._drained = drained

    def add(self, queue: CongestedQueue) -> None:
        """`queue` is congested by this publisher's publishes: hold it until the queue drains."""
        queues = self.queues
        if queue in queues:
            return
        first = not queues
        queues.add(queue)
        queue.flow_waiters[self] = lambda: self._one_drained(queue)
        if first:
            self._held()

    def _one_drained(self, queue: CongestedQueue) -> None:
        self.queues.discard(queue)
        if not self.queues:
            self._drained()

    def clear(self) -> None:
        """The publisher is gone: no queue keeps a way to resume it."""
        for queue in self.queues:
            queue.flow_waiters.pop(self, None)
        self.queues.clear()
