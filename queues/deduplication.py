"""Per-queue message deduplication (`x-message-deduplication`): a bounded cache of recent ids.

A message's id is the value of the header the queue names in `x-deduplication-header`; without
that argument it is the `x-deduplication-header` header (as the RabbitMQ deduplication plugin
and LavinMQ send it) or else the `message_id` property. A message without an id is never a
duplicate. An id is remembered for `x-cache-ttl` ms (the message's own `x-cache-ttl` header
wins; no TTL: until evicted) and the cache holds at most `x-cache-size` ids, the oldest evicted
first. The cache lives in memory: after a restart every id is new again.

Queue.publish consults the cache first (a repeat is accepted and confirmed, not enqueued) and
remembers a message's id once the queue took it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from queues.arguments import QueueArguments
from queues.message import FLAG_HEADERS, FLAG_MESSAGE_ID, Message

PLUGIN_HEADER = "x-deduplication-header"
TTL_HEADER = "x-cache-ttl"


class DeduplicationCache:
    """Ids seen recently by one queue, oldest first, each with the time it is forgotten (0: never)."""

    __slots__ = ("size", "ttl_ms", "header", "_seen")

    def __init__(self, size: int, ttl_ms: int | None = None, header: str | None = None) -> None:
        self.size = size
        self.ttl_ms = ttl_ms
        self.header = header
        self._seen: OrderedDict[Hashable, float] = OrderedDict()

    @classmethod
    def for_settings(cls, settings: QueueArguments) -> "DeduplicationCache | None":
        """The cache a queue with these settings keeps; None when it does not deduplicate."""
        if not settings.deduplication:
            return None
        return cls(settings.dedup_cache_size, settings.dedup_cache_ttl_ms, settings.dedup_header)

    def __len__(self) -> int:
        return len(self._seen)

    def id_of(self, message: Message) -> Hashable | None:
        """The message's deduplication id, or None when it has none."""
        flags = message.property_flags
        headers = message.properties.headers if flags & FLAG_HEADERS else None
        if self.header is not None:
            value = headers.get(self.header) if headers else None
        else:
            value = headers.get(PLUGIN_HEADER) if headers else None
            if value is None and flags & FLAG_MESSAGE_ID:
                value = message.properties.message_id
        if value is None or isinstance(value, Hashable):
            return value
        return repr(value)  # a table or array as id: compare by its text

    def is_duplicate(self, key: Hashable, now: float) -> bool:
        forget_at = self._seen.get(key)
        if forget_at is None:
            return False
        if forget_at and forget_at <= now:
            del self._seen[key]
            return False
        return True

    def remember(self, key: Hashable, message: Message, now: float) -> None:
        ttl_ms = self.ttl_ms
        headers = message.properties.headers if message.property_flags & FLAG_HEADERS else None
        if headers:
            header_ttl = headers.get(TTL_HEADER)  # one lookup, narrowed once
            if isinstance(header_ttl, int) and header_ttl > 0:
                ttl_ms = header_ttl
        seen = self._seen
        seen[key] = now + ttl_ms / 1000.0 if ttl_ms else 0.0
        seen.move_to_end(key)
        while len(seen) > self.size:
            seen.popitem(last=False)
        # Forget a few expired ids at the front on the way, so the cache shrinks when idle ids age.
        for _ in range(2):
            if not seen:
                break
            first = next(iter(seen))
            forget_at = seen[first]
            if not forget_at or forget_at > now:
                break
            del seen[first]
