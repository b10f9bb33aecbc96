"""Handlers for the channel, basic and confirm methods (the tx methods: transaction.py).

Each handler takes the channel and the decoded pamqp method, replies through the connection,
and raises AMQPError with RabbitMQ's code and text when it refuses. basic.publish and basic.ack
take fast paths in channel.py, which also does the work of publishing; settling deliveries
is in settlement.py.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from amqp_server.wire import codec, errors
from amqp_server.wire.errors import AMQPError
from amqp_server.broker.reply_to import REPLY_QUEUE
from amqp_server.channel.answers import ConsumeReply, GetReply
from amqp_server.channel.settlement import recover, settle
from amqp_server.channel.transaction import tx_commit, tx_rollback, tx_select
from queues.arguments import amqp_type_name
from queues.consumer import Consumer
from queues.queue_type import QueueTypeRefusal

if TYPE_CHECKING:
    from amqp_server.channel.ports import MethodChannel


def reply(channel: "MethodChannel", method: Any) -> None:
    """Send a method reply on the channel, after any earlier one that waits for disk."""
    channel.replies.send(method)


def queue_name_or_last(channel: "MethodChannel", name: str) -> str:
    """An empty queue name means the queue last declared on this channel (AMQP shortcut)."""
    if name:
        return name
    if not channel.last_queue_name:
        raise AMQPError(errors.NOT_FOUND, "no previously declared queue")
    return channel.last_queue_name


# -- channel class -------------------------------------------------------------------------


def channel_flow(channel: "MethodChannel", method: commands.Channel.Flow) -> None:
    # RabbitMQ does not let a client stop deliveries with channel.flow (basic.qos does that).
    if not method.active:
        raise AMQPError(errors.NOT_IMPLEMENTED, "active=false")
    reply(channel, commands.Channel.FlowOk(active=True))


def channel_close(channel: "MethodChannel", method: commands.Channel.Close) -> None:
    channel.connection.close_channel(channel)
    reply(channel, commands.Channel.CloseOk())


def channel_open(channel: "MethodChannel", method: commands.Channel.Open) -> None:
    raise AMQPError(errors.CHANNEL_ERROR, "second 'channel.open' seen")


# -- basic class ---------------------------------------------------------------------------


def basic_qos(channel: "MethodChannel", method: commands.Basic.Qos) -> None:
    if method.prefetch_size:
        raise AMQPError(errors.NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})")
    channel.set_prefetch(method.prefetch_count, method.global_)
    if not method.global_:
        # RabbitMQ applies a new per-consumer limit only to later consumers; applying it to the
        # running ones too is what Celery's dynamic prefetch needs (rabbitmq-server#11948).
        for consumer in channel.consumers.values():
            consumer.set_prefetch(method.prefetch_count)
            consumer.queue.prefetch_changed(consumer)  # (where it lives on another node, that node's too)
    reply(channel, commands.Basic.QosOk())
    channel.dispatch_all()


def basic_consume(channel: "MethodChannel", method: commands.Basic.Consume) -> None:
    connection = channel.connection
    tag = method.consumer_tag or _unique_tag(channel)
    if tag in channel.consumers or tag == channel.reply_consumer_tag:
        raise AMQPError(errors.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
    if method.queue == REPLY_QUEUE:
        _consume_replies(channel, method, tag)
        return
    queue = channel.vhost.queue(queue_name_or_last(channel, method.queue), connection)
    connection.check_permission("read", "queue", queue.name)
    queue.check_available()
    arguments = method.arguments or {}
    try:
        queue.check_consumer_arguments(arguments)
    except QueueTypeRefusal as refusal:
        raise AMQPError(refusal.code, refusal.text) from None
    if queue.exclusive_use_refused(method.exclusive):
        raise AMQPError(
            errors.ACCESS_REFUSED, f"{errors.resource('queue', queue.name, channel.vhost.name)} in exclusive use"
        )
    priority = arguments.get("x-priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise AMQPError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-priority' for {errors.resource('queue', queue.name, channel.vhost.name)}: "
            f'"expected integer, got {amqp_type_name(priority)}"',
        )
    timeout_ms = arguments.get("x-consumer-timeout", queue.settings.consumer_timeout_ms)
    if timeout_ms is not None and (not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < 0):
        raise AMQPError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-consumer-timeout' for {errors.resource('queue', queue.name, channel.vhost.name)}",
        )
    consumer = Consumer(
        tag,
        queue,
        channel,
        no_ack=method.no_ack,
        exclusive=method.exclusive,
        priority=priority,
        prefetch_count=channel.prefetch_count,
        arguments=arguments,
        timeout_ms=None if method.no_ack else timeout_ms or None,
    )
    channel.add_consumer(consumer)
    queue.consume(consumer, ConsumeReply(channel, consumer, method.nowait))


def _unique_tag(channel: "MethodChannel") -> str:
    return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def _consume_replies(channel: "MethodChannel", method: commands.Basic.Consume, tag: str) -> None:
    if not method.no_ack:
        raise AMQPError(errors.PRECONDITION_FAILED, "reply consumer cannot acknowledge")
    if channel.reply_key is not None:
        raise AMQPError(errors.PRECONDITION_FAILED, "reply consumer already set")
    channel.start_reply_consumer(tag)
    if not method.nowait:
        reply(channel, commands.Basic.ConsumeOk(consumer_tag=tag))


def basic_cancel(channel: "MethodChannel", method: commands.Basic.Cancel) -> None:
    tag = method.consumer_tag
    assert tag is not None, "pamqp types it Optional; a decoded basic.cancel carries one"
    if tag == channel.reply_consumer_tag and channel.reply_key is not None:
        channel.stop_reply_consumer()
    consumer = channel.remove_consumer(tag)
    if not method.nowait:
        reply(channel, commands.Basic.CancelOk(consumer_tag=tag))
    if consumer is not None:
        consumer.queue.remove_consumer(consumer)


def basic_get(channel: "MethodChannel", method: commands.Basic.Get) -> None:
    connection = channel.connection
    queue = channel.vhost.queue(queue_name_or_last(channel, method.queue), connection)
    connection.check_permission("read", "queue", queue.name)
    queue.check_available()
    if queue.single_active is not None:
        raise AMQPError(
            errors.RESOURCE_LOCKED,
            f"cannot obtain access to locked {errors.resource('queue', queue.name, channel.vhost.name)}. "
            "basic.get operations are not supported by quorum queues with single active consumer",
        )
    queue.get_for(method.no_ack, GetReply(channel, queue, method.no_ack))


def basic_nack(channel: "MethodChannel", method: commands.Basic.Nack) -> None:
    settle(channel.unacked, channel.delivery_timeouts, channel.transaction, channel.connection.broker.stats, channel,
           "nack", method.delivery_tag, method.multiple, method.requeue)


def basic_reject(channel: "MethodChannel", method: commands.Basic.Reject) -> None:
    # pamqp types delivery_tag Optional; a decoded basic.reject carries one (testing it for None
    # would cost a check per rejected message).
    settle(channel.unacked, channel.delivery_timeouts, channel.transaction, channel.connection.broker.stats, channel,
           "reject", method.delivery_tag, False, method.requeue)  # type: ignore[arg-type]


def basic_recover(channel: "MethodChannel", method: commands.Basic.Recover) -> None:
    if not method.requeue:
        raise AMQPError(errors.NOT_IMPLEMENTED, "requeue=false")
    # RabbitMQ answers recover-ok before the redeliveries.
    reply(channel, commands.Basic.RecoverOk())
    recover(channel.unacked, channel.delivery_timeouts, channel.connection.broker.stats, channel)


def basic_recover_async(channel: "MethodChannel", method: commands.Basic.RecoverAsync) -> None:
    if not method.requeue:
        raise AMQPError(errors.NOT_IMPLEMENTED, "requeue=false")
    recover(channel.unacked, channel.delivery_timeouts, channel.connection.broker.stats, channel)


# -- confirm (tx: transaction.py) ---------------------------------------------------------


def confirm_select(channel: "MethodChannel", method: commands.Confirm.Select) -> None:
    if channel.transaction is not None:
        raise AMQPError(errors.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
    channel.select_confirms()
    if not method.nowait:
        reply(channel, commands.Confirm.SelectOk())


# basic.ack is not here: Channel.handle_method settles every basic.ack on its fast path
# (codec.decode_ack) before it looks a method up in this table.
METHOD_HANDLERS: dict[type, Callable[["MethodChannel", Any], None]] = {
    commands.Channel.Open: channel_open,
    commands.Channel.Flow: channel_flow,
    commands.Channel.Close: channel_close,
    commands.Basic.Qos: basic_qos,
    commands.Basic.Consume: basic_consume,
    commands.Basic.Cancel: basic_cancel,
    commands.Basic.Get: basic_get,
    commands.Basic.Nack: basic_nack,
    commands.Basic.Reject: basic_reject,
    commands.Basic.Recover: basic_recover,
    commands.Basic.RecoverAsync: basic_recover_async,
    commands.Confirm.Select: confirm_select,
    commands.Tx.Select: tx_select,
    commands.Tx.Commit: tx_commit,
    commands.Tx.Rollback: tx_rollback,
}
