"""Where an unacked delivery goes when it comes back unsettled (basic.reject or basic.nack with
requeue, or its consumer went away): the rules of x-delivery-limit and delayed retry.

A message delivered more times than the queue's delivery limit is dead-lettered (reason
`delivery_limit`); one that the queue's delayed retry covers waits (delays/delayed_retry.py); every
other one is ready again at its original position, and a drop-head queue with a length limit
then drops its oldest ready messages past the limit (RabbitMQ applies the limit on requeue too).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from queues import dead_letter
from queues.consumer import Consumer
from queues.delays.delayed_retry import DelayedRetry, retry_delay_ms
from queues.length_limit import LimitedQueue, drop_head_after_return
from queues.message import QueueEntry


class RequeueingQueue(LimitedQueue, Protocol):
    """What requeueing uses of the queue (a queues.queue.Queue): settling a delivery, its delayed
    retry, putting a message back in its place and dispatching, and what its length limits and
    dead-lettering use."""

    @property
    def deleted(self) -> bool: ...

    def settle(self, entry: QueueEntry, consumer: Consumer | None) -> None: ...

    def delayed_retry(self) -> DelayedRetry: ...

    def put_back(self, entry: QueueEntry) -> None: ...

    def dispatch(self) -> None: ...


def requeue(queue: RequeueingQueue, entries: Iterable[tuple[QueueEntry, Consumer | None]], cause: str | None) -> None:
    """Settle `entries` as unacked deliveries of `queue` that came back for `cause`, then dispatch.

    `cause` is delayed_retry.FAILED or RETURNED; None (a management "get" that requeues)
    neither counts towards the delivery limit nor waits.
    """
    settings = queue.settings
    for entry, consumer in entries:
        queue.settle(entry, consumer)
        if queue.deleted:
            continue
        if cause is not None:
            limit = settings.delivery_limit
            if limit is not None and entry.delivery_count > limit:
                dead_letter.hand_off(queue, [entry], dead_letter.DELIVERY_LIMIT)
                continue
            delay = retry_delay_ms(settings, entry.delivery_count, cause)
            if delay:
                queue.delayed_retry().hold(entry, delay)
                continue
        queue.put_back(entry)
    drop_head_after_return(queue)
    queue.dispatch()
