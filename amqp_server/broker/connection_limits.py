"""Connection limits: how many connections the broker, a listener, a vhost or a user may hold at once.

Every accepted socket is a connection here, from accept until the socket closes: one still in
its handshake, one waiting out a refused login and an open one all hold memory and a file
descriptor. An `Admission` is what one socket holds: a slot in each of its limits, or, when one
of them is reached, the limit that refuses it. A refused socket is not dropped at once, which
clients report as a bare network error: it is refused at connection.open with 530 NOT_ALLOWED
and a text naming the limit, where every client expects a refusal (RabbitMQ refuses there when a
vhost's or user's connection limit is reached, with "access to vhost '/' refused for user
'guest': connection limit (N) is reached"). So that refused sockets cannot pile up in turn, each
limit lets at most REFUSING_AT_MOST of them wait for their refusal; beyond that a socket is
closed as soon as it is accepted.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence

from amqp_server.wire.errors import NOT_ALLOWED, AMQPError

# These are the connection's log lines: one logger to configure for all of them.
log = logging.getLogger("amqp_server.connection.connection")

# Sockets over a limit that may wait (at most the handshake timeout) for their refusal.
REFUSING_AT_MOST = 64
# Sockets closed at accept are logged once per this many seconds, with how many there were.
DROP_LOG_INTERVAL_S = 10.0


class LimitScope(enum.Enum):
    """Whose connections a limit counts, which decides what "no limit" is and the refusal text."""

    NODE = "node"  # the broker or one listener: 0 is no limit ([limits] max_connections)
    VHOST = "vhost"  # RabbitMQ's vhost max-connections: negative is no limit, 0 refuses every one
    USER = "user"  # RabbitMQ's user max-connections: the same


class ConnectionLimit:
    """At most `maximum` connections in one scope (see LimitScope for what means "no limit").
    `scope` names a NODE limit in the refusal ("broker", "listener 0.0.0.0:5672"); an empty
    scope gives RabbitMQ's vhost-limit text."""

    def __init__(self, scope: str, maximum: int, kind: LimitScope = LimitScope.NODE) -> None:
        self.scope = scope
        self.kind = kind
        self.maximum = maximum
        self.count = 0  # connections holding a slot
        self.refusing = 0  # sockets over the limit waiting for their refusal
        self._dropped = 0  # sockets closed at accept since the last log line about them
        self._dropped_logged_at = 0.0

    @property
    def is_limited(self) -> bool:
        return self.maximum > 0 if self.kind is LimitScope.NODE else self.maximum >= 0

    @property
    def is_reached(self) -> bool:
        return self.is_limited and self.count >= self.maximum

    def set_maximum(self, maximum: int) -> None:
        """A new limit; connections already over it stay (as in RabbitMQ)."""
        self.maximum = maximum

    def take(self) -> None:
        self.count += 1

    def give_back(self) -> None:
        self.count -= 1

    def start_refusing(self) -> bool:
        """Count one more socket waiting for its refusal; False when too many already wait."""
        if self.refusing >= REFUSING_AT_MOST:
            return False
        self.refusing += 1
        return True

    def stop_refusing(self) -> None:
        self.refusing -= 1

    def refusal(self, vhost: str, user: str) -> AMQPError:
        """The connection.close that refuses a connection over this limit at connection.open
        (RabbitMQ's texts for the vhost and user limits, rabbit_reader.erl)."""
        if self.kind is LimitScope.USER:
            text = f"connection refused for user '{user}': user connection limit ({self.maximum}) is reached"
        else:
            limit = f"{self.scope} connection limit" if self.scope else "connection limit"
            text = f"access to vhost '{vhost}' refused for user '{user}': {limit} ({self.maximum}) is reached"
        return AMQPError(NOT_ALLOWED, text, 10, 40)

    def dropped(self, peer: str, now: float) -> None:
        """A socket over this limit was closed at accept: log it, at most once per interval."""
        self._dropped += 1
        if now - self._dropped_logged_at < DROP_LOG_INTERVAL_S:
            return
        log.warning(
            "closed %d connection(s) at accept, the last from %s: %s connection limit (%d) is reached "
            "and %d more wait for their refusal",
            self._dropped, peer, self.scope or "the", self.maximum, self.refusing,
        )
        self._dropped = 0
        self._dropped_logged_at = now


class Admission:
    """What one socket holds against its limits, from accept until `release()`.

    `refused_by` is the limit that refuses it (at connection.open), None when it holds a slot in
    every limit; `dropped` is True when it must be closed at once (too many already wait)."""

    def __init__(self, limits: Sequence[ConnectionLimit], peer: str) -> None:
        self.refused_by = next((limit for limit in limits if limit.is_reached), None)
        self.dropped = False
        self._held: tuple[ConnectionLimit, ...] = ()
        if self.refused_by is None:
            self._held = tuple(limits)
            for limit in self._held:
                limit.take()
        elif not self.refused_by.start_refusing():
            self.dropped = True
            self.refused_by.dropped(peer, time.monotonic())
        self._released = False

    def enter(self, limit: ConnectionLimit) -> None:
        """At connection.open: take a slot in `limit` too (a vhost's or a user's, known only
        now, and checked by the caller with `is_reached`), given back with the others."""
        if self._released:
            return  # the socket is already gone: nothing to hold
        limit.take()
        self._held = (*self._held, limit)

    def release(self) -> None:
        """The socket closed: give its slots back (once)."""
        if self._released:
            return
        self._released = True
        for limit in self._held:
            limit.give_back()
        if self.refused_by is not None and not self.dropped:
            self.refused_by.stop_refusing()

