"""What the channel needs of its connection, as a Protocol (typing only).

The channel layer sits below the connection layer: a Channel is handed its connection when
it is opened (Connection._open_channel) and talks to it only through `ChannelConnection`, so no
module of amqp_server.channel imports amqp_server.connection. The Connection satisfies the
Protocol as it is. Read-only members are properties: the channel reads them, never assigns them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from amqp_server.broker.access_control import User
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.vhost import VirtualHost
    from amqp_server.wire.errors import AMQPError
    from amqp_server.wire.states import ConnectionState
    from queues.queue import Queue


class ChannelConnection(Protocol):
    """What a Channel, and the method handlers that reach the connection through
    `Channel.connection` (basic_methods.py, declarations.py, settlement.py, transaction.py,
    consumer_timeouts.py, the OrderedReplies it is given), use of the connection. A `channel`
    argument is the Channel itself (Any here: this module imports no channel)."""

    @property
    def broker(self) -> "Broker": ...

    @property
    def name(self) -> str:
        """RabbitMQ's connection name, which the firehose's copies carry."""

    @property
    def vhost(self) -> "VirtualHost | None": ...

    @property
    def user(self) -> "User | None": ...

    @property
    def state(self) -> "ConnectionState": ...

    @property
    def channels(self) -> Mapping[int, Any]: ...

    @property
    def client_capabilities(self) -> Mapping[str, Any]: ...

    @property
    def is_cluster_link(self) -> bool: ...

    @property
    def max_body_frame(self) -> int:
        """The largest body frame payload the client takes (frame_max less the frame's overhead)."""

    @property
    def content_in_flight(self) -> int:
        """Declared body bytes of publishes still arriving, on all the connection's channels."""

    @property
    def max_content_in_flight(self) -> int: ...

    @property
    def deliveries_paused(self) -> bool:
        """No deliveries now: the client is not reading, or enough wait for the next write."""

    # -- frames out

    def method_frame(self, channel_id: int, method: Any) -> bytes: ...

    def send_method(self, channel_id: int, method: Any) -> None: ...

    def send_frames(self, frames: list[bytes]) -> None: ...

    def send_delivery(self, frames: list[bytes], body_size: int) -> None:
        """The frames of one delivery (the connection may pause deliveries after it)."""

    def confirms_pending(self, channel: Any) -> None:
        """`channel` has publisher confirms to send with the next write."""

    # -- the channel's life on its connection

    def channel_finished(self, channel: Any) -> None:
        """close-ok arrived for a channel the broker closed: its number may be reused."""

    def close_channel(self, channel: Any) -> None:
        """The client closed `channel` (channel.close)."""

    def fail_channel(self, channel: Any, error: "AMQPError") -> None:
        """Close `channel` with a soft error."""

    def close_by_broker(self, code: int, text: str) -> None:
        """Close the whole connection with a hard error."""

    # -- what the channel's methods ask of the connection

    def check_permission(self, kind: str, resource_kind: str, name: str) -> None:
        """403 (AMQPError) unless the connection's user may `kind` the named resource."""

    def own_exclusive(self, queue: "Queue") -> None:
        """`queue` was declared exclusive here: deleted when the connection closes."""

    def spend_method_budget(self) -> None:
        """A channel method other than publish and ack is being handled."""

    def content_started(self, body_size: int) -> None: ...

    def content_finished(self, body_size: int) -> None: ...

    def throttle(self, queue: "Queue") -> None:
        """Stop reading from this publisher until `queue` drains (flow control)."""

    def describe(self) -> str:
        """The connection for log lines."""
