"""What the channel's parts need of the channel and its connection, as Protocols (typing only).

The channel layer sits below the connection layer: a Channel is handed its connection when it
is opened (Connection._open_channel) and talks to it only through `ChannelConnection`, so no
module of amqp_server.channel imports amqp_server.connection. Settlement, consumer timeouts and
ordered replies change narrow objects of their own (an UnackedStore, the DeliveryTimeouts, a
stats record, the held replies) and are handed those; what else they need of the channel or the
connection is declared here, member by member (`SettlingChannel`, `TimingOutChannel`,
`ReplyConnection`), so that they never import `amqp_server.channel.channel` either. The Channel
and the Connection satisfy these Protocols as they are. Read-only members are properties: a
part may read them, never assign them.
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
    from queues.consumer import Consumer
    from queues.queue import Queue


class SettlingChannel(Protocol):
    """What settling a channel's deliveries (settlement.py) reads of the channel, and asks of it:
    after a settlement freed room, its consumers are offered messages again."""

    @property
    def next_delivery_tag(self) -> int: ...

    @property
    def global_prefetch_count(self) -> int: ...

    @property
    def consumers(self) -> Mapping[str, "Consumer"]: ...

    def dispatch_all(self) -> None:
        """Offer messages again to every consumer of the channel."""


class TimeoutConnection(Protocol):
    """What the consumer-timeout answer (delivery_timeouts.py) uses of the channel's connection."""

    @property
    def client_capabilities(self) -> Mapping[str, Any]: ...

    def fail_channel(self, channel: Any, error: "AMQPError") -> None: ...

    def send_method(self, channel_id: int, method: Any) -> None: ...


class TimingOutChannel(SettlingChannel, Protocol):
    """What the consumer-timeout answer (delivery_timeouts.py) uses of the channel: it cancels the
    consumers whose deliveries timed out and settles those (or fails the channel)."""

    @property
    def id(self) -> int: ...

    @property
    def is_open(self) -> bool: ...

    @property
    def connection(self) -> TimeoutConnection: ...

    def remove_consumer(self, tag: str) -> "Consumer | None":
        """Forget the consumer `tag`; the caller stops it at its queue."""


class ReplyConnection(Protocol):
    """What a channel's OrderedReplies (ordered_replies.py) uses of its connection: it sends
    frames, and closes the channel or the connection when a held reply's change was refused."""

    @property
    def state(self) -> "ConnectionState": ...

    @property
    def channels(self) -> Mapping[int, Any]: ...

    def method_frame(self, channel_id: int, method: Any) -> bytes: ...

    def send_method(self, channel_id: int, method: Any) -> None: ...

    def send_frames(self, frames: list[bytes]) -> None: ...

    def close_by_broker(self, code: int, text: str) -> None: ...

    def fail_channel(self, channel: Any, error: "AMQPError") -> None: ...


class ChannelConnection(Protocol):
    """What a Channel, and the method handlers that reach the connection through
    `Channel.connection` (basic_methods.py, declarations.py, answers.py, transaction.py),
    use of the connection. A `channel`
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
