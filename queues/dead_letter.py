"""Dead-lettering: a message leaving its queue, and what it looks like afterwards (x-death).

`hand_off` is the queue's side: whatever removed the messages (expiry, a length limit, a
rejection, the delivery limit), they are counted, journaled as gone and handed to the vhost,
which republishes them through the queue's dead-letter exchange (amqp_server/dead_lettering.py).

RabbitMQ (docs/dlx.md) records, per {queue, reason}, one `x-death` entry with a count, the
time of the first occurrence, the exchange and routing keys the message had, and its
original expiration; the most recent entry comes first. It also sets `x-first-death-*` once
and `x-last-death-*` every time, and strips the per-message TTL so the message does not
expire again on the way.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from queues.message import Message

if TYPE_CHECKING:
    from queues.queue import Queue
    from queues.queue_entry import QueueEntry

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
DELIVERY_LIMIT = "delivery_limit"


def hand_off(queue: "Queue", entries: "list[QueueEntry]", reason: str) -> None:
    """`entries` left `queue` for `reason`: count them, journal it, and give them to the queue's
    dead-letter exchange if it has one (else they are dropped)."""
    if not entries:
        return
    stats = queue.stats
    counter = "dead_lettered_" + reason
    setattr(stats, counter, getattr(stats, counter) + len(entries))
    has_dlx = queue.dead_letterer is not None and queue.settings.dead_letter_exchange is not None
    if queue.journal is not None:
        for entry in entries:
            if entry.persisted:
                queue.journal.removed(entry, reason, has_dlx)
    if has_dlx:
        queue.dead_letterer(queue, entries, reason)


def routing_keys_of(message: Message) -> list[str]:
    """The message's routing key plus its CC keys (RabbitMQ keeps both in x-death)."""
    keys = [message.routing_key]
    headers = message.headers or {}
    cc = headers.get("CC")
    if isinstance(cc, list):
        keys.extend(item.decode() if isinstance(item, bytes) else str(item) for item in cc)
    return keys


def dead_lettered(
    message: Message, queue_name: str, reason: str, now: float, routing_key: str | None = None
) -> Message:
    """A copy of `message` with x-death updated for leaving `queue_name` for `reason`.

    With `routing_key` (the queue's x-dead-letter-routing-key) the copy carries that key.
    """
    properties = message.properties
    headers: dict[str, Any] = dict(properties.headers or {})
    deaths = [dict(entry) for entry in headers.get("x-death") or [] if isinstance(entry, dict)]
    for index, entry in enumerate(deaths):
        if _text(entry.get("queue")) == queue_name and _text(entry.get("reason")) == reason:
            entry["count"] = int(entry.get("count", 0)) + 1
            deaths.insert(0, deaths.pop(index))
            break
    else:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue_name,
            "time": datetime.datetime.fromtimestamp(int(now), tz=datetime.timezone.utc),
            "exchange": message.exchange,
            "routing-keys": routing_keys_of(message),
        }
        if properties.expiration is not None:
            entry["original-expiration"] = properties.expiration
        deaths.insert(0, entry)
    headers["x-death"] = deaths
    if "x-first-death-queue" not in headers:
        headers["x-first-death-queue"] = queue_name
        headers["x-first-death-reason"] = reason
        headers["x-first-death-exchange"] = message.exchange
    headers["x-last-death-queue"] = queue_name
    headers["x-last-death-reason"] = reason
    headers["x-last-death-exchange"] = message.exchange
    properties.headers = headers
    properties.expiration = None
    copy = message.with_properties(properties, routing_key)
    copy.published_at = now  # it enters its next queue now: that queue's TTL counts from here
    return copy


def is_cycle(message: Message, target_queue: str) -> bool:
    """RabbitMQ drops a dead-lettered message that would return to a queue it already died in,
    unless a rejection happened on the way (a client decided, so it is not an endless loop)."""
    deaths = (message.headers or {}).get("x-death") or []
    seen_target = False
    for entry in deaths:
        if not isinstance(entry, dict):
            continue
        if _text(entry.get("reason")) == REJECTED:
            return False
        if _text(entry.get("queue")) == target_queue:
            seen_target = True
    return seen_target


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
