"""POST /api/exchanges/{vhost}/{exchange}/publish: publish one message from JSON.

The message is routed as a basic.publish would be (no mandatory, no confirm) and counted in
the broker's received/routed/dropped counters. The exchange "amq.default" means the default
exchange, as in RabbitMQ's API.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import struct
from typing import TYPE_CHECKING, Any

from pamqp import commands

from amqp_server.wire.codec import InvalidContentHeader, check_content_header
from amqp_server.management import api_errors
from persistence.properties_format import MAX_NESTING_DEPTH
from queues.message import Message

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.vhost import VirtualHost
    from exchanges.exchange import Exchange

_CONTENT_HEADER_PREFIX = struct.Struct(">HHQ")
_BASIC_CLASS = 60
_INT_PROPERTIES = ("delivery_mode", "priority")
_TEXT_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
                    "user_id", "app_id", "cluster_id")


REQUIRED_KEYS = ("routing_key", "properties", "payload", "payload_encoding")
# RabbitMQ prints the list with Erlang's ~p: on one line if it fits, else one element per line.
# Measured on 3.10: 74 characters stay on one line, 79 break (no combination of keys falls between).
_ONE_LINE_LIMIT = 75


def require_keys(body: dict[str, Any]) -> None:
    """400 with RabbitMQ's reason (its Erlang list of `{key_missing,K}`) unless the body has all
    four keys; clients that leave out `properties` or `payload_encoding` learn it as on RabbitMQ."""
    missing = [f"{{key_missing,{key}}}" for key in REQUIRED_KEYS if key not in body]
    if not missing:
        return
    one_line = "[" + ",".join(missing) + "]"
    raise api_errors.bad_request(one_line if len(one_line) < _ONE_LINE_LIMIT else "[" + ",\n ".join(missing) + "]")


def decode_payload(payload: Any, encoding: str) -> bytes:
    if not isinstance(payload, str):
        raise api_errors.bad_request("payload must be a string")
    if encoding == "string":
        return payload.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise api_errors.bad_request("payload is not valid base64") from None
    raise api_errors.bad_request(f"payload_encoding must be string or base64, got {encoding!r}")


def build_properties(spec: dict[str, Any]) -> commands.Basic.Properties:
    """pamqp properties from the API's JSON (the names RabbitMQ's API uses)."""
    values: dict[str, Any] = {}
    for name, value in spec.items():
        if name in _INT_PROPERTIES:
            try:
                values[name] = int(value)
            except (TypeError, ValueError):
                raise api_errors.bad_request(f"property {name} must be an integer") from None
        elif name in _TEXT_PROPERTIES:
            values[name] = str(value)
        elif name == "type":
            values["message_type"] = str(value)
        elif name == "headers":
            if not isinstance(value, dict):
                raise api_errors.bad_request("property headers must be an object")
            values["headers"] = value
        elif name == "timestamp":
            try:
                values["timestamp"] = datetime.datetime.fromtimestamp(int(value), tz=datetime.timezone.utc)
            except (TypeError, ValueError, OverflowError):
                raise api_errors.bad_request("property timestamp must be seconds since the epoch") from None
        else:
            raise api_errors.bad_request(f"unknown property {name!r}")
    if values.get("delivery_mode", 1) not in (1, 2):  # pamqp would raise; RabbitMQ's words instead
        raise _invalid_message(f"{{delivery_mode_unknown,{values['delivery_mode']}}}")
    try:
        return commands.Basic.Properties(**values)
    except ValueError as error:  # pamqp's own validation of a property value
        raise api_errors.bad_request(str(error)) from None


def make_message(exchange_name: str, routing_key: str, properties: commands.Basic.Properties, body: bytes) -> Message:
    """The message, or 400 as RabbitMQ's API answers for what basic.publish would refuse (its API
    publishes through a channel): the same content header check as an AMQP publish."""
    try:
        raw_header = _CONTENT_HEADER_PREFIX.pack(_BASIC_CLASS, 0, len(body)) + properties.marshal()
    except RecursionError:  # pamqp encodes tables recursively: far beyond the depth limit
        raise _invalid_message(f"tables and arrays nested deeper than {MAX_NESTING_DEPTH}") from None
    try:
        check_content_header(raw_header)  # delivery_mode was checked in build_properties
    except InvalidContentHeader as invalid:
        raise _invalid_message(invalid.reason) from None
    return Message(exchange_name, routing_key, raw_header, body)


def _invalid_message(reason: str) -> api_errors.ApiError:
    return api_errors.bad_request(f"406 PRECONDITION_FAILED - invalid message: {reason}")


def publish(broker: "Broker", vhost: "VirtualHost", exchange: "Exchange", routing_key: str,
            properties: commands.Basic.Properties, body: bytes) -> bool:
    """Route the message into the vhost's queues; True if any queue took it."""
    if exchange.internal:
        raise api_errors.bad_request(f"cannot publish to internal exchange '{exchange.name}'")
    if len(body) > broker.max_message_size:
        raise api_errors.bad_request(f"message size {len(body)} is larger than max size {broker.max_message_size}")
    if len(routing_key.encode()) > 255:
        # No AMQP client could deliver it whole (a short string); RabbitMQ 3.10 routes it and
        # then closes its consumer's connection with 541.
        raise api_errors.bad_request(f"routing key of {len(routing_key.encode())} bytes: AMQP 0-9-1 allows 255")
    message = make_message(exchange.name, routing_key, properties, body)
    broker.stats.received += 1
    routed = False
    for queue in vhost.route(exchange, message):
        queue.publish(message)
        routed = True
    if routed:
        broker.stats.routed += 1
    else:
        broker.stats.dropped += 1
    return routed
