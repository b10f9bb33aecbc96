"""connection.update-secret: a client renews its credentials on a live connection, as in RabbitMQ.

Clients whose secret expires (an OAuth token used as the password) send the new one with a
reason. As RabbitMQ's internal user database, the secret is accepted for a user that still
exists and logged in with a password mechanism (the backend has nothing to re-check; the
connection keeps its identity); with `[server] verify_updated_secret = true` it must be the
user's password, as a backend whose credentials expire (OAuth 2) would check. On success the
connection carries on as the user's current record and every channel forgets the permission
checks it remembered, so permissions are looked up again from then on; on failure the
connection closes with RabbitMQ's 530.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server.wire import errors
from amqp_server.broker.access_control import AuthenticationFailed
from amqp_server.wire.errors import AMQPError

if TYPE_CHECKING:
    from amqp_server.connection.connection import Connection

# These are the connection's log lines: one logger to configure for all of them.
log = logging.getLogger("amqp_server.connection.connection")

REFUSED_TEXT = "New secret was refused by one of the backends"


def update_secret(connection: "Connection", method: commands.Connection.UpdateSecret) -> None:
    """Check the new secret and answer update-secret-ok, or close the connection with 530."""
    logged_in = connection.user
    assert logged_in is not None, "update-secret is taken only on an open connection"
    name = logged_in.name
    try:
        user = connection.broker.access.check_new_secret(name, connection.mechanism, method.new_secret)
    except AuthenticationFailed as failure:
        log.error("Secret update was refused for user '%s': %s", name, failure.reason)
        raise AMQPError(errors.NOT_ALLOWED, REFUSED_TEXT, 10, 70) from None
    connection.secret_updated(user)
    connection.send_connection_method(commands.Connection.UpdateSecretOk())
    log.info("connection %s: user '%s' updated secret, reason: %s", connection.name, name, method.reason)
