"""What a policy's definition may hold: each key's check, its x-argument, and how it combines.

RabbitMQ 3.13 is the reference (rabbit_policies.erl, rabbit_policy.erl): the same keys, the
same refusal texts ("-1 is not a valid message TTL", "[{<<"foo">>,1}] are not recognised policy
settings"), the same keys allowed in operator policies, and the same rules for combining:

- policy and operator policy: for the limits (OPERATOR_KEYS) the lower value wins; otherwise
  the operator policy's value is used only where the policy has none (merge_definitions);
- that combined value and the queue's own x-argument: for the limits (LOWER_WINS) the lower
  wins, for every other key the x-argument wins (rabbit_amqqueue_process res_min / res_arg),
  but a quorum queue takes the policy's overflow (rabbit_quorum_queue policy_has_precedence).

Keys RabbitMQ knows but that change nothing here (queue-mode, queue-version, quorum and stream
placement) are accepted and have no effect, as RabbitMQ 4 does with queue-mode. Mirroring
(ha-*) keys are refused as unknown: this broker cannot honour them. The federation keys
(federation-upstream, -set, -pattern) set no x-argument: amqp_server/federation/ reads them
from the policy in force and runs links for what they apply to; at most one of them may be
given (rabbit_federation_parameters:validate_policy).
docs/policies.md lists every key.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from queues.arguments import OVERFLOW_MODES, QUEUE_MODES, RETRY_BACKOFFS, RETRY_TYPES
from queues.arguments.intervals import interval_ms
from queues.arguments.queue_type_rules import DEAD_LETTER_STRATEGIES, LEADER_LOCATORS, QUORUM, STREAM


class AppliesTo(enum.Enum):
    """What a key acts on: queues, exchanges, both through federation links, or nothing here
    (accepted for compatibility)."""

    QUEUES = "queues"
    EXCHANGES = "exchanges"
    FEDERATION = "exchanges and queues, through federation links"
    NOTHING = "nothing"


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse; the message is RabbitMQ's text. `validation` is False for
    a body missing a key, which RabbitMQ's API reports bare ("[{key_missing,pattern}]"), not
    as "Validation failed"."""

    def __init__(self, text: str, validation: bool = True) -> None:
        super().__init__(text)
        self.validation = validation


