"""One AMQP channel as a sans-I/O state machine: frames in, frames out through its connection.

The channel owns its state (OPEN, CLOSING, CLOSED: states.py, moved only by `advance`) and
its settings; other modules change them through its methods. It takes frames from its
connection, delivers to its consumers and tracks what they have not acked.

Publishing is the channel's too, in this file: a basic.publish whose frames came in one read,
its body in one frame (codec.FRAME_PUBLISH, the usual case), is taken whole by `handle_publish`;
otherwise its method frame starts a ContentAssembly (content_assembly.py) that the channel hands
the content header and body frames. Once the content is complete the channel makes the Message, checks the properties
RabbitMQ checks (user_id, direct reply-to), and either keeps it for tx.commit or routes it at
once (`route_publish`): it enqueues it, returns it to a mandatory publisher when nothing took
it, and resolves its publisher confirm (PublisherConfirms, below) at once, or once every queue
that journaled it has fsynced and every queue that lives elsewhere has its receipt.

The rest is in modules of its own: ack/nack/reject (settlement.py), transactions
(transaction.py), consumer timeouts (delivery_timeouts.py), the other basic, channel and
confirm methods (basic_methods.py), and the exchange and queue classes (declarations.py).
"""

from __future__ import annotations

import logging
import struct
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Collection, Sequence
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from pamqp import commands

from amqp_server.wire import codec, errors
from amqp_server.channel.basic_methods import METHOD_HANDLERS
from amqp_server.channel.declarations import DECLARATION_HANDLERS
from amqp_server.channel.delivery_timeouts import DeliveryTimeouts
from amqp_server.wire.errors import AMQPError
from amqp_server.broker.stats import BUCKET_BOUNDS, FIRST_BOUND
from amqp_server.channel.ordered_replies import OrderedReplies
from amqp_server.channel.publish_expiration import check_expiration
from amqp_server.broker.reply_to import REPLY_PREFIX, REPLY_QUEUE
from amqp_server.broker.sender_selected import check_routing_headers, sender_selected_keys, strip_bcc
from amqp_server.wire.codec import InvalidContentHeader, NestedTooDeep, UnknownDeliveryMode, header_body_size
from amqp_server.wire.content_assembly import ContentAssembly
from amqp_server.channel.settlement import apply_settlement, settle
from amqp_server.wire.states import CHANNEL_TRANSITIONS, ChannelEvent, ChannelState, next_state
from amqp_server.channel.transaction import Transaction
from amqp_server.channel.unacked_store import Unacked, UnackedStore
from queues.consumer import Consumer
from queues.delays.delayed_retry import RETURNED
from queues.delivery_count import header_with_delivery_count
from queues.message import (
    CONTENT_HEADER_PREFIX_SIZE,
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_REPLY_TO,
    FLAG_USER_ID,
    Message,
    QueueEntry,
)
from queues.publish_outcome import AWAIT_RECEIPT, ENQUEUED, ENQUEUED_DURABLY, REJECTED, WRITE_FAILED
from queues.raw_properties import RawProperties

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost
    from amqp_server.channel.ports import ChannelConnection
    from exchanges import Exchange
    from queues.queue import Queue

_new_tuple = tuple.__new__
_message_of = attrgetter("message")  # of a QueueEntry
log = logging.getLogger(__name__)

OPEN = ChannelState.OPEN
CLOSING = ChannelState.CLOSING
CLOSED = ChannelState.CLOSED
# The properties _check_special_properties looks at (one constant: the flags are tested per publish).
_CHECKED_FLAGS = FLAG_USER_ID | FLAG_REPLY_TO | FLAG_EXPIRATION


