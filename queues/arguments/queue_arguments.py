"""Queue x-arguments: validated once at declare, then read as typed settings.

Validation follows RabbitMQ (rabbit_amqqueue:declare_args/0): the same keys, the same
accepted types and ranges, and the same reasons in the 406 text, for example
"invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_negative,-1}".
Unknown arguments are kept and ignored, as RabbitMQ does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from queues.arguments import queue_type_rules
from queues.arguments.texts import amqp_type_name
from queues.arguments.intervals import interval_ms

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
RETRY_TYPES = ("disabled", "all", "failed", "returned")
RETRY_BACKOFFS = ("linear", "exponential")
QUEUE_TYPES = tuple(queue_type_rules.QUEUE_TYPE_RULES)  # the x-queue-type values a queue may be declared with
QUEUE_MODES = ("default", "lazy")
QUEUE_VERSIONS = (1, 2)
MAX_PRIORITY = 255
MAX_STREAM_SEGMENT_SIZE = 3_000_000_000  # rabbit_stream_queue's ?MAX_STREAM_SIZE_BYTES
MAX_EXPIRY_MS = 315_360_000_000  # RabbitMQ's ?MAX_EXPIRY_TIMER (ten years), for x-message-ttl and x-expires


class InvalidArgument(ValueError):
    """An x-argument RabbitMQ would refuse; `reason` is RabbitMQ's Erlang-term description.

    `invalid_type` is set instead for an x-dead-letter-exchange that is not a string, which
    RabbitMQ's channel refuses before it validates any argument, in a sentence of its own.

    `queue_type_module` is set instead for an argument the queue's type does not take at all
    (queue_type_rules.py), which RabbitMQ names with the type's module and no reason.
    """

    def __init__(
        self, key: str, reason: str, invalid_type: str | None = None, queue_type_module: str | None = None,
        text: str | None = None,
    ) -> None:
        super().__init__(f"invalid arg '{key}': {reason}")
        self.key = key
        self.reason = reason
        self.invalid_type = invalid_type
        self.queue_type_module = queue_type_module
        self.text = text  # RabbitMQ's whole text, for the few refusals not worded "invalid arg"

    def describe(self, resource: str) -> str:
        """RabbitMQ's 406 text for the queue `resource` ("queue 'q' in vhost '/'")."""
        if self.text is not None:
            return self.text
        if self.invalid_type is not None:
            return f"invalid type '{self.invalid_type}' for arg '{self.key}' in {resource}"
        if self.queue_type_module is not None:
            return f"invalid arg '{self.key}' for {resource} of queue type {self.queue_type_module}"
        return f"invalid arg '{self.key}' for {resource}: {self.reason}"