def erlang_term(value: Any) -> str:
    """`value` (decoded JSON) as Erlang's ~p prints the term RabbitMQ decodes it to."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(item) for item in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{erlang_term(k)} => {erlang_term(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _integer_at_least(minimum: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _one_of(*choices: Any) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, (str, int)) and not isinstance(value, bool) and value in choices


def _is_interval(value: Any) -> bool:
    return isinstance(value, str) and interval_ms(value) is not None


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _is_compiling_pattern(value: Any) -> bool:
    """Text; whether it compiles is checked by _pattern_refusal, which has its own words."""
    return isinstance(value, str)


def _pattern_refusal(value: str) -> str | None:
    try:
        re.compile(value)
    except re.error as error:
        # RabbitMQ quotes PCRE's {"message",position}; Python's message stands in for it.
        return (f"could not compile pattern {value} to a regular expression. "
                f'Error: {{"{error.msg}",{error.pos or 0}}}')
    return None


@dataclass(frozen=True)
class PolicyKey:
    """One definition key: `valid(value)`, RabbitMQ's refusal (`{0}` is the value as ~p prints
    it), the x-argument it sets (None: no effect here) and whether the lower value wins."""

    name: str
    valid: Callable[[Any], bool]
    refusal: str
    argument: str | None
    applies_to: AppliesTo = AppliesTo.QUEUES
    lower_wins: bool = False

    def check(self, value: Any) -> None:
        if not self.valid(value):
            raise PolicyError(self.refusal.format(erlang_term(value)))


_NON_NEGATIVE = _integer_at_least(0)
KEYS: dict[str, PolicyKey] = {key.name: key for key in (
    PolicyKey("alternate-exchange", _is_text, "{0} is not a valid alternate exchange name", "alternate-exchange",
              AppliesTo.EXCHANGES),
    PolicyKey("dead-letter-exchange", _is_text, "{0} is not a valid dead letter exchange name",
              "x-dead-letter-exchange"),
    PolicyKey("dead-letter-routing-key", _is_text, "{0} is not a valid dead letter routing key",
              "x-dead-letter-routing-key"),
    PolicyKey("message-ttl", _NON_NEGATIVE, "{0} is not a valid message TTL", "x-message-ttl", lower_wins=True),
    PolicyKey("expires", _integer_at_least(1), "{0} is not a valid queue expiry", "x-expires", lower_wins=True),
    PolicyKey("max-length", _NON_NEGATIVE, "{0} is not a valid maximum length", "x-max-length", lower_wins=True),
    PolicyKey("max-length-bytes", _NON_NEGATIVE, "{0} is not a valid maximum length in bytes", "x-max-length-bytes",
              lower_wins=True),
    PolicyKey("overflow", _one_of(*OVERFLOW_MODES), "{0} is not a valid overflow value", "x-overflow"),
    PolicyKey("delivery-limit", _NON_NEGATIVE, "{0} is not a valid delivery limit", "x-delivery-limit",
              lower_wins=True),
    # Known to RabbitMQ, no effect here: classic queues have one storage, quorum queues are
    # classic queues with quorum rules.
    PolicyKey("queue-mode", _one_of(*QUEUE_MODES), "{0} is not a valid queue-mode value", None, AppliesTo.NOTHING),
    PolicyKey("queue-version", _one_of(1, 2), "{0} is not a valid queue-version value", None, AppliesTo.NOTHING),
    PolicyKey("max-in-memory-length", _NON_NEGATIVE, "{0} is not a valid maximum memory in bytes", None,
              AppliesTo.NOTHING, lower_wins=True),
    PolicyKey("max-in-memory-bytes", _NON_NEGATIVE, "{0} is not a valid maximum memory in bytes", None,
              AppliesTo.NOTHING, lower_wins=True),
    PolicyKey("dead-letter-strategy", _one_of(*DEAD_LETTER_STRATEGIES), "{0} is not a valid dead letter strategy",
              None, AppliesTo.NOTHING),
    PolicyKey("queue-leader-locator", _one_of(*LEADER_LOCATORS), "{0} is not a valid queue leader locator value",
              None, AppliesTo.NOTHING),
    PolicyKey("initial-cluster-size", _NON_NEGATIVE, "{0} is not a valid cluster size", None, AppliesTo.NOTHING),
    # Streams' retention (queues/stream_queue.py), as RabbitMQ's stream policies.
    PolicyKey("max-age", _is_interval, "{0} is not a valid max age", "x-max-age"),
    PolicyKey("stream-max-segment-size-bytes", _NON_NEGATIVE, "{0} is not a valid segment size",
              "x-stream-max-segment-size-bytes"),
    # This broker's own queue behaviour (docs/lifecycle.md), named as its x-arguments without "x-".
    PolicyKey("delayed-retry-type", _one_of(*RETRY_TYPES), "{0} is not a valid delayed retry type",
              "x-delayed-retry-type"),
    PolicyKey("delayed-retry-min", _NON_NEGATIVE, "{0} is not a valid delayed retry minimum", "x-delayed-retry-min"),
    PolicyKey("delayed-retry-max", _NON_NEGATIVE, "{0} is not a valid delayed retry maximum", "x-delayed-retry-max"),
    PolicyKey("delayed-retry-backoff", _one_of(*RETRY_BACKOFFS), "{0} is not a valid delayed retry backoff",
              "x-delayed-retry-backoff"),
    PolicyKey("consumer-timeout", _NON_NEGATIVE, "{0} is not a valid consumer timeout", "x-consumer-timeout"),
    PolicyKey("archive", _is_boolean, "{0} is not a valid archive value", "x-archive"),
    PolicyKey("message-deduplication", _is_boolean, "{0} is not a valid message deduplication value",
              "x-message-deduplication"),
    PolicyKey("cache-size", _integer_at_least(1), "{0} is not a valid deduplication cache size", "x-cache-size"),
    PolicyKey("cache-ttl", _integer_at_least(1), "{0} is not a valid deduplication cache TTL", "x-cache-ttl"),
    PolicyKey("deduplication-header", _is_text, "{0} is not a valid deduplication header",
              "x-deduplication-header"),
    # Federation (amqp_server/federation/), RabbitMQ's rabbit_federation_parameters texts.
    PolicyKey("federation-upstream", _is_text, "{0} is not a valid federation upstream name", None,
              AppliesTo.FEDERATION),
    PolicyKey("federation-upstream-set", _is_text, "{0} is not a valid federation upstream set name", None,
              AppliesTo.FEDERATION),
    PolicyKey("federation-upstream-pattern", _is_compiling_pattern, "{0} is not a valid federation upstream pattern name",
              None, AppliesTo.FEDERATION),
)}
FEDERATION_KEYS = tuple(key.name for key in KEYS.values() if key.applies_to is AppliesTo.FEDERATION)
# A policy holding one of these keys does not apply to queues of that type at all (RabbitMQ's
# unsupported_policies of the queue type, rabbit_queue_type:is_policy_applicable): the queue
# takes the next policy that matches, or none. RabbitMQ 3.13's lists, less what this broker
# refuses anyway (ha-*, max-priority, stream keys). 3.13 also lists delivery-limit for classic
# queues; here classic queues honour a delivery limit (docs/lifecycle.md), so it applies.
_STREAM_ONLY = frozenset({"max-age", "stream-max-segment-size-bytes"})
NOT_APPLICABLE_TO_TYPE: dict[str, frozenset[str]] = {
    "classic": frozenset({"dead-letter-strategy", "queue-leader-locator", "initial-cluster-size"}) | _STREAM_ONLY,
    QUORUM: frozenset({"queue-mode"}) | _STREAM_ONLY,
    # rabbit_stream_queue's unsupported policies (RabbitMQ 3.13), less what is refused anyway.
    STREAM: frozenset({
        "expires", "message-ttl", "dead-letter-exchange", "dead-letter-routing-key", "max-length", "overflow",
        "max-in-memory-length", "max-in-memory-bytes", "delivery-limit", "dead-letter-strategy", "queue-mode",
        "queue-version", "delayed-retry-type", "delayed-retry-min", "delayed-retry-max", "delayed-retry-backoff",
        "consumer-timeout", "message-deduplication", "cache-size", "cache-ttl", "deduplication-header", "archive",
    }),
}
# rabbit_policies: the keys an operator policy may set (all of them limits: the lower value wins).
OPERATOR_KEYS = frozenset({
    "expires", "message-ttl", "max-length", "max-length-bytes", "max-in-memory-length", "max-in-memory-bytes",
    "delivery-limit",
})
# x-arguments where the lower of policy and argument wins (res_min); the argument wins for the rest.
LOWER_WINS = frozenset(key.argument for key in KEYS.values() if key.lower_wins and key.argument)
# ...except these, where a quorum queue takes the policy's value over its own argument
# (rabbit_quorum_queue: overflow is looked up with policy_has_precedence; checked on 3.10.8).
POLICY_WINS_BY_TYPE: dict[str, frozenset[str]] = {QUORUM: frozenset({"x-overflow"})}


def check_definition(definition: Any, operator: bool = False) -> dict[str, Any]:
    """`definition` if RabbitMQ would accept it as a policy's (an operator policy's) definition;
    PolicyError with RabbitMQ's text otherwise. Checked in RabbitMQ's order: the shape, the known
    keys' values, then the keys nobody knows."""
    if not isinstance(definition, dict):
        raise PolicyError(f"definition must be a dictionary: {erlang_term(definition)}")
    if not definition:
        raise PolicyError("no policy provided")
    allowed = OPERATOR_KEYS if operator else KEYS
    federation = [name for name in FEDERATION_KEYS if name in definition and name in allowed]
    if len(federation) > 1:
        raise PolicyError("cannot specify federation-upstream, federation-upstream-set or "
                          "federation-upstream-pattern together")
    for name, value in definition.items():
        if name in allowed:
            KEYS[name].check(value)
            if name == "federation-upstream-pattern":
                refusal = _pattern_refusal(value)
                if refusal is not None:
                    raise PolicyError(refusal)
    unknown = sorted((name, value) for name, value in definition.items() if name not in allowed)
    if unknown:
        listed = ",".join(f"{{{erlang_term(name)},{erlang_term(value)}}}" for name, value in unknown)
        raise PolicyError(f"[{listed}] are not recognised policy settings")
    return definition


