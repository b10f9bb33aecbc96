"""Publishing on a channel: a basic.publish from its method frame to the queues it reaches.

The method frame starts a ContentAssembly (content_assembly.py) that the channel hands the
content header and body frames (Channel.handle_header / handle_body); then `complete_publish` makes the
Message, checks the properties RabbitMQ checks (user_id, direct reply-to), and either keeps it
for tx.commit or routes it at once. `route_publish` enqueues it, returns it to a mandatory
publisher when nothing took it, and resolves its publisher confirm: at once, or once every
queue that journaled it has fsynced and every other node it was forwarded to has confirmed it
(the queues are asked once per batch of input: PublisherConfirms.ask_stores).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import TYPE_CHECKING


from amqp_server import codec, errors
from amqp_server.content_assembly import ContentAssembly
from amqp_server.errors import AMQPError
from amqp_server.metrics.message_sizes import BUCKET_BOUNDS
from amqp_server.publish_expiration import check_expiration
from amqp_server.reply_to import REPLY_PREFIX, REPLY_QUEUE
from amqp_server.sender_selected import check_routing_headers, sender_selected_keys, strip_bcc
from queues.field_tables import InvalidContentHeader, NestedTooDeep, UnknownDeliveryMode
from queues.message import (
    CONTENT_HEADER_PREFIX_SIZE,
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_REPLY_TO,
    FLAG_USER_ID,
    Message,
)
from queues.raw_properties import RawProperties
from queues.publish_outcome import ENQUEUED_DURABLY, FORWARDED, REJECTED, WRITE_FAILED
from queues.queue import Queue

if TYPE_CHECKING:
    from amqp_server.channel import Channel
    from exchanges import Exchange

log = logging.getLogger(__name__)

def begin_publish(channel: "Channel", payload: bytes) -> ContentAssembly:
    """A basic.publish method frame: check the exchange and permission; what collects its content."""
    exchange_name, routing_key, mandatory, immediate, routing_raw = codec.decode_publish(payload)
    if immediate:
        raise AMQPError(errors.NOT_IMPLEMENTED, "immediate=true", 60, 40)
    vhost = channel.vhost
    exchange = vhost.exchanges.get(exchange_name)
    if exchange is None and channel.forward_targets is not None:
        # Forwarded by a node that routed it a moment before the exchange was deleted: it still
        # goes to its queues, named as published (deliveries repeat routing_raw byte for byte).
        exchange = vhost.default_exchange
    elif exchange is None:
        raise AMQPError(errors.NOT_FOUND, f"no {errors.resource('exchange', exchange_name, vhost.name)}", 60, 40)
    if exchange_name not in channel.write_permitted:
        channel.connection.check_permission("write", "exchange", exchange_name or "amq.default")
        channel.permit_write(exchange_name)
    if exchange.internal and channel.forward_targets is None:  # a dead-lettered message may come from one
        raise AMQPError(
            errors.ACCESS_REFUSED,
            f"cannot publish to internal {errors.resource('exchange', exchange_name, vhost.name)}",
            60,
            40,
        )
    return ContentAssembly(exchange, routing_key, mandatory, routing_raw)


def refused_header(channel: "Channel", invalid: InvalidContentHeader) -> AMQPError:
    """How to refuse a content header that `check_content_header` found consumers could not
    decode: 541 for what RabbitMQ cannot decode either (it closes the connection), 406 for a
    delivery_mode RabbitMQ refuses and for headers nested beyond this broker's limit."""
    log.warning(
        "refused a publish on connection %s, channel %d: content header %s",
        channel.connection.describe(),
        channel.id,
        invalid.reason,
    )
    if isinstance(invalid, UnknownDeliveryMode):
        text = f"invalid message: {{delivery_mode_unknown,{invalid.delivery_mode}}}"
        return AMQPError(errors.PRECONDITION_FAILED, text, 60, 40)
    if isinstance(invalid, NestedTooDeep):
        return AMQPError(errors.PRECONDITION_FAILED, f"invalid message: {invalid.reason}", 60, 40)
    return AMQPError(errors.INTERNAL_ERROR, "")


def complete_publish(channel: "Channel", content: ContentAssembly, body: bytes) -> None:
    """The whole content arrived: make the message and route it (or keep it for tx.commit)."""
    message = Message(content.exchange.name, content.routing_key, content.raw_header, body, content.routing_raw)
    flags = message.property_flags
    # One test of the flag word; properties are decoded only for messages that set these.
    if flags & (FLAG_USER_ID | FLAG_REPLY_TO | FLAG_EXPIRATION) and channel.forward_targets is None:
        # (A forwarded message was checked by the node its publisher is connected to.)
        message = check_special_properties(channel, message, flags)
    if flags & FLAG_HEADERS:
        check_routing_headers(message)
    stats = channel.connection.broker.stats
    stats.received += 1
    size = len(body)
    # The size histogram's bucket (metrics/message_sizes.py folds the counts when scraped):
    # most messages fit the first one, so no bisect for them.
    stats.received_sizes[0 if size <= 100 else bisect_left(BUCKET_BOUNDS, size)] += 1
    stats.received_bytes += size
    if channel.confirms is not None:
        stats.received_confirm += 1
    if channel.transaction is not None:
        channel.transaction.publish(content.exchange, message, content.mandatory)
        return
    route_publish(channel, content.exchange, message, content.mandatory)


