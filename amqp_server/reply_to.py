"""Direct reply-to (amq.rabbitmq.reply-to): replies go straight to the requesting channel.

A channel that consumes the pseudo-queue `amq.rabbitmq.reply-to` (no-ack) gets a key; its
requests carry `reply_to = amq.rabbitmq.reply-to.<key>`, and a publish to the default
exchange with that routing key is delivered to the channel without any queue.
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqp_server.channel import Channel
    from queues.message import Message

REPLY_QUEUE = "amq.rabbitmq.reply-to"
_REPLY_PREFIX = REPLY_QUEUE + "."


def is_reply_key(routing_key: str) -> bool:
    return routing_key.startswith(_REPLY_PREFIX)


class ReplyRegistry:
    """Reply keys of the channels that consume amq.rabbitmq.reply-to."""

    def __init__(self) -> None:
        self._channels: dict[str, "Channel"] = {}

    def register(self, channel: "Channel") -> str:
        key = base64.urlsafe_b64encode(os.urandom(18)).decode()
        self._channels[key] = channel
        return key

    def unregister(self, key: str) -> None:
        self._channels.pop(key, None)

    def is_pseudo_queue(self, name: str) -> bool:
        """Does `name` declare as a queue? RabbitMQ answers declare-ok (no messages, one
        consumer) for amq.rabbitmq.reply-to and for the reply address of a live requester."""
        if name == REPLY_QUEUE:
            return True
        return is_reply_key(name) and name[len(_REPLY_PREFIX):] in self._channels

    def deliver(self, message: "Message") -> bool:
        """Deliver a reply; False if the requesting channel is gone (the reply is unroutable)."""
        channel = self._channels.get(message.routing_key[len(_REPLY_PREFIX):])
        if channel is None:
            return False
        channel.deliver_reply(message)
        return True
