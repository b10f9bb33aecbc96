"""A federation link's status: its state, its error, its reconnects, and its counters.

RabbitMQ's statuses (rabbit_federation_status): `starting` while the link connects, `running`
once it consumes from the upstream, and `error` with the reason when a connection failed or
was lost (the link then waits its reconnect-delay and starts again). This broker adds what
RabbitMQ leaves to the logs: how many times the link reconnected, when it will try next, and
what it moved (received from the upstream, confirmed here, acknowledged upstream, dropped as
a loop). `as_json` is the shape of /api/federation-links.

The state moves only through `TRANSITIONS`, by LinkStatus's methods.
"""

from __future__ import annotations

import enum
import hashlib
import time
from dataclasses import dataclass
from typing import Any


class LinkState(enum.Enum):
    """Each value is how RabbitMQ's API names the state."""

    STARTING = "starting"
    RUNNING = "running"
    ERROR = "error"


class LinkEvent(enum.Enum):
    CONNECTING = "connecting"  # (re)connecting to both ends
    CONNECTED = "connected"  # consuming from the upstream
    FAILED = "failed"  # a connection failed, was refused or was lost


TRANSITIONS: dict[LinkState, dict[LinkEvent, LinkState]] = {
    LinkState.STARTING: {LinkEvent.CONNECTED: LinkState.RUNNING, LinkEvent.FAILED: LinkState.ERROR,
                         LinkEvent.CONNECTING: LinkState.STARTING},
    LinkState.RUNNING: {LinkEvent.FAILED: LinkState.ERROR, LinkEvent.CONNECTING: LinkState.STARTING},
    LinkState.ERROR: {LinkEvent.CONNECTING: LinkState.STARTING, LinkEvent.FAILED: LinkState.ERROR},
}


class IllegalLinkTransition(RuntimeError):
    pass


EXCHANGE, QUEUE = "exchange", "queue"


@dataclass(frozen=True)
class LinkKey:
    """What identifies a link: the federated exchange or queue here, and its upstream."""

    vhost: str
    kind: str  # EXCHANGE or QUEUE
    name: str  # the exchange or queue here
    upstream: str  # the upstream's name (its parameter)
    upstream_name: str  # the exchange or queue on the upstream

    @property
    def id(self) -> str:
        """A short stable id, as RabbitMQ's (8 hex digits of a hash of the key)."""
        text = "\0".join((self.vhost, self.kind, self.name, self.upstream, self.upstream_name))
        return hashlib.sha1(text.encode()).hexdigest()[:8]


def _timestamp(now: float) -> str:
    """RabbitMQ's "2026-12-02 0:48:45": local time, the hour unpadded."""
    local = time.localtime(now)
    return f"{local.tm_year}-{local.tm_mon:02d}-{local.tm_mday:02d} {local.tm_hour}:{local.tm_min:02d}:{local.tm_sec:02d}"


class LinkStatus:
    """The status of one link, changed only by the link that owns it."""

    def __init__(self, key: LinkKey, uri: str, consumer_tag: str | None = None,
                 clock: Any = time.time) -> None:
        self.key = key
        self.uri = uri  # the upstream's URI, without credentials
        self.consumer_tag = consumer_tag
        self._clock = clock
        self.state = LinkState.STARTING
        self.error: str | None = None
        self.local_connection: str | None = None
        self.changed_at = clock()
        self.reconnects = 0  # starts after the first
        self.next_attempt_at: float | None = None
        self.received = 0  # deliveries from the upstream
        self.confirmed = 0  # published here (confirmed, with on-confirm)
        self.acked_upstream = 0
        self.dropped = 0  # not forwarded: already seen, or past max-hops
        self.redelivered = 0  # deliveries the upstream marked redelivered (possible duplicates)

    def _move(self, event: LinkEvent) -> None:
        target = TRANSITIONS[self.state].get(event)
        if target is None:
            raise IllegalLinkTransition(f"{event.value} in state {self.state.value}")
        self.state = target
        self.changed_at = self._clock()

    def connecting(self, uri: str) -> None:
        """A (re)start: counted as a reconnect after the first."""
        if self.state is not LinkState.STARTING or self.error is not None:
            self.reconnects += 1
        self._move(LinkEvent.CONNECTING)
        self.uri = uri
        self.next_attempt_at = None

    def use_uri(self, uri: str) -> None:
        """The link reached its upstream at `uri` (one of its URIs)."""
        self.uri = uri

    def connected(self, local_connection: str) -> None:
        self._move(LinkEvent.CONNECTED)
        self.error = None
        self.local_connection = local_connection

    def failed(self, error: str, retry_in_s: float) -> None:
        self._move(LinkEvent.FAILED)
        self.error = error
        self.local_connection = None
        self.next_attempt_at = self.changed_at + retry_in_s

    def count_received(self, redelivered: bool) -> None:
        self.received += 1
        if redelivered:
            self.redelivered += 1

    def count_confirmed(self, count: int = 1) -> None:
        self.confirmed += count

    def count_acked_upstream(self, count: int = 1) -> None:
        self.acked_upstream += count

    def count_dropped(self) -> None:
        self.dropped += 1

    def as_json(self, node: str) -> dict[str, Any]:
        """The link as /api/federation-links lists it (RabbitMQ's fields first)."""
        key = self.key
        item: dict[str, Any] = {"node": node}
        if key.kind == EXCHANGE:
            item.update(exchange=key.name, upstream_exchange=key.upstream_name)
        else:
            item.update(queue=key.name, upstream_queue=key.upstream_name, consumer_tag=self.consumer_tag)
        item.update(type=key.kind, vhost=key.vhost, upstream=key.upstream, id=key.id, status=self.state.value)
        if self.state is LinkState.RUNNING:
            item["local_connection"] = self.local_connection
        elif self.state is LinkState.ERROR:
            item["error"] = self.error
        item.update(uri=self.uri, timestamp=_timestamp(self.changed_at))
        item.update(
            reconnects=self.reconnects,
            next_attempt_in=(max(0.0, round(self.next_attempt_at - self._clock(), 1))
                             if self.next_attempt_at is not None and self.state is LinkState.ERROR else None),
            messages_received=self.received,
            messages_confirmed=self.confirmed,
            messages_acked_upstream=self.acked_upstream,
            messages_dropped=self.dropped,
            messages_redelivered=self.redelivered,
        )
        return item
