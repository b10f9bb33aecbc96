"""What the channel's parts need of the channel and its connection, as Protocols (typing only).

Settlement, consumer timeouts and ordered replies change narrow objects of their own (an
UnackedStore, the DeliveryTimeouts, a stats record, the held replies) and are handed those;
what else they need of the channel or the connection is declared here, member by member, so
that they never import `amqp_server.channel.channel` or `amqp_server.connection` (the
Channel and the Connection satisfy these Protocols as they are). Read-only members are
properties: a part may read them, never assign them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from amqp_server.wire.errors import AMQPError
    from amqp_server.wire.states import ConnectionState
    from queues.consumer import Consumer


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
