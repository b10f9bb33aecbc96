"""A shovel's definition: RabbitMQ's keys, checked with RabbitMQ's texts, read into a `ShovelDefinition`.

The keys of a dynamic shovel's value (`PUT /api/parameters/shovel/{vhost}/{name}`), and of a
static shovel in the configuration file, as RabbitMQ 3.10's AMQP 0-9-1 shovel takes them (the
names before 3.8, in brackets, are still read):

    src-protocol, dest-protocol   "amqp091" (the default)
    src-uri, dest-uri             a URI or a list of URIs, tried in order (mandatory)
    src-queue | src-exchange      where messages come from (one of the two); src-exchange-key:
                                  the binding key of the queue the shovel makes for an exchange
    src-queue-args                the source queue's arguments, if the shovel declares it
    src-consumer-args             the consumer's arguments (x-priority ...)
    dest-queue | dest-exchange    where they go (neither: the exchange and routing key each
                                  message came with); dest-exchange-key: the routing key (the
                                  message's own when absent); dest-queue-args as for the source
    ack-mode                      on-confirm (default): the source is acked once the destination
                                  confirmed; on-publish: once published; no-ack: never
    reconnect-delay               seconds between attempts (default 1; 0: no reconnect)
    src-prefetch-count            unacked messages in flight (default 1000) [prefetch-count]
    src-delete-after              never (default), queue-length (what the queue held at the
                                  start) or a number of messages, after which the shovel
                                  deletes itself [delete-after]
    dest-add-forward-headers      add the x-shovelled header [add-forward-headers]
    dest-add-timestamp-header     add x-shovelled-timestamp [add-timestamp-header]
    dest-publish-properties       basic properties to set on each message [publish-properties]

`validate_shovel` returns the problems, one line each, in RabbitMQ's words and naming the key;
`parse_shovel` reads a valid value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from amqp_server.peer_link.reconnecting import DEFAULT_RECONNECT_DELAY_S
from amqp_server.peer_link.uri import InvalidUri, PeerAddress, parse_uri
from queues.arguments.policy_keys import erlang_term

COMPONENT = "shovel"
DEFAULT_PREFETCH = 1000
MAX_PREFETCH = 65535
PROTOCOL = "amqp091"
# The x-shovelled header's key, and the timestamp header's.
FORWARD_HEADER = "x-shovelled"
TIMESTAMP_HEADER = "x-shovelled-timestamp"


class AckMode(enum.Enum):
    ON_CONFIRM = "on-confirm"
    ON_PUBLISH = "on-publish"
    NO_ACK = "no-ack"


class DeleteAfter(enum.Enum):
    NEVER = "never"
    QUEUE_LENGTH = "queue-length"
    COUNT = "count"  # a number of messages (`delete_after_count`)


# Basic properties dest-publish-properties may set (RabbitMQ's names).
PUBLISH_PROPERTIES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                      "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")
_ALIASES = {"prefetch-count": "src-prefetch-count", "delete-after": "src-delete-after",
            "add-forward-headers": "dest-add-forward-headers", "add-timestamp-header": "dest-add-timestamp-header",
            "publish-properties": "dest-publish-properties"}
_TEXT_KEYS = ("src-exchange", "src-exchange-key", "src-queue", "dest-exchange", "dest-exchange-key", "dest-queue")
_TABLE_KEYS = ("src-queue-args", "src-consumer-args", "dest-queue-args")
_BOOLEAN_KEYS = ("dest-add-forward-headers", "dest-add-timestamp-header")
KEYS = frozenset(("src-protocol", "dest-protocol", "src-uri", "dest-uri", *_TEXT_KEYS, *_TABLE_KEYS, *_BOOLEAN_KEYS,
                  "ack-mode", "reconnect-delay", "src-prefetch-count", "src-delete-after", "dest-publish-properties",
                  *_ALIASES))


@dataclass(frozen=True)
class ShovelDefinition:
    """A checked shovel: where from, where to, and how."""

    vhost: str
    name: str
    kind: str  # "dynamic" (a runtime parameter) or "static" (the configuration file)
    src_uris: tuple[PeerAddress, ...]
    dest_uris: tuple[PeerAddress, ...]
    src_queue: str | None = None
    src_exchange: str | None = None
    src_exchange_key: str = ""
    src_queue_args: dict[str, Any] = field(default_factory=dict)
    src_consumer_args: dict[str, Any] = field(default_factory=dict)
    dest_queue: str | None = None
    dest_exchange: str | None = None
    dest_exchange_key: str | None = None
    dest_queue_args: dict[str, Any] = field(default_factory=dict)
    ack_mode: AckMode = AckMode.ON_CONFIRM
    reconnect_delay_s: float = DEFAULT_RECONNECT_DELAY_S
    prefetch: int = DEFAULT_PREFETCH
    delete_after: DeleteAfter = DeleteAfter.NEVER
    delete_after_count: int = 0
    forward_headers: bool = False
    timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    value: dict[str, Any] = field(default_factory=dict)  # as given

    def routing(self, exchange: str, routing_key: str) -> tuple[str, str]:
        """Where a message that came with `exchange` and `routing_key` is published."""
        if self.dest_queue is not None:
            return "", self.dest_queue
        if self.dest_exchange is not None:
            return self.dest_exchange, self.dest_exchange_key if self.dest_exchange_key is not None else routing_key
        return exchange, routing_key

    @property
    def rewrites_properties(self) -> bool:
        """Each message's properties change on the way (else its content header goes as it came)."""
        return self.forward_headers or self.timestamp_header or bool(self.publish_properties)

    def source_description(self) -> dict[str, Any]:
        """The source's keys in the status (src_queue, or src_exchange and src_exchange_key)."""
        if self.src_queue is not None:
            return {"src_queue": self.src_queue}
        return {"src_exchange": self.src_exchange, "src_exchange_key": self.src_exchange_key}

    def destination_description(self) -> dict[str, Any]:
        if self.dest_queue is not None:
            return {"dest_queue": self.dest_queue}
        if self.dest_exchange is not None:
            described: dict[str, Any] = {"dest_exchange": self.dest_exchange}
            if self.dest_exchange_key is not None:
                described["dest_exchange_key"] = self.dest_exchange_key
            return described
        return {}


