"""Direct reply-to (amq.rabbitmq.reply-to): replies go straight to the requesting channel.

A channel that consumes the pseudo-queue `amq.rabbitmq.reply-to` (no-ack) gets a key; its
requests carry `reply_to = amq.rabbitmq.reply-to.<key>`, and a publish to the default
exchange with that routing key is delivered to the channel without any queue.

In a cluster a key also names the node of its channel (as RabbitMQ's encode theirs): a reply
published on another node is forwarded there (`forward_elsewhere`, set by the cluster side).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from queues.message import Message

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."  # what every reply key starts with


def is_reply_key(routing_key: str) -> bool:
    return routing_key.startswith(REPLY_PREFIX)


def node_of_key(key: str) -> str | None:
    """The node a cluster node's reply key names (None for a single node's key)."""
    _random, dot, node = key.partition(".")
    if not dot:
        return None
    try:
        return base64.urlsafe_b64decode(node + "=" * (-len(node) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


class Requester(Protocol):
    """A channel consuming amq.rabbitmq.reply-to (amqp_server.channel.channel.Channel)."""

    def deliver_reply(self, message: "Message") -> None:
        """Deliver a reply published to this channel's key, with no queue in between."""


# Forwards a reply whose key names another node: (node, vhost, message) -> whether it went.
ForwardReply = Callable[[str, str, "Message"], bool]


class ReplyRegistry:
    """Reply keys of the channels that consume amq.rabbitmq.reply-to."""

    def __init__(self) -> None:
        self._channels: dict[str, Requester] = {}
        self._node_suffix = ""
        self._node = ""
        self._forward: ForwardReply | None = None

    def forward_elsewhere(self, node: str, forward: ForwardReply) -> None:
        """This is cluster node `node`: keys name it from now on, and replies for keys of other
        nodes go to `forward`."""
        self._node = node
        self._node_suffix = "." + base64.urlsafe_b64encode(node.encode()).decode().rstrip("=")
        self._forward = forward

    def register(self, channel: Requester) -> str:
        key = base64.urlsafe_b64encode(os.urandom(18)).decode() + self._node_suffix
        self._channels[key] = channel
        return key

    def unregister(self, key: str) -> None:
        self._channels.pop(key, None)

    def is_pseudo_queue(self, name: str) -> bool:
        """Does `name` declare as a queue? RabbitMQ answers declare-ok (no messages, one
        consumer) for amq.rabbitmq.reply-to and for the reply address of a live requester."""
        if name == REPLY_QUEUE:
            return True
        return is_reply_key(name) and name[len(REPLY_PREFIX):] in self._channels

    def deliver(self, message: "Message", vhost: str) -> bool:
        """Deliver a reply (forward it, when its key names another node of the cluster); False
        if the requesting channel is gone (the reply is unroutable)."""
        key = message.routing_key[len(REPLY_PREFIX):]
        channel = self._channels.get(key)
        if channel is None:
            if self._forward is None:
                return False
            node = node_of_key(key)
            return node is not None and node != self._node and self._forward(node, vhost, message)
        channel.deliver_reply(message)
        return True

    def has_key(self, routing_key: str) -> bool:
        """Is `routing_key` the reply address of a live requester on this node?"""
        return routing_key[len(REPLY_PREFIX):] in self._channels
