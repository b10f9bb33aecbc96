"""The channel's side of the queue type behaviour (queues/queue_type.py): answers.

A method that a queue type serves (basic.consume, basic.get, queue.declare's counts,
queue.purge, queue.delete's counts) hands the queue an answer. The queue calls it once: at
once (a queue of this node), or later (the stand-in of a queue another node holds, once that
node answered). An answer that is to come later first calls `later()`, which keeps its place
among the channel's replies (ordered_replies.py), so replies stay in the order of the methods.

The answers build the frames and change the channel's state; the queue type only says what
happened. An answer that comes once the channel has closed is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from amqp_server.wire import codec
from amqp_server.wire.errors import AMQPError
from amqp_server.channel.unacked_store import Unacked
from queues.queue_type import QueueTypeRefusal

if TYPE_CHECKING:
    from amqp_server.channel.ports import MethodChannel
    from queues.consumer import Consumer
    from queues.message import QueueEntry
    from queues.queue import Queue


class Answer:
    """What every answer does: keep its place, be refused, know whether it is still wanted."""

    __slots__ = ("_channel", "_class_id", "_method_id", "_nowait", "_later", "_held")

    def __init__(self, channel: "MethodChannel", class_id: int, method_id: int, nowait: bool = False) -> None:
        self._channel = channel
        self._class_id = class_id
        self._method_id = method_id
        self._nowait = nowait  # nothing to send: only a refusal reaches the client
        self._later = False
        self._held: Any = None

    def later(self) -> None:
        """The answer comes later: keep its place among the channel's replies."""
        self._later = True
        if not self._nowait:
            self._held = self._channel.replies.hold(b"")

    @property
    def wanted(self) -> bool:
        """False once the channel closed: what the answer would carry is to be given back."""
        return self._channel.is_open

    def refused(self, error: Exception) -> None:
        """The queue cannot serve the method: the channel (or, for a hard error, the connection)
        is closed with `error`, an AMQPError or a queue type's QueueTypeRefusal."""
        if isinstance(error, QueueTypeRefusal):
            error = AMQPError(error.code, error.text)
        if not self._later:
            raise error
        self._withdraw()
        channel = self._channel
        if channel.is_open and isinstance(error, AMQPError):
            if not error.class_id:
                error.caused_by(self._class_id, self._method_id)
            channel.connection.fail_channel(channel, error)

    def _withdraw(self) -> None:
        if self._held is not None:
            self._channel.replies.withdraw(self._held)
            self._held = None

    def _send(self, frames: list[bytes]) -> None:
        if self._nowait:
            return
        if self._held is None:
            self._channel.replies.send_frames(frames)
        else:
            self._channel.replies.fill(self._held, frames)
            self._held = None


class ConsumeReply(Answer):
    """basic.consume: consume-ok once the queue registered the consumer."""

    __slots__ = ("_consumer",)

    def __init__(self, channel: "MethodChannel", consumer: "Consumer", nowait: bool) -> None:
        super().__init__(channel, 60, 20, nowait)
        self._consumer = consumer

    @property
    def global_qos_active(self) -> bool:
        return self._channel.global_qos_active

    def started(self) -> None:
        if not self.wanted:  # closed meanwhile: its release() cancelled the consumer
            self._withdraw()
            return
        self._send([codec.method_frame(self._channel.id, commands.Basic.ConsumeOk(consumer_tag=self._consumer.tag))])

    def refused(self, error: Exception) -> None:
        self._channel.forget_consumer(self._consumer)
        super().refused(error)


class GetReply(Answer):
    """basic.get: get-ok with the message (unacked on this channel unless no_ack), or get-empty."""

    __slots__ = ("_queue", "_no_ack")

    def __init__(self, channel: "MethodChannel", queue: "Queue", no_ack: bool) -> None:
        super().__init__(channel, 60, 70)
        self._queue = queue
        self._no_ack = no_ack

    def got(self, entry: "QueueEntry", raw_header: bytes, redelivered: bool, message_count: int,
            durable_wait: Any = None) -> None:
        channel = self._channel
        connection = channel.connection
        queue = self._queue
        tag = channel.take_delivery_tag()
        if not self._no_ack:
            channel.await_ack(tag, Unacked(entry, queue, None), queue.settings.consumer_timeout_ms)
        message = entry.message
        if channel.vhost.firehose is not None:
            channel.vhost.firehose.delivered(queue.name, message, redelivered, connection, channel.id)
        frames = [codec.get_ok_frame(channel.id, tag, redelivered, message.routing_raw, message_count)]
        codec.content_frames(frames, channel.id, raw_header, message.body, connection.max_body_frame)
        if durable_wait is None:
            self._send(frames)
        elif self._held is None:
            channel.replies.send_when_durable(b"".join(frames), durable_wait, "basic.get")
        else:
            channel.replies.fill_later(self._held, b"".join(frames))
            channel.replies.release(self._held, durable_wait, "basic.get")
            self._held = None
        connection.broker.stats.get += 1

    def empty(self) -> None:
        self._channel.connection.broker.stats.get_empty += 1
        self._send([codec.method_frame(self._channel.id, commands.Basic.GetEmpty())])


class CountsReply(Answer):
    """The queue's message and consumer counts, for `then(messages, consumers, place)`: `place`
    is the reply's held place when the counts came later (None when they came at once)."""

    __slots__ = ("_then",)

    def __init__(self, channel: "MethodChannel", class_id: int, method_id: int,
                 then: Callable[[int, int, Any], None], nowait: bool = False) -> None:
        super().__init__(channel, class_id, method_id, nowait)
        self._then = then

    def counted(self, message_count: int, consumer_count: int) -> None:
        if not self.wanted:
            self._withdraw()
            return
        place, self._held = self._held, None
        self._then(message_count, consumer_count, place)
