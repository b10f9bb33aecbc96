"""Queue x-arguments: validated once at declare, then read as typed settings.

Validation follows RabbitMQ (rabbit_amqqueue:declare_args/0): the same keys, the same
accepted types and ranges, and the same reasons in the 406 text, for example
"invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_negative,-1}".
Unknown arguments are kept and ignored, as RabbitMQ does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
RETRY_TYPES = ("disabled", "all", "failed", "returned")
RETRY_BACKOFFS = ("linear", "exponential")
QUEUE_TYPES = ("classic", "quorum")
QUEUE_MODES = ("default", "lazy")
MAX_PRIORITY = 255


class InvalidArgument(ValueError):
    """An x-argument RabbitMQ would refuse; `reason` is RabbitMQ's Erlang-term description."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"invalid arg '{key}': {reason}")
        self.key = key
        self.reason = reason


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "void" if value is None else type(value).__name__


def _text(key: str, value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise InvalidArgument(key, f"{{unacceptable_type,{_type_name(value)}}}")
    return value


def _integer(key: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(key, f"{{unacceptable_type,{_type_name(value)}}}")
    if value < minimum:
        raise InvalidArgument(key, f"{{value_negative,{value}}}" if value < 0 else f"{{value_zero,{value}}}")
    return value


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    text = _text(key, value)
    if text not in choices:
        raise InvalidArgument(key, f"{{invalid_value,<<\"{text}\">>}}")
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
        if defaults:
            arguments = {**defaults, **arguments}
        get = arguments.get
        settings: dict[str, Any] = {}
        if get("x-message-ttl") is not None:
            settings["message_ttl_ms"] = _integer("x-message-ttl", get("x-message-ttl"), 0)
        if get("x-expires") is not None:
            settings["expires_ms"] = _integer("x-expires", get("x-expires"), 1)
        if get("x-max-length") is not None:
            settings["max_length"] = _integer("x-max-length", get("x-max-length"), 0)
        if get("x-max-length-bytes") is not None:
            settings["max_length_bytes"] = _integer("x-max-length-bytes", get("x-max-length-bytes"), 0)
        if get("x-overflow") is not None:
            settings["overflow"] = _choice("x-overflow", get("x-overflow"), OVERFLOW_MODES)
        if get("x-dead-letter-exchange") is not None:
            settings["dead_letter_exchange"] = _text("x-dead-letter-exchange", get("x-dead-letter-exchange"))
        if get("x-dead-letter-routing-key") is not None:
            if "dead_letter_exchange" not in settings:
                raise InvalidArgument("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
            settings["dead_letter_routing_key"] = _text("x-dead-letter-routing-key", get("x-dead-letter-routing-key"))
        if get("x-max-priority") is not None:
            priority = _integer("x-max-priority", get("x-max-priority"), 0)
            if priority > MAX_PRIORITY:
                raise InvalidArgument("x-max-priority", f"{{max_value_exceeded,{priority}}}")
            settings["max_priority"] = priority
        if get("x-single-active-consumer") is not None:
            value = get("x-single-active-consumer")
            if not isinstance(value, bool):
                raise InvalidArgument("x-single-active-consumer", f"{{unacceptable_type,{_type_name(value)}}}")
            settings["single_active_consumer"] = value
        if get("x-queue-type") is not None:
            queue_type = _text("x-queue-type", get("x-queue-type"))
            if queue_type not in QUEUE_TYPES:
                raise InvalidArgument("x-queue-type", f"{{unsupported_queue_type,<<\"{queue_type}\">>}}")
            settings["queue_type"] = queue_type
        if get("x-queue-mode") is not None:
            _choice("x-queue-mode", get("x-queue-mode"), QUEUE_MODES)
        _parse_lifecycle(get, settings)
        return cls(**settings)


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(key, f"{{unacceptable_type,{_type_name(value)}}}")
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
