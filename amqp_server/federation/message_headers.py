"""A federated message's content header, edited in its raw form for the next hop.

A link receives each message from its upstream as the content header payload it came in (class,
weight, body size, then the basic properties) and publishes it downstream with that header
changed only where federation changes it (queues/raw_properties.py: every other property and
header field keeps its bytes, integer types included):

- `x-received-from` gets this hop in front (loops.exchange_hop, loops.queue_hop); a queue hop
  also adds x-original-exchange / x-original-routing-key and renames CC to x-original-cc;
- `user_id` is removed unless the upstream is trusted (`trust-user-id`): this broker, like
  RabbitMQ, refuses a publish whose user_id is not the publishing user
  (rabbit_federation_link_util:maybe_clear_user_id).

`exchange_forward` answers None for a message that must not cross (loops.should_forward).
"""

from __future__ import annotations

import struct
from typing import Any

from amqp_server.federation.loops import exchange_hop, queue_hop
from exchanges.federation_upstream import RECEIVED_FROM, should_forward
from persistence.properties_format import InvalidField, decode_field_value
from queues.message import FLAG_USER_ID
from queues.raw_properties import RawProperties, encode_field

_PREFIX = 12  # class id, weight, body size
_ORIGINAL_FIELDS = ("x-original-exchange", "x-original-routing-key", "x-original-cc", "CC", "x-invalid-headers")


class UnreadableHeader(ValueError):
    """The content header cannot be read (the link rejects the message upstream)."""


def _decoded(fields: list[tuple[str, bytes]], names: tuple[str, ...]) -> dict[str, Any]:
    found = {}
    for name, value in fields:
        if name in names:
            try:
                found[name] = decode_field_value(value, 0, len(value))[0]
            except InvalidField as error:
                raise UnreadableHeader(f"header {name}: {error}") from None
    return found


def _read(raw_header: bytes, names: tuple[str, ...]) -> tuple[RawProperties, list[tuple[str, bytes]], dict[str, Any]]:
    """The header's properties, its header fields, and the decoded values of the fields `names`."""
    try:
        properties = RawProperties(raw_header[_PREFIX:])
        fields = properties.header_fields()
    except (ValueError, IndexError, struct.error) as error:
        raise UnreadableHeader(str(error)) from None
    return properties, fields, _decoded(fields, names)


def _write(raw_header: bytes, properties: RawProperties, fields: list[tuple[str, bytes]], names: tuple[str, ...],
           changed: dict[str, Any], keep_user_id: bool) -> bytes:
    """The header with the fields `names` replaced by `changed`, the others kept byte for byte."""
    kept = [(name, value) for name, value in fields if name not in names]
    # The federation fields first, as RabbitMQ prepends them; the others in their order.
    properties.set_header_fields([(name, encode_field(value)) for name, value in changed.items()] + kept)
    if not keep_user_id:
        properties.remove(FLAG_USER_ID)
    return raw_header[:_PREFIX] + properties.encode()


_EXCHANGE_FIELDS = (RECEIVED_FROM, "x-invalid-headers")
_QUEUE_FIELDS = (RECEIVED_FROM,) + _ORIGINAL_FIELDS


def exchange_forward(raw_header: bytes, *, max_hops: int, downstream_name: str, downstream_vhost: str,
                     uri: str, exchange: str, redelivered: bool, upstream_cluster: str | None,
                     upstream_vhost: str, trust_user_id: bool) -> bytes | None:
    """The header a message from an upstream exchange is published with here, or None when it
    must not cross (past max-hops, or back where it was)."""
    properties, fields, current = _read(raw_header, _EXCHANGE_FIELDS)
    if not should_forward(current, max_hops, downstream_name, downstream_vhost):
        return None
    changed = exchange_hop(current, uri, exchange, redelivered, upstream_cluster, upstream_vhost)
    return _write(raw_header, properties, fields, _EXCHANGE_FIELDS, changed, trust_user_id)


def queue_forward(raw_header: bytes, *, uri: str, queue: str, redelivered: bool, exchange: str,
                  routing_key: str, trust_user_id: bool) -> bytes:
    """The header a message from an upstream queue is published with here."""
    properties, fields, current = _read(raw_header, _QUEUE_FIELDS)
    changed = queue_hop(current, uri, queue, redelivered, exchange, routing_key)
    return _write(raw_header, properties, fields, _QUEUE_FIELDS, changed, trust_user_id)
