"""Pausing a publishing connection: flow control, and resource alarms.

Flow control: a connection that publishes into a congested queue (queues/queue.py FLOW_HIGH)
stops being read until every such queue drains; it handles none of the frames it read already
either, as RabbitMQ's reader does: they wait in its buffer (Connection.hold_input), so a
publisher is held at the publish that congested the queue, not a whole socket read (up to
256 KB, some 1,500 small publishes) later. Resource alarms, as RabbitMQ does them: an
alarm (memory or disk low) blocks a connection when it next publishes, not at once, so
connections that only consume keep going; it stops reading from the socket and, if the client
announced the connection.blocked capability, sends connection.blocked with the reason. Body
frames count as publishing too: a connection with publishes whose bodies are still arriving when
an alarm goes off is blocked at once, and a body frame that arrives during an alarm blocks as a
content header does, so publishes begun before the alarm cannot go on feeding the broker.
Clearing the last alarm unblocks every connection at once (connection.unblocked).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server.wire.states import ConnectionState
from queues.congestion import CongestedQueues

if TYPE_CHECKING:
    from amqp_server.connection.connection import Connection
    from queues.queue import Queue

# These are the connection's log lines: one logger to configure for all of them.
log = logging.getLogger("amqp_server.connection.connection")


class PublisherFlow:
    """Whether one connection's publishes hold it back: the congested queues it published into,
    and the resource alarm that blocked it. The connection asks `holds_reading` before reading,
    and tells `publishing()` of every content header and body frame."""

    __slots__ = ("_connection", "_congested", "block_on_publish", "blocked_by", "_alarm_reason", "_blocked_sent")

    def __init__(self, connection: "Connection") -> None:
        self._connection = connection
        # Queues whose congestion pauses reading from the connection (flow control).
        self._congested = CongestedQueues(self._throttled, self._unthrottled)
        # While an alarm is in effect the next publish blocks the connection; `blocked_by` is
        # then the reason ("low on memory") until it clears.
        self.block_on_publish = False
        self.blocked_by: str | None = None
        self._alarm_reason: str | None = None  # the alarm in effect
        self._blocked_sent = False  # connection.blocked was sent for it

    @property
    def holds_reading(self) -> bool:
        """A congested queue or a resource alarm holds back reading from the connection."""
        return bool(self._congested.queues) or self.blocked_by is not None

    @property
    def management_state(self) -> str:
        """RabbitMQ's state of an open connection: "blocked" once an alarm stopped reading from
        it, "blocking" while an alarm waits for its next publish, "flow" while a congested
        queue holds it back, else "running"."""
        if self.blocked_by is not None:
            return "blocked"
        if self.block_on_publish:
            return "blocking"
        return "flow" if self._congested.queues else "running"

    def throttle(self, queue: "Queue") -> None:
        """Stop reading from the connection until `queue` drains."""
        self._congested.add(queue)

    def _throttled(self) -> None:
        self._connection.hold_input()

    def _unthrottled(self) -> None:
        self._connection.release_input()

    def alarm_changed(self, reason: str | None) -> None:
        """The broker's resource alarms changed (alarms.py); `reason` is None when none is left."""
        connection = self._connection
        self._alarm_reason = reason
        if reason is not None:
            self.block_on_publish = self.blocked_by is None
            if self.block_on_publish and connection.content_in_flight:
                # Publishes started before the alarm: their bodies are publishes too, and would
                # otherwise go on arriving while every new one waits.
                self.publishing()
            return
        self.block_on_publish = False
        if self.blocked_by is None:
            return
        self.blocked_by = None
        if self._blocked_sent and connection.state is ConnectionState.OPEN:
            connection.send_connection_method(commands.Connection.Unblocked())
        self._blocked_sent = False
        log.debug("connection %s unblocked: resource alarms cleared", connection.describe())
        if not connection.reading_paused:
            connection.on_reading_paused(False)

    def publishing(self) -> None:
        """A content header or body arrived while an alarm waits for the next publish (the
        connection checks `block_on_publish` first): tell the client, if it listens, and stop
        reading."""
        connection = self._connection
        self.block_on_publish = False
        reason = self._alarm_reason
        if reason is None or connection.state is not ConnectionState.OPEN:
            return
        self.blocked_by = reason
        # AMQP 0-8 has no connection.blocked: its clients are held without a word, even one that
        # announced the capability (RabbitMQ 3.10's reader crashes encoding it for them).
        if connection.client_capabilities.get("connection.blocked") and connection.protocol.connection_blocked:
            connection.send_connection_method(commands.Connection.Blocked(reason))
            self._blocked_sent = True
        log.debug("connection %s blocked: %s", connection.describe(), reason)
        connection.on_reading_paused(True)

    def release(self) -> None:
        """The connection is gone: no queue holds a way to resume it, and nothing blocks it."""
        self._congested.clear()
        self.block_on_publish = False
        self.blocked_by = None
