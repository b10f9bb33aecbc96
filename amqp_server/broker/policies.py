"""Policies and operator policies: named rules that give matching queues and exchanges settings.

A policy belongs to a vhost and has a pattern (a regular expression searched in the queue's or
exchange's name, as RabbitMQ's re:run does), what it applies to, a priority and a definition
(policy_keys.py). Of the policies that match, the one with the highest priority applies; at
equal priority RabbitMQ leaves the choice undefined, and this broker takes the name that sorts
first, so the choice is stable. Operator policies are the same kind of object in a separate
set, whose values cap the policy's (policy_keys.merge_definitions). Setting one re-applies it
to what already exists (policy_application.py). docs/policies.md.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from queues.arguments import queue_type_rules
from queues.arguments.policy_keys import NOT_APPLICABLE_TO_TYPE, PolicyError, check_definition, erlang_term


class ApplyTo(enum.Enum):
    """RabbitMQ 3.13's apply-to values (3.10 knows queues, exchanges and all)."""

    QUEUES = "queues"
    CLASSIC_QUEUES = "classic_queues"
    QUORUM_QUEUES = "quorum_queues"
    STREAMS = "streams"
    EXCHANGES = "exchanges"
    ALL = "all"


_QUEUE_TYPES_OF = {
    ApplyTo.QUEUES: None,  # every type
    ApplyTo.ALL: None,
    ApplyTo.CLASSIC_QUEUES: "classic",
    ApplyTo.QUORUM_QUEUES: queue_type_rules.QUORUM,
    ApplyTo.STREAMS: "stream",  # this broker has no stream queues: matches none
}


@dataclass(frozen=True)
class Policy:
    """One policy or operator policy, validated (`parse_policy` makes them)."""

    vhost: str
    name: str
    pattern: str
    apply_to: ApplyTo
    definition: dict[str, Any]
    priority: int | float
    regex: re.Pattern[str] = field(compare=False, repr=False)

    def matches_queue(self, name: str, queue_type: str) -> bool:
        """Whether the policy applies to queue `name` of `queue_type`: apply-to and pattern fit,
        and the definition holds no key that type does not take (then RabbitMQ skips the
        policy for that queue, policy_keys.NOT_APPLICABLE_TO_TYPE)."""
        if self.apply_to is ApplyTo.EXCHANGES:
            return False
        wanted = _QUEUE_TYPES_OF[self.apply_to]
        if wanted is not None and wanted != queue_type:
            return False
        if not NOT_APPLICABLE_TO_TYPE.get(queue_type, frozenset()).isdisjoint(self.definition):
            return False
        return self.regex.search(name) is not None

    def matches_exchange(self, name: str) -> bool:
        return self.apply_to in (ApplyTo.EXCHANGES, ApplyTo.ALL) and self.regex.search(name) is not None

    def as_json(self) -> dict[str, Any]:
        """RabbitMQ's shape: the management API's, the definitions export's and the store's."""
        return {
            "vhost": self.vhost,
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to.value,
            "definition": dict(self.definition),
            "priority": self.priority,
        }


def parse_policy(vhost: str, name: str, body: dict[str, Any], operator: bool = False) -> Policy:
    """A policy from a management API body or a definitions entry (pattern, definition,
    optional priority and apply-to); PolicyError with RabbitMQ's text when it would refuse it."""
    for key in ("pattern", "definition"):
        if key not in body:
            raise PolicyError(f"[{{key_missing,{key}}}]", validation=False)
    pattern = body["pattern"]
    try:
        if not isinstance(pattern, str):
            raise re.error("not a string")
        regex = re.compile(pattern)
    except re.error as error:
        # RabbitMQ quotes PCRE's {"message",position}; Python's message stands in for it.
        reason = f'{{"{error.msg}",{error.pos or 0}}}'
        raise PolicyError(f"pattern should be regular expression but is invalid: {reason}") from None
    priority = _priority(body.get("priority", 0))
    apply_to_text = body.get("apply-to", ApplyTo.ALL.value)
    try:
        apply_to = ApplyTo(apply_to_text)
    except ValueError:
        raise PolicyError(
            f"apply-to '{apply_to_text}' unrecognised; should be one of: 'queues', 'classic_queues', "
            " 'quorum_queues', 'streams', 'exchanges', or 'all'"
        ) from None
    definition = check_definition(body["definition"], operator)
    return Policy(vhost, name, pattern, apply_to, dict(definition), priority, regex)


def _priority(value: Any) -> int | float:
    """A number, as RabbitMQ's rabbit_parameter_validation:number takes it (1.5 too); text is
    refused, even "3" (rabbitmqadmin sends a JSON number, ctl converts --priority itself)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    raise PolicyError(f"priority should be a number, actually was {erlang_term(value)}")


class PolicySet:
    """The policies (or the operator policies) of one vhost, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Policy] = {}

    def __iter__(self) -> Iterator[Policy]:
        """Highest priority first, then by name (the order in which they win)."""
        return iter(sorted(self._by_name.values(), key=_precedence))

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Policy | None:
        return self._by_name.get(name)

    def put(self, policy: Policy) -> bool:
        """Add or replace `policy`; False when an equal one was already there."""
        if self._by_name.get(policy.name) == policy:
            return False
        self._by_name[policy.name] = policy
        return True

    def remove(self, name: str) -> Policy | None:
        return self._by_name.pop(name, None)

    def for_queue(self, name: str, queue_type: str) -> Policy | None:
        """The policy that applies to queue `name` of `queue_type`, or None."""
        return next((policy for policy in self if policy.matches_queue(name, queue_type)), None)

    def for_exchange(self, name: str) -> Policy | None:
        return next((policy for policy in self if policy.matches_exchange(name)), None)


def _precedence(policy: Policy) -> tuple[int | float, str]:
    return (-policy.priority, policy.name)
