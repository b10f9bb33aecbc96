"""What a channel does when deliveries outlive their consumer timeout (x-consumer-timeout).

The deadlines themselves are amqp_server/channel/delivery_timeouts.py; this is RabbitMQ's answer when one
passes. A client that understands basic.cancel (consumer_cancel_notify) keeps its channel:
each late delivery goes back to its queue (subject to delayed retry, as a "returned" one) and
only the consumers that held them are cancelled. Other clients get what RabbitMQ does: the
channel is closed with 406, which returns everything it had not acked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError
from amqp_server.channel.settlement import apply_settlement
from queues.delays.delayed_retry import RETURNED

if TYPE_CHECKING:
    from amqp_server.channel.channel import Channel


def deliveries_timed_out(channel: "Channel", tags: list[int]) -> None:
    """Deliveries `tags` of `channel` stayed unacked longer than their consumer timeout."""
    if not channel.is_open:
        return
    unacked = channel.unacked
    late = [(tag, unacked.pop(tag)) for tag in tags if tag in unacked]
    if not late:
        return
    connection = channel.connection
    if not connection.client_capabilities.get("consumer_cancel_notify"):
        for tag, delivery in late:
            unacked.add(tag, delivery)  # the channel's release requeues them all
        timeout = next((u.consumer.timeout_ms for _t, u in late if u.consumer is not None), None)
        timeout = timeout or late[0][1].queue.settings.consumer_timeout_ms
        connection.fail_channel(
            channel,
            AMQPError(
                errors.PRECONDITION_FAILED,
                f"delivery acknowledgement on channel {channel.id} timed out. Timeout value used: {timeout} ms. "
                "This timeout value can be configured, see consumers doc guide to learn more",
            ),
        )
        return
    channel.timed_out.update(tag for tag, _delivery in late)
    for consumer in {delivery.consumer for _tag, delivery in late if delivery.consumer is not None}:
        # Cancel first, so the requeued message is not handed straight back to it.
        if channel.remove_consumer(consumer.tag) is not None:
            consumer.queue.remove_consumer(consumer)
            connection.send_method(channel.id, commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))
    apply_settlement(channel, "nack", [delivery for _tag, delivery in late], True, RETURNED)
