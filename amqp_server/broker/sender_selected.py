"""Sender-selected distribution: the CC and BCC headers add routing keys to a publish.

As in RabbitMQ, a message is routed with its routing key plus every string in its CC and BCC
headers; the BCC header is removed before the message reaches a queue. A CC or BCC header
that is not an array makes the message invalid (406, closing the channel).
"""

from __future__ import annotations

from amqp_server.wire import errors
from amqp_server.wire.errors import AMQPError
from queues.arguments import amqp_type_name
from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message
from queues.raw_properties import RawProperties


def check_routing_headers(message: Message) -> None:
    """406 unless the CC and BCC headers, where present, are arrays (RabbitMQ checks this on
    publish, before routing and before a transaction holds the message)."""
    raw = message.raw_header
    if b"\x02CC" not in raw and b"\x03BCC" not in raw:
        return
    headers = message.headers or {}
    for name in ("CC", "BCC"):
        if name in headers and not isinstance(headers[name], list):
            raise AMQPError(
                errors.PRECONDITION_FAILED,
                f'invalid message: {{unacceptable_type_in_header,"{name}",{amqp_type_name(headers[name])}}}',
                60,
                40,
            )


def sender_selected_keys(message: Message) -> list[str] | None:
    """Routing keys from the CC and BCC headers (None: the message has neither)."""
    raw = message.raw_header
    if b"\x02CC" not in raw and b"\x03BCC" not in raw:
        return None
    headers = message.headers or {}
    extra: list[str] = []
    for name in ("CC", "BCC"):
        value = headers.get(name)
        if isinstance(value, list):
            # RabbitMQ takes the longstr items and skips the rest.
            strings = [item for item in value if isinstance(item, (str, bytes))]
            extra.extend(item.decode() if isinstance(item, bytes) else item for item in strings)
    if not extra:
        return None
    return [message.routing_key, *extra]


def strip_bcc(message: Message) -> Message:
    """The message without its BCC header (itself if it has none); the other headers keep
    their bytes."""
    headers = message.headers or {}
    if "BCC" not in headers:
        return message
    raw = RawProperties(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
    raw.set_header_fields([(name, value) for name, value in raw.header_fields() if name != "BCC"])
    return message.with_raw_properties(raw.encode())
