"""Opening a connection: protocol header, start/start-ok (login), tune/tune-ok, open.

The connection calls these as the client's methods arrive on channel 0 (connection.py checks
that each comes in its turn). They negotiate as RabbitMQ does: the client may lower but not
raise frame_max and channel_max, a refused login is answered with connection.close only for
clients that announce authentication_failure_close, and connection.open names a vhost the
user may access. The protocol header chose the protocol (wire/protocols.py): connection.start
gives its version, and the capabilities only where it has them (not AMQP 0-8); the methods
here are 0-9-1's whichever is spoken, the connection encodes them in its ids.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server.wire import errors
from amqp_server.broker.access_control import AuthenticationFailed, UnsupportedMechanism
from amqp_server.config.settings import FRAME_MIN_SIZE
from amqp_server.wire.errors import AMQPError

if TYPE_CHECKING:
    from amqp_server.connection.connection import Connection

# These are the connection's log lines: one logger to configure for all of them.
log = logging.getLogger("amqp_server.connection.connection")

PRODUCT = "amqp-server"
VERSION = "0.1.0"
# What the client may rely on; each is implemented and covered by interop tests.
CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}
EXTERNAL = "EXTERNAL"


def offered_mechanisms(connection: "Connection") -> list[str]:
    """The configured SASL mechanisms ([server] auth_mechanisms, in its order), less EXTERNAL
    unless this is a TLS connection whose client presented a verified certificate."""
    has_peer_cert = connection.tls is not None and connection.tls.peer_cert is not None
    return [m for m in connection.broker.config.auth_mechanisms if m != EXTERNAL or has_peer_cert]


def send_start(connection: "Connection") -> None:
    """The protocol header was right: offer our properties and login mechanisms."""
    protocol = connection.protocol
    connection.send_connection_method(
        commands.Connection.Start(
            version_major=protocol.start_version[0],
            version_minor=protocol.start_version[1],
            server_properties={
                "product": PRODUCT,
                "version": VERSION,
                "platform": f"Python {sys.version.split()[0]}",
                "copyright": "The amqp-server authors",
                "information": "Licensed under the Apache License 2.0",
                "cluster_name": connection.broker.cluster_name,
                # Empty for AMQP 0-8, as RabbitMQ sends it: 0-8 has none of these extensions.
                "capabilities": dict(CAPABILITIES) if protocol.capabilities else {},
            },
            mechanisms=" ".join(offered_mechanisms(connection)),
            locales="en_US",
        ),
    )


def start_ok(connection: "Connection", method: commands.Connection.StartOk) -> None:
    """The client's properties and login: log in and tune, or refuse."""
    connection.identify(method.client_properties or {})
    access = connection.broker.access
    try:
        if method.mechanism not in offered_mechanisms(connection):
            raise UnsupportedMechanism(f"unknown authentication mechanism {method.mechanism!r}", method.mechanism)
        if method.mechanism == EXTERNAL:
            tls = connection.tls
            assert tls is not None, "EXTERNAL is offered only on TLS (offered_mechanisms)"
            login_from = connection.broker.config.tls.ssl_cert_login_from
            user = access.authenticate_external(tls.login_name(login_from), connection.peer_is_loopback)
        else:
            user = access.authenticate(method.mechanism, method.response, connection.peer_is_loopback)
    except AuthenticationFailed as failure:
        log.warning("login refused for connection %s: %s", connection.describe(), failure.reason)
        connection.refuse_login(failure)
        return
    connection.logged_in(user, method.mechanism)
    connection.send_connection_method(
        commands.Connection.Tune(
            channel_max=connection.channel_max, frame_max=connection.frame_max, heartbeat=connection.heartbeat
        ),
    )


def tune_ok(connection: "Connection", method: commands.Connection.TuneOk) -> None:
    """The client's limits: at most ours (0 means ours)."""
    frame_max = method.frame_max or connection.frame_max
    # AMQP 0-9-1 sets 4096 as the smallest frame_max a peer must accept. RabbitMQ 4.1 raised its
    # minimum to 8192 and broke amqplib < 0.10.7, which asks for 4096; we accept it.
    if frame_max < FRAME_MIN_SIZE:
        raise AMQPError(errors.NOT_ALLOWED, f"frame_max={frame_max} < {FRAME_MIN_SIZE} min size", 10, 31)
    if frame_max > connection.frame_max:
        raise AMQPError(errors.NOT_ALLOWED, f"frame_max={frame_max} > {connection.frame_max} max size", 10, 31)
    channel_max = method.channel_max or connection.channel_max
    if channel_max > connection.channel_max:
        raise AMQPError(
            errors.NOT_ALLOWED, f"channel_max={channel_max} > {connection.channel_max} max size", 10, 31
        )
    connection.tuned(frame_max, channel_max, method.heartbeat)


def open_vhost(connection: "Connection", method: commands.Connection.Open) -> None:
    """connection.open: enter the vhost if the user may; the connection is open."""
    broker = connection.broker
    vhost = broker.vhosts.get(method.virtual_host)
    if vhost is None:
        raise AMQPError(errors.NOT_ALLOWED, f"vhost {method.virtual_host} not found", 10, 40)
    user = connection.user
    assert user is not None, "connection.open comes after the login (the connection's states)"
    # The vhost's limit, then the user's, before the user's access to the vhost, as
    # rabbit_reader.erl checks them (a user without access is told the vhost is full).
    limits = (vhost.limits.connections, broker.limits_of(user.name).connections)
    for limit in limits:
        if limit.is_reached:
            raise limit.refusal(vhost.name, user.name)
    if not broker.access.can_access_vhost(user, vhost.name):
        raise AMQPError(
            errors.NOT_ALLOWED, f"access to vhost '{vhost.name}' refused for user '{user.name}'", 10, 40
        )
    over_limit = connection.admission.refused_by
    if over_limit is not None:
        raise over_limit.refusal(vhost.name, user.name)
    for limit in limits:  # held from here until the socket closes
        connection.admission.enter(limit)
    connection.entered(vhost)
    broker.connection_opened(connection)
    log.info(
        "connection %s: user '%s' authenticated and granted access to vhost '%s' (client %s)",
        connection.name, user.name, vhost.name, connection.client_properties.get("product", "unknown"),
    )
    connection.alarm_changed(broker.alarms.blocked_reason)
    connection.send_connection_method(commands.Connection.OpenOk())
