"""One AMQP channel as a sans-I/O state machine: frames in, frames out through its connection.

The channel owns its state (OPEN, CLOSING, CLOSED: states.py, moved only by `advance`) and
its settings; other modules change them through its methods. It takes frames from its
connection, hands a publish's content frames to its ContentAssembly (content_assembly.py),
delivers to its consumers and tracks what they have not acked. The rest is in modules of its
own: publishing, routing and confirms (publishing.py), ack/nack/reject (settlement.py),
transactions (transaction.py), consumer timeouts (consumer_timeouts.py), the other basic,
channel and confirm methods (basic_methods.py), and the exchange and queue classes
(declarations.py).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server import codec, errors
from amqp_server.basic_methods import METHOD_HANDLERS
from amqp_server.cluster_link_frames import FORWARD_TO_METHOD
from amqp_server.consumer_timeouts import deliveries_timed_out
from amqp_server.declarations import DECLARATION_HANDLERS
from amqp_server.delivery_timeouts import DeliveryTimeouts
from amqp_server.errors import AMQPError
from amqp_server.ordered_replies import OrderedReplies
from amqp_server.publisher_confirms import PublisherConfirms
from amqp_server.cluster_forwarded import ForwardFlow, forwarded_queues
from amqp_server.content_assembly import ContentAssembly
from amqp_server.publishing import begin_publish, complete_publish, refused_header
from amqp_server.settlement import apply_settlement, settle
from amqp_server.states import CHANNEL_TRANSITIONS, ChannelEvent, ChannelState, next_state
from amqp_server.transaction import Transaction
from amqp_server.unacked_store import Unacked, UnackedStore
from queues.consumer import Consumer
from queues.delays.delayed_retry import RETURNED
from queues.delivery_count import header_with_delivery_count
from queues.field_tables import InvalidContentHeader
from queues.message import Message
from queues.queue_entry import QueueEntry

if TYPE_CHECKING:
    from amqp_server.connection import Connection
    from exchanges import Exchange
    from queues.queue import Queue

log = logging.getLogger(__name__)

OPEN = ChannelState.OPEN
CLOSING = ChannelState.CLOSING
CLOSED = ChannelState.CLOSED


class Channel:
    """One channel of a connection, and the DeliverySink of the consumers it opened."""

    def __init__(self, connection: "Connection", channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self.state = OPEN  # changed by advance() only
        self.vhost = connection.vhost
        # Method replies, in order even when one waits for disk (declare-ok, commit-ok).
        self.replies = OrderedReplies(connection, channel_id)
        self.consumers: dict[str, Consumer] = {}
        self.unacked = UnackedStore()
        self.next_delivery_tag = 1
        self.prefetch_count = 0  # basic.qos global=false: per consumer
        self.global_prefetch_count = 0  # basic.qos global=true: the whole channel
        self.confirms: PublisherConfirms | None = None
        self.transaction: Transaction | None = None  # from tx.select on
        self.last_queue_name = ""
        self.reply_key: str | None = None
        self.reply_consumer_tag: str | None = None
        self.content: ContentAssembly | None = None  # a publish whose content is arriving
        self._tag_raw: dict[str, bytes] = {}
        self.write_permitted: set[str] = set()  # exchanges the user was allowed to publish to
        self._published_before = False  # published before forget_permissions() emptied write_permitted
        # Consumer timeouts: deadlines of tracked deliveries (made on first use), and the tags
        # that timed out, so a late ack of one is ignored instead of being an unknown tag.
        self.delivery_timeouts: DeliveryTimeouts | None = None
        self.timed_out: set[int] = set()
        # On a cluster link's channel, after a forward-to: the queues of this node the next
        # publishes go into, unrouted (cluster_forwarded.py). None on every client channel.
        self.forward_targets: tuple["Queue", ...] | None = None
        self.forward_flow: ForwardFlow | None = None  # its channel.flow to the sending node, once needed

    def advance(self, event: ChannelEvent) -> None:
        """Move to the state `event` leads to (states.py); IllegalTransition if this state does
        not allow it."""
        self.state = next_state(CHANNEL_TRANSITIONS, self.state, event)

    # -- frames in ---------------------------------------------------------------------

    def handle_method(self, payload: bytes, index: int) -> None:
        """Handle one method frame (`index`: its class and method ids, codec.method_index);
        AMQPError for anything RabbitMQ would refuse."""
        if self.content is not None:
            raise self.content.method_refused()
        if self.state is CLOSING:
            self._handle_while_closing(index, payload)
            return
        try:
            if index == codec.PUBLISH_METHOD:
                self.content = begin_publish(self, payload)
                return
            if index == codec.ACK_METHOD:
                tag, multiple = codec.decode_ack(payload)
                settle(self, "ack", tag, multiple, False)
                return
        except (IndexError, struct.error, UnicodeDecodeError):
            raise codec.cannot_decode(payload) from None
        if index == FORWARD_TO_METHOD and self.connection.is_cluster_link:
            self.forward_targets = forwarded_queues(self, payload)
            if self.forward_flow is None:
                self.forward_flow = ForwardFlow(self)
            return
        if index == codec.ACCESS_REQUEST_METHOD:
            # Kept by RabbitMQ for very old clients: always granted, ticket 1 (pamqp 4 lacks the class).
            self.connection.send_frames([codec.access_request_ok_frame(self.id)])
            return
        self.connection.spend_method_budget()
        method = codec.decode_method(payload)
        handler = METHOD_HANDLERS.get(type(method)) or DECLARATION_HANDLERS.get(type(method))
        if handler is None:
            raise AMQPError(errors.COMMAND_INVALID, "unimplemented method", index >> 16, index & 0xFFFF)
        try:
            handler(self, method)
        except AMQPError as error:
            if not error.class_id:
                error.class_id, error.method_id = index >> 16, index & 0xFFFF
            raise

    def _handle_while_closing(self, index: int, payload: bytes) -> None:
        # After we sent channel.close, everything but close and close-ok is dropped (spec 1.5.2.5).
        if index == 0x00140029:  # channel.close-ok
            self.advance(ChannelEvent.CLOSE_OK)
            self.connection.channel_finished(self)
        elif index == 0x00140028:  # channel.close crossing ours
            self.connection.send_method(self.id, commands.Channel.CloseOk())
        elif index == 0x0014000A:  # channel.open before our close was acknowledged
            raise AMQPError(errors.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)

    def handle_header(self, payload: bytes) -> None:
        content = self.content
        if content is None:
            if self.state is CLOSING:
                return
            raise AMQPError(errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        try:
            complete = content.take_header(payload, self.connection.broker.max_message_size)
        except InvalidContentHeader as invalid:
            raise refused_header(self, invalid) from None
        if complete:
            self.content = None
            complete_publish(self, content, b"")

    def handle_body(self, payload: bytes) -> None:
        content = self.content
        if content is None or content.raw_header is None:
            if self.state is CLOSING:
                return
            raise AMQPError(errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        body = content.take_body(payload)
        if body is not None:
            self.content = None
            if content.in_flight:
                self.connection.content_finished(content.body_size)
            complete_publish(self, content, body)
        elif not content.in_flight:
            self._content_in_flight(content)

    def _content_in_flight(self, content: ContentAssembly) -> None:
        """A content's first body frame left it incomplete: it holds memory until the rest comes.
        Messages arriving interleaved on many channels would each hold theirs, so one connection
        may hold at most max_content_in_flight declared bytes (one message of any allowed size
        always). Messages whose body comes in one frame, the usual case, never get here."""
        connection = self.connection
        in_flight = connection.content_in_flight
        if in_flight and in_flight + content.body_size > connection.max_content_in_flight:
            raise AMQPError(
                errors.PRECONDITION_FAILED,
                f"content in flight on this connection would reach {in_flight + content.body_size} bytes, "
                f"more than the configured max_content_in_flight {connection.max_content_in_flight}",
                60,
                40,
            )
        content.counted_in_flight()
        connection.content_started(content.body_size)

    # -- modes and settings (basic_methods.py, transaction.py) ---------------------------

    def select_confirms(self) -> None:
        """confirm.select: publishes from now on are confirmed (once; a second select changes nothing)."""
        if self.confirms is None:
            self.confirms = PublisherConfirms(self.confirms_released)

    def select_transactions(self) -> None:
        """tx.select: publishes and settlements from now on wait for tx.commit."""
        if self.transaction is None:
            self.transaction = Transaction()

    @property
    def transactional(self) -> bool:
        return self.transaction is not None

    @property
    def uncommitted_messages(self) -> int:
        return len(self.transaction.publishes) if self.transaction is not None else 0

    @property
    def uncommitted_acks(self) -> int:
        return len(self.transaction.settlements) if self.transaction is not None else 0

    def set_prefetch(self, count: int, global_: bool) -> None:
        """basic.qos: the channel-wide limit (global), or the one later consumers get."""
        if global_:
            self.global_prefetch_count = count
        else:
            self.prefetch_count = count

    def remember_queue(self, name: str) -> None:
        """The queue last declared: an empty queue name in later methods means it."""
        self.last_queue_name = name

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[consumer.tag] = consumer

    def remove_consumer(self, tag: str) -> Consumer | None:
        """Forget the consumer `tag` (basic.cancel, consumer timeout); the caller stops it at its
        queue. None if the channel has no such consumer."""
        return self.consumers.pop(tag, None)

    def permit_write(self, exchange_name: str) -> None:
        """The user may publish to `exchange_name`: not checked again until forget_permissions()."""
        self.write_permitted.add(exchange_name)

    def start_reply_consumer(self, tag: str) -> None:
        """basic.consume on amq.rabbitmq.reply-to (direct reply-to): the channel gets its key."""
        self.reply_key = self.connection.broker.reply_registry.register(self)
        self.reply_consumer_tag = tag

    def stop_reply_consumer(self) -> None:
        if self.reply_key is not None:
            self.connection.broker.reply_registry.unregister(self.reply_key)
        self.reply_key = self.reply_consumer_tag = None

    # -- publisher confirms ------------------------------------------------------------

    def flush_confirms(self) -> None:
        """Send the publisher confirms collected since the last flush."""
        confirms = self.confirms
        acked_before = confirms.acked_total
        for is_ack, tag, multiple in confirms.take_frames():
            # RabbitMQ's confirm nack leaves requeue at its default, true.
            method = commands.Basic.Ack(tag, multiple) if is_ack else commands.Basic.Nack(tag, multiple, True)
            self.connection.send_method(self.id, method)
        self.connection.broker.stats.confirmed += confirms.acked_total - acked_before

    def confirms_released(self) -> None:
        """Publishes that waited for their queues to store them can be confirmed now."""
        if self.state is OPEN:
            self.connection.confirms_pending(self)

    @property
    def has_published(self) -> bool:
        """True once the channel has published (RabbitMQ counts it as a publisher from then on)."""
        return self._published_before or bool(self.write_permitted)

    def forget_permissions(self) -> None:
        """The user's credentials were renewed: check permissions again from the next publish."""
        self._published_before = self.has_published
        self.write_permitted.clear()

    # -- delivering (the DeliverySink a consumer uses) ---------------------------------

    @property
    def is_open(self) -> bool:
        return self.state is OPEN

    def take_delivery_tag(self) -> int:
        """The next delivery tag of this channel."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        return tag

    def forget_consumer(self, consumer: Consumer) -> None:
        """Drop a consumer that never started (its remote queue's owner refused it), untold."""
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]

    def can_deliver(self) -> bool:
        if self.connection.deliveries_paused or self.state is not OPEN:
            return False
        return not self.global_prefetch_count or len(self.unacked) < self.global_prefetch_count

    def deliver(self, consumer: Consumer, entry: QueueEntry) -> None:
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        if not consumer.no_ack:
            self.unacked.add(tag, Unacked(entry, consumer.queue, consumer))
            if consumer.timeout_ms:
                self.track_timeout(tag, consumer.timeout_ms)
        tag_raw = self._tag_raw.get(consumer.tag)
        if tag_raw is None:
            tag_raw = self._tag_raw[consumer.tag] = codec.shortstr(consumer.tag)
        message = entry.message
        raw_header = message.raw_header
        redelivered = entry.delivery_count > 0
        if redelivered and consumer.queue.adds_delivery_count:
            raw_header = header_with_delivery_count(message, entry.delivery_count)
        if self.vhost.firehose is not None:
            self.vhost.firehose.delivered(consumer.queue.name, message, redelivered, self.connection, self.id)
        self.connection.send_delivery(
            codec.deliver_frames(
                self.id,
                tag_raw,
                tag,
                redelivered,
                message.routing_raw,
                raw_header,
                message.body,
                self.connection.max_body_frame,
            ),
            len(message.body),
        )

    def deliver_reply(self, message: Message) -> None:
        """Direct reply-to: deliver straight to this channel's reply consumer (no-ack)."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        self.connection.send_frames(
            codec.deliver_frames(
                self.id,
                codec.shortstr(self.reply_consumer_tag),
                tag,
                False,
                message.routing_raw,
                message.raw_header,
                message.body,
                self.connection.max_body_frame,
            )
        )

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue went away: forget the consumer and tell clients that understand basic.cancel."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.state is OPEN and self.connection.client_capabilities.get("consumer_cancel_notify"):
            self.replies.send(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    def dispatch_all(self) -> None:
        """Offer messages again to every consumer of this channel (room appeared)."""
        for queue in {consumer.queue for consumer in self.consumers.values()}:
            queue.dispatch()

    # -- closing -----------------------------------------------------------------------

    def release(self) -> None:
        """The channel is gone (closed or closing, its state says which): cancel its consumers
        and requeue what it had not acked."""
        content = self.content
        if content is not None and content.in_flight:
            self.connection.content_finished(content.body_size)
        self.content = None
        if self.forward_flow is not None:
            self.forward_flow.release()
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        if self.reply_key is not None:
            self.stop_reply_consumer()
        if self.delivery_timeouts is not None:
            self.delivery_timeouts.clear()
        self.timed_out.clear()
        apply_settlement(self, "nack", self.unacked.pop_all(), True, RETURNED)

    # -- consumer timeout --------------------------------------------------------------

    def track_timeout(self, tag: int, timeout_ms: int) -> None:
        """Delivery `tag` times out if it is still unacked after `timeout_ms`."""
        if self.delivery_timeouts is None:
            self.delivery_timeouts = DeliveryTimeouts(self.vhost.timers, lambda tags: deliveries_timed_out(self, tags))
        self.delivery_timeouts.track(tag, timeout_ms)

    def forget_timeouts(self, tag: int, multiple: bool) -> None:
        timeouts = self.delivery_timeouts
        if timeouts is None:
            return
        if not multiple:
            timeouts.forget(tag)
        elif tag == 0:
            timeouts.clear()
        else:
            timeouts.forget_up_to(tag)
