"""Arguments of declarations, checked as RabbitMQ checks them and refused in its words.

- queue_arguments.py: a queue's x-arguments, validated once at declare (rabbit_amqqueue
  declare_args) into typed settings (`QueueArguments`), or refused (`InvalidArgument`, with
  RabbitMQ's reason: "{value_negative,-1}");
- queue_type_rules.py: what a quorum queue refuses that a classic queue takes;
- equivalence.py: what a redeclaration of a queue or an exchange must repeat
  ("inequivalent arg ...");
- texts.py: the field type names and value descriptions those texts share.

The broker turns each refusal into 406 PRECONDITION_FAILED. Policy definitions, which set the
same settings by pattern, are checked in amqp_server/policy_keys.py with the values allowed
here; the x-delayed-type of an x-delayed-message exchange by the exchange type
(exchanges/delayed.py), which cannot depend on this package.
"""

from queues.arguments.queue_arguments import (
    MAX_EXPIRY_MS,
    MAX_PRIORITY,
    NO_ARGUMENTS,
    OVERFLOW_MODES,
    QUEUE_MODES,
    QUEUE_TYPES,
    QUEUE_VERSIONS,
    RETRY_BACKOFFS,
    RETRY_TYPES,
    InvalidArgument,
    QueueArguments,
)
from queues.arguments.texts import amqp_type_name

__all__ = [
    "MAX_EXPIRY_MS",
    "MAX_PRIORITY",
    "NO_ARGUMENTS",
    "OVERFLOW_MODES",
    "QUEUE_MODES",
    "QUEUE_TYPES",
    "QUEUE_VERSIONS",
    "RETRY_BACKOFFS",
    "RETRY_TYPES",
    "InvalidArgument",
    "QueueArguments",
    "amqp_type_name",
]