class Channel:
    """One channel of a connection, and the DeliverySink of the consumers it opened."""

    def __init__(self, connection: "ChannelConnection", channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self.state = OPEN  # changed by advance() only
        vhost = connection.vhost
        user = connection.user
        assert vhost is not None and user is not None, "a channel opens only after connection.open chose the vhost"
        self.vhost: "VirtualHost" = vhost
        # A publish's user_id must be this name (update-secret renews the user's record, never its name).
        self.user_name = user.name
        # Method replies, in order even when one waits for disk (declare-ok, commit-ok).
        self.replies = OrderedReplies(connection, channel_id)
        self.consumers: dict[str, Consumer] = {}
        self.unacked = UnackedStore()
        self.next_delivery_tag = 1
        self.prefetch_count = 0  # basic.qos global=false: per consumer
        self.global_prefetch_count = 0  # basic.qos global=true: the whole channel
        self.global_qos_active = False  # the last basic.qos was global, with a limit (set_prefetch)
        self.confirms: PublisherConfirms | None = None
        self.transaction: Transaction | None = None  # from tx.select on
        self.last_queue_name = ""
        self.reply_key: str | None = None
        self.reply_consumer_tag: str | None = None
        self.content: ContentAssembly | None = None  # a publish whose content is arriving
        # The last basic.publish method frame decoded, and its fields (_publish_method).
        self._last_publish_method = b""
        self._last_publish_fields: tuple[str, str, bool, bytes] = ("", "", False, b"")
        self._tag_raw: dict[str, bytes] = {}
        self.write_permitted: set[str] = set()  # exchanges the user was allowed to publish to
        self._published_before = False  # published before forget_permissions() emptied write_permitted
        # Consumer timeouts: deadlines of tracked deliveries and the tags that timed out (made on first use).
        self.delivery_timeouts: DeliveryTimeouts | None = None

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
        if index == codec.PUBLISH_METHOD:
            exchange, routing_key, mandatory, routing_raw = self._publish_method(payload)
            self.content = ContentAssembly(exchange, routing_key, mandatory, routing_raw)
            return
        try:
            if index == codec.ACK_METHOD:
                tag, multiple = codec.decode_ack(payload)
                settle(self.unacked, self.delivery_timeouts, self.transaction, self.connection.broker.stats, self,
                       "ack", tag, multiple, False)
                return
        except (IndexError, struct.error, UnicodeDecodeError):
            raise codec.cannot_decode(payload) from None
        if index == codec.ACCESS_REQUEST_METHOD:
            # Kept by RabbitMQ for very old clients: always granted, ticket 1 (pamqp 4 lacks the class).
            self.connection.send_frames([codec.access_request_ok_frame(self.id)])
            return
        self.handle_other_method(payload, index)

    def handle_other_method(self, payload: bytes, index: int) -> None:
        """A method frame that is neither a publish nor an ack: decoded, and handed to its
        handler (basic_methods.py, declarations.py). A subclass may take methods of its own
        first (the cluster plug-in's link channel takes its forward-to)."""
        self.connection.spend_method_budget()
        method = self.connection.decode_method(payload)  # in the connection's protocol (AMQP 0-8 too)
        handler = METHOD_HANDLERS.get(type(method)) or DECLARATION_HANDLERS.get(type(method))
        if handler is None:
            raise AMQPError(errors.COMMAND_INVALID, "unimplemented method", index >> 16, index & 0xFFFF)
        try:
            handler(self, method)
        except AMQPError as error:
            if not error.class_id:
                error.caused_by(index >> 16, index & 0xFFFF)
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
            raise self._refused_header(invalid) from None
        if complete:
            self.content = None
            self._complete_publish(content.exchange, content.routing_key, content.routing_raw, payload, b"",
                                   content.mandatory)

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
            self._complete_publish(content.exchange, content.routing_key, content.routing_raw, content.raw_header,
                                   body, content.mandatory)
        elif not content.in_flight:
            self._content_in_flight(content)

    def handle_publish(self, method: bytes, header: bytes, body: bytes) -> None:
        """A basic.publish method frame, its content header and its whole body in one frame, read
        together (codec.FRAME_PUBLISH): what handle_method, handle_header and handle_body do with
        them in turn, in one call and without a ContentAssembly."""
        if self.content is not None:
            raise self.content.method_refused()  # a publish before the last one's content was complete
        if self.state is CLOSING:
            return  # dropped, as its three frames would be one by one
        exchange, routing_key, mandatory, routing_raw = self._publish_method(method)
        try:
            # The body size it announces is len(body), not 0 (FrameReader joins only such a publish).
            header_body_size(header, self.connection.broker.max_message_size)
        except InvalidContentHeader as invalid:
            raise self._refused_header(invalid) from None
        self._complete_publish(exchange, routing_key, routing_raw, header, body, mandatory)

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

    # -- publishing --------------------------------------------------------------------

    def _publish_method(self, payload: bytes) -> tuple["Exchange", str, bool, bytes]:
        """A basic.publish method frame, decoded (or refused as undecodable), its exchange and
        permission checked: the exchange, the routing key, mandatory, and the exchange and key
        as they arrived (Message.routing_raw)."""
        if payload == self._last_publish_method:
            # A publisher usually repeats one exchange and key: the same bytes decode the same.
            exchange_name, routing_key, mandatory, routing_raw = self._last_publish_fields
        else:
            try:
                exchange_name, routing_key, mandatory, immediate, routing_raw = codec.decode_publish(payload)
            except (IndexError, struct.error, UnicodeDecodeError):
                raise codec.cannot_decode(payload) from None
            if immediate:
                raise AMQPError(errors.NOT_IMPLEMENTED, "immediate=true", 60, 40)
            self._last_publish_method = payload
            self._last_publish_fields = (exchange_name, routing_key, mandatory, routing_raw)
        vhost = self.vhost
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None:
            exchange = self.missing_exchange(exchange_name)
        if exchange_name not in self.write_permitted:
            self.connection.check_permission("write", "exchange", exchange_name or "amq.default")
            self.permit_write(exchange_name)
        if exchange.internal:
            self.check_internal_publish(exchange)
        return exchange, routing_key, mandatory, routing_raw

    def missing_exchange(self, exchange_name: str) -> "Exchange":
        """A publish names an exchange the vhost does not have: 404 (a subclass may decide
        otherwise: a link channel's publishes were routed by another node)."""
        raise AMQPError(errors.NOT_FOUND, f"no {errors.resource('exchange', exchange_name, self.vhost.name)}", 60, 40)

    def check_internal_publish(self, exchange: "Exchange") -> None:
        """A client may not publish to an internal exchange (403)."""
        raise AMQPError(
            errors.ACCESS_REFUSED,
            f"cannot publish to internal {errors.resource('exchange', exchange.name, self.vhost.name)}",
            60,
            40,
        )

    def _refused_header(self, invalid: InvalidContentHeader) -> AMQPError:
        """How to refuse a content header that `check_content_header` (codec.py)
        found consumers could not decode: 541 for what RabbitMQ cannot decode either (it closes
        the connection), 406 for a delivery_mode RabbitMQ refuses and for headers nested beyond
        this broker's limit."""
        log.warning(
            "refused a publish on connection %s, channel %d: content header %s",
            self.connection.describe(),
            self.id,
            invalid.reason,
        )
        if isinstance(invalid, UnknownDeliveryMode):
            text = f"invalid message: {{delivery_mode_unknown,{invalid.delivery_mode}}}"
            return AMQPError(errors.PRECONDITION_FAILED, text, 60, 40)
        if isinstance(invalid, NestedTooDeep):
            return AMQPError(errors.PRECONDITION_FAILED, f"invalid message: {invalid.reason}", 60, 40)
        return AMQPError(errors.INTERNAL_ERROR, "")

    def _complete_publish(self, exchange: "Exchange", routing_key: str, routing_raw: bytes, raw_header: bytes,
                          body: bytes, mandatory: bool) -> None:
        """The whole content arrived: make the message and route it (or keep it for tx.commit)."""
        message = Message(exchange.name, routing_key, raw_header, body, routing_raw)
        flags = message.property_flags
        # One test of the flag word; properties are decoded only for messages that set these.
        if flags & _CHECKED_FLAGS:
            message = self.check_special_properties(message, flags)
        if flags & FLAG_HEADERS:
            check_routing_headers(message)
        stats = self.connection.broker.stats
        stats.received += 1
        size = len(body)
        # The size histogram's bucket (metrics/message_sizes.py folds the counts when scraped):
        # most messages fit the first one, so no bisect for them.
        stats.received_sizes[0 if size <= FIRST_BOUND else bisect_left(BUCKET_BOUNDS, size)] += 1
        stats.received_bytes += size
        if self.confirms is not None:
            stats.received_confirm += 1
        if self.transaction is not None:
            self.transaction.publish(exchange, message, mandatory)
            return
        self.route_publish(exchange, message, mandatory)

    def check_special_properties(self, message: Message, flags: int) -> Message:
        """user_id must be the connection's user; reply_to amq.rabbitmq.reply-to gets the channel's key;
        expiration must be a TTL RabbitMQ accepts."""
        properties = message.properties
        user = self.user_name
        if flags & FLAG_USER_ID and properties.user_id != user:
            raise AMQPError(
                errors.PRECONDITION_FAILED,
                f"user_id property set to '{properties.user_id}' but authenticated user was '{user}'",
                60,
                40,
            )
        if flags & FLAG_REPLY_TO and properties.reply_to == REPLY_QUEUE:
            if self.reply_key is None:
                raise AMQPError(errors.PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40)
            raw = RawProperties(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
            raw.set_short_string(FLAG_REPLY_TO, f"{REPLY_QUEUE}.{self.reply_key}")
            message = message.with_raw_properties(raw.encode())
        if flags & FLAG_EXPIRATION:
            # The flag says the property is set (testing it for None too would cost a check per such publish).
            check_expiration(properties.expiration)  # type: ignore[arg-type]
        return message

    def route_publish(self, exchange: "Exchange", message: Message, mandatory: bool) -> "list[Queue] | int | None":
        """Route and enqueue; returns what to wait on until the message is stored (`when_stored`:
        the queues that journaled it, and for each queue that lives elsewhere the receipt of the
        message itself), None if nothing is to be waited on, or WRITE_FAILED if a queue's disk
        write failed (a transaction then fails its commit, transaction.py)."""
        vhost = self.vhost
        if vhost.firehose is not None:
            vhost.firehose.published(message, self.connection, self.id)
        # (reply_to.is_reply_key, without a call into reply_to.py for every publish)
        if exchange is vhost.default_exchange and message.routing_key.startswith(REPLY_PREFIX):
            delivered = self.connection.broker.reply_registry.deliver(message, vhost.name)
            return self.enqueue(message, mandatory, (), delivered)
        routing_keys = sender_selected_keys(message) if message.property_flags & FLAG_HEADERS else None
        if routing_keys is not None:
            message = strip_bcc(message)
            destinations = vhost.route(exchange, message, routing_keys)
        elif exchange is vhost.default_exchange:
            # The default exchange routes to the queue named by the key (VirtualHost.route's
            # first case, without the call): the usual publish to a queue.
            queue = vhost.queues.get(message.routing_key)
            destinations = (queue,) if queue is not None else ()
        else:
            destinations = vhost.route(exchange, message)
        return self.enqueue(message, mandatory, destinations, False)

    def enqueue(self, message: Message, mandatory: bool, destinations: "Collection[Queue]",
                delivered: bool) -> "list[Any] | int | None":
        """Publish a routed message into `destinations` (`delivered`: it already reached a direct
        reply-to consumer), return it when nothing took it and it is mandatory, and settle its
        publisher confirm: at once, or once what it waits for is stored (route_publish)."""
        connection = self.connection
        broker = connection.broker
        confirms = self.confirms
        seq = confirms.take_seq() if confirms is not None else 0
        accepted = True
        write_failed = False
        journaled: list[Any] | None = None
        for queue in destinations:
            outcome = queue.publish(message)
            if outcome == ENQUEUED:
                pass  # the usual outcome: nothing to wait for (one comparison, not four)
            elif outcome == REJECTED:
                accepted = False  # a queue at its length limit with x-overflow reject-publish
            elif outcome == ENQUEUED_DURABLY:
                if journaled is None:
                    journaled = [queue]
                else:
                    journaled.append(queue)
            elif outcome == WRITE_FAILED:
                accepted = False  # its disk write failed (queues/journal.py)
                write_failed = True
            elif outcome == AWAIT_RECEIPT:
                # Stored where the queue lives: wait for the receipt of this very message (a wait
                # per queue would cover only the last message sent there, and miss a nack).
                if journaled is None:
                    journaled = [queue.publish_receipt()]
                else:
                    journaled.append(queue.publish_receipt())
            delivered = True
            if queue.congested:
                self.congested(queue)
        if delivered:
            broker.stats.routed += 1
        elif mandatory:
            broker.stats.returned += 1
            self._send_return(message)
        else:
            broker.stats.dropped += 1
        if confirms is not None:
            if journaled is None:
                confirms.resolve(seq, accepted)
            else:
                # Durable means durable: confirm only once every queue's copy is fsynced (the
                # queues are asked at the end of the batch of input, once for the whole batch).
                confirms.hold_until_stored(seq, journaled, accepted)
            connection.confirms_pending(self)
        return WRITE_FAILED if write_failed else journaled

    def congested(self, queue: "Queue") -> None:
        """A publish of this channel congested `queue`: its connection stops reading until the
        queue drains (publisher flow control)."""
        self.connection.throttle(queue)

    def _send_return(self, message: Message) -> None:
        """basic.return of an unroutable mandatory message, with its content."""
        frames = [codec.return_frame(self.id, errors.NO_ROUTE, "NO_ROUTE", message.routing_raw)]
        codec.content_frames(frames, self.id, message.raw_header, message.body, self.connection.max_body_frame)
        self.connection.send_frames(frames)

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
            # As RabbitMQ's channel: a per-consumer basic.qos lifts the channel's global limit
            # (rabbit_limiter:unlimit_prefetch); a global one sent after it applies beside it.
            self.global_prefetch_count = 0
        # RabbitMQ's limiter is active while the last basic.qos was a global one (stream
        # consumers refuse it, queues/stream_queue.py).
        self.global_qos_active = global_ and count > 0

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
        assert confirms is not None, "only a channel in confirm mode has confirms to send"
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
            # (Unacked(...) without the named tuple's Python-level __new__: half the time, per delivery)
            self.unacked.add(tag, _new_tuple(Unacked, (entry, consumer.queue, consumer)))
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
        self.connection.send_deliveries(
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
            1,
        )

    def deliver_many(self, consumer: Consumer, entries: list[QueueEntry]) -> None:
        """`deliver` each of `entries`, first deliveries all, with one batch of frames (a stream's
        records: queues/stream_queue.py)."""
        first_tag = self.next_delivery_tag
        count = len(entries)
        self.next_delivery_tag = first_tag + count
        if not consumer.no_ack:
            # Unacked(entry, queue, consumer) for each, made by C loops (zip, map), not a Python step.
            made = map(_new_tuple, repeat(Unacked), zip(entries, repeat(consumer.queue), repeat(consumer)))
            self.unacked.add_run(first_tag, made)
            if consumer.timeout_ms:
                for tag in range(first_tag, first_tag + count):
                    self.track_timeout(tag, consumer.timeout_ms)
        tag_raw = self._tag_raw.get(consumer.tag)
        if tag_raw is None:
            tag_raw = self._tag_raw[consumer.tag] = codec.shortstr(consumer.tag)
        messages = list(map(_message_of, entries))
        if self.vhost.firehose is not None:
            for message in messages:
                self.vhost.firehose.delivered(consumer.queue.name, message, False, self.connection, self.id)
        frames: list[bytes] = []
        body_bytes = codec.deliveries_frames(frames, self.id, tag_raw, first_tag, messages, self.connection.max_body_frame)
        self.connection.send_deliveries(frames, body_bytes, count)

    def deliver_reply(self, message: Message) -> None:
        """Direct reply-to: deliver straight to this channel's reply consumer (no-ack)."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        self.connection.send_frames(
            codec.deliver_frames(
                self.id,
                # Set while reply_key is (the registry delivers to this channel by it); testing it
                # for None would cost a check per reply.
                codec.shortstr(self.reply_consumer_tag),  # type: ignore[arg-type]
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
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        if self.reply_key is not None:
            self.stop_reply_consumer()
        if self.delivery_timeouts is not None:
            self.delivery_timeouts.close()
        apply_settlement(self.connection.broker.stats, self, "nack", self.unacked.pop_all(), True, RETURNED)

    # -- consumer timeout --------------------------------------------------------------

    def track_timeout(self, tag: int, timeout_ms: int) -> None:
        """Delivery `tag` times out if it is still unacked after `timeout_ms`."""
        if self.delivery_timeouts is None:
            self.delivery_timeouts = DeliveryTimeouts(self.vhost.timers, self, self.unacked, self.connection.broker.stats)
        self.delivery_timeouts.track(tag, timeout_ms)

    def await_ack(self, tag: int, delivery: Unacked, timeout_ms: int | None) -> None:
        """Delivery `tag` (a basic.get's) awaits its ack; it times out after `timeout_ms`, if set.
        (Channel.deliver does the same inline, per message.)"""
        self.unacked.add(tag, delivery)
        if timeout_ms:
            self.track_timeout(tag, timeout_ms)


# -- publisher confirms ------------------------------------------------------------------
#
# Publisher confirms of one channel: which sequence numbers to ack or nack, batched.
#
# Each publish in confirm mode takes the next sequence number. A message is confirmed when
# every queue it went to has taken responsibility for it (for a persistent message on a durable
# queue: once it is on disk). Confirms are collected and sent once per batch of input, as one
# `multiple` ack covering everything that can be covered, so a fast publisher gets few frames.
#
# Messages that wait for their queues to store them are waited for in groups, not one by one:
# the publishes of one batch of input that went to the same queues share one `StoreWait`, which
# asks each of those queues once (`Queue.when_stored`) when the connection has handled the batch
# (`ask_stores`), after its last publish, so the one answer covers them all.


class StoreWait:
    """Publishes that went to the same queues, confirmed together once those queues stored them."""

    __slots__ = ("confirms", "queues", "seqs", "refused", "left", "error")

    def __init__(self, confirms: "PublisherConfirms", queues: Sequence[Any]) -> None:
        self.confirms = confirms
        self.queues = queues
        self.seqs: list[int] = []
        self.refused: set[int] | None = None  # sequence numbers a queue refused (nacked even if stored)
        self.left = len(queues)
        self.error: OSError | None = None

    def ask(self) -> None:
        """Ask each queue to call back once what was published to it so far is stored."""
        for queue in self.queues:
            queue.when_stored(self.one_stored)

    def one_stored(self, error: OSError | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.left -= 1
        if not self.left:
            self.confirms.stored(self)


class PublisherConfirms:
    """`on_released` is called when messages that waited for their queues can be confirmed."""

    __slots__ = ("next_seq", "acked_total", "_outstanding", "_held", "_acks", "_nacks", "_waits", "on_released")

    def __init__(self, on_released: Callable[[], None] = lambda: None) -> None:
        self.next_seq = 1
        self.acked_total = 0  # messages confirmed with basic.ack so far
        # Sequence numbers held until their messages are stored, and the same in the order they
        # were held (the oldest first, which bounds a multiple ack; stored ones are skipped).
        self._outstanding: set[int] = set()
        self._held: deque[int] = deque()
        self._acks: list[int] = []
        self._nacks: list[int] = []
        self._waits: list[StoreWait] = []  # made since the last take_frames, not asked yet
        self.on_released = on_released

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def hold_until_stored(self, seq: int, queues: Sequence[Any], accepted: bool = True) -> None:
        """`seq` is confirmed (acked if `accepted`, else nacked) once every one of `queues` has
        stored it; a queue's storage error nacks it. on_released() tells when."""
        self._outstanding.add(seq)
        self._held.append(seq)
        waits = self._waits
        wait = waits[-1] if waits else None
        if wait is None or wait.queues != queues:
            wait = StoreWait(self, queues)
            waits.append(wait)
        wait.seqs.append(seq)
        if not accepted:
            if wait.refused is None:
                wait.refused = set()
            wait.refused.add(seq)

    def ask_stores(self) -> None:
        """Hand the publishes held since the last call to their queues' storage (StoreWait.ask).
        Call it after the last publish of a batch of input, in the same event-loop iteration:
        one answer per queue then covers them all, and the fsync round that gives it starts as
        soon as it would have for the first of them."""
        waits = self._waits
        self._waits = []
        for wait in waits:
            wait.ask()

    def stored(self, wait: StoreWait) -> None:
        """Every queue of `wait` stored its messages (or failed to): they can be confirmed."""
        ok = wait.error is None
        refused = wait.refused
        outstanding = self._outstanding
        for seq in wait.seqs:
            outstanding.discard(seq)
            if ok and (refused is None or seq not in refused):
                self._acks.append(seq)
            else:
                self._nacks.append(seq)
        self.on_released()

    def resolve(self, seq: int, ok: bool = True) -> None:
        (self._acks if ok else self._nacks).append(seq)

    @property
    def unconfirmed(self) -> int:
        """Published in confirm mode, and neither ack nor nack sent yet."""
        return len(self._outstanding) + len(self._acks) + len(self._nacks)

    @property
    def has_pending(self) -> bool:
        return bool(self._acks or self._nacks)

    def _oldest_outstanding(self) -> int | None:
        held = self._held
        outstanding = self._outstanding
        while held and held[0] not in outstanding:
            held.popleft()
        return held[0] if held else None

    def take_frames(self) -> list[tuple[bool, int, bool]]:
        """(is_ack, delivery_tag, multiple) to send now, in order.

        Publishes held since the last ask_stores() are asked for first.
        """
        if self._waits:
            self.ask_stores()
        if not self._acks and not self._nacks:
            return []
        self.acked_total += len(self._acks)
        acks = self._acks
        nacks = self._nacks
        self._acks = []
        self._nacks = []
        acks.sort()
        nacks.sort()
        # A multiple ack for tag T also confirms every earlier tag, so it may only cover tags
        # that are all acked now or earlier: none still outstanding and none being nacked.
        limit = self._oldest_outstanding()
        if nacks and (limit is None or nacks[0] < limit):
            limit = nacks[0]
        covered = len(acks) if limit is None else bisect_left(acks, limit)
        frames: list[tuple[bool, int, bool]] = []
        if covered:
            frames.append((True, acks[covered - 1], covered > 1))
        if covered == len(acks) and not nacks:
            return frames
        for seq in acks[covered:]:
            frames.append((True, seq, False))
        for seq in nacks:
            frames.append((False, seq, False))
        frames.sort(key=_tag)
        return frames


def _tag(frame: tuple[bool, int, bool]) -> int:
    return frame[1]
