"""Arguments of declarations, checked as RabbitMQ checks them and refused in its words.

- queue_arguments.py: a queue's x-arguments, validated once at declare (rabbit_amqqueue
  declare_args) into typed settings (`QueueArguments`), or refused (`InvalidArgument`, with
  RabbitMQ's reason: "{value_negative,-1}");
- queue_type_rules.py: what a quorum queue refuses that a classic queue takes;
- equivalence.py: what a redeclaration of a queue or an exchange must repeat
  ("inequivalent arg ...");
- exchange_arguments.py: the exchange argument the broker checks (alternate-exchange);
- queue_defaults.py: x-arguments the configuration sets by vhost and queue name
  ([[queue_defaults]]), checked as a queue's own;
- policy_keys.py: what a policy's definition may hold (the same settings, set by pattern),
  each key's check and its x-argument;
- texts.py: the field type names and value descriptions those texts share.

The broker turns a refusal of a declaration into 406 PRECONDITION_FAILED, of a policy into
the management API's 400. Arguments of exchange types (x-delayed-type, a headers binding's
x-match) are checked by the types themselves (exchanges/), which do not depend on queues/.
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
