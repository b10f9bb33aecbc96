"""Dead-lettering, all of it: a message leaving its queue, what it looks like afterwards
(x-death), and where it goes next (the queue's dead-letter exchange).

`hand_off` is the queue's side: whatever removed the messages (expiry, a length limit, a
rejection, the delivery limit), they are counted, journaled as gone and handed to the queue's
`dead_letterer` (the vhost, which owns exchanges and bindings), which calls `republish`.

`republish` routes copies through the dead-letter exchange. As in RabbitMQ, a missing
dead-letter exchange drops them, and so does a cycle (a message that would return to a queue
it already died in without a rejection on the way: `is_cycle`).

RabbitMQ (docs/dlx.md) records, per {queue, reason}, one `x-death` entry with a count, the
time of the first occurrence, the exchange and routing keys the message had, and its
original expiration; the most recent entry comes first. It also sets `x-first-death-*` once
and `x-last-death-*` every time, and strips the per-message TTL so the message does not
expire again on the way (`dead_lettered`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol, Self

from queues.message import CONTENT_HEADER_PREFIX_SIZE, FLAG_EXPIRATION, Message
from queues.raw_properties import RawProperties, encode_field

if TYPE_CHECKING:
    from queues.arguments import QueueArguments
    from queues.journal import QueueJournal
    from queues.message import QueueEntry
    from queues.queue_stats import QueueStats

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
DELIVERY_LIMIT = "delivery_limit"


class DeadLetterSource(Protocol):
    """What dead-lettering uses of the queue messages leave (a queues.queue.Queue): its name,
    settings and counters, its journal, and the callback that republishes them (the vhost's)."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> QueueArguments: ...

    @property
    def stats(self) -> QueueStats: ...

    @property
    def journal(self) -> QueueJournal | None: ...

    @property
    def dead_letterer(self) -> Callable[[Self, list[QueueEntry], str], None] | None: ...


def hand_off(queue: DeadLetterSource, entries: "list[QueueEntry]", reason: str) -> None:
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
    if has_dlx and queue.dead_letterer is not None:  # (has_dlx holds it: for mypy, per batch)
        queue.dead_letterer(queue, entries, reason)


class DeadLetterTarget(Protocol):
    """A queue a dead-lettered copy is routed to (a queues.queue.Queue)."""

    @property
    def name(self) -> str: ...

    def publish(self, message: Message) -> int: ...


class Router(Protocol):
    """What republishing needs of the vhost: its exchanges by name, and routing through them."""

    @property
    def exchanges(self) -> Mapping[str, Any]: ...  # read only: a vhost's dict of its Exchanges

    def route(
        self, exchange: Any, message: Message, routing_keys: Collection[str] | None = None
    ) -> Collection[DeadLetterTarget]:
        ...


def republish(router: Router, queue: DeadLetterSource, entries: "list[QueueEntry]", reason: str) -> None:
    """Route copies of `entries` (with x-death updated) from `queue`'s dead-letter exchange.

    With x-dead-letter-routing-key they carry that key; otherwise they keep their routing key
    and CC keys.
    """
    settings = queue.settings
    exchange = router.exchanges.get(settings.dead_letter_exchange or "")
    if exchange is None:
        return
    now = time.time()
    for entry in entries:
        new_key = settings.dead_letter_routing_key
        message = dead_lettered(entry.message, queue.name, reason, now, new_key, exchange.name)
        keys = (new_key,) if new_key is not None else tuple(routing_keys_of(entry.message))
        for target in router.route(exchange, message, keys):
            if not is_cycle(message, target.name, reason):
                target.publish(message)


def routing_keys_of(message: Message) -> list[str]:
    """The message's routing key plus its CC keys (RabbitMQ keeps both in x-death)."""
    keys = [message.routing_key]
    headers = message.headers or {}
    cc = headers.get("CC")
    if isinstance(cc, list):
        keys.extend(item.decode() if isinstance(item, bytes) else str(item) for item in cc)
    return keys


def dead_lettered(
    message: Message,
    queue_name: str,
    reason: str,
    now: float,
    routing_key: str | None = None,
    exchange: str | None = None,
) -> Message:
    """A copy of `message` with x-death updated for leaving `queue_name` for `reason`, as it
    is republished through the dead-letter `exchange`.

    With `routing_key` (the queue's x-dead-letter-routing-key) the copy carries that key and
    loses its CC header, as in RabbitMQ. Only the headers the broker writes and the expiration
    change: every other property and header keeps the bytes (and integer types) it came with.
    """
    properties = message.properties  # decoded (cached): read only, the original stays as it is
    headers = properties.headers or {}
    # An x-death that is not an array (a client's) counts as none, as in RabbitMQ (iterating
    # an integer one raised TypeError).
    x_death = headers.get("x-death")
    deaths: list[dict[str, Any]] = [dict(entry) for entry in x_death if isinstance(entry, dict)] if isinstance(x_death, list) else []
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
    written: dict[str, Any] = {"x-death": deaths}  # header values for encode_field
    if "x-first-death-queue" not in headers:
        written["x-first-death-queue"] = queue_name
        written["x-first-death-reason"] = reason
        written["x-first-death-exchange"] = message.exchange
    written["x-last-death-queue"] = queue_name
    written["x-last-death-reason"] = reason
    written["x-last-death-exchange"] = message.exchange
    dropped = {"CC", "BCC"} if routing_key is not None else {"BCC"}

    raw = RawProperties(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
    fields = []
    for name, value in raw.header_fields():
        if name in written:
            fields.append((name, encode_field(written.pop(name))))
        elif name not in dropped:
            fields.append((name, value))
    fields.extend((name, encode_field(value)) for name, value in written.items())
    raw.set_header_fields(fields)
    raw.remove(FLAG_EXPIRATION)  # it does not expire again on the way
    copy = message.with_raw_properties(raw.encode(), routing_key, exchange)
    copy.published_at = now  # it enters its next queue now: that queue's TTL counts from here
    return copy


def is_cycle(message: Message, target_queue: str, reason: str) -> bool:
    """Would dead-lettering `message` (x-death already updated) for `reason` into `target_queue`
    close an automatic loop? RabbitMQ's rule: never for a rejection (a client decided); else
    look at the x-death entries from the most recent back to the latest one for the target
    queue: a loop if none of them is a rejection."""
    if reason == REJECTED:
        return False
    deaths = (message.headers or {}).get("x-death") or []
    for entry in deaths:
        if not isinstance(entry, dict) or _text(entry.get("reason")) == REJECTED:
            return False  # a rejection, or something a client put there: not automatic
        if _text(entry.get("queue")) == target_queue:
            return True
    return False


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