def merge_definitions(policy: dict[str, Any] | None, operator: dict[str, Any] | None) -> dict[str, Any]:
    """The definition in force where both apply (RabbitMQ's effective_policy_definition): every
    key of either, the lower value for a key both set."""
    merged = dict(policy or {})
    for name, value in (operator or {}).items():
        current = merged.get(name)
        merged[name] = value if current is None else min(current, value)
    return merged


def queue_arguments_of(definition: dict[str, Any]) -> dict[str, Any]:
    """The x-arguments a definition gives a queue (keys without effect left out)."""
    arguments = {}
    for name, value in definition.items():
        key = KEYS.get(name)
        if key is not None and key.argument is not None and key.applies_to is AppliesTo.QUEUES:
            arguments[key.argument] = value
    return arguments


def combine_with_arguments(from_policy: dict[str, Any], own: dict[str, Any], queue_type: str = "classic"
                           ) -> dict[str, Any]:
    """A queue's effective x-arguments: its own win, except that for the limits the lower of
    its own and the policy's wins, and that a quorum queue takes the policy's overflow. A value
    of the wrong type is left to the argument check."""
    combined = {**from_policy, **own}
    for argument in POLICY_WINS_BY_TYPE.get(queue_type, frozenset()).intersection(from_policy):
        combined[argument] = from_policy[argument]
    for argument in LOWER_WINS.intersection(own).intersection(from_policy):
        mine, theirs = own[argument], from_policy[argument]
        if _is_integer(mine) and _is_integer(theirs):
            combined[argument] = min(mine, theirs)
    return combined


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
