"""The firehose tracer: a copy of every publish and delivery in a vhost, sent to amq.rabbitmq.trace.

As RabbitMQ's rabbit_trace: while tracing is on for a vhost, each message published in it is
republished to the vhost's `amq.rabbitmq.trace` exchange (internal, topic) with routing key
"publish.<exchange>", and each delivery to a consumer with "deliver.<queue>". The copy has the
original body; its headers say what the message was and who handled it:

    exchange_name, routing_keys, properties (the original basic properties as a table), node,
    then for a publish: vhost, connection, channel, user, routed_queues;
    for a delivery:     redelivered (1 or 0), vhost, connection, channel, user.

Copies are transient and carry no other properties. Messages published to the trace exchange
itself are never traced, so tracing a trace queue's consumer cannot loop. Tracing is off by
default and switched per vhost with `set_tracing` (`amqp-server ctl trace_on`, or the
management API's PUT /api/vhosts/{vhost} {"tracing": true}); as in RabbitMQ, the switch does
not survive a restart. While tracing is off it costs the message path one `is None` test.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from amqp_server.broker.sender_selected import sender_selected_keys
from queues.message import FLAG_HEADERS, BasicProperties, Message

if TYPE_CHECKING:
    from amqp_server.broker.ports import TracedConnection
    from amqp_server.broker.vhost import VirtualHost

TRACE_EXCHANGE = "amq.rabbitmq.trace"
# Basic properties: their AMQP names (the trace's "properties" table), pamqp's attribute names,
# and their bits in the property flags (AMQP 0-9-1 order, from bit 15 down).
_PROPERTIES = tuple(
    (amqp_name, attribute, 1 << (15 - index))
    for index, (amqp_name, attribute) in enumerate((
        ("content_type", "content_type"),
        ("content_encoding", "content_encoding"),
        ("headers", "headers"),
        ("delivery_mode", "delivery_mode"),
        ("priority", "priority"),
        ("correlation_id", "correlation_id"),
        ("reply_to", "reply_to"),
        ("expiration", "expiration"),
        ("message_id", "message_id"),
        ("timestamp", "timestamp"),
        ("type", "message_type"),
        ("user_id", "user_id"),
        ("app_id", "app_id"),
        ("cluster_id", "cluster_id"),
    ))
)
_CONTENT_HEADER_PREFIX = struct.Struct(">HHQ")  # class 60 (basic), weight 0, body size
_BASIC_CLASS = 60


class Firehose:
    """Republishes traffic of one vhost to its trace exchange (see the module docstring).

    The channel calls `published` before routing each message and `delivered` for each
    delivery to a consumer, only while `vhost.firehose` is this object.
    """

    def __init__(self, vhost: "VirtualHost", node_name: str) -> None:
        self.vhost = vhost
        self.node_name = node_name

    def published(self, message: Message, connection: "TracedConnection", channel_id: int) -> None:
        if message.exchange == TRACE_EXCHANGE:
            return
        keys = sender_selected_keys(message) if message.property_flags & FLAG_HEADERS else None
        exchange = self.vhost.exchanges.get(message.exchange)
        # Where the message is about to go: the same routing the channel does next.
        routed = sorted(queue.name for queue in self.vhost.route(exchange, message, keys)) if exchange is not None else []
        headers = self._message_table(message, keys)
        headers.update(
            vhost=self.vhost.name,
            connection=connection.name,
            channel=channel_id,
            user=connection.user.name if connection.user else "",
            routed_queues=routed,
        )
        self._trace(f"publish.{message.exchange}", headers, message.body)

    def delivered(
        self, queue_name: str, message: Message, redelivered: bool, connection: "TracedConnection", channel_id: int
    ) -> None:
        if message.exchange == TRACE_EXCHANGE:
            return
        keys = sender_selected_keys(message) if message.property_flags & FLAG_HEADERS else None
        headers = self._message_table(message, keys)
        headers.update(
            redelivered=1 if redelivered else 0,
            vhost=self.vhost.name,
            connection=connection.name,
            channel=channel_id,
            user=connection.user.name if connection.user else "",
        )
        self._trace(f"deliver.{queue_name}", headers, message.body)

    def _message_table(self, message: Message, keys: list[str] | None) -> dict[str, Any]:
        flags = message.property_flags
        properties = message.properties if flags else None
        table: dict[str, Any] = {}
        for amqp_name, attribute, flag in _PROPERTIES:
            if not flags & flag:
                continue  # absent properties are left out, as RabbitMQ leaves out undefined ones
            value = getattr(properties, attribute)
            if amqp_name == "headers":
                # BCC is a secret from the receivers; RabbitMQ strips it before tracing too.
                value = {key: item for key, item in value.items() if key != "BCC"}
            table[amqp_name] = _encodable(value)
        return {
            "exchange_name": message.exchange,
            "routing_keys": keys if keys is not None else [message.routing_key],
            "properties": table,
            "node": self.node_name,
        }

    def _trace(self, routing_key: str, headers: dict[str, Any], body: bytes) -> None:
        exchange = self.vhost.exchanges.get(TRACE_EXCHANGE)
        if exchange is None:
            return
        raw_header = _CONTENT_HEADER_PREFIX.pack(_BASIC_CLASS, 0, len(body)) + BasicProperties(headers=headers).marshal()
        copy = Message(TRACE_EXCHANGE, routing_key, raw_header, body)
        for queue in self.vhost.route(exchange, copy):
            queue.publish(copy)


def _encodable(value: Any) -> Any:
    """`value` with bytes turned into bytearray: pamqp decodes a long string that is not UTF-8
    to bytes but can only encode a byte array, so the octets are kept as one."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, dict):
        return {key: _encodable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_encodable(item) for item in value]
    return value


def set_tracing(vhost: "VirtualHost", on: bool, node_name: str) -> None:
    """Switch the firehose of `vhost` on or off (rabbit_trace:start/stop)."""
    if on and vhost.firehose is None:
        vhost.use_firehose(Firehose(vhost, node_name))
    elif not on:
        vhost.use_firehose(None)


def is_tracing(vhost: "VirtualHost") -> bool:
    return vhost.firehose is not None
