"""Length limits of a queue: x-max-length, x-max-length-bytes, and what x-overflow does at them.

Only ready messages count, as in RabbitMQ. With `drop-head` (the default) the oldest ready
messages leave (dead-lettered with reason `maxlen` if there is a dead-letter exchange) until
the queue fits again; `reject-publish` refuses a message that would not fit, so its publisher
gets a basic.nack; `reject-publish-dlx` also dead-letters the refused message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from queues import dead_letter
from queues.arguments import QueueArguments
from queues.message import Message, QueueEntry

if TYPE_CHECKING:
    from queues.ready_messages import ReadyList


class LimitedQueue(dead_letter.DeadLetterSource, Protocol):
    """What the length limits use of the queue (a queues.queue.Queue): its ready messages, and
    what dead-lettering uses (settings among them)."""

    @property
    def ready(self) -> ReadyList: ...


def is_limited(settings: QueueArguments) -> bool:
    return settings.max_length is not None or settings.max_length_bytes is not None


def refuses(queue: LimitedQueue, message: Message) -> bool:
    """True when x-overflow reject-publish(-dlx) refuses `message` because it would not fit."""
    overflow = queue.settings.overflow
    if overflow == "drop-head" or not over_limit(queue, 1, len(message.body)):
        return False
    if overflow == "reject-publish-dlx":
        dead_letter.hand_off(queue, [QueueEntry(message, 0)], dead_letter.MAXLEN)
    return True


def over_limit(queue: LimitedQueue, extra_messages: int, extra_bytes: int) -> bool:
    """Would the ready messages exceed a limit with `extra_messages` of `extra_bytes` more?"""
    settings = queue.settings
    if settings.max_length is not None and len(queue.ready) + extra_messages > settings.max_length:
        return True
    limit = settings.max_length_bytes
    return limit is not None and queue.ready.bytes + extra_bytes > limit


def drop_head_over_limit(queue: LimitedQueue) -> None:
    """Drop (or dead-letter) the oldest ready messages until the queue is within its limits."""
    dropped = []
    while queue.ready and over_limit(queue, 0, 0):
        entry = queue.ready.pop()
        entry.mark_gone()
        dropped.append(entry)
    dead_letter.hand_off(queue, dropped, dead_letter.MAXLEN)


def drop_head_after_return(queue: LimitedQueue) -> None:
    """Messages came back (requeued, or released from a delayed retry): a drop-head queue drops
    its oldest ready messages past the limits, as RabbitMQ does; reject-publish queues keep them."""
    if is_limited(queue.settings) and queue.settings.overflow == "drop-head":
        drop_head_over_limit(queue)
