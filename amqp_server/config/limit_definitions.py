"""Vhost and user limits as definitions: their names, and RabbitMQ's check of a limits definition.

A vhost's limits are {"max-connections": N, "max-queues": N}, a user's {"max-connections": N,
"max-channels": N}. The broker (amqp_server/broker/resource_limits.py enforces them), the
management API, definitions imports, the cluster's shared definitions and `amqp-server ctl`
(which checks a definition before sending it, as rabbitmqctl does) all refuse a bad one with
the same text, RabbitMQ's (rabbit_parameter_validation).
"""

from __future__ import annotations

from typing import Any

from queues.arguments.policy_keys import erlang_term

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")


class LimitError(ValueError):
    """Limits RabbitMQ would refuse; the message is its text."""


def check_limits(value: Any, names: tuple[str, ...], component: str) -> dict[str, int]:
    """`value` ({"max-connections": 10, ...}) if every key is one of `names` with an integer
    value; LimitError with RabbitMQ's text (rabbit_parameter_validation) otherwise."""
    if not isinstance(value, dict):
        raise LimitError(f"{component} must be a JSON object, got {erlang_term(value)}")
    unknown = sorted((name, item) for name, item in value.items() if name not in names)  # as an Erlang map lists them
    if unknown:
        listed = ",".join(f"{{{erlang_term(name)},{erlang_term(item)}}}" for name, item in unknown)
        raise LimitError(f"Unrecognised terms [{listed}] in {component}")
    for name, item in value.items():
        if not isinstance(item, int) or isinstance(item, bool):
            raise LimitError(f"{name} should be a number, actually was {erlang_term(item)}")
    return dict(value)


def updated(current: dict[str, int], name: str, value: int | None) -> dict[str, int]:
    """`current` with limit `name` set to `value` (None: lifted), for one-limit API calls."""
    limits = dict(current)
    if value is None:
        limits.pop(name, None)
    else:
        limits[name] = value
    return limits