def _canonical(value: dict[str, Any]) -> dict[str, Any]:
    """The value with pre-3.8 key names read as today's (a key given both ways: today's wins)."""
    keyed = {}
    for key, item in value.items():
        canonical = _ALIASES.get(key, key)
        if canonical != key and canonical in value:
            continue
        keyed[canonical] = item
    return keyed


def validate_shovel(vhost: str, name: str, value: Any) -> list[str]:
    """What is wrong with `value` as a shovel called `name` in `vhost`: RabbitMQ's lines (its
    order: the source and destination choice first, then key by key)."""
    if not isinstance(value, dict):
        return [f"shovel definition should be a JSON object, actually was {erlang_term(value)}"]
    problems: list[str] = []
    raw = value
    value = _canonical(value)
    if "src-exchange" in value and "src-queue" in value:
        problems.append("Cannot specify 'src-exchange' and 'src-queue'")
    elif "src-exchange" not in value and "src-queue" not in value:
        problems.append("Must specify 'src-exchange' or 'src-queue'")
    if "dest-exchange" in value and "dest-queue" in value:
        problems.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    delete_after = value.get("src-delete-after")
    if value.get("ack-mode") == "no-ack" and isinstance(delete_after, int) and not isinstance(delete_after, bool):
        problems.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    unknown = [(key, item) for key, item in raw.items() if key not in KEYS]
    if unknown:
        listed = ",".join(f"{{{erlang_term(key)},{erlang_term(item)}}}" for key, item in unknown)
        problems.append(f"Unrecognised terms [{listed}] in {name}")
    for key in ("src-uri", "dest-uri"):
        if key not in value:
            problems.append(f'Key "{key}" not found in {name}')
        else:
            problems.extend(_uri_problems(key, value[key], vhost))
    for key in ("src-protocol", "dest-protocol"):
        if key in value and value[key] != PROTOCOL:
            problems.append(f"{key} should be {erlang_term(PROTOCOL)} (the only protocol of this broker's shovels), "
                            f"actually was {erlang_term(value[key])}")
    for key in _TEXT_KEYS:
        if key in value and not isinstance(value[key], str):
            problems.append(f"{key} should be binary, actually was {erlang_term(value[key])}")
    for key in _TABLE_KEYS:
        if key in value and not isinstance(value[key], dict):
            problems.append(f"{key} should be a JSON object (a table), actually was {erlang_term(value[key])}")
    for key in _BOOLEAN_KEYS:
        if key in value and not isinstance(value[key], bool):
            problems.append(f"{key} should be boolean, actually was {erlang_term(value[key])}")
    if "ack-mode" in value and value["ack-mode"] not in [mode.value for mode in AckMode]:
        choices = ",".join(erlang_term(mode) for mode in ("no-ack", "on-publish", "on-confirm"))
        problems.append(f"ack-mode should be one of [{choices}], actually was {erlang_term(value['ack-mode'])}")
    delay = value.get("reconnect-delay", 0)
    if not _is_number(delay):
        problems.append(f"reconnect-delay should be a number, actually was {erlang_term(delay)}")
    elif delay < 0:
        problems.append(f"reconnect-delay should be a number greater than or equal to 0, actually was {delay}")
    prefetch = value.get("src-prefetch-count", DEFAULT_PREFETCH)
    if not _is_number(prefetch):
        problems.append(f"src-prefetch-count should be a number, actually was {erlang_term(prefetch)}")
    elif not isinstance(prefetch, int) or not 0 <= prefetch <= MAX_PREFETCH:
        problems.append(f"src-prefetch-count should be a whole number from 0 to {MAX_PREFETCH}, actually was {prefetch}")
    if delete_after is not None and delete_after not in ("never", "queue-length") and not (
            isinstance(delete_after, int) and not isinstance(delete_after, bool) and delete_after >= 0):
        problems.append('src-delete-after should be a number greater than or equal to 0, "never" or "queue-length", '
                        f"actually was {erlang_term(delete_after)}")
    properties = value.get("dest-publish-properties", {})
    if not isinstance(properties, dict):
        problems.append(f"dest-publish-properties not a list {erlang_term(properties)}")
    else:
        unknown = [(key, item) for key, item in properties.items() if key not in PUBLISH_PROPERTIES]
        if unknown:
            listed = ",".join(f"{{{erlang_term(key)},{erlang_term(item)}}}" for key, item in unknown)
            problems.append(f"Unrecognised terms [{listed}] in dest-publish-properties")
        problems.extend(_property_problems(properties))
    return problems


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _uri_problems(key: str, value: Any, vhost: str) -> list[str]:
    uris = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        return [f"{key} should be a URI or a non-empty list of URIs, actually was []"]
    for uri in uris:
        if not isinstance(uri, str):
            return [f"{key} should be list, actually was {erlang_term(uri)}"]
        try:
            parse_uri(uri, default_vhost=vhost)
        except InvalidUri as error:
            return [str(error)]
    return []


