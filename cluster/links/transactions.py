"""Transactions in a cluster: a tx.commit must not touch queues of more than one node.

A commit's publishes and settlements are applied queue by queue; on one node that is one step,
but queues of two nodes would be applied by two nodes, and one of them may fail (or die) after
the other applied its part. Rather than half-apply such a commit, the broker refuses it before
applying anything, with the error RabbitMQ uses for what it does not implement (540
NOT_IMPLEMENTED, which closes the connection); nothing of the transaction is applied. A
transaction whose queues all live on one node, this one or another, commits as on one node.
docs/cluster.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError
from amqp_server.broker.reply_to import is_reply_key
from amqp_server.broker.sender_selected import sender_selected_keys
from queues.message import FLAG_HEADERS

if TYPE_CHECKING:
    from amqp_server.channel.channel import Channel
    from exchanges import Exchange
    from queues.message import Message
    from queues.queue import Queue

HERE = ""  # the node name this node's own queues count under


def _node_of(destination: "Queue") -> str:
    """The node owning a routed destination (a delayed exchange's held messages are here)."""
    return destination.owner if getattr(destination, "is_remote", False) else HERE  # type: ignore[attr-defined]


def check_one_node(channel: "Channel", publishes: list[tuple["Exchange", "Message", bool]],
                   settlements: list[tuple[str, int, bool, bool]]) -> None:
    """540 when the transaction's publishes and settlements reach queues of several nodes."""
    vhost = channel.vhost
    nodes: set[str] = set()
    for exchange, message, _mandatory in publishes:
        if exchange is vhost.default_exchange and is_reply_key(message.routing_key):
            continue
        keys = sender_selected_keys(message) if message.property_flags & FLAG_HEADERS else None
        nodes.update(_node_of(queue) for queue in vhost.route(exchange, message, keys))
    unacked = channel.unacked
    for _kind, tag, multiple, _requeue in settlements:
        if multiple:
            nodes.update(_node_of(delivery.queue) for t, delivery in unacked.items() if tag == 0 or t <= tag)
        else:
            delivery = unacked.get(tag)
            if delivery is not None:
                nodes.add(_node_of(delivery.queue))
    if len(nodes) > 1:
        named = ", ".join(sorted("this node" if node == HERE else f"'{node}'" for node in nodes))
        raise AMQPError(
            errors.NOT_IMPLEMENTED,
            f"tx.commit would apply to queues on more than one cluster node ({named}); a transaction "
            "cannot be atomic across nodes, so nothing of it was applied",
        )

