"""Handlers for the exchange and queue classes: declare, delete, bind, unbind, purge.

Permissions follow RabbitMQ: configure on the declared or deleted resource; for bindings,
write on the destination and read on the source exchange; read to purge.

A method that changed a durable definition is answered only once the change is on disk
(the definition store's fsync round, off the event loop); later replies on the channel wait
behind it (ordered_replies.py), other channels and connections do not.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from amqp_server.wire import codec, errors
from amqp_server.channel.answers import CountsReply
from amqp_server.channel.basic_methods import queue_name_or_last, reply
from amqp_server.broker.definitions_export import is_stored_queue
from amqp_server.wire.errors import AMQPError
from exchanges.registry import EXCHANGE_TYPES
from queues.arguments.exchange_arguments import alternate_exchange_refusal

if TYPE_CHECKING:
    from queues.queue import Queue
    from amqp_server.broker.broker import Broker
    from amqp_server.channel.ports import MethodChannel
    from amqp_server.channel.ordered_replies import WaitForDisk

MAX_NAME_LENGTH = 255


def generate_queue_name() -> str:
    """A server-named queue: "amq.gen-" and 22 URL-safe characters, as RabbitMQ names them."""
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def _reply_once_stored(channel: "MethodChannel", changes_before: int, answer: Any) -> None:
    """Reply ``answer`` (a method, or an encoded frame) now, or once the definition changes
    made since ``changes_before`` are durable."""
    broker = channel.connection.broker
    if broker.definition_changes == changes_before:
        if isinstance(answer, bytes):
            channel.replies.send_frame(answer)
        else:
            reply(channel, answer)
        return
    frame = answer if isinstance(answer, bytes) else codec.method_frame(channel.id, answer)
    channel.replies.send_when_durable(frame, _changes_since(broker, changes_before), broker.definitions_failure)


def _changes_since(broker: "Broker", changes_before: int) -> WaitForDisk:
    """Waits for the definition changes so far; refused with what a change made after
    ``changes_before`` got (a lost declare race in a cluster: 406)."""
    return lambda callback: broker.when_definitions_durable(callback, changes_before)


def exchange_declare(channel: "MethodChannel", method: commands.Exchange.Declare) -> None:
    changes_before = channel.connection.broker.definition_changes
    name = method.exchange
    if not method.passive:
        channel.connection.check_permission("configure", "exchange", name or "amq.default")
        _check_alternate_exchange_type(channel, method)
    channel.vhost.declare_exchange(
        name,
        method.exchange_type,
        passive=method.passive,
        durable=method.durable,
        auto_delete=method.auto_delete,
        internal=method.internal,
        arguments=method.arguments,
    )
    if not method.nowait:
        _reply_once_stored(channel, changes_before, commands.Exchange.DeclareOk())


def _check_alternate_exchange_type(channel: "MethodChannel", method: commands.Exchange.Declare) -> None:
    """406 when a new exchange's alternate-exchange is not a string. RabbitMQ checks it only
    when it creates the exchange, after the type and the amq. prefix (a redeclare is checked for
    equivalence instead)."""
    vhost = channel.vhost
    name = method.exchange
    refusal = alternate_exchange_refusal(method.arguments, name, vhost.name)
    if refusal is None:
        return
    if not name or name in vhost.exchanges or name.startswith("amq.") or method.exchange_type not in EXCHANGE_TYPES:
        return
    raise AMQPError(errors.PRECONDITION_FAILED, refusal)


def exchange_delete(channel: "MethodChannel", method: commands.Exchange.Delete) -> None:
    changes_before = channel.connection.broker.definition_changes
    channel.connection.check_permission("configure", "exchange", method.exchange or "amq.default")
    channel.vhost.delete_exchange(method.exchange, method.if_unused)
    if not method.nowait:
        _reply_once_stored(channel, changes_before, commands.Exchange.DeleteOk())


def exchange_bind(channel: "MethodChannel", method: commands.Exchange.Bind) -> None:
    changes_before = channel.connection.broker.definition_changes
    _exchange_binding(channel, method, bind=True)
    if not method.nowait:
        _reply_once_stored(channel, changes_before, commands.Exchange.BindOk())


def exchange_unbind(channel: "MethodChannel", method: commands.Exchange.Unbind) -> None:
    changes_before = channel.connection.broker.definition_changes
    _exchange_binding(channel, method, bind=False)
    if not method.nowait:
        _reply_once_stored(channel, changes_before, commands.Exchange.UnbindOk())


def _exchange_binding(channel: "MethodChannel", method: Any, bind: bool) -> None:
    connection = channel.connection
    vhost = channel.vhost
    connection.check_permission("write", "exchange", method.destination or "amq.default")
    connection.check_permission("read", "exchange", method.source or "amq.default")
    if not bind and (method.destination not in vhost.exchanges or method.source not in vhost.exchanges):
        return  # unbinding something that is not there is not an error
    # RabbitMQ looks the source up first: with both missing, the 404 names the source.
    source = vhost.exchange(method.source)
    destination = vhost.exchange(method.destination)
    if destination is vhost.default_exchange:
        raise errors.default_exchange_refused()
    (vhost.bind if bind else vhost.unbind)(source, destination, method.routing_key, method.arguments or {})


def queue_declare(channel: "MethodChannel", method: commands.Queue.Declare) -> None:
    connection = channel.connection
    changes_before = connection.broker.definition_changes
    name = method.queue
    if not name and method.passive:
        name = queue_name_or_last(channel, name)
    if name and connection.broker.reply_registry.is_pseudo_queue(name):
        if not method.nowait:
            channel.replies.send_frame(codec.queue_declare_ok_frame(channel.id, name, 0, 1))
        return
    server_named = not name
    if server_named:
        name = generate_queue_name()
    if len(name.encode()) > MAX_NAME_LENGTH:
        raise AMQPError(errors.PRECONDITION_FAILED, "queue name too long")
    if not method.passive:
        connection.check_permission("configure", "queue", name)
    queue, created = channel.vhost.declare_queue(
        name,
        connection=connection,
        passive=method.passive,
        durable=method.durable,
        exclusive=method.exclusive,
        auto_delete=method.auto_delete,
        arguments=method.arguments,
        allow_reserved_name=server_named,  # amq.gen-… is ours to give
        server_named=server_named,
        by_client=True,
    )
    queue.check_available()
    if created:
        connection.broker.stats.queues_created += 1
        if queue.exclusive:
            connection.own_exclusive(queue)
    connection.broker.stats.queues_declared += 1
    channel.remember_queue(queue.name)
    if method.nowait:
        return
    if connection.broker.definition_changes == changes_before:
        # The queue's own counts (where it lives on another node, that node's: they come later).
        queue.count(CountsReply(channel, 50, 10, lambda messages, consumers, place: _send_or_fill(
            channel, place, codec.queue_declare_ok_frame(channel.id, queue.name, messages, consumers))))
        return
    _reply_once_stored(
        channel,
        changes_before,
        codec.queue_declare_ok_frame(channel.id, queue.name, queue.message_count, queue.consumer_count),
    )


def _send_or_fill(channel: "MethodChannel", place: Any, frame: bytes) -> None:
    """Send `frame` now, or into the reply's held `place` (a queue type's answer that came later)."""
    if place is None:
        channel.replies.send_frame(frame)
    else:
        channel.replies.fill(place, [frame])


def queue_bind(channel: "MethodChannel", method: commands.Queue.Bind) -> None:
    changes_before = channel.connection.broker.definition_changes
    _queue_binding(channel, method, bind=True)
    if not method.nowait:
        _reply_once_stored(channel, changes_before, commands.Queue.BindOk())


def queue_unbind(channel: "MethodChannel", method: commands.Queue.Unbind) -> None:
    changes_before = channel.connection.broker.definition_changes
    _queue_binding(channel, method, bind=False)
    _reply_once_stored(channel, changes_before, commands.Queue.UnbindOk())


def _queue_binding(channel: "MethodChannel", method: Any, bind: bool) -> None:
    connection = channel.connection
    vhost = channel.vhost
    queue_name = queue_name_or_last(channel, method.queue)
    # An empty routing key with an empty queue name means the last declared queue's name.
    routing_key = method.routing_key or (channel.last_queue_name if not method.queue else "")
    connection.check_permission("write", "queue", queue_name)
    connection.check_permission("read", "exchange", method.exchange or "amq.default")
    if not bind and (queue_name not in vhost.queues or method.exchange not in vhost.exchanges):
        return
    # RabbitMQ looks the exchange up first: with both missing, the 404 names the exchange.
    exchange = vhost.exchange(method.exchange)
    queue = vhost.queue(queue_name, connection)
    (vhost.bind if bind else vhost.unbind)(exchange, queue, routing_key, method.arguments or {})


def queue_purge(channel: "MethodChannel", method: commands.Queue.Purge) -> None:
    connection = channel.connection
    queue = channel.vhost.queue(queue_name_or_last(channel, method.queue), connection)
    connection.check_permission("read", "queue", queue.name)
    queue.check_available()
    queue.purge_for(CountsReply(channel, 50, 30, lambda messages, _consumers, place: _send_or_fill(
        channel, place, codec.method_frame(channel.id, commands.Queue.PurgeOk(message_count=messages))),
        nowait=method.nowait))


def queue_delete(channel: "MethodChannel", method: commands.Queue.Delete) -> None:
    connection = channel.connection
    changes_before = connection.broker.definition_changes
    vhost = channel.vhost
    name = queue_name_or_last(channel, method.queue)
    connection.check_permission("configure", "queue", name)
    queue = vhost.queues.get(name)
    if queue is None:
        _delete_counted(channel, method, None, None, 0, 0)
        return
    vhost.queue(name, connection)  # 405 if another connection owns it
    queue.check_available()
    # if-unused, if-empty and delete-ok's count are the queue's (where it lives on another node,
    # that node's: they come later, and the reply keeps its place meanwhile).
    queue.count(CountsReply(channel, 50, 40, lambda messages, consumers, place: _delete_counted(
        channel, method, queue, place, messages, consumers)))


def _delete_counted(channel: "MethodChannel", method: commands.Queue.Delete, queue: "Queue | None", place: Any,
                    messages: int, consumers: int) -> None:
    """queue.delete once the queue's message and consumer counts are known; `place` is the
    reply's place when it was held while they were asked for (a queue of another node)."""
    connection = channel.connection
    changes_before = connection.broker.definition_changes
    vhost = channel.vhost
    name = queue.name if queue is not None else queue_name_or_last(channel, method.queue)
    if queue is not None:
        refusal = None
        if method.if_unused and consumers:
            refusal = AMQPError(errors.PRECONDITION_FAILED, f"{errors.resource('queue', name, vhost.name)} in use")
        elif method.if_empty and messages:
            refusal = AMQPError(errors.PRECONDITION_FAILED, f"{errors.resource('queue', name, vhost.name)} not empty")
        if refusal is not None:
            if place is None:
                raise refusal
            channel.replies.withdraw(place)
            refusal.caused_by(50, 40)
            connection.fail_channel(channel, refusal)
            return
    count = messages
    # RabbitMQ answers delete-ok before its consumers hear basic.cancel. A stored queue's
    # delete-ok waits for the deletion to be on disk: its place is held first, so this
    # channel's basic.cancel still comes after it.
    stored = queue is not None and is_stored_queue(queue)
    held = place
    delete_ok = codec.method_frame(channel.id, commands.Queue.DeleteOk(message_count=count))
    if method.nowait:
        if place is not None:
            channel.replies.withdraw(place)
        held = None
    elif held is not None:
        channel.replies.fill_later(held, delete_ok)
    elif stored:
        held = channel.replies.hold(delete_ok)
    else:
        reply(channel, commands.Queue.DeleteOk(message_count=count))
    if queue is not None:
        vhost.delete_queue(queue)
    if held is not None:
        channel.replies.release(held, _changes_since(connection.broker, changes_before),
                                connection.broker.definitions_failure)


DECLARATION_HANDLERS: dict[type, Callable[["MethodChannel", Any], None]] = {
    commands.Exchange.Declare: exchange_declare,
    commands.Exchange.Delete: exchange_delete,
    commands.Exchange.Bind: exchange_bind,
    commands.Exchange.Unbind: exchange_unbind,
    commands.Queue.Declare: queue_declare,
    commands.Queue.Bind: queue_bind,
    commands.Queue.Unbind: queue_unbind,
    commands.Queue.Purge: queue_purge,
    commands.Queue.Delete: queue_delete,
}
