"""The x-delivery-count header that deliveries from some queues carry.

Queues with delayed retry, an x-delivery-limit or x-queue-type quorum add it to a message they
deliver again, counting its earlier deliveries (1 on the first redelivery). A quorum queue also
adds it to every basic.get, 0 on the first, as RabbitMQ 3.10 does; its first basic.deliver goes
out untouched, keeping any x-delivery-count the publisher set.

The header is written as RabbitMQ writes it: a 64-bit `l` integer in a headers table sorted by
name (rabbit_misc:set_table_value sorts it), every other field copied byte for byte so the
publisher's integer types survive. Only these deliveries pay for a new content header; every
other delivery goes out as the raw bytes the publisher sent.
"""

from __future__ import annotations

from queues.arguments import QueueArguments
from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message, content_header
from queues.arguments.queue_type_rules import QUORUM
from queues.raw_properties import RawProperties, encode_field

HEADER = "x-delivery-count"


def header_with_delivery_count(message: Message, count: int) -> bytes:
    """`message`'s content header with x-delivery-count set to `count` (the message is not changed)."""
    raw = RawProperties(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
    fields = [(name, value) for name, value in raw.header_fields() if name != HEADER]
    fields.append((HEADER, encode_field(count)))
    fields.sort(key=lambda field: field[0].encode("utf-8", "surrogateescape"))
    raw.set_header_fields(fields)
    return content_header(len(message.body), raw.encode())


def get_ok_header(settings: QueueArguments, message: Message, delivery_count: int) -> bytes:
    """The content header a basic.get-ok carries for `message`, delivered `delivery_count` times before."""
    if settings.adds_delivery_count and (delivery_count or settings.queue_type == QUORUM):
        return header_with_delivery_count(message, delivery_count)
    return message.raw_header
