"""Per-vhost and per-user limits, as RabbitMQ's `set_vhost_limits` and `set_user_limits` set them.

A vhost may cap its connections (`max-connections`) and queues (`max-queues`); a user may cap
their connections (`max-connections`) and open channels over all of them (`max-channels`). A
negative value is no limit, 0 refuses every one, as in RabbitMQ. Connections are counted by the
same ConnectionLimit as the node's (connection_limits.py), entered at connection.open. Each
refusal is RabbitMQ's, at the moment the limit is hit:

    connection.open   530 "access to vhost '/' refused for user 'u': connection limit (N) is reached"
                      530 "connection refused for user 'u': user connection limit (N) is reached"
    channel.open      530 "number of channels opened for user 'u' has reached the maximum allowed
                           user limit of (N)"
    queue.declare     406 "cannot declare queue 'q': queue limit in vhost '/' (N) is reached"

Lowering a limit closes nothing that is already open. docs/policies.md. What a limits
definition may hold, and RabbitMQ's refusals of one, are amqp_server/config/limit_definitions.py's.
"""

from __future__ import annotations

from amqp_server.wire import errors
from amqp_server.broker.connection_limits import ConnectionLimit, LimitScope
from amqp_server.wire.errors import AMQPError

NO_LIMIT = -1


class _Limits:
    """Limits as set (RabbitMQ's "value"), a ConnectionLimit counting connections, and one
    count checked when an object is made (`counted`: max-queues or max-channels)."""

    counted = ""  # the limit name of the count the subclass checks
    scope = LimitScope.VHOST

    def __init__(self) -> None:
        self.connections = ConnectionLimit("", NO_LIMIT, self.scope)
        self.maximum = NO_LIMIT  # of the counted objects
        self._set: dict[str, int] = {}

    def replace(self, limits: dict[str, int]) -> None:
        """Make `limits` (checked by check_limits) the limits; those it does not name are lifted."""
        self._set = dict(limits)
        self.connections.set_maximum(limits.get("max-connections", NO_LIMIT))
        self.maximum = limits.get(self.counted, NO_LIMIT)

    def as_value(self) -> dict[str, int]:
        """The limits as set, {} when none is."""
        return dict(self._set)

    def _reached(self, count: int) -> bool:
        return 0 <= self.maximum <= count


class VhostLimits(_Limits):
    """A vhost's max-connections and max-queues."""

    counted = "max-queues"

    def check_new_queue(self, queue: str, vhost: str, queue_count: int) -> None:
        """406 when one more queue would pass max-queues."""
        if self._reached(queue_count):
            raise AMQPError(
                errors.PRECONDITION_FAILED,
                f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({self.maximum}) is reached",
            )


class UserLimits(_Limits):
    """A user's max-connections and max-channels (over all their connections)."""

    counted = "max-channels"
    scope = LimitScope.USER

    def check_new_channel(self, user: str, open_channels: int) -> None:
        """530 when one more channel would pass max-channels."""
        if self._reached(open_channels):
            raise AMQPError(
                errors.NOT_ALLOWED,
                f"number of channels opened for user '{user}' has reached the maximum allowed user limit of "
                f"({self.maximum})",
            )

    @property
    def limits_channels(self) -> bool:
        return self.maximum >= 0
