"""The x-delivery-count header that redeliveries from some queues carry.

Queues with delayed retry, an x-delivery-limit or x-queue-type quorum add it to a message they
deliver again, counting its earlier deliveries (RabbitMQ's quorum queues do the same). Only
such redeliveries pay for the re-encoded content header: every other delivery goes out as the
raw bytes the publisher sent.
"""

from __future__ import annotations

from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message, content_header, decode_properties

HEADER = "x-delivery-count"


def header_with_delivery_count(message: Message, count: int) -> bytes:
    """`message`'s content header with x-delivery-count set to `count` (the message is not changed)."""
    properties = decode_properties(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])  # a copy of its own
    headers = dict(properties.headers or {})
    headers[HEADER] = count
    properties.headers = headers
    return content_header(len(message.body), properties.marshal())
