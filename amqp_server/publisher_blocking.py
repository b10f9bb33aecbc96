"""Pausing a publishing connection: flow control, and resource alarms.

Flow control: a connection that publishes into a congested queue (queues/queue.py FLOW_HIGH)
stops being read until every such queue drains. Resource alarms, as RabbitMQ does them: an
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

from amqp_server.states import ConnectionState

if TYPE_CHECKING:
    from amqp_server.connection import Connection
    from queues.queue import Queue

# These are the connection's log lines: one logger to configure for all of them.
log = logging.getLogger("amqp_server.connection")


def throttle(connection: "Connection", queue: "Queue") -> None:
    """Stop reading from `connection` until `queue` drains."""
    if queue in connection.throttled_by:
        return
    first = not connection.throttled_by
    connection.throttled_by.add(queue)
    queue.flow_waiters[connection] = lambda: _unthrottle(connection, queue)
    if first:
        connection.on_reading_paused(True)


def _unthrottle(connection: "Connection", queue: "Queue") -> None:
    connection.throttled_by.discard(queue)
    if not connection.reading_paused:
        connection.on_reading_paused(False)


def alarm_changed(connection: "Connection", reason: str | None) -> None:
    """The broker's resource alarms changed (alarms.py); `reason` is None when none is left."""
    connection.alarm_reason = reason
    if reason is not None:
        connection.block_on_publish = connection.blocked_by is None
        if connection.block_on_publish and connection.content_in_flight:
            # Publishes started before the alarm: their bodies are publishes too, and would
            # otherwise go on arriving while every new one waits.
            block(connection)
        return
    connection.block_on_publish = False
    if connection.blocked_by is None:
        return
    connection.blocked_by = None
    if connection.blocked_sent and connection.state is ConnectionState.OPEN:
        connection.send_method(0, commands.Connection.Unblocked())
    connection.blocked_sent = False
    log.debug("connection %s unblocked: resource alarms cleared", connection.describe())
    if not connection.reading_paused:
        connection.on_reading_paused(False)


def block(connection: "Connection") -> None:
    """A publish arrived during an alarm: tell the client (if it listens) and stop reading."""
    connection.block_on_publish = False
    reason = connection.alarm_reason
    if reason is None or connection.state is not ConnectionState.OPEN:
        return
    connection.blocked_by = reason
    if connection.client_capabilities.get("connection.blocked"):
        connection.send_method(0, commands.Connection.Blocked(reason))
        connection.blocked_sent = True
    log.debug("connection %s blocked: %s", connection.describe(), reason)
    connection.on_reading_paused(True)