_INTEGER_PROPERTIES = {"delivery_mode": (1, 2), "priority": (0, 255), "timestamp": (0, 2 ** 64 - 1)}


def _property_problems(properties: dict[str, Any]) -> list[str]:
    problems = []
    for key, item in properties.items():
        if key in _INTEGER_PROPERTIES:
            low, high = _INTEGER_PROPERTIES[key]
            if not isinstance(item, int) or isinstance(item, bool) or not low <= item <= high:
                problems.append(f"dest-publish-properties {key} should be a number from {low} to {high}, "
                                f"actually was {erlang_term(item)}")
        elif key == "headers":
            if not isinstance(item, dict):
                problems.append(f"dest-publish-properties headers should be a JSON object, actually was "
                                f"{erlang_term(item)}")
        elif key in PUBLISH_PROPERTIES and not isinstance(item, str):
            problems.append(f"dest-publish-properties {key} should be binary, actually was {erlang_term(item)}")
    return problems


def parse_shovel(vhost: str, name: str, value: dict[str, Any], kind: str = "dynamic") -> ShovelDefinition:
    """The definition of a value `validate_shovel` found nothing wrong with."""
    keyed = _canonical(value)

    def uris(key: str) -> tuple[PeerAddress, ...]:
        given = keyed[key]
        return tuple(parse_uri(uri, default_vhost=vhost) for uri in (given if isinstance(given, list) else [given]))

    delete_after = keyed.get("src-delete-after", "never")
    return ShovelDefinition(
        vhost=vhost, name=name, kind=kind,
        src_uris=uris("src-uri"), dest_uris=uris("dest-uri"),
        src_queue=keyed.get("src-queue"), src_exchange=keyed.get("src-exchange"),
        src_exchange_key=keyed.get("src-exchange-key", ""),
        src_queue_args=dict(keyed.get("src-queue-args") or {}),
        src_consumer_args=dict(keyed.get("src-consumer-args") or {}),
        dest_queue=keyed.get("dest-queue"), dest_exchange=keyed.get("dest-exchange"),
        dest_exchange_key=keyed.get("dest-exchange-key"),
        dest_queue_args=dict(keyed.get("dest-queue-args") or {}),
        ack_mode=AckMode(keyed.get("ack-mode", AckMode.ON_CONFIRM.value)),
        reconnect_delay_s=float(keyed.get("reconnect-delay", DEFAULT_RECONNECT_DELAY_S)),
        prefetch=int(keyed.get("src-prefetch-count", DEFAULT_PREFETCH)),
        delete_after=(DeleteAfter.COUNT if isinstance(delete_after, int) else DeleteAfter(delete_after)),
        delete_after_count=delete_after if isinstance(delete_after, int) else 0,
        forward_headers=bool(keyed.get("dest-add-forward-headers", False)),
        timestamp_header=bool(keyed.get("dest-add-timestamp-header", False)),
        publish_properties=dict(keyed.get("dest-publish-properties") or {}),
        value=dict(value),
    )
