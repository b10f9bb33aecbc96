"""POST /api/queues/{vhost}/{name}/get: look at messages in a queue.

RabbitMQ's ackmodes work as in RabbitMQ: the messages are fetched (basic.get), then
`ack_requeue_true` / `reject_requeue_true` put them back at their positions (they are now
marked redelivered and count as delivered), `ack_requeue_false` removes them, and
`reject_requeue_false` dead-letters them.

`ackmode: "peek"` is this broker's own addition: it reads the first `count` ready messages
in delivery order without taking them, so nothing changes: no redelivered flag, no delivery
counted, no consumer misses its turn.
"""

from __future__ import annotations

import base64
import datetime
from typing import TYPE_CHECKING, Any

from amqp_server.wire.codec import InvalidContentHeader, check_content_header
from amqp_server.management import api_errors
from persistence.properties_format import PROPERTY_NAMES as STORED_PROPERTY_ORDER, InvalidField, decode_properties_leniently
from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message, QueueEntry

if TYPE_CHECKING:
    from queues.queue import Queue

PEEK = "peek"
REQUEUE_MODES = ("ack_requeue_true", "reject_requeue_true")
ACKMODES = (*REQUEUE_MODES, "ack_requeue_false", "reject_requeue_false", PEEK)
ENCODINGS = ("auto", "base64")
# (name in the API's JSON, attribute of pamqp's Basic.Properties)
PROPERTY_NAMES = tuple(
    (name, "message_type" if name == "type" else name)
    for name in (
        "content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id", "reply_to",
        "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id",
    )
)


def browse(queue: "Queue", count: int, ackmode: str, encoding: str = "auto", truncate: int | None = None) -> list[dict[str, Any]]:
    """The messages as RabbitMQ's get returns them; ApiError 400 for an unknown mode."""
    if ackmode not in ACKMODES:
        raise api_errors.bad_request(f"unknown ackmode {ackmode!r} (one of {', '.join(ACKMODES)})")
    if encoding not in ENCODINGS:
        raise api_errors.bad_request(f"unknown encoding {encoding!r} (auto or base64)")
    if count < 1:
        return []
    if ackmode == PEEK:
        entries = peek_ready(queue, count)
        remaining = queue.message_count
        return [message_json(entry, remaining - index - 1, encoding, truncate) for index, entry in enumerate(entries)]
    taken: list[QueueEntry] = []
    shown = []
    for _ in range(count):
        entry = queue.get(no_ack=False)
        if entry is None:
            break
        shown.append(message_json(entry, queue.message_count, encoding, truncate))
        queue.after_get(entry)
        taken.append(entry)
    if ackmode in REQUEUE_MODES:
        queue.requeue([(entry, None) for entry in taken])
    elif ackmode == "ack_requeue_false":
        for entry in taken:
            queue.ack(entry, None)
    else:
        for entry in taken:
            queue.reject(entry, None)
    return shown


def peek_ready(queue: "Queue", count: int) -> list[QueueEntry]:
    """The first `count` ready messages in delivery order, left where they are (paged-out ones
    are read back from the queue's journal for display)."""
    return queue.ready.peek(count)


def message_json(entry: QueueEntry, remaining: int, encoding: str, truncate: int | None) -> dict[str, Any]:
    message = entry.message
    body = message.body
    shown = body[:truncate] if truncate is not None and truncate >= 0 else body
    payload, payload_encoding = _payload(shown, encoding)
    return {
        "payload_bytes": len(body),
        "redelivered": entry.redelivered,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "message_count": remaining,
        "properties": message_properties_json(message),
        "payload": payload,
        "payload_encoding": payload_encoding,
    }


def _payload(body: bytes, encoding: str) -> tuple[str, str]:
    if encoding == "auto":
        try:
            return body.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode(), "base64"


def message_properties_json(message: Message) -> dict[str, Any]:
    """The message's properties as RabbitMQ shows them. A message stored by a version that did
    not check content headers may hold fields no decoder can read: those are shown as
    "<invalid field: REASON>" and the rest as usual, so a poison message never fails a get."""
    try:
        check_content_header(message.raw_header)
    except InvalidContentHeader:
        try:
            values = decode_properties_leniently(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
        except InvalidField:
            return {}  # the property list itself is cut short: nothing can be shown
        return {name: value for name, value in zip(STORED_PROPERTY_ORDER, values) if value not in (None, "")}
    return properties_json(message.properties)


def properties_json(properties: Any) -> dict[str, Any]:
    """The properties that are set, as RabbitMQ shows them (timestamps in seconds)."""
    shown = {}
    for name, attribute in PROPERTY_NAMES:
        value = getattr(properties, attribute, None)
        if value is None or value == "":
            continue
        if isinstance(value, datetime.datetime):
            value = int(value.replace(tzinfo=value.tzinfo or datetime.timezone.utc).timestamp())
        shown[name] = value
    return shown
