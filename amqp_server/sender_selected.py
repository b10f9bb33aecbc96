"""Sender-selected distribution: the CC and BCC headers add routing keys to a publish.

As in RabbitMQ, a message is routed with its routing key plus every key in its CC and BCC
headers (arrays of strings); the BCC header is removed before the message reaches a queue.
"""

from __future__ import annotations

from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message
from queues.raw_properties import RawProperties


def sender_selected_keys(message: Message) -> list[str] | None:
    """Routing keys from the CC and BCC headers (None: the message has neither)."""
    raw = message.raw_header
    if b"\x02CC" not in raw and b"\x03BCC" not in raw:
        return None
    headers = message.headers or {}
    extra = []
    for name in ("CC", "BCC"):
        value = headers.get(name)
        if isinstance(value, list):
            extra.extend(item.decode() if isinstance(item, bytes) else str(item) for item in value)
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
