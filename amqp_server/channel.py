"""One AMQP channel as a sans-I/O state machine: frames in, frames out through its connection.

The channel assembles published content, routes it, tracks its consumers and unacked
deliveries, and implements confirms and transactions. Methods of the exchange and queue
classes are in `declarations.py`; this file keeps what runs per message.
"""

from __future__ import annotations

import logging
import struct
from collections import defaultdict
from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server import codec, errors
from amqp_server.basic_methods import METHOD_HANDLERS
from amqp_server.declarations import DECLARATION_HANDLERS
from amqp_server.errors import AMQPError
from amqp_server.publisher_confirms import PublisherConfirms
from amqp_server.reply_to import REPLY_QUEUE, is_reply_key
from queues.consumer import Consumer
from queues.delayed_retry import FAILED, RETURNED
from queues.delivery_count import header_with_delivery_count
from queues.delivery_timeouts import DeliveryTimeouts
from queues.journal import when_synced
from queues.message import FLAG_HEADERS, FLAG_REPLY_TO, FLAG_USER_ID, Message
from queues.queue import ENQUEUED_DURABLY, REJECTED, Queue
from queues.queue_entry import QueueEntry
from queues.unacked_store import Unacked, UnackedStore

if TYPE_CHECKING:
    from amqp_server.connection import Connection
    from exchanges import Exchange

log = logging.getLogger(__name__)

OPEN = "open"
CLOSING = "closing"  # we sent channel.close and wait for close-ok
CLOSED = "closed"


