"""The broker's connections as the Connections they are, for the layers above the connection.

The broker holds its connections through its own narrow Protocol (broker/ports.py's
BrokerConnection), and a channel its connection through channel/ports.py's ChannelConnection:
the layers below the connection may not name the class. The management API and the metrics,
which sit above it and report every field of a connection, read them through these views.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.connection.connection import Connection


def connections_of(broker: "Broker") -> "list[Connection]":
    """A copy of the broker's connections (every one is a Connection: only Connection registers)."""
    return cast("list[Connection]", list(broker.connections))


def connection_of(channel: Any) -> "Connection":
    """The Connection a channel belongs to."""
    return cast("Connection", channel.connection)

