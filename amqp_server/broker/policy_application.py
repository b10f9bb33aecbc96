"""Policies in force: a queue's or exchange's effective settings, kept current as policies change.

A queue's effective x-arguments are, lowest layer first: the configuration's [[queue_defaults]],
the combined policy and operator policy (policy_keys.merge_definitions), and the queue's own
x-arguments, which win except for the limits, where the lower value wins, and a quorum
queue's overflow, where the policy wins
(policy_keys.combine_with_arguments). The queue's own arguments are checked on their own at
declare, as RabbitMQ checks them; a policy value that cannot combine with them (a delayed retry
maximum below the queue's own minimum) is left out and logged, never refused to the client.

Which policy applies is worked out from the vhost's policy sets whenever it is needed, so it
cannot go stale; `reapply` pushes the result into every queue and exchange after a change.
Nothing here runs per message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from amqp_server.broker.policies import Policy, PolicySet
from exchanges.exchange import Exchange
from queues.arguments import InvalidArgument, QueueArguments
from queues.arguments.policy_keys import combine_with_arguments, merge_definitions, queue_arguments_of
from queues.arguments.queue_defaults import QueueDefault, defaults_for
from queues.queue import Queue

log = logging.getLogger(__name__)


class PolicedVhost(Protocol):
    """What applying policies reads of the vhost (amqp_server.broker.vhost.VirtualHost): its
    policy sets and queue defaults, and the queues and exchanges they apply to."""

    @property
    def name(self) -> str: ...

    @property
    def policies(self) -> PolicySet: ...

    @property
    def operator_policies(self) -> PolicySet: ...

    @property
    def queue_defaults(self) -> list[QueueDefault]: ...

    @property
    def archives_everything(self) -> bool: ...

    @property
    def default_exchange(self) -> Exchange: ...

    @property
    def exchanges(self) -> Mapping[str, Exchange]: ...

    @property
    def queues(self) -> Mapping[str, Queue]: ...


# Arguments checked against another one (queues/arguments/queue_arguments.py): a refusal of the first may be
# the other's fault.
_CHECKED_AGAINST = {"x-delayed-retry-max": "x-delayed-retry-min"}


@dataclass(frozen=True)
class PoliciesInForce:
    """The policy and operator policy that apply to one queue or exchange (either may be None)."""

    policy: Policy | None
    operator_policy: Policy | None

    @property
    def definition(self) -> dict[str, Any]:
        """RabbitMQ's effective_policy_definition ({} when neither applies)."""
        return merge_definitions(
            self.policy.definition if self.policy else None,
            self.operator_policy.definition if self.operator_policy else None,
        )

    def as_json(self) -> dict[str, Any]:
        """The fields /api/queues and /api/exchanges show."""
        return {
            "policy": self.policy.name if self.policy else None,
            "operator_policy": self.operator_policy.name if self.operator_policy else None,
            "effective_policy_definition": self.definition,
        }


NONE_IN_FORCE = PoliciesInForce(None, None)


def for_queue(vhost: PolicedVhost, name: str, queue_type: str) -> PoliciesInForce:
    return _in_force(vhost.policies, vhost.operator_policies, lambda set_: set_.for_queue(name, queue_type))


def for_exchange(vhost: PolicedVhost, name: str) -> PoliciesInForce:
    return _in_force(vhost.policies, vhost.operator_policies, lambda set_: set_.for_exchange(name))


def _in_force(policies: PolicySet, operator_policies: PolicySet, match: Any) -> PoliciesInForce:
    if not policies and not operator_policies:
        return NONE_IN_FORCE
    return PoliciesInForce(match(policies) if policies else None, match(operator_policies) if operator_policies else None)


def queue_settings(
    vhost: PolicedVhost, name: str, arguments: dict[str, Any], checked: QueueArguments
) -> tuple[QueueArguments, bool]:
    """The effective settings of queue `name` whose own `arguments` parsed to `checked` (with
    the configuration's defaults), and its x-archive; `checked` itself when no policy applies."""
    in_force = for_queue(vhost, name, checked.queue_type)
    own_archive = arguments.get("x-archive") is True
    if in_force is NONE_IN_FORCE:
        return checked, own_archive
    from_policy = queue_arguments_of(in_force.definition)
    if "x-dead-letter-exchange" not in from_policy and "x-dead-letter-exchange" not in arguments:
        from_policy.pop("x-dead-letter-routing-key", None)  # ignored without a dead-letter exchange, as in RabbitMQ
    defaults = defaults_for(vhost.queue_defaults, vhost.name, name) if vhost.queue_defaults else {}
    while True:
        combined = {**defaults, **combine_with_arguments(from_policy, arguments, checked.queue_type)}
        try:
            settings = QueueArguments.parse(combined)
        except InvalidArgument as error:
            # The policy's value for the refused key, or for the one it is checked against.
            key = error.key if error.key in from_policy else _CHECKED_AGAINST.get(error.key)
            if key not in from_policy:
                return checked, own_archive  # the queue's own arguments alone decide (they were accepted)
            log.warning(
                "policy value %s=%r not applied to queue '%s' in vhost '%s': %s",
                key, from_policy.pop(key), name, vhost.name, error.reason,
            )
            continue
        archive = combined.get("x-archive") is True
        return settings, archive


def exchange_alternate(vhost: PolicedVhost, exchange: Exchange) -> str | None:
    """The alternate exchange a policy gives `exchange` (its own argument wins over it)."""
    value = for_exchange(vhost, exchange.name).definition.get("alternate-exchange")
    return value if isinstance(value, str) else None


def apply_to_queue(vhost: PolicedVhost, queue: Queue) -> None:
    """Bring `queue` to the settings the policies in force give it now."""
    try:
        checked = QueueArguments.parse(queue.arguments, _defaults(vhost, queue.name))
    except InvalidArgument:
        return  # restored with arguments today's rules refuse: it keeps what it has
    settings, archive = queue_settings(vhost, queue.name, queue.arguments, checked)
    queue.reconfigure(settings)
    if queue.journal is not None:
        queue.journal.set_archive(archive or vhost.archives_everything)


def apply_to_exchange(vhost: PolicedVhost, exchange: Exchange) -> None:
    if exchange is vhost.default_exchange:
        return  # it routes by queue name only; RabbitMQ's default exchange takes no policy
    exchange.use_policy_alternate(exchange_alternate(vhost, exchange))


def reapply(vhost: PolicedVhost) -> None:
    """A policy of `vhost` was set or cleared: every queue and exchange takes what is now in
    force, at once and in place."""
    for queue in list(vhost.queues.values()):
        apply_to_queue(vhost, queue)
    for exchange in list(vhost.exchanges.values()):
        apply_to_exchange(vhost, exchange)


def _defaults(vhost: PolicedVhost, name: str) -> dict[str, Any] | None:
    return defaults_for(vhost.queue_defaults, vhost.name, name) if vhost.queue_defaults else None
