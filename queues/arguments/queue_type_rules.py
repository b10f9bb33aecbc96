"""Each queue type's declare rules: the arguments and properties it takes, as RabbitMQ 3.10 checks them.

`QUEUE_TYPE_RULES` holds one `QueueTypeRules` per declarable x-queue-type (the declare half of
the queue type behaviour, queues/queue_type.py): a new type plugs in by adding its entry.

RabbitMQ checks a new queue in this order (verified against RabbitMQ 3.10 with pika):

1. a server-named quorum queue: "Cannot declare a server-named queue for type rabbit_quorum_queue";
2. the channel's x-dead-letter-exchange type check, then the x-queue-type value;
3. the values of the arguments the queue type supports (rabbit_amqqueue:declare_args/0 order);
4. the first argument, in the client's table order, that some queue type knows but this one
   does not: "invalid arg 'x-max-priority' for queue 'q' in vhost '/' of queue type
   rabbit_quorum_queue" (an argument no type knows, such as x-foo, is kept and ignored);
5. the queue's properties: auto-delete, then exclusive, then non-durable, as
   "invalid property 'auto-delete' for queue 'q' in vhost '/'".

Classic queues keep this broker's lifecycle extensions (x-delivery-limit on a classic queue,
docs/lifecycle.md), so step 4 applies to quorum queues only. Streams are refused as an
unsupported queue type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CLASSIC = "classic"
QUORUM = "quorum"
QUORUM_MODULE = "rabbit_quorum_queue"
STREAM = "stream"
STREAM_MODULE = "rabbit_stream_queue"

# rabbit_queue_type capabilities() of RabbitMQ 3.10: the x-arguments each type accepts.
CLASSIC_ARGUMENTS = frozenset({
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
    "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
    "x-single-active-consumer", "x-queue-type", "x-queue-master-locator",
})
QUORUM_ARGUMENTS = frozenset({
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
    "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes", "x-overflow",
    "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size", "x-delivery-limit",
    "x-dead-letter-strategy", "x-queue-leader-locator",
})
STREAM_ARGUMENTS = frozenset({
    "x-queue-type", "x-max-length-bytes", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size", "x-queue-leader-locator",
})
KNOWN_ARGUMENTS = CLASSIC_ARGUMENTS | QUORUM_ARGUMENTS | STREAM_ARGUMENTS
# x-max-priority, x-queue-mode, x-queue-version, x-queue-master-locator, x-max-age,
# x-stream-max-segment-size-bytes, x-initial-cluster-size.
QUORUM_REFUSED_ARGUMENTS = KNOWN_ARGUMENTS - QUORUM_ARGUMENTS



@dataclass(frozen=True)
class QueueTypeRules:
    """What one queue type accepts at queue.declare."""

    name: str  # its x-queue-type value
    module: str  # RabbitMQ's module for it, which its refusals name
    arguments: frozenset[str]  # the x-arguments it takes (RabbitMQ's capabilities/0)
    refuses_other_arguments: bool  # an argument only other types know is refused (step 4)
    shared_durable_only: bool  # refuses auto-delete, exclusive and non-durable (step 5)
    named_only: bool  # refuses a server-named queue (step 1)
    replicated: bool  # its journal is replicated on a clustered broker (cluster/replication/)

    def refused_argument(self, arguments: dict[str, Any]) -> str | None:
        """The first key in `arguments` this type refuses as not its own, or None."""
        if not self.refuses_other_arguments:
            return None
        return next((key for key in arguments if key in KNOWN_ARGUMENTS and key not in self.arguments), None)

    def refused_property(self, *, durable: bool, exclusive: bool, auto_delete: bool) -> str | None:
        """The queue property this type refuses, by RabbitMQ's name for it, or None."""
        if not self.shared_durable_only:
            return None
        if auto_delete:
            return "auto-delete"
        if exclusive:
            return "exclusive-owner"
        if not durable:
            return "non-durable"
        return None


