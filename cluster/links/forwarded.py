"""The receiving end of forwarding: a cluster link's forward-to on this node.

Another node routed a message with the full binding table and found queues this node owns; it
sends forward-to (their names, frames.py) and then the publishes, on a channel of a connection
logged in with the cluster secret: a `ForwardingChannel`, the channel class this plug-in
registers with the broker for such connections (amqp_server/broker/cluster_interface.py). Each
publish then goes into those queues as it is, without routing it again (`route_publish`), and
is confirmed as any publish: at once, or once every queue that journaled it fsynced.

Only queues this node owns are taken. A name this node holds no queue of (not yet taken back
after a restart, deleted a moment ago, or owned by yet another node now) makes the message
refused (a nack to the publisher, who may publish it again and have it routed afresh): the
sending node believed the queue is here, and confirming would lose the message. The names are
looked up again whenever a queue they stood for goes (deleted, or a replicated queue handed to
a new leader elsewhere): publishes that follow a forward-to of long ago, held meanwhile by a
partitioned TCP stream, are refused rather than confirmed into a queue object nobody holds. A name may
also be a direct reply-to address of a channel here (a reply published on another node): the
message is delivered to that channel, as a reply published here would be.

Flow control (`ForwardFlow`): a queue here congested by forwarded publishes does not stop this
node reading the link, as it stops reading a client that publishes into it: the same link
carries the acks of the sending node's consumers of that queue, which are what drain it, so
reading nothing would wait for them forever. The channel is sent channel.flow(active=false)
instead, and channel.flow(active=true) once every such queue drained (the sending node then stops
and resumes reading its own publishers, cluster_link.ForwardStream).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from pamqp import commands

from amqp_server.channel.channel import Channel
from amqp_server.wire import codec
from cluster.links.frames import FORWARD_TO_METHOD, decode_forward_to
from amqp_server.wire.states import ChannelState, ConnectionState
from amqp_server.broker.reply_to import ReplyRegistry, is_reply_key
from queues.message import Message
from queues.publish_outcome import ENQUEUED, REJECTED
from queues.congestion import CongestedQueues

if TYPE_CHECKING:
    from exchanges import Exchange
    from queues.queue import Queue


def forwarded_names(payload: bytes) -> tuple[str, ...]:
    """The queue names a forward-to carries; 501 if it cannot be decoded."""
    try:
        return tuple(decode_forward_to(payload))
    except (IndexError, struct.error, UnicodeDecodeError):
        raise codec.cannot_decode(payload) from None


def forwarded_queues(channel: "Channel", names: tuple[str, ...]) -> tuple["Queue", ...]:
    """The queues of this node that `names` (a forward-to's) stand for now."""
    vhost = channel.vhost
    queues = vhost.queues
    registry = channel.connection.broker.reply_registry
    found: list[Any] = []  # queues, and stand-ins that take a publish as one does (below)
    for name in names:
        queue = queues.get(name)
        if queue is not None and not queue.home_node:
            found.append(queue)
        elif is_reply_key(name):
            if registry.has_key(name):
                found.append(ReplyAddress(registry, vhost.name))
        else:
            found.append(NOT_HERE)
    return tuple(found)


class _NotHere:
    """A forward-to destination this node holds no queue for: the message is refused."""

    __slots__ = ()
    deleted = False
    congested = False

    def publish(self, message: Message) -> int:
        return REJECTED


NOT_HERE = _NotHere()


class ReplyAddress:
    """A forward-to destination that is a direct reply-to address of a channel of this node:
    taken by route_publish like a queue (publish, deleted, congested)."""

    __slots__ = ("_registry", "_vhost")
    deleted = False
    congested = False

    def __init__(self, registry: ReplyRegistry, vhost: str) -> None:
        self._registry = registry
        self._vhost = vhost

    def publish(self, message: Message) -> int:
        self._registry.deliver(message, self._vhost)
        return ENQUEUED


class ForwardFlow:
    """channel.flow on one link channel that forwards into this node's queues: off while any
    queue it published into is congested, on again once they all drained (module docstring)."""

    __slots__ = ("_channel", "_congested")

    def __init__(self, channel: "Channel") -> None:
        self._channel = channel
        self._congested = CongestedQueues(lambda: self._send(False), lambda: self._send(True))

    def hold(self, queue: "Queue") -> None:
        """`queue` is congested by this channel's publishes: ask the sending node to pause."""
        self._congested.add(queue)

    def release(self) -> None:
        """The channel is gone: no queue keeps it (nor a way to resume it) until it drains."""
        self._congested.clear()

    def _send(self, active: bool) -> None:
        channel = self._channel
        connection = channel.connection
        if (channel.state is ChannelState.OPEN and connection.state is ConnectionState.OPEN
                and connection.channels.get(channel.id) is channel):
            connection.send_method(channel.id, commands.Channel.Flow(active=active))


class ForwardingChannel(Channel):
    """A channel of another node's link: after a forward-to, its publishes go into the queues
    that forward-to named, unrouted (module docstring), and congestion pauses the sending node
    (`ForwardFlow`) instead of this connection's reading."""

    def __init__(self, connection: Any, channel_id: int) -> None:
        super().__init__(connection, channel_id)
        # The queues of this node the next publishes go into: None until the first forward-to,
        # and the names that forward-to gave (looked up again when one of the queues goes).
        self._targets: tuple[Any, ...] | None = None
        self._names: tuple[str, ...] = ()
        self._flow: ForwardFlow | None = None  # its channel.flow to the sending node, once needed

    def handle_other_method(self, payload: bytes, index: int) -> None:
        if index == FORWARD_TO_METHOD:
            self._names = forwarded_names(payload)
            self._targets = forwarded_queues(self, self._names)
            if self._flow is None:
                self._flow = ForwardFlow(self)
            return
        super().handle_other_method(payload, index)

    def missing_exchange(self, exchange_name: str) -> "Exchange":
        if self._targets is None:
            return super().missing_exchange(exchange_name)
        # Routed by a node a moment before the exchange was deleted: it still goes to its queues,
        # named as published (deliveries repeat routing_raw byte for byte).
        return self.vhost.default_exchange

    def check_internal_publish(self, exchange: "Exchange") -> None:
        if self._targets is None:
            super().check_internal_publish(exchange)
        # (else: routed by another node; a dead-lettered message may come from an internal exchange)

    def check_special_properties(self, message: Message, flags: int) -> Message:
        if self._targets is None:
            return super().check_special_properties(message, flags)
        return message  # checked by the node its publisher is connected to

    def route_publish(self, exchange: "Exchange", message: Message, mandatory: bool) -> Any:
        targets = self._targets
        if targets is None:
            return super().route_publish(exchange, message, mandatory)
        vhost = self.vhost
        if vhost.firehose is not None:
            vhost.firehose.published(message, self.connection, self.id)
        for queue in targets:
            if queue.deleted:
                # A queue the forward-to named went since: deleted, or handed over (a replicated
                # queue whose replica here stopped leading is replaced by a stand-in). What its
                # name stands for now decides: another node's queue or none is refused (a nack
                # the sending node passes on), never confirmed into a queue object nobody holds
                # (that lost confirmed messages forwarded across a leader change).
                targets = self._targets = forwarded_queues(self, self._names)
                break
        return self.enqueue(message, mandatory, list(targets), False)

    def congested(self, queue: "Queue") -> None:
        if self._flow is None:
            super().congested(queue)
        else:  # pause the sending node, keep reading the link (module docstring)
            self._flow.hold(queue)

    def release(self) -> None:
        if self._flow is not None:
            self._flow.release()
        super().release()
