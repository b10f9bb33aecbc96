"""Redeclaring an existing exchange or queue: what must match (RabbitMQ's equivalence rules).

A declare whose type, flags or listed arguments differ from what exists is refused with
RabbitMQ's "inequivalent arg" text (`Inequivalent`; the broker answers 406
PRECONDITION_FAILED); other arguments may differ freely. Exclusivity (405 RESOURCE_LOCKED) is
the vhost's check, not this one.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from queues.arguments.texts import describe_argument, plain, resource


class DeclaredExchange(Protocol):
    """What a redeclaration is compared with (an exchanges.Exchange; queues/ does not import
    the exchanges package)."""

    name: str
    type_name: ClassVar[str]  # (a class attribute of each exchange type)
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


class DeclaredQueue(Protocol):
    """What a queue redeclaration is compared with (a queues.queue.Queue)."""

    name: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]

# Queue arguments that must match on redeclaration (rabbit_amqqueue:declare_args()).
EQUIVALENT_QUEUE_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-delayed-retry-type",
    "x-delayed-retry-min",
    "x-delayed-retry-max",
    "x-delayed-retry-backoff",
    "x-consumer-timeout",
    "x-message-deduplication",
)
# A stream compares only the arguments it takes (checked on RabbitMQ 3.10.8: an x-max-priority
# or x-message-ttl on a redeclare is neither compared nor refused).
EQUIVALENT_STREAM_ARGUMENTS = (
    "x-queue-type", "x-max-length-bytes", "x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
    "x-queue-leader-locator",
)
EQUIVALENT_EXCHANGE_ARGUMENTS = ("alternate-exchange", "x-delayed-type")
# What an absent argument means when comparing: a queue declared without x-queue-type is a
# classic queue, so RabbitMQ lets "classic" and no type redeclare each other (kombu, Celery and
# aio-pika applications add or drop it between versions).
_QUEUE_ARGUMENT_DEFAULTS = {"x-queue-type": "classic"}


class Inequivalent(ValueError):
    """A redeclaration that differs from what exists; str() is RabbitMQ's text (without the
    "PRECONDITION_FAILED - " prefix)."""

    def __init__(self, field: str, kind: str, name: str, vhost: str, received: str, current: str) -> None:
        super().__init__(
            f"inequivalent arg '{field}' for {resource(kind, name, vhost)}: received {received} but current is {current}"
        )


def inequivalent_argument(key: str, kind: str, name: str, vhost: str, received: object, current: object) -> Inequivalent:
    """An x-argument that differs on redeclaration, worded as RabbitMQ 3.x words it."""
    if received is not None and current is not None:
        return Inequivalent(key, kind, name, vhost, f"'{plain(received)}'", f"'{plain(current)}'")
    return Inequivalent(key, kind, name, vhost, describe_argument(received), describe_argument(current))


def flag(value: bool) -> str:
    return "'true'" if value else "'false'"


def check_exchange(
    vhost: str, existing: DeclaredExchange, type_name: str, durable: bool, auto_delete: bool, internal: bool,
    arguments: dict[str, Any],
) -> None:
    """Raise Inequivalent unless a declare with these properties matches `existing`."""

    def refuse(field: str, received: str, current: str) -> Inequivalent:
        return Inequivalent(field, "exchange", existing.name, vhost, received, current)

    if existing.type_name != type_name:
        raise refuse("type", f"'{type_name}'", f"'{existing.type_name}'")
    if existing.durable != durable:
        raise refuse("durable", flag(durable), flag(existing.durable))
    if existing.auto_delete != auto_delete:
        raise refuse("auto_delete", flag(auto_delete), flag(existing.auto_delete))
    if existing.internal != internal:
        raise refuse("internal", flag(internal), flag(existing.internal))
    _check_arguments(vhost, "exchange", existing.name, existing.arguments, arguments, EQUIVALENT_EXCHANGE_ARGUMENTS)


def check_queue(vhost: str, existing: DeclaredQueue, durable: bool, auto_delete: bool, arguments: dict[str, Any]) -> None:
    """Raise Inequivalent unless a declare with these properties matches `existing`."""
    if existing.durable != durable:
        raise Inequivalent("durable", "queue", existing.name, vhost, flag(durable), flag(existing.durable))
    if existing.auto_delete != auto_delete:
        raise Inequivalent(
            "auto_delete", "queue", existing.name, vhost, flag(auto_delete), flag(existing.auto_delete)
        )
    stream = existing.arguments.get("x-queue-type") in ("stream", b"stream")
    _check_arguments(
        vhost, "queue", existing.name, existing.arguments, arguments,
        EQUIVALENT_STREAM_ARGUMENTS if stream else EQUIVALENT_QUEUE_ARGUMENTS, _QUEUE_ARGUMENT_DEFAULTS,
    )


def _check_arguments(
    vhost: str, kind: str, name: str, current: dict[str, Any], received: dict[str, Any], keys: Collection[str],
    defaults: dict[str, Any] | None = None,
) -> None:
    for key in keys:
        have, want = current.get(key), received.get(key)
        if have != want:
            default = defaults.get(key) if defaults else None
            if default is not None and _text(have, default) == _text(want, default):
                continue
            raise inequivalent_argument(key, kind, name, vhost, want, have)


def _text(value: Any, default: str) -> Any:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else value