QUEUE_TYPE_RULES: dict[str, QueueTypeRules] = {
    # Classic queues keep this broker's lifecycle extensions (x-delivery-limit and the like).
    CLASSIC: QueueTypeRules(CLASSIC, "rabbit_classic_queue", CLASSIC_ARGUMENTS, refuses_other_arguments=False,
                            shared_durable_only=False, named_only=False, replicated=False),
    QUORUM: QueueTypeRules(QUORUM, QUORUM_MODULE, QUORUM_ARGUMENTS, refuses_other_arguments=True,
                           shared_durable_only=True, named_only=True, replicated=True),
    # An append-only log (queues/stream/): replicated across a cluster in a later step.
    STREAM: QueueTypeRules(STREAM, STREAM_MODULE, STREAM_ARGUMENTS, refuses_other_arguments=True,
                           shared_durable_only=True, named_only=True, replicated=False),
}


def rules_for(queue_type: str) -> QueueTypeRules:
    """The declare rules of `queue_type` (classic's for a type this broker does not know)."""
    return QUEUE_TYPE_RULES.get(queue_type, QUEUE_TYPE_RULES[CLASSIC])


DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")


def refused_argument(queue_type: str, arguments: dict[str, Any]) -> str | None:
    """The first key in `arguments` that `queue_type` refuses as not its own, or None."""
    return rules_for(queue_type).refused_argument(arguments)


def refused_property(queue_type: str, *, durable: bool, exclusive: bool, auto_delete: bool) -> str | None:
    """The queue property `queue_type` refuses, by RabbitMQ's name for it, or None."""
    return rules_for(queue_type).refused_property(durable=durable, exclusive=exclusive, auto_delete=auto_delete)


def server_named_refusal(arguments: dict[str, Any]) -> str | None:
    """RabbitMQ's 406 text for a server-named queue of a type that needs a name, or None."""
    queue_type = arguments.get("x-queue-type")
    if isinstance(queue_type, bytes):
        queue_type = queue_type.decode(errors="replace")
    rules = QUEUE_TYPE_RULES.get(queue_type) if isinstance(queue_type, str) else None
    if rules is not None and rules.named_only:
        return f"Cannot declare a server-named queue for type {rules.module}"
    return None


def implies_quorum(
    arguments: dict[str, Any], *, durable: bool, exclusive: bool, auto_delete: bool, default_queue_type: str
) -> bool:
    """Does a client's declaration that leaves x-queue-type out ask for a quorum queue?

    It does when the queue is durable, non-exclusive and non-auto-delete (the queues RabbitMQ 3.13
    gives its default_queue_type; the others stay classic) and either it carries
    x-quorum-initial-group-size (RabbitMQ 3.10 would make a classic queue and ignore that argument:
    here asking for replicas asks for replication) or the broker's default_queue_type is quorum.
    """
    if "x-queue-type" in arguments or not durable or exclusive or auto_delete:
        return False
    return default_queue_type == QUORUM or "x-quorum-initial-group-size" in arguments


def with_implied_type(
    arguments: dict[str, Any], existing_type: Any | None, *, durable: bool, exclusive: bool,
    auto_delete: bool, default_queue_type: str, exists: bool,
) -> dict[str, Any]:
    """A client's queue.declare arguments with the type it left out filled in, before validation.

    A new queue that implies_quorum gets `x-queue-type: quorum`, stored with it, so everything after
    (the quorum checks above, replication, /api/queues) sees a quorum queue. An existing queue
    redeclared the same way takes its own type (`existing_type`, None for none), as RabbitMQ 3.13
    resolves an omitted type on redeclaration: the client that declared without x-queue-type and
    redeclares without it stays equivalent, whatever the default was when the queue was made.
    """
    if not implies_quorum(arguments, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                          default_queue_type=default_queue_type):
        return arguments
    if not exists:
        return {**arguments, "x-queue-type": QUORUM}
    return arguments if existing_type is None else {**arguments, "x-queue-type": existing_type}
