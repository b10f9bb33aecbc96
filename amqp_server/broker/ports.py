"""What the broker's model needs of the connections and channels it holds, as Protocols (typing only).

The broker layer sits below the channel and connection layers: a connection registers itself
with the broker (Broker.connection_opened) and the broker, its alarms and its firehose see it
only through the Protocols here, so no module of amqp_server.broker imports
amqp_server.connection or amqp_server.channel (direct reply-to's channels: reply_to.Requester). The Connection and the Channel satisfy these
Protocols as they are. Read-only members are properties: the broker reads them, never assigns them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from amqp_server.broker.access_control import User
    from amqp_server.broker.vhost import VirtualHost
    from queues.message import QueueEntry


class HeldDelivery(Protocol):
    """One delivery a channel holds until its ack."""

    @property
    def entry(self) -> "QueueEntry": ...


class HeldDeliveries(Protocol):
    def values(self) -> Iterable[HeldDelivery]:
        """The deliveries awaiting their ack."""


class BrokerChannel(Protocol):
    """What the broker reads of a connection's channel: counted for the max-channels limit, and
    its unacked deliveries' bytes counted by the memory alarm (alarms.message_bytes_held)."""

    @property
    def unacked(self) -> HeldDeliveries: ...


class TracedConnection(Protocol):
    """What the firehose (firehose.py) writes of the connection a traced message came through."""

    @property
    def name(self) -> str:
        """RabbitMQ's connection name ("client_ip:port -> server_ip:port")."""

    @property
    def user(self) -> "User | None": ...


class BrokerConnection(TracedConnection, Protocol):
    """A client connection as the broker holds it (`Broker.connections`)."""

    @property
    def vhost(self) -> "VirtualHost | None": ...

    @property
    def channels(self) -> Mapping[int, BrokerChannel]: ...

    def close_by_broker(self, code: int, text: str) -> None:
        """Close the connection from the broker's side (its vhost deleted, shutdown)."""

    def alarm_changed(self, reason: str | None) -> None:
        """The resource alarms' blocking reason changed (None: no alarm is left)."""