class PendingPublish:
    """A basic.publish whose content header and body are still arriving."""

    __slots__ = ("exchange", "routing_key", "mandatory", "routing_raw", "raw_header", "body_size", "parts", "received")

    def __init__(self, exchange: "Exchange", routing_key: str, mandatory: bool, routing_raw: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.routing_raw = routing_raw
        self.raw_header: bytes | None = None
        self.body_size = 0
        self.parts: list[bytes] = []
        self.received = 0


class Channel:
    def __init__(self, connection: "Connection", channel_id: int) -> None:
        self.connection = connection
        self.id = channel_id
        self.state = OPEN
        self.vhost = connection.vhost
        self.consumers: dict[str, Consumer] = {}
        self.unacked = UnackedStore()
        self.next_delivery_tag = 1
        self.prefetch_count = 0  # basic.qos global=false: per consumer
        self.global_prefetch_count = 0  # basic.qos global=true: the whole channel
        self.confirms: PublisherConfirms | None = None
        self.transactional = False
        self.tx_publishes: list[tuple["Exchange", Message, bool]] = []
        self.tx_settlements: list[tuple[str, int, bool, bool]] = []
        self.last_queue_name = ""
        self.reply_key: str | None = None
        self.reply_consumer_tag: str | None = None
        self._pending: PendingPublish | None = None
        self._tag_raw: dict[str, bytes] = {}
        self._write_permitted: set[str] = set()
        # Consumer timeouts: deadlines of tracked deliveries (made on first use), and the tags
        # that timed out, so a late ack of one is ignored instead of being an unknown tag.
        self.delivery_timeouts: DeliveryTimeouts | None = None
        self._timed_out: set[int] = set()

    # -- frames in ---------------------------------------------------------------------

    def handle_method(self, payload: bytes) -> None:
        """Handle one method frame; AMQPError for anything RabbitMQ would refuse."""
        index = codec.method_index(payload)
        pending = self._pending
        if pending is not None:
            expected = "content header for class 60" if pending.raw_header is None else "content body"
            kind = "content header" if pending.raw_header is None else "content body"
            raise AMQPError(
                errors.UNEXPECTED_FRAME, f"expected {expected}, got non {kind} frame instead", 60, 40
            )
        if self.state == CLOSING:
            self._handle_while_closing(index, payload)
            return
        try:
            if index == codec.PUBLISH_METHOD:
                self._on_publish(payload)
                return
            if index == codec.ACK_METHOD:
                tag, multiple = codec.decode_ack(payload)
                self._settle("ack", tag, multiple, False)
                return
        except (IndexError, struct.error, UnicodeDecodeError):
            raise codec.cannot_decode(payload) from None
        if index == codec.ACCESS_REQUEST_METHOD:
            # Kept by RabbitMQ for very old clients: always granted, ticket 1 (pamqp 4 lacks the class).
            self.connection.send_frames([codec.access_request_ok_frame(self.id)])
            return
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
            self.state = CLOSED
            self.connection.channel_finished(self)
        elif index == 0x00140028:  # channel.close crossing ours
            self.connection.send_method(self.id, commands.Channel.CloseOk())
        elif index == 0x0014000A:  # channel.open before our close was acknowledged
            raise AMQPError(errors.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)

    def handle_header(self, payload: bytes) -> None:
        pending = self._pending
        if pending is None:
            if self.state == CLOSING:
                return
            raise AMQPError(errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        if pending.raw_header is not None:
            raise AMQPError(errors.UNEXPECTED_FRAME, "expected content body, got non content body frame instead")
        class_id, body_size = codec.content_header_body_size(payload)
        if class_id != codec.BASIC_CLASS:
            raise AMQPError(errors.FRAME_ERROR, f"content header for class {class_id} not class 60")
        max_size = self.connection.broker.max_message_size
        if body_size > max_size:
            self._pending = None
            raise AMQPError(
                errors.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {max_size}",
                60,
                40,
            )
        pending.raw_header = payload
        pending.body_size = body_size
        if body_size == 0:
            self._complete_publish()

    def handle_body(self, payload: bytes) -> None:
        pending = self._pending
        if pending is None or pending.raw_header is None:
            if self.state == CLOSING:
                return
            raise AMQPError(errors.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        pending.parts.append(payload)
        pending.received += len(payload)
        if pending.received >= pending.body_size:
            if pending.received > pending.body_size:
                raise AMQPError(
                    errors.FRAME_ERROR,
                    f"content body larger than declared: {pending.received} > {pending.body_size}",
                )
            self._complete_publish()

    def expects_content(self) -> bool:
        return self._pending is not None

    # -- publishing --------------------------------------------------------------------

    def _on_publish(self, payload: bytes) -> None:
        exchange_name, routing_key, mandatory, immediate, routing_raw = codec.decode_publish(payload)
        if immediate:
            raise AMQPError(errors.NOT_IMPLEMENTED, "immediate=true", 60, 40)
        exchange = self.vhost.exchanges.get(exchange_name)
        if exchange is None:
            raise AMQPError(errors.NOT_FOUND, f"no {errors.resource('exchange', exchange_name, self.vhost.name)}", 60, 40)
        if exchange_name not in self._write_permitted:
            self.connection.check_permission("write", "exchange", exchange_name or "amq.default")
            self._write_permitted.add(exchange_name)
        if exchange.internal:
            raise AMQPError(
                errors.ACCESS_REFUSED,
                f"cannot publish to internal {errors.resource('exchange', exchange_name, self.vhost.name)}",
                60,
                40,
            )
        self._pending = PendingPublish(exchange, routing_key, mandatory, routing_raw)

    def _complete_publish(self) -> None:
        pending = self._pending
        self._pending = None
        parts = pending.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        message = Message(pending.exchange.name, pending.routing_key, pending.raw_header, body, pending.routing_raw)
        flags = message.property_flags
        if flags & (FLAG_USER_ID | FLAG_REPLY_TO):
            message = self._check_special_properties(message, flags)
        broker = self.connection.broker
        broker.stats.received += 1
        broker.message_sizes.observe(len(body))
        if self.confirms is not None:
            broker.stats.received_confirm += 1
        if self.transactional:
            self.tx_publishes.append((pending.exchange, message, pending.mandatory))
            return
        self._route(pending.exchange, message, pending.mandatory)

    def _check_special_properties(self, message: Message, flags: int) -> Message:
        properties = message.properties
        user = self.connection.user.name
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
            properties.reply_to = f"{REPLY_QUEUE}.{self.reply_key}"
            message = message.with_properties(properties)
        return message

    def _route(self, exchange: "Exchange", message: Message, mandatory: bool) -> list[Queue] | None:
        """Route and enqueue; returns the queues that journaled the message (None if none did)."""
        broker = self.connection.broker
        confirms = self.confirms
        if self.vhost.firehose is not None:
            self.vhost.firehose.published(message, self.connection, self.id)
        seq = confirms.take_seq() if confirms is not None else 0
        accepted = True
        journaled: list[Queue] | None = None
        if exchange is self.vhost.default_exchange and is_reply_key(message.routing_key):
            delivered = broker.reply_registry.deliver(message)
        else:
            routing_keys = sender_selected_keys(message) if message.property_flags & FLAG_HEADERS else None
            if routing_keys is not None:
                message = strip_bcc(message)
            delivered = False
            for queue in self.vhost.route(exchange, message, routing_keys):
                outcome = queue.publish(message)
                if outcome == REJECTED:
                    accepted = False  # a queue at its length limit with x-overflow reject-publish
                elif outcome == ENQUEUED_DURABLY:
                    journaled = [queue] if journaled is None else journaled + [queue]
                delivered = True
                if queue.congested:
                    self.connection.throttle(queue)
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
                self.connection.confirms_pending(self)
            else:
                # Durable means durable: confirm only once every queue's copy is fsynced.
                confirms.hold(seq)
                when_synced(journaled, lambda error: self._confirm_synced(seq, accepted and error is None))
        return journaled

    def _confirm_synced(self, seq: int, ok: bool) -> None:
        if self.state != OPEN:
            return
        self.confirms.release(seq, ok)
        self.connection.confirms_pending(self)

    def _send_return(self, message: Message) -> None:
        frames = [
            codec.method_frame(
                self.id,
                commands.Basic.Return(
                    reply_code=errors.NO_ROUTE,
                    reply_text="NO_ROUTE",
                    exchange=message.exchange,
                    routing_key=message.routing_key,
                ),
            )
        ]
        codec.content_frames(frames, self.id, message.raw_header, message.body, self.connection.max_body_frame)
        self.connection.send_frames(frames)

    def flush_confirms(self) -> None:
        """Send the publisher confirms collected since the last flush."""
        confirms = self.confirms
        acked_before = confirms.acked_total
        for is_ack, tag, multiple in confirms.take_frames():
            method = commands.Basic.Ack(tag, multiple) if is_ack else commands.Basic.Nack(tag, multiple, False)
            self.connection.send_method(self.id, method)
        self.connection.broker.stats.confirmed += confirms.acked_total - acked_before

    @property
    def has_published(self) -> bool:
        """True once the channel has published (RabbitMQ counts it as a publisher from then on)."""
        return bool(self._write_permitted)

    # -- delivering (the DeliverySink a consumer uses) ---------------------------------

    def can_deliver(self) -> bool:
        if self.connection.write_paused or self.state != OPEN:
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
        self.connection.send_frames(
            codec.deliver_frames(
                self.id,
                tag_raw,
                tag,
                redelivered,
                message.routing_raw,
                raw_header,
                message.body,
                self.connection.max_body_frame,
            )
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
        if self.state == OPEN and self.connection.client_capabilities.get("consumer_cancel_notify"):
            self.connection.send_method(self.id, commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    # -- settling deliveries -----------------------------------------------------------

    def _settle(self, kind: str, tag: int, multiple: bool, requeue: bool) -> None:
        """ack / nack / reject of one delivery tag, or of all up to it with `multiple`."""
        if self.transactional:
            self._take_unacked(tag, multiple, peek=True)
            self.tx_settlements.append((kind, tag, multiple, requeue))
            return
        taken = self._take_unacked(tag, multiple)
        self._apply_settlement(kind, taken, requeue)

    def _take_unacked(self, tag: int, multiple: bool, peek: bool = False) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            if tag == 0 or tag in unacked or unacked.has_tag_above(tag) or tag in self._timed_out:
                if peek:
                    return []
                if self.delivery_timeouts is not None:
                    self.forget_timeouts(tag, True)
                return unacked.pop_up_to(tag)
        elif tag in unacked:
            if peek:
                return []
            if self.delivery_timeouts is not None:
                self.delivery_timeouts.forget(tag)
            return [unacked.pop(tag)]
        elif tag in self._timed_out:
            # It timed out and went back to its queue: settling it now changes nothing.
            if not peek:
                self._timed_out.discard(tag)
            return []
        raise AMQPError(errors.PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, 80)

    def _apply_settlement(self, kind: str, taken: list[Unacked], requeue: bool, cause: str = FAILED) -> None:
        """Settle `taken`; a requeue is for `cause` (delayed_retry.FAILED or RETURNED)."""
        if not taken:
            return
        stats = self.connection.broker.stats
        touched: set[Queue] = set()
        if kind == "ack":
            for entry, queue, consumer in taken:
                queue.ack(entry, consumer)
                touched.add(queue)
            stats.acked += len(taken)
        elif requeue:
            by_queue: dict[Queue, list[tuple[QueueEntry, Consumer | None]]] = defaultdict(list)
            for entry, queue, consumer in taken:
                by_queue[queue].append((entry, consumer))
            for queue, entries in by_queue.items():
                queue.requeue(entries, cause)
            touched.update(by_queue)
        else:
            for entry, queue, consumer in taken:
                queue.reject(entry, consumer)
                touched.add(queue)
        self._after_room_freed(touched)

    def _after_room_freed(self, queues: set[Queue]) -> None:
        # With a channel-wide limit, room freed by one queue's ack may be used by any queue.
        if self.global_prefetch_count:
            queues = queues | {consumer.queue for consumer in self.consumers.values()}
        for queue in queues:
            queue.dispatch()

    def dispatch_all(self) -> None:
        """Offer messages again to every consumer of this channel (room appeared)."""
        for queue in {consumer.queue for consumer in self.consumers.values()}:
            queue.dispatch()

    # -- closing -----------------------------------------------------------------------

    def release(self) -> None:
        """The channel is gone: cancel its consumers and requeue what it had not acked."""
        self._pending = None
        self.state = CLOSED if self.state == OPEN else self.state
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        if self.reply_key is not None:
            self.connection.broker.reply_registry.unregister(self.reply_key)
            self.reply_key = None
        if self.delivery_timeouts is not None:
            self.delivery_timeouts.clear()
        self._timed_out.clear()
        self._apply_settlement("nack", self.unacked.pop_all(), True, RETURNED)

    # -- consumer timeout --------------------------------------------------------------

    def track_timeout(self, tag: int, timeout_ms: int) -> None:
        """Delivery `tag` times out if it is still unacked after `timeout_ms`."""
        if self.delivery_timeouts is None:
            self.delivery_timeouts = DeliveryTimeouts(self.vhost.timers, self._deliveries_timed_out)
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

    def _deliveries_timed_out(self, tags: list[int]) -> None:
        """Deliveries unacked for longer than their consumer timeout.

        A client that understands basic.cancel (consumer_cancel_notify) keeps its channel: each
        late delivery goes back to its queue (subject to delayed retry, as a "returned" one) and
        only the consumers that held them are cancelled. Other clients get what RabbitMQ does:
        the channel is closed with 406, which returns everything it had not acked.
        """
        if self.state != OPEN:
            return
        late = [(tag, self.unacked.pop(tag)) for tag in tags if tag in self.unacked]
        if not late:
            return
        if not self.connection.client_capabilities.get("consumer_cancel_notify"):
            for tag, unacked in late:
                self.unacked.add(tag, unacked)  # the channel's release requeues them all
            timeout = next((u.consumer.timeout_ms for _t, u in late if u.consumer is not None), None)
            timeout = timeout or late[0][1].queue.settings.consumer_timeout_ms
            self.connection.fail_channel(
                self,
                AMQPError(
                    errors.PRECONDITION_FAILED,
                    f"delivery acknowledgement on channel {self.id} timed out. Timeout value used: {timeout} ms. "
                    "This timeout value can be configured, see consumers doc guide to learn more",
                ),
            )
            return
        self._timed_out.update(tag for tag, _unacked in late)
        for consumer in {unacked.consumer for _tag, unacked in late if unacked.consumer is not None}:
            # Cancel first, so the requeued message is not handed straight back to it.
            if self.consumers.pop(consumer.tag, None) is not None:
                consumer.queue.remove_consumer(consumer)
                self.connection.send_method(self.id, commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))
        self._apply_settlement("nack", [unacked for _tag, unacked in late], True, RETURNED)


def sender_selected_keys(message: Message) -> list[str] | None:
    """Routing keys from the CC and BCC headers (RabbitMQ's sender-selected distribution)."""
    raw = message.raw_header
    if b"\x02CC" not in raw and b"\x03BCC" not in raw:
        return None
    headers = message.headers or {}
    extra = []
    for name in ("CC", "BCC"):
        value = headers.get(name)
        if isinstance(value, list):
            extra.extend(item.decode() if isinstance(item, bytes) else str(item) for item in value)
    if not extra:
        return None
    return [message.routing_key, *extra]


def strip_bcc(message: Message) -> Message:
    headers = message.headers or {}
    if "BCC" not in headers:
        return message
    properties = message.properties
    properties.headers = {key: value for key, value in headers.items() if key != "BCC"}
    return message.with_properties(properties)