def check_special_properties(channel: "Channel", message: Message, flags: int) -> Message:
    """user_id must be the connection's user; reply_to amq.rabbitmq.reply-to gets the channel's key;
    expiration must be a TTL RabbitMQ accepts."""
    properties = message.properties
    user = channel.connection.user.name
    if flags & FLAG_USER_ID and properties.user_id != user:
        raise AMQPError(
            errors.PRECONDITION_FAILED,
            f"user_id property set to '{properties.user_id}' but authenticated user was '{user}'",
            60,
            40,
        )
    if flags & FLAG_REPLY_TO and properties.reply_to == REPLY_QUEUE:
        if channel.reply_key is None:
            raise AMQPError(errors.PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40)
        raw = RawProperties(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
        raw.set_short_string(FLAG_REPLY_TO, f"{REPLY_QUEUE}.{channel.reply_key}")
        message = message.with_raw_properties(raw.encode())
    if flags & FLAG_EXPIRATION:
        check_expiration(properties.expiration)
    return message


class _NotWritten:
    """What route_publish returns when a queue's journal could not write the message."""

    __slots__ = ()


# A durable queue could not write the message to disk (queue.publish said WRITE_FAILED): it was
# nacked to a publisher in confirm mode; a transaction fails its commit (tx.commit).
NOT_WRITTEN = _NotWritten()


def route_publish(
    channel: "Channel", exchange: "Exchange", message: Message, mandatory: bool
) -> list[Queue] | _NotWritten | None:
    """Route and enqueue; returns what to wait on until the message is stored (`when_stored`:
    the queues that journaled it, and for each queue of another node the forwarded message
    itself), None if nothing is to be waited on, or NOT_WRITTEN if a queue's disk write failed."""
    connection = channel.connection
    broker = connection.broker
    vhost = channel.vhost
    confirms = channel.confirms
    if vhost.firehose is not None:
        vhost.firehose.published(message, connection, channel.id)
    seq = confirms.take_seq() if confirms is not None else 0
    accepted = True
    write_failed = False
    journaled: list[Queue] | None = None
    destinations = channel.forward_targets
    # (reply_to.is_reply_key, without a call into reply_to.py for every publish)
    if destinations is None and exchange is vhost.default_exchange and message.routing_key.startswith(REPLY_PREFIX):
        delivered = broker.reply_registry.deliver(message, vhost.name)
    else:
        if destinations is None:
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
        else:
            # Forwarded by another node, which routed it to these queues of ours (cluster_forwarded.py).
            destinations = [queue for queue in destinations if not queue.deleted]
        delivered = False
        for queue in destinations:
            outcome = queue.publish(message)
            if outcome == REJECTED:
                accepted = False  # a queue at its length limit with x-overflow reject-publish
            elif outcome == ENQUEUED_DURABLY:
                if journaled is None:
                    journaled = [queue]
                else:
                    journaled.append(queue)
            elif outcome == WRITE_FAILED:
                accepted = False  # its disk write failed (queues/journal.py)
                write_failed = True
            elif outcome == FORWARDED:
                # A queue of another node: wait for the owner's confirm of this very message (a
                # wait per queue would cover only the last message forwarded there, and miss a nack).
                if journaled is None:
                    journaled = [queue.forwarded_message()]
                else:
                    journaled.append(queue.forwarded_message())
            delivered = True
            if queue.congested:
                if channel.forward_flow is None:
                    connection.throttle(queue)
                else:  # forwarded by another node: pause it, keep reading the link (cluster_forwarded.py)
                    channel.forward_flow.hold(queue)
    if delivered:
        broker.stats.routed += 1
    elif mandatory:
        broker.stats.returned += 1
        send_return(channel, message)
    else:
        broker.stats.dropped += 1
    if confirms is not None:
        if journaled is None:
            confirms.resolve(seq, accepted)
        else:
            # Durable means durable: confirm only once every queue's copy is fsynced (the
            # queues are asked at the end of the batch of input, once for the whole batch).
            confirms.hold_until_stored(seq, journaled, accepted)
        connection.confirms_pending(channel)
    return NOT_WRITTEN if write_failed else journaled


def send_return(channel: "Channel", message: Message) -> None:
    """basic.return of an unroutable mandatory message, with its content."""
    frames = [codec.return_frame(channel.id, errors.NO_ROUTE, "NO_ROUTE", message.routing_raw)]
    codec.content_frames(frames, channel.id, message.raw_header, message.body, channel.connection.max_body_frame)
    channel.connection.send_frames(frames)
