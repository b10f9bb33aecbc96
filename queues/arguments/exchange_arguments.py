"""The arguments of an exchange that the broker, not the exchange type, checks at declare."""

from __future__ import annotations

from typing import Any

from queues.arguments.texts import amqp_type_name, resource


def alternate_exchange_refusal(arguments: dict[str, Any] | None, name: str, vhost: str) -> str | None:
    """RabbitMQ's text when a new exchange's `alternate-exchange` is not a string, else None.
    (A longstr that is not UTF-8 decodes to bytes: still a string.)"""
    if not arguments or "alternate-exchange" not in arguments:
        return None
    value = arguments["alternate-exchange"]
    if isinstance(value, (str, bytes)):
        return None
    return f"invalid type '{amqp_type_name(value)}' for arg 'alternate-exchange' in {resource('exchange', name, vhost)}"
