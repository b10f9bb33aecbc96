"""What the channel's parts need of the channel and its connection, as Protocols (typing only).

The channel layer sits below the connection layer: a Channel is handed its connection when it
is opened (Connection._open_channel) and talks to it only through `ChannelConnection`, so no
module of amqp_server.channel imports amqp_server.connection. Settlement, consumer timeouts and
ordered replies change narrow objects of their own (an UnackedStore, the DeliveryTimeouts, a
stats record, the held replies) and are handed those; what else they need of the channel is
declared here, member by member (`SettlingChannel`, `TimingOutChannel`), and what settling
needs of the timeouts and of an open transaction too (`SettlingTimeouts`, `OpenTransaction`),
so that settlement.py imports neither delivery_timeouts.py nor transaction.py. The method
handlers (basic_methods.py, declarations.py, transaction.py) and the queue types' answers
(answers.py) take the channel as a `MethodChannel`. So no other module of the package imports
`amqp_server.channel.channel`, and this module imports none of the package that imports it
(OrderedReplies says what it needs of its connection itself, ordered_replies.py).
The Channel and the Connection satisfy these Protocols as they are. Read-only members are
properties: a part may read them, never assign them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from queues.consumer import DeliverySink

if TYPE_CHECKING:
    from amqp_server.broker.access_control import User
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.vhost import VirtualHost
    from amqp_server.channel.ordered_replies import OrderedReplies
    from amqp_server.channel.unacked_store import Unacked, UnackedStore
    from amqp_server.wire.errors import AMQPError
    from amqp_server.wire.states import ConnectionState
    from exchanges import Exchange
    from queues.consumer import Consumer
    from queues.message import Message
    from queues.queue import Queue

# What an open transaction keeps for tx.commit (transaction.py).
Publish = tuple["Exchange", "Message", bool]  # exchange, message, mandatory
Settlement = tuple[str, int, bool, bool]  # kind ("ack", "nack", "reject"), tag, multiple, requeue


class SettlingChannel(Protocol):
    """What settling a channel's deliveries (settlement.py) reads of the channel, and asks of it:
    after a settlement freed room, its consumers are offered messages again."""

    @property
    def next_delivery_tag(self) -> int: ...

    @property
    def global_prefetch_count(self) -> int: ...

    @property
    def global_qos_active(self) -> bool: ...

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


class SettlingTimeouts(Protocol):
    """What settling (settlement.py, transaction.py) uses of a channel's DeliveryTimeouts
    (delivery_timeouts.py): settled tags are no longer timed, and a late settlement of a tag
    that timed out is ignored."""

    def has_timed_out(self, tag: int) -> bool: ...

    def forget(self, tag: int) -> None: ...

    def forget_settled(self, tag: int, multiple: bool) -> None: ...

    def forget_all(self) -> None: ...

    def forget_timed_out(self, tag: int) -> None: ...


class OpenTransaction(Protocol):
    """What settling (settlement.py) and the tx methods (transaction.py) use of a channel's open
    transaction (transaction.Transaction): it keeps publishes and settlements for tx.commit."""

    @property
    def publishes(self) -> list[Publish]: ...

    @property
    def settlements(self) -> list[Settlement]: ...

    def settle(self, unacked: "UnackedStore", timeouts: SettlingTimeouts | None, next_delivery_tag: int, kind: str,
               tag: int, multiple: bool, requeue: bool) -> None:
        """Keep a settlement for tx.commit; 406 unless it names unsettled deliveries."""

    def end(self) -> tuple[list[Publish], list[Settlement]]:
        """Commit or rollback: what the transaction kept; the next one starts empty."""


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

    # -- frames in

    def decode_method(self, payload: bytes) -> Any:
        """A method frame's payload decoded as the 0-9-1 method it is, in the protocol the
        connection speaks (wire/protocols.py); AMQPError as codec.decode_method raises it."""

    # -- frames out

    def method_frame(self, channel_id: int, method: Any) -> bytes: ...

    def send_method(self, channel_id: int, method: Any) -> None: ...

    def send_frames(self, frames: list[bytes]) -> None: ...

    def send_deliveries(self, frames: list[bytes], body_size: int, count: int) -> None:
        """The frames of `count` deliveries, `body_size` bytes of bodies (the connection may
        pause deliveries after them)."""

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


class MethodChannel(SettlingChannel, DeliverySink, Protocol):
    """What the method handlers (basic_methods.py, declarations.py, transaction.py) and the
    queue types' answers (answers.py) use of the channel they are handed: they read its state,
    and change it through its methods. It is the DeliverySink of the consumers basic.consume
    opens, and what settling a delivery reads (SettlingChannel)."""

    @property
    def id(self) -> int: ...

    @property
    def is_open(self) -> bool: ...

    @property
    def connection(self) -> ChannelConnection: ...

    @property
    def vhost(self) -> "VirtualHost": ...

    @property
    def replies(self) -> "OrderedReplies":
        """The channel's method replies, sent in the order of the methods."""

    @property
    def unacked(self) -> "UnackedStore": ...

    @property
    def delivery_timeouts(self) -> SettlingTimeouts | None: ...

    @property
    def transaction(self) -> OpenTransaction | None:
        """The open transaction, from tx.select on."""

    @property
    def confirms(self) -> object | None:
        """Not None in confirm mode (the handlers only test which mode the channel is in)."""

    @property
    def prefetch_count(self) -> int:
        """basic.qos global=false: the limit later consumers get."""

    @property
    def last_queue_name(self) -> str:
        """The queue last declared: an empty queue name in a method means it."""

    @property
    def reply_key(self) -> str | None:
        """The channel's direct reply-to key, while it consumes amq.rabbitmq.reply-to."""

    @property
    def reply_consumer_tag(self) -> str | None: ...

    def set_prefetch(self, count: int, global_: bool) -> None: ...

    def remember_queue(self, name: str) -> None: ...

    def add_consumer(self, consumer: "Consumer") -> None: ...

    def remove_consumer(self, tag: str) -> "Consumer | None":
        """Forget the consumer `tag`; the caller stops it at its queue."""

    def forget_consumer(self, consumer: "Consumer") -> None:
        """Drop a consumer that never started, untold."""

    def start_reply_consumer(self, tag: str) -> None: ...

    def stop_reply_consumer(self) -> None: ...

    def select_confirms(self) -> None: ...

    def select_transactions(self) -> None: ...

    def take_delivery_tag(self) -> int: ...

    def await_ack(self, tag: int, delivery: "Unacked", timeout_ms: int | None) -> None:
        """Delivery `tag` (a basic.get's) awaits its ack, timing out after `timeout_ms` if set."""

    def route_publish(self, exchange: "Exchange", message: "Message", mandatory: bool) -> list[Any] | int | None:
        """Route and enqueue a publish (tx.commit); what to wait on until it is stored, or WRITE_FAILED."""