def _text(key: str, value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise InvalidArgument(key, f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return value


def _integer(key: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(key, f'"expected integer, got {amqp_type_name(value)}"')
    if value < minimum:
        raise InvalidArgument(key, f"{{value_negative,{value}}}" if value < 0 else f"{{value_zero,{value}}}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(key, f"{{value_too_large,{value}}}")
    return value


def _choice(key: str, value: Any, choices: tuple[str, ...], refusal: str | None = None) -> str:
    """One of `choices`; `refusal` is RabbitMQ's reason for another string ({0} is the string)."""
    text = _text(key, value)
    if text not in choices:
        raise InvalidArgument(key, (refusal or '{{invalid_value,<<"{0}">>}}').format(text))
    return text


@dataclass(frozen=True)
class QueueArguments:
    """The x-arguments a queue acts on, typed. None means "not set"."""

    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    single_active_consumer: bool = False
    queue_type: str = "classic"
    # Message lifecycle extensions (docs/lifecycle.md).
    delivery_limit: int | None = None
    retry_type: str = "disabled"
    retry_min_ms: int = 1000
    retry_max_ms: int | None = None
    retry_backoff: str = "linear"
    consumer_timeout_ms: int | None = None
    deduplication: bool = False
    dedup_cache_size: int = 10_000
    dedup_cache_ttl_ms: int | None = None
    dedup_header: str | None = None
    # Streams (queues/stream_queue.py).
    max_age_ms: int | None = None
    stream_max_segment_size_bytes: int | None = None

    @property
    def delayed_retry(self) -> bool:
        return self.retry_type != "disabled"

    @property
    def adds_delivery_count(self) -> bool:
        """Redeliveries carry an x-delivery-count header (as quorum queues do)."""
        return self.delayed_retry or self.delivery_limit is not None or self.queue_type == "quorum"

    @classmethod
    def parse(cls, arguments: dict[str, Any], defaults: dict[str, Any] | None = None) -> "QueueArguments":
        """Validate `arguments`; raises InvalidArgument on the first bad one.

        `defaults` (x-argument keys, from the configuration's [[queue_defaults]]) apply where
        `arguments` does not set the key.
        """
        if not arguments and not defaults:
            return NO_ARGUMENTS
        if defaults:
            arguments = {**defaults, **arguments}
        get = arguments.get
        settings: dict[str, Any] = {}
        # RabbitMQ's order: the channel checks the DLX name's type, the queue type is resolved,
        # then rabbit_amqqueue:declare_args/0 runs its checks in this order. A key that is
        # present with a void value is refused like any other wrong type.
        dead_letter_exchange = get("x-dead-letter-exchange")
        if "x-dead-letter-exchange" in arguments and not isinstance(dead_letter_exchange, (str, bytes)):
            kind = amqp_type_name(dead_letter_exchange)
            raise InvalidArgument("x-dead-letter-exchange", f"{{unacceptable_type,{kind}}}", invalid_type=kind)
        if "x-queue-type" in arguments:
            settings["queue_type"] = _choice(
                "x-queue-type", get("x-queue-type"), QUEUE_TYPES, "\"unsupported queue type '{0}'\""
            )
        queue_type = settings.get("queue_type", "classic")
        rules = queue_type_rules.rules_for(queue_type)
        quorum = queue_type == queue_type_rules.QUORUM
        stream = queue_type == queue_type_rules.STREAM
        if rules.refuses_other_arguments:
            # Only the arguments the type takes are validated; the others are refused below
            # whatever their value (x-max-priority 500 is not "max_value_exceeded").
            present = {key for key in arguments if rules.refused_argument({key: None}) is None}
        else:
            present = set(arguments)
        if "x-expires" in present:
            settings["expires_ms"] = _integer("x-expires", get("x-expires"), 1, MAX_EXPIRY_MS)
        if "x-message-ttl" in present:
            settings["message_ttl_ms"] = _integer("x-message-ttl", get("x-message-ttl"), 0, MAX_EXPIRY_MS)
        if "x-dead-letter-exchange" in present:
            settings["dead_letter_exchange"] = _text("x-dead-letter-exchange", dead_letter_exchange)
        if "x-dead-letter-routing-key" in present:
            # The type is checked before the missing DLX.
            routing_key = _text("x-dead-letter-routing-key", get("x-dead-letter-routing-key"))
            if "dead_letter_exchange" not in settings:
                raise InvalidArgument("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
            settings["dead_letter_routing_key"] = routing_key
        if quorum and "x-dead-letter-strategy" in present:
            _choice("x-dead-letter-strategy", get("x-dead-letter-strategy"),
                    queue_type_rules.DEAD_LETTER_STRATEGIES, "invalid_dlx_strategy")
        if "x-max-length" in present:
            settings["max_length"] = _integer("x-max-length", get("x-max-length"), 0)
        if "x-max-length-bytes" in present:
            settings["max_length_bytes"] = _integer("x-max-length-bytes", get("x-max-length-bytes"), 0)
        if quorum:
            for key in ("x-max-in-memory-length", "x-max-in-memory-bytes"):
                if key in present:
                    _integer(key, get(key), 0)
        if "x-max-priority" in present:
            priority = _integer("x-max-priority", get("x-max-priority"), 0)
            if priority > MAX_PRIORITY:
                raise InvalidArgument("x-max-priority", f"{{max_value_exceeded,{priority}}}")
            settings["max_priority"] = priority
        if "x-overflow" in present:
            settings["overflow"] = _choice("x-overflow", get("x-overflow"), OVERFLOW_MODES, "invalid_overflow")
        if "x-queue-mode" in present:
            _choice("x-queue-mode", get("x-queue-mode"), QUEUE_MODES, "\"unsupported queue mode '{0}'\"")
        if "x-queue-version" in present:
            version = _integer("x-queue-version", get("x-queue-version"), 0)
            if version not in QUEUE_VERSIONS:
                raise InvalidArgument("x-queue-version", f"\"unsupported queue version '{version}'\"")
        if "x-single-active-consumer" in present:
            settings["single_active_consumer"] = _boolean("x-single-active-consumer", get("x-single-active-consumer"))
        if stream:
            if "x-max-age" in present:
                settings["max_age_ms"] = _max_age("x-max-age", get("x-max-age"))
            if "x-stream-max-segment-size-bytes" in present:
                size = _integer("x-stream-max-segment-size-bytes", get("x-stream-max-segment-size-bytes"), 0)
                if size > MAX_STREAM_SEGMENT_SIZE:
                    raise InvalidArgument("x-stream-max-segment-size-bytes", "too large",
                                          text="Exceeded max value for x-stream-max-segment-size-bytes")
                settings["stream_max_segment_size_bytes"] = size
            if "x-initial-cluster-size" in present:
                _integer("x-initial-cluster-size", get("x-initial-cluster-size"), 1)
            if "x-queue-leader-locator" in present:
                _choice("x-queue-leader-locator", get("x-queue-leader-locator"),
                        queue_type_rules.LEADER_LOCATORS, "invalid_queue_locator_arg")
            refused = rules.refused_argument(arguments)
            if refused is not None:
                raise InvalidArgument(refused, "unsupported", queue_type_module=rules.module)
            return cls(**settings)
        if quorum:
            if "x-quorum-initial-group-size" in present:
                _integer("x-quorum-initial-group-size", get("x-quorum-initial-group-size"), 1)
            if "x-queue-leader-locator" in present:
                _choice("x-queue-leader-locator", get("x-queue-leader-locator"),
                        queue_type_rules.LEADER_LOCATORS, "invalid_queue_locator_arg")
            refused = queue_type_rules.refused_argument(queue_type, arguments)
            if refused is not None:
                raise InvalidArgument(refused, "unsupported", queue_type_module=queue_type_rules.QUORUM_MODULE)
            # RabbitMQ 3.10 does not check a quorum queue's x-delivery-limit: an integer is the
            # limit (a negative one acts as 0), anything else ("x") means no limit at all.
            limit = get("x-delivery-limit")
            if isinstance(limit, int) and not isinstance(limit, bool):
                settings["delivery_limit"] = max(limit, 0)
            arguments = {key: value for key, value in arguments.items() if key != "x-delivery-limit"}
            get = arguments.get
        _parse_lifecycle(get, settings)
        return cls(**settings)


# The settings of every queue declared without x-arguments: immutable, so they share one object.
NO_ARGUMENTS = QueueArguments()


def _max_age(key: str, value: Any) -> int:
    """x-max-age: a positive integer and a unit, Y M D h m s ("7D"), in milliseconds."""
    text = _text(key, value)
    span = interval_ms(text)
    if span is None:
        raise InvalidArgument(key, "invalid_max_age")
    return span


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(key, f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return value


def _parse_lifecycle(get: Any, settings: dict[str, Any]) -> None:
    """Delivery limit, delayed retry, consumer timeout and deduplication arguments."""
    if get("x-delivery-limit") is not None:
        settings["delivery_limit"] = _integer("x-delivery-limit", get("x-delivery-limit"), 0)
    if get("x-delayed-retry-type") is not None:
        settings["retry_type"] = _choice("x-delayed-retry-type", get("x-delayed-retry-type"), RETRY_TYPES)
    if get("x-delayed-retry-min") is not None:
        settings["retry_min_ms"] = _integer("x-delayed-retry-min", get("x-delayed-retry-min"), 0)
    if get("x-delayed-retry-max") is not None:
        maximum = _integer("x-delayed-retry-max", get("x-delayed-retry-max"), 0)
        if maximum < settings.get("retry_min_ms", QueueArguments.retry_min_ms):
            raise InvalidArgument("x-delayed-retry-max", f"{{less_than_min,{maximum}}}")
        settings["retry_max_ms"] = maximum
    if get("x-delayed-retry-backoff") is not None:
        settings["retry_backoff"] = _choice("x-delayed-retry-backoff", get("x-delayed-retry-backoff"), RETRY_BACKOFFS)
    if get("x-consumer-timeout") is not None:
        settings["consumer_timeout_ms"] = _integer("x-consumer-timeout", get("x-consumer-timeout"), 0) or None
    if get("x-message-deduplication") is not None:
        settings["deduplication"] = _boolean("x-message-deduplication", get("x-message-deduplication"))
    if get("x-cache-size") is not None:
        settings["dedup_cache_size"] = _integer("x-cache-size", get("x-cache-size"), 1)
    if get("x-cache-ttl") is not None:
        settings["dedup_cache_ttl_ms"] = _integer("x-cache-ttl", get("x-cache-ttl"), 1)
    if get("x-deduplication-header") is not None:
        settings["dedup_header"] = _text("x-deduplication-header", get("x-deduplication-header"))
